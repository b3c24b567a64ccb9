"""The pool's stream-ordering core: where a block comes from when the requesting stream's own
bin of that size is empty, and where a freed block goes.

It holds the stream order, and takes its other parts at construction, as RMM's
``stream_ordered_memory_resource`` takes a free list and an upstream: the streams' arenas
(:class:`StreamTable`), their epochs and events (:class:`Fences`), the safe free list
(:class:`SafeBlocks`) and the upstream (:class:`DeviceUpstream`, under its limit).

The reuse ladder, cheapest first (step 1, the stream's own bin, is the fast paths'):

2. the safe index: blocks every user stream is known to have passed (best fit, coalesced);
3. blocks whose streams have passed them, found by polling, moved to the safe index, except the
   requesting stream's newest ``cache_frees`` frees (its cache: below); and any of the requesting
   stream's own blocks of other sizes;
4. more memory from the upstream, while under the limit (growing is preferred over a device-side
   wait, because such a wait makes unrelated tasks' streams depend on each other); where that
   memory is for good (small chunks, and every chunk under ``growth="chunks"``: only segments can
   move pieces back out), first a run of adjacent safe blocks and the stream's own cached ones,
   joined, as only the run leaves the cache;
5. the requesting stream's cache too, coalesced, then 4 again where it gave up blocks (their holes
   may now be moved);
6. a block still in flight on another stream, taken with ``cudaStreamWaitEvent`` on the
   requesting stream; adjacent free blocks of any state may be joined into one run, whose fences
   are the union of theirs;
7. one host synchronize of the streams with blocks in flight, then 2, 3 and 5 again.

Why a stream's newest frees are kept out of step 3 until growth is refused: a stream that repeats
a step (a training step, a chain of temporaries) frees each size shortly before it allocates that
size again, and its own bins serve it at once (step 1). Coalescing those blocks whenever one
allocation reaches the slow path empties the bins, so the next step's allocations reach the slow
path too, and the pool never settles: each step paid the locked steps and moved physical pieces.
Kept, a repeating step settles after its first repetitions with every allocation served by its
bins; the pool holds what the step's sizes need at once (a little above what coalescing would), and
only below its limit: at the limit step 5 coalesces them as before. Frees older than the newest
``cache_frees`` are reclaimed as always, so a stream of ever-new sizes keeps no more than that.
Step 3's split of a larger block of the stream's own (cached or in flight) stays before growth: the
tests' MLP step settles with it too, and the project's Spark-like trace replay (bench_core.py) holds
1.076x its peak request with it at its peak, 1.081x without it, 1.066x with no cache at all.

:meth:`StreamOrderingCore.steal` is the lock-free step 1b; everything else runs with the pool's
lock held.
"""

from __future__ import annotations

from ..errors import OutOfDeviceMemory
from .block import LIVE, PENDING, SAFE, UNMAPPED, Block
from .fences import Fences
from .safe_free_index import SafeBlocks
from .stream_arena import StreamArena
from .stream_table import StreamTable
from .upstream import ALIGNMENT, SMALL_REQUEST, DeviceUpstream


