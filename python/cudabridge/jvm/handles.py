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
* ``released_with(handle)``: the task whose release took ``handle`` out of the table, or None
  (a handle never handed out, freed, or taken by a release too long ago, see below). A free of
  such a handle has no effect: it raced its task's release (Java's ``DeviceBuffer.close()`` on one
  thread, the task's release on another), and the release has freed the buffer and counted it
  as a leak;
* ``refusal(handle, call)`` / ``refusal_many(handles)``: the
  :class:`~cudabridge.errors.InvalidFree` to raise for a free of a handle that is neither live
  nor taken by a release (or not an int) and for a batch that is not all such handles and
  distinct; ``dead(handle, call)`` what any other use of a handle that is not live raises
  (:class:`~cudabridge.errors.UnknownTask` if a release took it, else
  :class:`~cudabridge.errors.InvalidArgument`); the single wording of both twins.

``insert``, ``pop``, ``get`` and ``released_with`` are dicts' own bound methods (C-level
callables: the C twin calls them without a Python frame), and take exact ``int`` handles only:
callers refuse anything else first (``True`` or ``1.0`` would find handle 1). The rest
(``forget``, ``sweep``, iteration, ``len``, ``clear``) runs in Python only, under the GIL,
between two of the C twin's calls.

The handles a release took are remembered, newest last, up to :data:`RELEASED_KEPT` of them: a
close that reaches Python after its task's release has no effect for as long as its handle is
among them. Java refuses to close a buffer once it sees its task released, so only closes in
flight across a release get here, within microseconds of it; ``DeviceBuffer.close()`` also takes
any refusal of a buffer whose task reads released as its release's doing.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Iterable, Iterator

from ..errors import InvalidArgument, InvalidFree, UnknownTask
from ..memory.allocation import RELEASED

if TYPE_CHECKING:
    from ..memory import Allocation

GPU_BITS = 6                      # handle = allocation id << 6 | GPU ordinal
MAX_GPUS = 1 << GPU_BITS
GPU_MASK = MAX_GPUS - 1
RELEASED_KEPT = 1 << 14           # handles taken by releases that are remembered (module docstring)


class HandleTable:
    """handle -> live Allocation (see the module docstring for the operations' contract)."""

    __slots__ = ("_by_handle", "insert", "pop", "get", "_released", "released_with")

    def __init__(self) -> None:
        self._by_handle: dict[int, "Allocation"] = {}
        self.insert = self._by_handle.setdefault   # always inserts: handles are never reused
        self.pop = self._by_handle.pop
        self.get = self._by_handle.get
        # handle -> task of the handles releases took, oldest first (an OrderedDict: the oldest
        # goes in O(1)); written by forget/sweep only, read by released_with
        self._released: OrderedDict[int, int] = OrderedDict()
        self.released_with = self._released.get

    def __len__(self) -> int:
        return len(self._by_handle)

    def __contains__(self, handle: object) -> bool:
        return handle.__class__ is int and handle in self._by_handle

    def items(self) -> list[tuple[int, "Allocation"]]:
        """A snapshot of (handle, allocation) pairs."""
        return list(self._by_handle.items())

    def clear(self) -> None:
        self._by_handle.clear()

    def forget(self, handles: Iterable[int], released_with: int | None = None) -> list[int]:
        """Drop ``handles`` (those present); returns the ones dropped. ``released_with``: the
        task whose release takes them (remembered, see the module docstring)."""
        pop = self._by_handle.pop
        if released_with is None:
            return [h for h in handles if pop(h, None) is not None]
        dropped = [h for h in handles if self._take(h, released_with)]
        self._trim()
        return dropped

    def _take(self, handle: int, task: int) -> bool:
        """Take ``handle`` out of the table as its task's release does: remembered first, so that
        a free between the two steps finds it live or taken, never neither. False (and forgotten
        again) if it was not live: freed on its own meanwhile, so a free of it again is a double
        free."""
        self._released[handle] = task
        if self._by_handle.pop(handle, None) is not None:
            return True
        self._released.pop(handle, None)
        return False

    def _trim(self) -> None:
        released = self._released
        while len(released) > RELEASED_KEPT:
            released.popitem(last=False)

    def sweep(self) -> int:
        """Drop handles whose allocation is no longer alive (one a release reclaimed is
        remembered as that release's); returns how many."""
        dropped = 0
        for h, a in list(self._by_handle.items()):
            if a.alive:
                continue
            if a._state == RELEASED:
                dropped += self._take(h, a.owner)
            else:
                dropped += self._by_handle.pop(h, None) is not None
        self._trim()
        return dropped

    @property
    def released_remembered(self) -> int:
        """How many handles taken by releases are remembered (at most RELEASED_KEPT)."""
        return len(self._released)

    # the refusals, worded once for both twins ----------------------------------------------------
    @staticmethod
    def why_not_live(handle: object, call: str) -> str:
        if handle.__class__ is not int:
            return f"{call}: a device buffer handle is an int, got {type(handle).__name__} ({handle!r})"
        return (f"{call}: device buffer handle {handle:#x} is not live (freed already, released with its task, "
                f"or never handed out by this bridge)")

    def refusal(self, handle: object, call: str) -> InvalidFree:
        return InvalidFree(self.why_not_live(handle, call))

    def dead(self, handle: object, call: str) -> Exception:
        """What a use of ``handle`` other than a free (a copy, a memset, a launch argument) raises
        when it is not live: UnknownTask when its task's release took it, else InvalidArgument."""
        task = self._released.get(handle) if handle.__class__ is int else None
        if task is not None:
            return UnknownTask(f"{call}: device buffer handle {handle:#x} was released with its task {task}")
        return InvalidArgument(self.why_not_live(handle, call))

    def refusal_many(self, handles: tuple | list) -> InvalidFree:
        """What a free_many of ``handles`` that are not all ints, live or taken by a release, and
        distinct raises."""
        get, released = self._by_handle.get, self._released.get
        bad = [h for h in handles if h.__class__ is not int or (get(h) is None and released(h) is None)]
        if bad:
            return InvalidFree(f"free_many of {len(handles)} buffer(s): {len(bad)} not live "
                               f"(first: {self.why_not_live(bad[0], 'free')}); nothing was freed")
        return InvalidFree(f"free_many of {len(handles)} buffer(s): a handle appears twice; nothing was freed")

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._by_handle))
