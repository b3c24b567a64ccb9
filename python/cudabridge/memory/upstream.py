"""Where a pool's memory comes from: its upstream.

Blocks up to ``SMALL_REQUEST`` are cut from 2 MiB ``cudaMalloc`` chunks; larger ones from one
expandable segment (segment_growth.py) where the GPU has virtual memory management, else from
20 MiB chunks (or the request rounded to 2 MiB above 10 MiB). Every byte reserved is charged to
the pool's :class:`ReservationLimit`, asked first. The upstream never gives memory back before
the pool closes. Guarded by the pool's lock.
"""

from __future__ import annotations

import logging

from ..device import DeviceAllocationFailed, DeviceBackend
from .block import SAFE, Block, Chunk
from .limit import ReservationLimit
from .safe_free_index import SafeBlocks
from .segment_growth import SegmentGrowth

log = logging.getLogger(__name__)

ALIGNMENT = 256
SMALL_REQUEST = 1 << 20          # requests up to 1 MiB come from small chunks
SMALL_CHUNK = 2 << 20            # as PyTorch's caching allocator: 2 MiB chunks for small blocks
LARGE_CHUNK = 20 << 20           # and 20 MiB chunks for medium ones
LARGE_EXACT = 10 << 20           # above this, a chunk is the request rounded to 2 MiB
CHUNK_GRANULE = 2 << 20


class DeviceUpstream:
    """``cudaMalloc`` chunks, and the expandable segments (``granularity`` > 0: the GPU's VMM
    granularity; 0: chunks only). ``chunks`` lists every chunk and segment, in the order made:
    the slow path walks them to join runs of neighbouring blocks."""

    __slots__ = ("backend", "device", "limit", "counters", "chunks", "segments")

    def __init__(self, backend: DeviceBackend, device: int, limit: ReservationLimit, counters: dict[str, int],
                 safe: SafeBlocks, granularity: int, device_total: int) -> None:
        self.backend = backend
        self.device = device
        self.limit = limit
        self.counters = counters
        self.chunks: list[Chunk] = []
        self.segments = (SegmentGrowth(backend, device, limit, counters, safe.large, self.chunks, granularity,
                                       device_total) if granularity else None)

    @property
    def growth(self) -> str:
        """"segment" (large blocks from expandable segments) or "chunks"."""
        return "segment" if self.segments is not None else "chunks"

    @property
    def spare_bytes(self) -> int:
        """Physical memory reserved and mapped nowhere (segments' spare pieces)."""
        return self.segments.spares.bytes if self.segments is not None else 0

    def grow(self, r: int, small: bool, exact: bool = False) -> Block | None:
        """A new safe block of at least ``r`` bytes, or None where the limit or the device has no
        room. ``exact``: a chunk of just ``r`` bytes (the pool's initial reservation)."""
        if not small and self.segments is not None:
            return self.segments.grow(r)
        if exact:
            size = -(-r // ALIGNMENT) * ALIGNMENT
        elif small:
            size = SMALL_CHUNK
        elif r <= LARGE_EXACT:
            size = LARGE_CHUNK
        else:
            size = -(-r // CHUNK_GRANULE) * CHUNK_GRANULE
        room = self.limit.room()
        if size > room:
            size = room // ALIGNMENT * ALIGNMENT
        if size < r:
            return None
        try:
            ptr = self.backend.malloc(size)
        except DeviceAllocationFailed as exc:
            log.info("GPU %d: pool growth by %d bytes failed (%s)", self.device, size, exc)
            return None
        chunk = Chunk(ptr, size, small)
        self.chunks.append(chunk)
        self.limit.charge(size)
        self.counters["chunks_allocated"] += 1
        blk = Block(ptr, size, chunk, None, None)
        chunk.head = blk  # the lowest block of a chunk is never merged away: runs start here
        blk.state = SAFE  # fresh memory: no stream has touched it
        return blk

    def close(self) -> None:
        """Return every chunk and segment to the device (the device is idle: the pool synchronized).
        Each is tried whatever the one before met (after a sticky error every call fails, and
        the memory goes with the context); the first error is raised once all were tried, with
        nothing left counted as reserved."""
        first: BaseException | None = None
        for chunk in self.chunks:
            try:
                if chunk.segment is not None:
                    chunk.segment.close()
                else:
                    self.backend.free(chunk.ptr)
            except Exception as exc:   # noqa: BLE001 - the rest are returned all the same
                first = first or exc
        if self.segments is not None:
            try:
                self.segments.close()
            except Exception as exc:   # noqa: BLE001
                first = first or exc
        self.forget()
        if first is not None:
            raise first

    def forget(self) -> None:
        """Drop every chunk without returning it (the device could not be waited for: its memory
        goes with the CUDA context)."""
        self.chunks.clear()
        self.limit.clear()
