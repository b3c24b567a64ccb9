"""The pool's fast paths in Python: the reference, and the fallback where the C extension is
not built. ``FastPath`` in _fastpath.c follows it step for step, errors included (the
differential tests in tests/test_native_fast_path.py hold them to it).

allocate: the requesting stream's own bin of that exact size, then a block of that size another
stream has passed (``steal``), then the pool's slow path. free: into the freeing stream's bin,
stamped with its epoch; a free that must wait for several streams goes to the pending list.
Each step on shared state is one built-in container operation, atomic under the GIL.
"""

from __future__ import annotations

import itertools
from typing import Callable

from .allocation import FREED, Allocation
from .block import LIVE, Block
from .fast_path_hooks import FastPathHooks
from .statistics import UsageLedger
from .stream_arena import StreamArena

FOLD_MASK = (1 << 14) - 1    # the ledger folds every 16384 allocations: a short deque


class PythonFastPath:
    __slots__ = ("_pool", "_arenas", "_resolve", "_live", "_owners", "_max_request", "_refuse_size",
                 "_refuse_free", "_allocate_normalized", "_free_normalized", "_slow", "_fence_stamps",
                 "_place_fenced", "_trim_recent", "_steal", "_ids", "_ledger", "_ledger_add", "_out_of_memory",
                 "_oom")

    def __init__(self, hooks: FastPathHooks, *, steal: Callable[[int, StreamArena], Block | None] | None,
                 place_fenced: Callable[[Block, StreamArena, dict], None], ledger: UsageLedger) -> None:
        self._pool = hooks.pool
        self._arenas = hooks.arenas
        self._resolve = hooks.resolve_arena
        self._live = hooks.live
        self._owners = hooks.owners
        self._max_request = hooks.max_request
        self._refuse_size = hooks.refuse_size
        self._refuse_free = hooks.refuse_free
        self._allocate_normalized = hooks.allocate_normalized
        self._free_normalized = hooks.free_normalized
        # On this path the slow path runs on the calling thread, which names its own stream: it
        # never returns (block, waits), so queue_waits / return_unwaited are never needed here.
        self._slow = hooks.allocate_slow
        self._out_of_memory = hooks.out_of_memory
        self._oom = hooks.out_of_memory_error
        self._fence_stamps = hooks.fence_stamps
        self._place_fenced = place_fenced
        self._trim_recent = hooks.trim_recent
        self._steal = steal
        self._ids = itertools.count(1)
        self._ledger = ledger
        self._ledger_add = ledger.add

    # The steal step is the core's and counts there; the C twin counts its own.
    steals = 0
    stream_polls = 0

    @property
    def issued(self) -> int:
        """Allocations made so far (the ledger's count, exact once folded)."""
        self._ledger.fold()
        return self._ledger.allocations

    def allocate(self, size: int, stream: int, owner: int | None = None) -> Allocation:
        if size.__class__ is not int or stream.__class__ is not int or (owner is not None and owner.__class__ is not int):
            return self._allocate_normalized(size, stream, owner)
        if size <= 0 or size > self._max_request:   # before the stream: a refusal creates no arena
            self._refuse_size(size)
        arena = self._arenas.get(stream)
        if arena is None:
            arena = self._resolve(stream, "allocate")
        r = (size + 255) & -256
        lst = arena.bins.get(r)
        blk = None
        if lst:
            try:
                blk = lst.pop()
            except IndexError:
                pass
        if blk is None:
            blk = self._steal(r, arena) if self._steal is not None else None
            attempt = 0
            while blk is None:
                try:
                    blk = self._slow(r, arena)
                except self._oom as exc:   # no lock held here: the hook may wait, then ask again
                    if not self._out_of_memory(r, arena, owner, exc, attempt):
                        raise
                    attempt += 1
        blk.state = LIVE
        aid = next(self._ids)
        a = Allocation(blk.ptr, size, aid, stream, owner, blk, arena, self._pool)
        self._live.add(a)
        if owner is not None:
            owned = self._owners.get(owner)
            if owned is None:
                owned = self._owners.setdefault(owner, {})
            owned[a] = None
        self._ledger_add(r)
        if not aid & FOLD_MASK:
            self._ledger.fold()
        return a

    def free(self, a: Allocation, stream: int | None = None) -> None:
        if stream is None:
            arena = a._arena if a.__class__ is Allocation else None
        elif stream.__class__ is not int:
            return self._free_normalized(a, stream)
        else:
            arena = self._arenas.get(stream)
            if arena is None:
                arena = self._resolve(stream, "free")
        if arena is None or a.__class__ is not Allocation:   # only exact Allocations are ever live
            self._refuse_free(a)
        fenced = a._extra is not None or arena.eager
        if fenced:
            # device work first (a per-thread stream records now), while nothing has changed
            if not self._is_live(a):
                self._refuse_free(a)
            stamps = self._fence_stamps(a, arena)
        try:
            self._live.remove(a)
        except (KeyError, TypeError):
            self._refuse_free(a)
        a._state = FREED
        if a.owner is not None:
            owned = self._owners.get(a.owner)
            if owned is not None:
                owned.pop(a, None)
        blk = a._block
        nbytes = blk.size   # read before the block is visible to other threads: a taker may cut it
        if fenced:
            self._place_fenced(blk, arena, stamps)
        else:
            blk.epoch = arena.epoch
            blk.state = arena
            lst = arena.bins.get(nbytes)
            if lst is None:
                lst = arena.bins.setdefault(nbytes, [])
            lst.append(blk)
            arena.recent.append(blk)
            if arena.bins.get(nbytes) is not lst:   # its size class was dropped meanwhile (trim_recent)
                arena.rehome(blk, lst)
            if len(arena.recent) > arena.trim_at:
                self._trim_recent(arena)
        self._ledger_add(-nbytes)

    def reissue(self, a: Allocation, stream: int) -> Allocation | None:
        """The live allocation ``a`` handed out again under a new handle for work ordered on
        ``stream``, where that needs no ordering: ``stream`` is the one whose arena ``a`` was
        allocated on (not a per-thread stream's, whose handle names another stream on each
        thread), and no other stream was recorded on ``a``. ``a`` is claimed out of the live set as
        a free claims it (its later free or record_stream is refused), and a new allocation of the
        same block, size, stream and owner takes its place (a new id, counted as an allocation;
        the bytes in use unchanged). None, with nothing changed, where it does not apply. The
        caller keeps the owner's release out meanwhile (a task lease), as for an allocation."""
        if a.__class__ is not Allocation or stream.__class__ is not int:
            return None
        arena = self._arenas.get(stream)
        if arena is None or arena is not a._arena or arena.eager or a._extra is not None:
            return None
        try:
            self._live.remove(a)
        except (KeyError, TypeError):   # not live (freed, reclaimed, closed): nothing to reissue
            return None
        a._state = FREED
        blk = a._block
        aid = next(self._ids)
        b = Allocation(a.ptr, a.size, aid, a.stream, a.owner, blk, arena, self._pool)
        self._live.add(b)
        if a.owner is not None:
            owned = self._owners.get(a.owner)
            if owned is not None:
                owned[b] = None
                owned.pop(a, None)
        nbytes = blk.size
        self._ledger_add(-nbytes)   # a free and an allocation of the block, in the ledger's terms
        self._ledger_add(nbytes)
        if not aid & FOLD_MASK:
            self._ledger.fold()
        return b

    def _is_live(self, a: object) -> bool:
        try:
            return a in self._live
        except TypeError:
            return False
