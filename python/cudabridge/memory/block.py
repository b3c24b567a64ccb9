"""Blocks and chunks: the pool's view of device memory.

A chunk is one ``malloc`` from the device; it is cut into blocks that are physical neighbours
(``prev`` / ``next``), so coalescing never crosses a chunk boundary. A block is, at any time,
in exactly one place, named by ``state``: live (lent out), in one stream arena's bins (freed on
that stream, maybe still in use by its queued work), pending (freed behind several streams), or
in the safe index (no queued work can touch it any more); in a segment, a block may also be
unmapped address space, which is never handed out.
"""

from __future__ import annotations

from typing import Any, Protocol

from .native import load as load_native

LIVE = "live"
PENDING = "pending"
SAFE = "safe"
UNMAPPED = "unmapped"   # address space of a segment with no memory behind it (never free)


class Chunk:
    """One ``malloc`` from the device, or (``segment`` set) the mapped part of an expandable
    segment, whose size grows."""

    __slots__ = ("ptr", "size", "small", "head", "segment")

    def __init__(self, ptr: int, size: int, small: bool, segment: Any = None) -> None:
        self.ptr = ptr
        self.size = size
        self.small = small
        self.head: "Block | None" = None
        self.segment = segment


class Arena(Protocol):
    """What a block knows of a stream arena (``StreamArena`` is one; stream_arena.py imports this
    module, not the other way round): the arena whose bins hold the block is its ``state``, a
    further arena it waits for a key of ``extra``, and ``name`` is said in the block's repr."""

    name: str


class _BlockSlots:
    """A block's fields; the C extension's identical ``BlockBase`` replaces it when built, so
    that the pool's C fast paths read them without an attribute lookup."""

    __slots__ = ("ptr", "size", "chunk", "prev", "next", "state", "epoch", "extra")


_native = load_native()


class Block(_native.BlockBase if _native is not None else _BlockSlots):  # type: ignore[misc]
    """A contiguous piece of a chunk.

    ``state`` is LIVE, PENDING, SAFE, or the :class:`StreamArena` whose bins hold it. ``epoch`` is
    the freeing arena's epoch stamp; ``extra`` maps further arenas to stamps for blocks that must
    also wait for other streams (``record_stream``, coalesced runs)."""

    __slots__ = ()

    def __init__(self, ptr: int, size: int, chunk: Chunk, prev: "Block | None", next_: "Block | None") -> None:
        self.ptr = ptr
        self.size = size
        self.chunk = chunk
        self.prev = prev
        self.next = next_
        self.state: Any = LIVE
        self.epoch = 0
        self.extra: "dict[Arena, int] | None" = None

    def split(self, size: int) -> "Block":
        """Cut this block to ``size`` bytes and return the remainder as a new block that keeps the
        same fences. The caller owns both (neither is in any container)."""
        rest = Block(self.ptr + size, self.size - size, self.chunk, self, self.next)
        if self.next is not None:
            self.next.prev = rest
        self.next = rest
        self.size = size
        rest.epoch = self.epoch
        rest.extra = dict(self.extra) if self.extra else None
        return rest

    def __repr__(self) -> str:
        state = self.state if isinstance(self.state, str) else f"arena:{self.state.name}"
        return f"Block({self.ptr:#x}, {self.size}, {state})"
