"""The large blocks' upstream where the GPU has virtual memory management: expandable segments
(segment.py) that grow by what their free tail lacks, and move physical pieces out of free holes
before they take new memory, so that fragmentation does not turn into growth. Guarded by the
pool's lock."""

from __future__ import annotations

import logging

from ..device import DeviceAllocationFailed, DeviceBackend
from .block import LIVE, SAFE, UNMAPPED, Block, Chunk
from .limit import ReservationLimit
from .safe_free_index import SafeFreeIndex
from .segment import PhysicalPieces, Segment

log = logging.getLogger(__name__)


class SegmentGrowth:
    __slots__ = ("backend", "device", "limit", "counters", "large", "chunks", "granularity", "device_total",
                 "spares", "current")

    def __init__(self, backend: DeviceBackend, device: int, limit: ReservationLimit, counters: dict[str, int],
                 large: SafeFreeIndex, chunks: list[Chunk], granularity: int, device_total: int) -> None:
        self.backend = backend
        self.device = device
        self.limit = limit
        self.counters = counters
        self.large = large             # the safe index of large blocks: free tails and holes are there
        self.chunks = chunks           # the upstream's list of chunks: a new segment joins it
        self.granularity = granularity
        self.device_total = device_total
        self.spares = PhysicalPieces(backend)
        self.current: Chunk | None = None   # the segment that grows; made on first use

    def grow(self, r: int) -> Block | None:
        """Memory for a large request at the end of the current segment: only what its free
        tail lacks, from spare physical pieces first, then pieces moved out of holes, then new
        memory under the limit."""
        chunk = self.current or self._new_segment(r)
        seg = chunk.segment
        tail = chunk.head
        while tail is not None and tail.next is not None:
            tail = tail.next
        free_tail = tail if tail is not None and tail.state is SAFE else None
        need = seg.round_up(r - (free_tail.size if free_tail is not None else 0))
        if need > seg.room():
            chunk = self._new_segment(r)
            seg, tail, free_tail = chunk.segment, None, None
            need = seg.round_up(r)
        if self.spares.bytes < need:
            self._release_holes(need - self.spares.bytes, free_tail)
        if not self.limit.allows(max(0, need - self.spares.bytes)):
            return None
        try:
            start, mapped, created = seg.extend(need, self.spares)
        except DeviceAllocationFailed as exc:
            log.info("GPU %d: segment growth by %d bytes failed (%s)", self.device, need, exc)
            return None
        self.limit.charge(created)
        self.counters["chunks_allocated"] += 1
        chunk.size = seg.end - seg.ptr
        blk = Block(start, mapped, chunk, tail, None)
        if tail is None:
            chunk.head = blk
        else:
            tail.next = blk
        if free_tail is not None and self.large.take(free_tail):
            free_tail.size += mapped
            free_tail.next = None
            blk = free_tail
        blk.state = SAFE
        if blk.size < r:      # the device ran out part way: keep what was mapped, report none
            self.large.insert(blk)
            return None
        return blk

    def _new_segment(self, r: int) -> Chunk:
        seg = Segment(self.backend, max(2 * min(self.limit.limit, self.device_total), r), self.granularity)
        chunk = Chunk(seg.ptr, 0, False, seg)
        self.chunks.append(chunk)
        self.current = chunk
        return chunk

    def _release_holes(self, want: int, keep: Block | None) -> int:
        """Unmap physical pieces that lie wholly inside free safe blocks of the segments, largest
        blocks first, until ``want`` bytes are spare; the holes become unmapped address space."""
        got = 0
        for blk in sorted((b for b in self.large.blocks() if b.chunk.segment is not None and b is not keep),
                          key=lambda b: -b.size):
            if got >= want:
                break
            if blk.size < self.granularity or not self.large.take(blk):
                continue
            blk.state = LIVE   # claimed while cut, so that nothing merges into it
            ranges = blk.chunk.segment.release_within(blk.ptr, blk.ptr + blk.size, self.spares)
            keep_parts: list[Block] = []
            cur: Block | None = blk
            for start, size in ranges:
                got += size
                if start > cur.ptr:
                    keep_parts.append(cur)
                    cur = cur.split(start - cur.ptr)
                rest = cur.split(size) if cur.size > size else None
                cur.state = UNMAPPED
                cur.extra = None
                cur = rest
                if cur is None:
                    break
            if cur is not None:
                keep_parts.append(cur)
            for part in keep_parts:
                self.large.insert(part)
            if ranges:
                self.counters["pieces_moved"] += len(ranges)
        return got

    def close(self) -> None:
        """The segments themselves are in ``chunks`` (the upstream closes them); the spares here."""
        self.current = None
        self.spares.close()
