"""The narrow interface between a pool and its fast paths.

A pool's ``allocate`` and ``free`` are its fast paths: the pure-Python reference
(python_fast_path.py) or its C twin (``FastPath`` in _fastpath.c, installed by
native_fast_path.py for the default composition). Both are handed one :class:`FastPathHooks`
and see nothing else of the pool: the shared containers they change, each with single atomic
operations, and the pool's steps they call back (the locked ones run through the pool's serial
section: on the C path, its SerialWorker's thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NoReturn

if TYPE_CHECKING:
    from .allocation import Allocation
    from .block import Block
    from .stream_arena import StreamArena


@dataclass(frozen=True, slots=True)
class FastPathHooks:
    pool: Any                               # each Allocation's ``_pool``: where its free() goes
    arenas: dict[int, StreamArena]          # StreamTable.by_handle: stream -> arena, one lookup
    all_arenas: list[StreamArena]           # StreamTable.all: the cross-stream steal walks it
    live: set[Allocation]                   # the live allocations: a free claims out of it
    owners: dict[int, dict[Allocation, None]]   # OwnerTracker.by_owner
    max_request: int                        # the largest size allocate accepts (the pool's limit)
    # refusals: each raises the pool's typed error, before anything changed
    resolve_arena: Callable[[object, str], StreamArena]    # a stream the lookup missed (or refuse it)
    refuse_size: Callable[[int], NoReturn]                  # an exact-int size out of range
    refuse_free: Callable[[object], NoReturn]               # not a live allocation of this pool
    allocate_normalized: Callable[[object, object, object], Allocation]   # arguments not exact ints
    free_normalized: Callable[[Allocation, object], None]
    # the pool's steps
    allocate_slow: Callable[[int, StreamArena], "Block | tuple[Block, list]"]   # locked: steps 2-7
    queue_waits: Callable[[StreamArena, list], None]        # on the caller: its stream waits
    return_unwaited: Callable[[Block, StreamArena, list], None]   # locked: the waits failed
    fence_stamps: Callable[[Allocation, StreamArena], dict]       # device work only, on the caller
    place_pending: Callable[[Block, StreamArena, dict], None]     # locked: freed behind several streams
    trim_recent: Callable[[StreamArena], None]              # inline, takes the lock itself
    # the slow path found no memory (it raised ``out_of_memory_error``): called on the allocating
    # thread with no lock held and not on the serial worker, with (rounded size, arena, owner, the
    # error, how many times before this allocation asked: 0 the first); returns True to run the
    # slow path again (memory may have come back), False to raise the error, or raises what the
    # allocation raises instead (StreamOrderedMemoryPool._out_of_memory)
    out_of_memory: Callable[[int, StreamArena, object, BaseException, int], bool]
    out_of_memory_error: type
