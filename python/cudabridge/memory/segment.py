"""Expandable segments: reservations of device address space, mapped in pieces at their end.

Separate ``cudaMalloc`` chunks can never coalesce: a free 200 MiB chunk and a free 100 MiB chunk
cannot serve a 250 MiB request, so a pool of chunks grows while it holds enough free memory
(2.2x the peak request on the project's Spark-like trace). A segment reserves address space
once (``cuMemAddressReserve`` costs no memory) and maps physical pieces (``cuMemCreate`` +
``cuMemMap``) at its end as the pool grows, so new memory is contiguous with the free block that
was last: a request grows the pool only by what that free tail lacks.

That alone leaves holes (1.44x on the same trace). So physical memory also moves: a piece that
lies wholly inside a free, safe block (no queued work can touch it) can be unmapped and its
handle mapped again at the end of a segment, where it extends the free tail. The hole becomes
address space with no memory behind it; address space is cheap, and when a segment's runs out
the pool reserves another. This is the idea behind ``cudaMallocAsync``'s pools and PyTorch's
expandable segments.
"""

from __future__ import annotations

from ..device import DeviceBackend

PIECE = 16 << 20   # the most one physical handle holds: smaller pieces fit more holes


class PhysicalPieces:
    """Physical memory handles owned by a pool and mapped nowhere: ready to map again."""

    __slots__ = ("backend", "spare", "bytes")

    def __init__(self, backend: DeviceBackend) -> None:
        self.backend = backend
        self.spare: list[tuple[int, int]] = []   # (bytes, handle)
        self.bytes = 0

    def put(self, nbytes: int, handle: int) -> None:
        self.spare.append((nbytes, handle))
        self.bytes += nbytes

    def take(self) -> tuple[int, int] | None:
        if not self.spare:
            return None
        nbytes, handle = self.spare.pop()
        self.bytes -= nbytes
        return nbytes, handle

    def close(self) -> None:
        spare, self.spare = self.spare, []
        self.bytes = 0
        for _nbytes, handle in spare:
            self.backend.phys_release(handle)


class Segment:
    __slots__ = ("backend", "ptr", "size", "granularity", "end", "_pieces")

    def __init__(self, backend: DeviceBackend, size: int, granularity: int) -> None:
        if granularity <= 0 or size <= 0:
            raise ValueError(f"a segment needs a positive size and granularity, got {size}, {granularity}")
        self.backend = backend
        self.granularity = granularity
        self.size = -(-size // granularity) * granularity
        self.ptr = backend.va_reserve(self.size)
        self.end = self.ptr                          # the first address never mapped
        self._pieces: dict[int, tuple[int, int]] = {}   # start -> (bytes, handle), mapped now

    def round_up(self, nbytes: int) -> int:
        g = self.granularity
        return -(-nbytes // g) * g

    def room(self) -> int:
        return self.ptr + self.size - self.end

    def extend(self, nbytes: int, spares: PhysicalPieces) -> tuple[int, int, int]:
        """Map at least ``nbytes`` more at the end, spare pieces first, then new ones.
        Returns (start, bytes mapped, bytes newly created); fewer bytes than asked where the
        reservation runs out. Raises DeviceAllocationFailed when the device has no room and
        nothing was mapped; after a partial mapping it returns what was mapped, so the caller's
        accounting stays exact."""
        start = self.end
        mapped = created = 0
        while mapped < nbytes:
            piece = spares.take()
            if piece is not None and self.end + piece[0] > self.ptr + self.size:
                spares.put(*piece)   # too big for the room left: make a piece that fits instead
                piece = None
            fresh = piece is None
            if fresh:
                size = min(PIECE, self.round_up(nbytes - mapped), self.ptr + self.size - self.end)
                if size <= 0:
                    break
                try:
                    handle = self.backend.phys_create(size)
                except BaseException:
                    if mapped:
                        return start, mapped, created   # partial: the caller counts and retries
                    raise
            else:
                size, handle = piece
            try:
                self.backend.mem_map(self.end, size, handle)
            except BaseException:
                if fresh:
                    self.backend.phys_release(handle)
                else:
                    spares.put(size, handle)
                if mapped:
                    return start, mapped, created
                raise
            self._pieces[self.end] = (size, handle)
            self.end += size
            mapped += size
            if fresh:
                created += size
        return start, mapped, created

    def release_within(self, lo: int, hi: int, spares: PhysicalPieces) -> list[tuple[int, int]]:
        """Unmap every piece lying wholly in [lo, hi) (free memory no work can touch) and keep
        its handle as a spare. Returns the unmapped (start, bytes) ranges, in address order."""
        out = []
        for start in sorted(p for p in self._pieces if lo <= p and p + self._pieces[p][0] <= hi):
            size, handle = self._pieces.pop(start)
            self.backend.mem_unmap(start, size)
            spares.put(size, handle)
            out.append((start, size))
        return out

    def close(self) -> None:
        """Unmap and release everything, then the reservation (the device must be idle)."""
        pieces, self._pieces = self._pieces, {}
        for start, (size, handle) in sorted(pieces.items(), reverse=True):
            self.backend.mem_unmap(start, size)
            self.backend.phys_release(handle)
        if self.ptr:
            self.backend.va_release(self.ptr, self.size)
            self.ptr = 0
