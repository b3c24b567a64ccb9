"""What ``allocate`` hands out: a device pointer with an identity.

The identity is the object itself plus ``id``, a number never reused within a pool (the
pointer plus a generation). The pool keeps the set of live allocations; freeing claims the
object out of that set in one atomic step, so a stale handle, a double free or a handle from
another pool can never free a block that has since gone to another owner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable, Protocol

from ..errors import InvalidFree, PoolClosed
from .native import load as load_native

if TYPE_CHECKING:
    from .block import Block
    from .stream_arena import StreamArena


class Pool(Protocol):
    """What an allocation needs of the pool that made it (``StreamOrderedMemoryPool`` is one; the
    pool imports this module, not the other way round)."""

    device: int

    @property
    def closed(self) -> bool: ...

    def free(self, a: "Allocation", stream: int | None = None) -> None: ...

    def record_stream(self, a: "Allocation", stream: int) -> None: ...


# Why an allocation is no longer live, for error messages.
ALIVE = 0
FREED = 1
RELEASED = 2  # freed by the pool when its owner (task) was released
CLOSED = 3


class _AllocationSlots:
    """The fields of an allocation; replaced by the C extension's identical ``AllocationBase``
    when it is built, so that its fast path can fill them without running ``__init__``."""

    __slots__ = ("ptr", "size", "id", "stream", "owner", "_block", "_arena", "_pool", "_extra", "_state")


_native = load_native()
_Base: type = _native.AllocationBase if _native is not None else _AllocationSlots


class Allocation(_Base):  # type: ignore[misc, valid-type]
    __slots__ = ()

    def __init__(self, ptr: int, size: int, id_: int, stream: int, owner: Hashable | None,
                 block: "Block", arena: "StreamArena", pool: Pool) -> None:
        self.ptr = ptr
        self.size = size
        self.id = id_
        self.stream = stream
        self.owner = owner
        self._block = block
        self._arena = arena
        self._pool = pool
        self._extra: "list[StreamArena] | None" = None
        self._state = ALIVE

    @property
    def device(self) -> int:
        return self._pool.device

    @property
    def alive(self) -> bool:
        return self._state == ALIVE

    def free(self, stream: int | None = None) -> None:
        """Free asynchronously; ``stream`` is where the last work using it was queued
        (default: the stream it was allocated on)."""
        self._pool.free(self, stream)

    def record_stream(self, stream: int) -> None:
        """Declare that work on ``stream`` uses this buffer too; its free then waits for both."""
        self._pool.record_stream(self, stream)

    def __enter__(self) -> "Allocation":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._state == ALIVE:
            self._pool.free(self)

    def __repr__(self) -> str:
        state = {ALIVE: "live", FREED: "freed", RELEASED: "released", CLOSED: "closed"}[self._state]
        return f"Allocation(#{self.id}, ptr={self.ptr:#x}, size={self.size}, stream={self.stream:#x}, {state})"


def free_refusal(a: object, pool: Pool) -> Exception:
    """What a free (or a record_stream) of ``a`` on ``pool`` raises when ``a`` is not one of its
    live allocations: the reason, from the allocation's own state where it has one."""
    if not isinstance(a, Allocation):
        return InvalidFree(f"free expects an Allocation, got {type(a).__name__}")
    if a._pool is not pool:
        return InvalidFree(f"{a!r} belongs to the pool of GPU {a._pool.device}, not to this pool of GPU {pool.device}")
    if pool.closed:
        return PoolClosed(f"free of {a!r} after the pool of GPU {pool.device} was closed")
    why = {FREED: "double free", RELEASED: "stale handle: its owner was released and the pool reclaimed it",
           CLOSED: "the pool was closed"}.get(a._state, "not a live allocation of this pool")
    return InvalidFree(f"free of {a!r}: {why}")
