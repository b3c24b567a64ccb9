"""Per-stream free lists with event-deferred cross-stream reuse (the ``EventDeferredFreeList``).

A block freed on stream S goes into S's arena. S may take it back at once: stream order makes
that safe. Any other stream may take it only once the work queued on S before the free has
completed, known on the host (an event or a stream query says so) or enforced on the device
(the taker waits on the event).

Epochs make that cheap. A free does not record an event: it stamps the block with S's current
epoch. When another stream wants S's blocks, the pool *covers* the current epoch: it advances
the epoch first and then records one event on S (or sees S idle with one stream query), so a
single record vouches for every free stamped so far. Advancing before recording is what makes
it safe: a free that read the old epoch had its work queued before the advance, hence before
the record. Events on one stream complete in order, so ``fences`` is polled from its head.

The per-thread default stream is the exception: ``cudaStreamPerThread`` names the *calling*
thread's stream, so only the owning thread can record on it. Its arena is ``eager``: the owner
records at every free. A free by another thread (or a ``record_stream`` from one) only stamps,
and is covered by the owner's next record, or by a device synchronize as the last resort.

Fast-path operations (``bins`` pop/append, ``recent`` append, epoch reads) are single built-in
container operations, atomic under the GIL and under free-threaded CPython's per-object locks;
everything else runs under the pool's lock.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque

from .block import Block
from .native import load as load_native


TRIM_MIN = 256
DROP_MIN = 64          # size-class lists an arena keeps before it drops its empty ones


class _ArenaSlots:
    """An arena's fields; the C extension's identical ``ArenaBase`` replaces it when built."""

    __slots__ = ("name", "handle", "kind", "eager", "bins", "recent", "epoch", "completed", "fences", "_owner",
                 "trim_at")


_native = load_native()


class StreamArena(_native.ArenaBase if _native is not None else _ArenaSlots):  # type: ignore[misc]
    __slots__ = ("__weakref__", "drop_at")

    def __init__(self, name: str, handle: int, kind: str, eager: bool = False) -> None:
        self.name = name
        self.handle = handle
        self.kind = kind  # "pool", "legacy", "external", "per-thread"
        self.eager = eager
        self.bins: dict[int, list[Block]] = {}
        self.recent: deque[Block] = deque()  # frees in order, possibly stale entries
        self.epoch = 1
        self.completed = 0                    # every stamp <= completed is known complete
        self.fences: deque[tuple[int, int]] = deque()  # (covered stamp, event), oldest first
        self._owner = weakref.ref(threading.current_thread()) if eager else None
        # ``recent`` gains an entry per free, and a block taken back by the fast path leaves its
        # entry behind; past this length the pool drops stale entries (see trim_recent).
        self.trim_at = TRIM_MIN
        self.drop_at = DROP_MIN   # drop_empty when bins reaches this many lists

    def owned_by_caller(self) -> bool:
        """For per-thread arenas: whether the calling thread is the one whose stream this is."""
        return self._owner is not None and self._owner() is threading.current_thread()

    def owner_alive(self) -> bool:
        if self._owner is None:
            return True
        t = self._owner()
        return t is not None and t.is_alive()

    def can_record(self) -> bool:
        return not self.eager or self.owned_by_caller()

    def push(self, blk: Block) -> None:
        """Put a freed block (already stamped) into this arena. Fast path: two atomic appends."""
        blk.state = self
        size = blk.size
        lst = self.bins.get(size)
        if lst is None:
            lst = self.bins.setdefault(size, [])
        lst.append(blk)
        self.recent.append(blk)
        if self.bins.get(size) is not lst:
            self.rehome(blk, lst)

    def rehome(self, blk: Block, orphan: list) -> None:
        """A lock-free free appended ``blk`` to a size class's list that :meth:`trim_recent` had
        just dropped (empty) from ``bins``: move it to the live list, unless a thread took it
        from the orphan first. The C fast path needs no such step: its lookup and append run
        with no Python code between them, so a drop cannot fall in between."""
        size = blk.size
        while True:
            try:
                orphan.remove(blk)   # one atomic step: either we move it or someone took it
            except ValueError:
                return
            lst = self.bins.setdefault(size, [])
            lst.append(blk)
            if self.bins.get(size) is lst:
                return
            orphan = lst

    def trim_recent(self) -> None:
        """Drop entries of blocks that are no longer in this arena, and repeats, keeping order and
        each block's newest entry (the order of frees the stream's cache keeps: stream_ordering.py).
        Amortized O(1) per free: the next trim waits until the deque has doubled again. Call
        with the pool's lock held (``_reclaim`` reads the head, then pops it)."""
        recent = self.recent
        snapshot = list(recent)   # one step under the GIL; frees append after it
        newest = {id(blk): i for i, blk in enumerate(snapshot)}
        for i in range(len(snapshot)):
            try:
                blk = recent.popleft()
            except IndexError:
                break
            if blk.state is self and newest.get(id(blk)) == i:
                recent.append(blk)   # concurrent frees append too: nothing is lost
        self.trim_at = max(TRIM_MIN, 2 * len(recent))
        self.drop_empty()

    def drop_empty(self) -> None:
        """Drop the empty size-class lists (pool lock held), so that host memory does not grow
        with every size ever freed; amortized O(1) per size class: the next drop waits until
        ``bins`` has doubled. A free racing this (it fetched a list before the drop and appends
        after) sees that the list is no longer the live one and rehomes its block."""
        bins = self.bins
        for size in [size for size, lst in list(bins.items()) if not lst]:
            lst = bins.get(size)
            if lst is not None and not lst:
                del bins[size]
        self.drop_at = max(DROP_MIN, 2 * len(bins))

    def take(self, blk: Block) -> bool:
        """Claim a specific block from the bins; False if another thread took it first."""
        if blk.state is not self:
            return False
        lst = self.bins.get(blk.size)
        if lst is None:
            return False
        try:
            lst.remove(blk)  # one atomic operation: exactly one claimant succeeds
        except ValueError:
            return False
        return True

    def free_blocks(self) -> list[Block]:
        out: list[Block] = []
        for lst in list(self.bins.values()):
            out.extend(b for b in list(lst) if b.state is self)
        return out

    def __repr__(self) -> str:
        return f"StreamArena({self.name}, handle={self.handle:#x}, epoch={self.epoch}, completed={self.completed})"