class StreamOrderingCore:
    __slots__ = ("streams", "fences", "safe", "upstream", "counters", "stream_query", "pending", "deferred_waits",
                 "fast_steals", "fast_polls", "cache_frees")

    def __init__(self, streams: StreamTable, fences: Fences, safe: SafeBlocks, upstream: DeviceUpstream,
                 counters: dict[str, int], stream_query, cache_frees: int = 0) -> None:
        self.streams = streams
        self.fences = fences
        self.safe = safe
        self.upstream = upstream
        self.counters = counters
        # steal()'s one stream query, or None: it queries outside the slow path's device scope,
        # so only where there is one device (the current device cannot be another GPU's).
        self.stream_query = stream_query
        self.pending: list[Block] = []          # blocks freed behind several streams
        self.deferred_waits: list = []          # the current slow path's waits for the caller's stream
        self.fast_steals = 0                    # steal()'s counters (the C twin keeps its own)
        self.fast_polls = 0
        self.cache_frees = cache_frees          # a stream's newest frees kept from step 3 (module docstring)

    # step 1b, lock-free ------------------------------------------------------------------------
    def steal(self, r: int, arena: StreamArena) -> Block | None:
        """Cross-stream reuse without the lock: a block of exactly ``r`` bytes in another
        stream's bin whose free that stream is known to have passed, or is seen to have passed
        by one stream query (advance-then-query, as ``Fences.cover``; per-thread streams are never
        queried: only their owner can name them). At most one query per call. The C fast path
        has the same step (``steal`` in _fastpath.c); both must stay identical."""
        candidate = None
        for other in self.streams.all:
            if other is arena:
                continue
            lst = other.bins.get(r)
            if not lst:
                continue
            blk = lst[-1]
            if blk.state is other and blk.epoch <= other.completed:
                if other.take(blk):
                    self.fast_steals += 1
                    return blk
            elif candidate is None and not other.eager:
                candidate = other
        if candidate is None:
            return None
        cur = candidate.epoch
        candidate.epoch = cur + 1
        self.fast_polls += 1
        if not self.stream_query(candidate.handle):
            return None
        if cur > candidate.completed:
            candidate.completed = cur
        for blk in reversed(list(candidate.bins.get(r) or ())):
            if blk.state is candidate and blk.epoch <= cur and candidate.take(blk):
                self.fast_steals += 1
                return blk
        return None

    # steps 2-6 (lock held) ---------------------------------------------------------------------
    def take(self, r: int, arena: StreamArena, device_scope, ledger) -> Block:
        """A block of ``r`` bytes for ``arena``, cut to size, or 7. OutOfDeviceMemory (its report
        reads bytes in use from the pool's ``ledger``). Waits the requesting stream must queue itself land in
        ``deferred_waits``; device calls run inside ``device_scope()``."""
        self.deferred_waits = []
        small = r <= SMALL_REQUEST
        blk = self.safe.index(small).take_best_fit(r)
        if blk is None:
            with device_scope():
                blk = self._find(r, arena, small)
            if blk is None:
                self.counters["oom"] += 1
                ledger.fold()
                limit = self.upstream.limit
                raise OutOfDeviceMemory(
                    requested_bytes=r, in_use_bytes=ledger.in_use, reserved_bytes=limit.reserved,
                    largest_free_block_bytes=self.largest_free(), waiting_on_events_bytes=self.waiting_bytes(),
                    limit_bytes=limit.limit, device=self.streams.device,
                )
        return self._fit(blk, r)

    def _find(self, r: int, arena: StreamArena, small: bool) -> Block | None:
        index = self.safe.index(small)
        # 3. poll every arena and move what has completed to the safe index (the requesting
        # stream's newest frees stay its cache).
        self.reclaim_all(arena)
        blk = index.take_best_fit(r) or self._own_best_fit(arena, r, small)
        if blk is not None:
            return blk
        # 4. grow; where the growth is for good (a small chunk, a cudaMalloc chunk: never given
        # back before close), first a run of the stream's cached blocks and safe ones joined.
        if small or self.upstream.segments is None:
            blk = self._take_own_run(r, arena, small)
            if blk is not None:
                return blk
        blk = self.upstream.grow(r, small)
        if blk is not None:
            return blk
        # 5. the requesting stream's cache, coalesced; then growth again, which may move pieces
        # out of the holes it leaves.
        if self.reclaim(arena):
            blk = index.take_best_fit(r) or self.upstream.grow(r, small)
            if blk is not None:
                return blk
        # 6. take a block in flight, waiting for it on the device.
        blk = self._take_in_flight(r, arena, small)
        if blk is not None:
            return blk
        # 7. block the host, once; then any size class will do (the split into small and large
        # chunks limits fragmentation, it must not cause an out-of-memory by itself).
        self.fences.host_sync(self.streams.all, self.pending)
        self.reclaim_all()
        for cls in (small, not small):
            blk = (self.safe.index(cls).take_best_fit(r) or self._own_best_fit(arena, r, cls)
                   or self._take_in_flight(r, arena, cls))
            if blk is not None:
                return blk
        return None

    def _fit(self, blk: Block, r: int) -> Block:
        """Cut ``blk`` (claimed, out of every container) to ``r`` bytes, placing the rest where
        its fences say. The block is marked live first, so the rest cannot merge back into it."""
        home = blk.state if isinstance(blk.state, StreamArena) else None
        blk.state = LIVE
        if blk.size - r >= ALIGNMENT:
            self.place(blk.split(r), home)
        blk.extra = None
        return blk

    def _own_best_fit(self, arena: StreamArena, r: int, small: bool) -> Block | None:
        """A block of another size in the requesting stream's own bins: usable at once."""
        sizes = sorted(size for size, lst in list(arena.bins.items()) if size >= r and lst)
        for size in sizes:
            lst = arena.bins[size]
            try:
                blk = lst.pop()
            except IndexError:
                continue  # the stream's other thread took it
            if blk.chunk.small == small:
                return blk  # still in the arena's state: _fit keeps the rest there
            lst.append(blk)
        return None

    def _take_own_run(self, r: int, arena: StreamArena, small: bool) -> Block | None:
        """Join adjacent blocks the requesting stream may use at once (safe ones, and its own free
        blocks, cached or in flight on it) into one of at least ``r`` bytes: no device wait. Only
        the run's blocks leave the stream's cache."""
        return self._joined_run(r, arena, small, lambda b: b.state is SAFE or b.state is arena)

    def _take_in_flight(self, r: int, arena: StreamArena, small: bool) -> Block | None:
        """Best-fit block (or run of adjacent free blocks) still in flight elsewhere; the
        requesting stream waits for its fences on the device."""
        candidates: list[Block] = []
        for other in self.streams.all:
            if other is arena:
                continue
            for size, lst in list(other.bins.items()):
                if size >= r and lst:
                    candidates.extend(b for b in list(lst) if b.state is other and b.chunk.small == small)
        candidates.extend(b for b in self.pending if b.size >= r and b.chunk.small == small)
        candidates.sort(key=lambda b: b.size)
        for blk in candidates:
            fences = Fences.of(blk)
            if not Fences.waitable(fences, arena):
                continue
            if not self._claim(blk):
                continue
            self._wait_on(fences, arena)
            return blk  # _fit keeps its fences on the remainder
        return self._take_run(r, arena, small)

    def _claim(self, blk: Block) -> bool:
        state = blk.state
        if isinstance(state, StreamArena):
            return state.take(blk)
        if state is PENDING:
            try:
                self.pending.remove(blk)
            except ValueError:
                return False
            return True
        if state is SAFE:
            return self.safe.take(blk)
        return False

    def _wait_on(self, fences: dict[StreamArena, int], consumer: StreamArena) -> None:
        for user, stamp in fences.items():
            if user is consumer or stamp <= user.completed:
                continue
            ev = self.fences.event_for(user, stamp)
            if ev is None:
                continue
            if consumer.can_record():
                self.fences.backend.stream_wait_event(consumer.handle, ev)
            else:   # another thread's per-thread stream: that thread queues it (the pool's queue_waits)
                self.deferred_waits.append((user, stamp, ev))
            self.counters["gpu_waits"] += 1

    def _take_run(self, r: int, consumer: StreamArena, small: bool) -> Block | None:
        """Join adjacent free blocks of any state into one block of at least ``r`` bytes; its
        fences are the union of theirs."""
        return self._joined_run(r, consumer, small, lambda b: b.state is not LIVE and b.state is not UNMAPPED
                                and Fences.waitable(Fences.of(b), consumer))

    def _joined_run(self, r: int, consumer: StreamArena, small: bool, usable) -> Block | None:
        """The first run of adjacent ``usable`` blocks in a chunk of ``small``'s class that reaches
        ``r`` bytes, joined (:meth:`_join`), or None."""
        for chunk in self.upstream.chunks:
            if chunk.small != small or chunk.size < r:
                continue
            run: list[Block] = []
            total = 0
            blk = chunk.head
            while blk is not None:
                if usable(blk):
                    run.append(blk)
                    total += blk.size
                    if total >= r:
                        joined = self._join(run, consumer)
                        if joined is not None:
                            return joined
                        run, total = [], 0
                else:
                    run, total = [], 0
                blk = blk.next
        return None

    def _join(self, run: list[Block], consumer: StreamArena) -> Block | None:
        union: dict[StreamArena, int] = {}
        claimed: list[Block] = []
        for blk in run:
            fences = Fences.of(blk)
            if not self._claim(blk):
                for b in claimed:   # lost a race: put the others back as they were
                    self.place(b, b.state if isinstance(b.state, StreamArena) else None)
                return None
            claimed.append(blk)
            for user, stamp in fences.items():
                union[user] = max(stamp, union.get(user, 0))
        self._wait_on(union, consumer)
        head = claimed[0]
        for blk in claimed[1:]:
            head.size += blk.size
            head.next = blk.next
            if blk.next is not None:
                blk.next.prev = head
        head.state = LIVE
        head.extra = union or None  # _fit passes the union on to the remainder
        self.counters["runs_joined"] += 1
        return head

    # where free blocks go (lock held) ----------------------------------------------------------
    def place(self, blk: Block, home: StreamArena | None) -> None:
        """Return a free block, fenced as it was, to where it belongs."""
        if blk.extra:
            blk.state = PENDING
            self.pending.append(blk)
        elif home is not None and blk.epoch > home.completed:
            home.push(blk)
        else:
            self.safe.insert(blk)

    def place_pending(self, blk: Block, stamps: dict[StreamArena, int]) -> None:
        """A block freed behind several streams: safe once each has passed its stamp."""
        blk.epoch = 0
        blk.extra = stamps
        blk.state = PENDING
        self.pending.append(blk)

    def reclaim(self, arena: StreamArena, keep: int = 0) -> int:
        """Move the arena's completed blocks to the safe index, oldest first, but the blocks of its
        newest ``keep`` frees (stale entries among them count too: the bound is approximate).
        Returns how many it moved."""
        self.fences.poll(arena)
        recent = arena.recent
        covered = False
        moved = 0
        # A block taken back by the fast path and freed again has an older entry too: the blocks
        # of the kept entries are not moved through their older ones.
        # (a copy first: frees append to the deque without the lock, and iterating it meanwhile raises)
        kept = {id(b) for b in list(recent)[-keep:]} if keep and len(recent) > keep else ()
        while len(recent) > keep:
            blk = recent[0]
            if blk.state is not arena or id(blk) in kept:
                recent.popleft()  # stale: taken back since, or moved, or freed again since
                continue
            if blk.epoch > arena.completed:
                if covered or blk.epoch < arena.epoch or not arena.can_record():
                    return moved  # an event covers it already (or only the owner thread can): wait
                self.fences.cover(arena)
                covered = True
                if blk.epoch > arena.completed:
                    return moved
                continue
            recent.popleft()
            if not arena.take(blk):
                continue
            if blk.epoch > arena.completed:   # freed again between the check and the claim
                arena.push(blk)
                return moved
            self.safe.insert(blk)
            moved += 1
        return moved

    def retire_stream(self, arena: StreamArena) -> None:
        """A registered stream goes (the pool's device current): wait for it on the host, make
        its free blocks safe, and forget it. Nobody can name it any more."""
        cur = self.fences.advance(arena)
        self.fences.wait.stream(arena.handle, f"stream {arena.name}")
        self.counters["host_syncs"] += 1
        arena.completed = cur
        self.reclaim(arena)
        for blk in arena.free_blocks():
            if arena.take(blk):
                self.safe.insert(blk)
        self.streams.remove(arena)

    def reclaim_all(self, caching: StreamArena | None = None) -> None:
        """:meth:`reclaim` every arena, and the pending list; ``caching`` keeps its newest
        ``cache_frees`` frees."""
        streams = self.streams.all
        for arena in list(streams):
            if len(arena.bins) > arena.drop_at:
                arena.drop_empty()
            if arena.recent or arena.fences:
                self.reclaim(arena, self.cache_frees if arena is caching else 0)
            elif arena.eager and not arena.owner_alive():
                streams.remove(arena)  # a finished thread's empty per-thread arena
        if self.pending:
            still = []
            for blk in self.pending:
                if all(self.fences.done(user, stamp) for user, stamp in blk.extra.items()):
                    self.safe.insert(blk)
                else:
                    still.append(blk)
            self.pending = still

    # what the statistics and the out-of-memory report read (lock held) -------------------------
    def waiting_bytes(self) -> int:
        total = sum(b.size for b in self.pending)
        for arena in list(self.streams.all):
            total += sum(b.size for b in arena.free_blocks() if b.epoch > arena.completed)
        return total

    def pending_bytes(self) -> int:
        return sum(b.size for b in self.pending)

    def in_streams_bytes(self) -> int:
        return sum(b.size for arena in list(self.streams.all) for b in arena.free_blocks())

    def largest_free(self) -> int:
        in_arenas = max((b.size for arena in list(self.streams.all) for b in arena.free_blocks()), default=0)
        return max(self.safe.largest(), in_arenas)
