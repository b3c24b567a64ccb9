"""The Java hot path's handle table: handle -> the live :class:`~cudabridge.memory.Allocation`
behind it, for every device buffer the bridge has handed to Java and not taken back.

A *handle* is the pool's allocation id (never reused within a pool) shifted left by
:data:`GPU_BITS`, or'ed with the GPU ordinal; always an exact ``int``. The table belongs to
:class:`~cudabridge.jvm.hot_path.JavaHotPath`, which hands it explicitly to its C twin
(``jvm/_hotcore.c``). Both twins use it through the same operations, and the C twin through
nothing else:

* ``insert(handle, allocation)``: add a new handle (the dict's ``setdefault``, one C-level
  call; a handle is never reused, so it always inserts);
* ``pop(handle, default)``: take a handle out, returning its allocation, or ``default`` if
  it is not in the table (the step that makes a free, or a batch's free, exclusive);
* ``get(handle)``: its allocation, or None (a free_many checks each handle with it first);
* ``refusal(handle, call)`` / ``refusal_many(handles)``: the
  :class:`~cudabridge.errors.InvalidFree` to raise for a handle that is not live (or not an
  int) and for a batch that is not all live and distinct; the single wording of both twins.

``insert``, ``pop`` and ``get`` are the table dict's own bound methods (C-level callables: the C
twin calls them without a Python frame), and take exact ``int`` handles only: callers refuse
anything else first (``True`` or ``1.0`` would find handle 1). The rest (``forget``,
``sweep``, iteration, ``len``, ``clear``) runs in Python only, under the GIL, between two of the
C twin's calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Iterator

from ..errors import InvalidFree

if TYPE_CHECKING:
    from ..memory import Allocation

GPU_BITS = 6                      # handle = allocation id << 6 | GPU ordinal
MAX_GPUS = 1 << GPU_BITS
GPU_MASK = MAX_GPUS - 1


class HandleTable:
    """handle -> live Allocation (see the module docstring for the operations' contract)."""

    __slots__ = ("_by_handle", "insert", "pop", "get")

    def __init__(self) -> None:
        self._by_handle: dict[int, "Allocation"] = {}
        self.insert = self._by_handle.setdefault   # always inserts: handles are never reused
        self.pop = self._by_handle.pop
        self.get = self._by_handle.get

    def __len__(self) -> int:
        return len(self._by_handle)

    def __contains__(self, handle: object) -> bool:
        return handle.__class__ is int and handle in self._by_handle

    def items(self) -> list[tuple[int, "Allocation"]]:
        """A snapshot of (handle, allocation) pairs."""
        return list(self._by_handle.items())

    def clear(self) -> None:
        self._by_handle.clear()

    def forget(self, handles: Iterable[int]) -> list[int]:
        """Drop ``handles`` (those present); returns the ones dropped."""
        pop = self._by_handle.pop
        return [h for h in handles if pop(h, None) is not None]

    def sweep(self) -> int:
        """Drop handles whose allocation is no longer alive; returns how many."""
        dead = [h for h, a in list(self._by_handle.items()) if not a.alive]
        return len(self.forget(dead))

    # the refusals, worded once for both twins ----------------------------------------------------
    @staticmethod
    def why_not_live(handle: object, call: str) -> str:
        if handle.__class__ is not int:
            return f"{call}: a device buffer handle is an int, got {type(handle).__name__} ({handle!r})"
        return (f"{call}: device buffer handle {handle:#x} is not live (freed already, released with its task, "
                f"or never handed out by this bridge)")

    def refusal(self, handle: object, call: str) -> InvalidFree:
        return InvalidFree(self.why_not_live(handle, call))

    def refusal_many(self, handles: tuple | list) -> InvalidFree:
        """What a free_many of ``handles`` that are not all live ints and distinct raises."""
        get = self._by_handle.get
        bad = [h for h in handles if h.__class__ is not int or get(h) is None]
        if bad:
            return InvalidFree(f"free_many of {len(handles)} buffer(s): {len(bad)} not live "
                               f"(first: {self.why_not_live(bad[0], 'free')}); nothing was freed")
        return InvalidFree(f"free_many of {len(handles)} buffer(s): a handle appears twice; nothing was freed")

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._by_handle))
