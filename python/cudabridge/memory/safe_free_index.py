"""Free blocks that no queued work can touch any more, indexed for best fit, coalescing.

Blocks enter only once every stream that used them has been seen (on the host) to pass the
free, so merging neighbours needs no event bookkeeping. Lookup is a bisection over (size,
address) keys: O(log n) in the number of free blocks. Guarded by the pool's lock.
"""

from __future__ import annotations

import bisect

from .block import SAFE, Block


class SafeFreeIndex:
    __slots__ = ("_keys", "_blocks", "bytes")

    def __init__(self) -> None:
        self._keys: list[tuple[int, int]] = []
        self._blocks: dict[int, Block] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._keys)

    def insert(self, blk: Block) -> Block:
        """Add a free block, merged with its free neighbours; returns the merged block."""
        prev = blk.prev
        if prev is not None and prev.state is SAFE:
            self._remove(prev)
            prev.size += blk.size
            prev.next = blk.next
            if blk.next is not None:
                blk.next.prev = prev
            blk = prev
        nxt = blk.next
        if nxt is not None and nxt.state is SAFE:
            self._remove(nxt)
            blk.size += nxt.size
            blk.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = blk
        blk.state = SAFE
        blk.extra = None
        bisect.insort(self._keys, (blk.size, blk.ptr))
        self._blocks[blk.ptr] = blk
        self.bytes += blk.size
        return blk

    def take_best_fit(self, size: int) -> Block | None:
        keys = self._keys
        i = bisect.bisect_left(keys, (size, 0))
        if i == len(keys):
            return None
        _, ptr = keys.pop(i)
        blk = self._blocks.pop(ptr)
        self.bytes -= blk.size
        return blk

    def take(self, blk: Block) -> bool:
        """Remove a specific block (for coalescing runs); False if it is not here."""
        if blk.state is not SAFE or self._blocks.get(blk.ptr) is not blk:
            return False
        self._remove(blk)
        return True

    def _remove(self, blk: Block) -> None:
        keys = self._keys
        i = bisect.bisect_left(keys, (blk.size, blk.ptr))
        del keys[i]
        del self._blocks[blk.ptr]
        self.bytes -= blk.size

    def largest(self) -> int:
        return self._keys[-1][0] if self._keys else 0

    def blocks(self) -> list[Block]:
        return list(self._blocks.values())


class SafeBlocks:
    """The pool's safe free list: one index for blocks of small chunks and one for the rest, so
    that small requests do not fragment the large blocks (PyTorch's caching allocator splits
    its pools the same way). A block goes to the index its chunk's kind says."""

    __slots__ = ("small", "large")

    def __init__(self) -> None:
        self.small = SafeFreeIndex()
        self.large = SafeFreeIndex()

    def index(self, small: bool) -> SafeFreeIndex:
        return self.small if small else self.large

    def insert(self, blk: Block) -> Block:
        return (self.small if blk.chunk.small else self.large).insert(blk)

    def take(self, blk: Block) -> bool:
        return (self.small if blk.chunk.small else self.large).take(blk)

    @property
    def bytes(self) -> int:
        return self.small.bytes + self.large.bytes

    def largest(self) -> int:
        return max(self.small.largest(), self.large.largest())

    def blocks(self) -> list[Block]:
        return self.small.blocks() + self.large.blocks()
