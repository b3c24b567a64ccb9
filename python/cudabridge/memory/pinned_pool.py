"""Page-locked host memory reserved once and handed out in blocks (cudf's ``PinnedMemoryPool``,
spark-rapids' ``spark.rapids.memory.pinnedPool.size``): ``cudaHostAlloc`` costs milliseconds and
synchronizes the device, so a pinned buffer per batch or per task from it would cost more than the
copies it speeds up.

* Reserved once, lazily (the first block asked for), ``capacity`` bytes; blocks are carved from it
  first fit, ``ALIGN``-aligned, and coalesce with free neighbours when they come back.
* Stream-ordered, like the device pool: a block freed while asynchronous copies of it may still run
  is not handed out again until an event recorded on each stream that used it has completed
  (``free(block, streams)``); nothing waits on the host for it.
* When the pool cannot serve a request (exhausted, larger than the pool, or the pool is 0), the
  block comes from ``cudaHostAlloc`` on its own, and when that fails, from pageable memory: copies
  from it are then staged by the driver, not asynchronous. Both fallbacks are counted; the first of
  each kind is logged.

Thread-safe: every step holds the pool's lock, and none calls back into the caller.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from ..errors import CudaError, InvalidArgument

log = logging.getLogger(__name__)

POOL, HOST_ALLOC, PAGEABLE = "pool", "host_alloc", "pageable"


@dataclass(eq=False)
class PinnedBlock:
    """A block handed out: ``view`` spans exactly its bytes (a memoryview over the reserved
    memory, or over its own allocation), ``kind`` says where it came from."""

    address: int
    size: int
    kind: str
    view: memoryview
    offset: int = -1                 # in the reserved memory (POOL blocks)
    own: Any = None                  # its own allocation (HOST_ALLOC, PAGEABLE blocks)
    streams: set[int] = field(default_factory=set)   # streams asynchronous copies of it ran on
    owner: int = 0                   # the task it is reclaimed with (0: none)

    @property
    def pinned(self) -> bool:
        return self.kind != PAGEABLE


class PinnedHostPool:
    ALIGN = 256

    def __init__(self, backend: Any, capacity: int) -> None:
        if capacity.__class__ is not int or capacity < 0:
            raise InvalidArgument(f"the pinned pool's capacity is a non-negative int, got {capacity!r}")
        self._backend = backend
        self.capacity = capacity - capacity % self.ALIGN
        self._arena: Any = None                # the reserved memory (a ctypes array), once reserved
        self._arena_view: memoryview | None = None
        self._base = 0
        self._free: list[tuple[int, int]] = []          # (offset, size), sorted, coalesced
        self._pending: list[tuple[PinnedBlock, list[int]]] = []   # freed, waiting for their events
        self._lock = threading.Lock()
        self.in_use_bytes = 0                  # bytes of blocks handed out and not freed (all kinds)
        self._pool_blocks_out = 0              # POOL blocks handed out and not freed
        self.fallbacks_host_alloc = 0
        self.fallbacks_pageable = 0
        self.reserve_failed = False

    @property
    def reserved_bytes(self) -> int:
        return self.capacity if self._arena is not None else 0

    # handing out -----------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> PinnedBlock:
        if nbytes.__class__ is not int or nbytes <= 0:
            raise InvalidArgument(f"pinned buffer size must be a positive int, got {nbytes!r}")
        size = -(-nbytes // self.ALIGN) * self.ALIGN
        with self._lock:
            block = self._from_pool(nbytes, size)
            if block is not None:
                self.in_use_bytes += size
                self._pool_blocks_out += 1
                return block
        block = self._fallback(nbytes)
        with self._lock:
            self.in_use_bytes += block.size
        return block

    def _from_pool(self, nbytes: int, size: int) -> PinnedBlock | None:
        if size > self.capacity or self.reserve_failed:
            return None
        if self._arena is None:
            try:
                self._arena = self._backend.alloc_pinned(self.capacity)
            except CudaError as exc:
                self.reserve_failed = True
                log.warning("pinned pool: reserving %d bytes failed (%s); pinned buffers come from cudaHostAlloc",
                            self.capacity, exc)
                return None
            self._arena_view = memoryview(self._arena).cast("B")
            self._base = ctypes.addressof(self._arena)
            self._free = [(0, self.capacity)]
        self._reclaim()
        for i, (off, free_size) in enumerate(self._free):
            if free_size >= size:
                if free_size == size:
                    del self._free[i]
                else:
                    self._free[i] = (off + size, free_size - size)
                assert self._arena_view is not None
                return PinnedBlock(self._base + off, size, POOL, self._arena_view[off:off + nbytes], offset=off)
        return None

    def _fallback(self, nbytes: int) -> PinnedBlock:
        try:
            own = self._backend.alloc_pinned(nbytes)
            kind = HOST_ALLOC
            if self._counted("fallbacks_host_alloc"):
                log.info("pinned pool (%d bytes) could not serve %d bytes: cudaHostAlloc serves it (counted as "
                         "pinned_fallbacks_host_alloc; a larger spark.cudabridge.pinnedPool avoids it)",
                         self.capacity, nbytes)
        except CudaError as exc:
            own = (ctypes.c_char * nbytes)()
            kind = PAGEABLE
            if self._counted("fallbacks_pageable"):
                log.warning("pinned memory for %d bytes failed (%s): pageable memory serves it (copies from it "
                            "are staged, not asynchronous; counted as pinned_fallbacks_pageable)", nbytes, exc)
        return PinnedBlock(ctypes.addressof(own), nbytes, kind, memoryview(own).cast("B"), own=own)

    def _counted(self, counter: str) -> bool:
        """Counts one more fallback of a kind; True for the first (logged once)."""
        with self._lock:
            n = getattr(self, counter) + 1
            setattr(self, counter, n)
        return n == 1

    # giving back -----------------------------------------------------------------------------
    def free(self, block: PinnedBlock) -> None:
        """Give ``block`` back. A pool block is handed out again once every stream in
        ``block.streams`` has passed an event recorded now; another block is freed at once (its
        own allocation: ``cudaFreeHost`` waits for the device itself)."""
        if block.kind != POOL:
            with self._lock:
                self.in_use_bytes -= block.size
            if block.kind == HOST_ALLOC:
                self._backend.free_pinned(block.own)
            return
        events: list[int] = []
        try:
            for stream in sorted(block.streams):
                event = self._backend.event_create()
                events.append(event)
                self._backend.event_record(event, stream)
        except CudaError:
            # No event to order the reuse after: wait for those streams now instead.
            for stream in block.streams:
                self._backend.stream_synchronize(stream)
            for event in events:
                self._backend.event_destroy(event)
            events = []
        with self._lock:
            self.in_use_bytes -= block.size
            self._pool_blocks_out -= 1
            if events:
                self._pending.append((block, events))
            else:
                self._give_back(block.offset, block.size)

    def _reclaim(self) -> None:
        """Pending blocks whose events have all completed go back to the free list (lock held)."""
        still: list[tuple[PinnedBlock, list[int]]] = []
        for block, events in self._pending:
            if all(self._backend.event_query(e) for e in events):
                for e in events:
                    self._backend.event_destroy(e)
                self._give_back(block.offset, block.size)
            else:
                still.append((block, events))
        self._pending = still

    def _give_back(self, offset: int, size: int) -> None:
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < offset:
            i += 1
        free.insert(i, (offset, size))
        # coalesce with the next, then with the previous neighbour
        if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
            free[i] = (free[i][0], free[i][1] + free[i + 1][1])
            del free[i + 1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
            del free[i]

    def free_bytes(self) -> int:
        with self._lock:
            return sum(size for _, size in self._free)

    def close(self) -> None:
        """Release the reserved memory (after the service's streams are drained), unless blocks of
        it are still handed out: Java may still write through a ByteBuffer over one, and freed
        memory under it would crash the JVM, so it stays reserved until the process ends."""
        with self._lock:
            if self._pool_blocks_out:
                log.info("pinned pool: %d block(s) still held at close; its memory stays reserved",
                         self._pool_blocks_out)
                return
            for _, events in self._pending:
                for e in events:
                    self._backend.event_destroy(e)
            self._pending = []
            arena, self._arena = self._arena, None
            self._arena_view = None
        if arena is not None:
            self._backend.free_pinned(arena)
