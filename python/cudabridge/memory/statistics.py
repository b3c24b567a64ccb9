"""Pool statistics: a snapshot type, and the lock-free ledger behind bytes in use.

Bytes in use change on every allocate and free, from many threads. A shared counter would need
a lock on the fast path; instead each call appends its signed size to a deque (one atomic
operation) and the ledger folds the deltas in order, so current and peak bytes are exact for
the order in which the calls were appended.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict, dataclass
from itertools import accumulate, repeat
from typing import ClassVar


class UsageLedger:
    """Bytes in use and their peak, and the allocations made (each one adds its positive size;
    frees and releases add negative ones)."""

    __slots__ = ("_deltas", "add", "_lock", "in_use", "peak", "allocations")

    def __init__(self) -> None:
        self._deltas: deque[int] = deque()
        self.add = self._deltas.append
        self._lock = threading.Lock()
        self.in_use = 0
        self.peak = 0
        self.allocations = 0

    def fold(self) -> None:
        with self._lock:
            d = self._deltas
            n = len(d)
            if not n:
                return
            pop = d.popleft
            deltas = [pop() for _ in repeat(None, n)]
            self.allocations += sum(1 for d in deltas if d > 0)
            running = list(accumulate(deltas, initial=self.in_use))
            self.in_use = running[-1]
            top = max(running)
            if top > self.peak:
                self.peak = top


@dataclass(frozen=True)
class PoolStatistics:
    """One GPU's memory pool at one moment. Bytes are block bytes (requests rounded to 256).

    The books balance: ``in_use_bytes + free_safe_bytes + free_in_streams_bytes +
    free_pending_bytes + spare_bytes == reserved_bytes`` whenever no allocate or free is in flight."""

    COUNTERS: ClassVar[tuple[str, ...]] = (
        "slow_allocations", "chunks_allocated", "event_polls", "stream_polls", "events_recorded",
        "gpu_waits", "host_syncs", "oom", "leaks_reclaimed", "leaked_bytes_reclaimed", "runs_joined",
        "pieces_moved",
    )
    # fast_steals: cross-stream reuses served outside the lock (an exact-size block another
    # stream had passed); not in COUNTERS because the fast paths count them on their own.

    device: int
    in_use_bytes: int
    peak_in_use_bytes: int
    reserved_bytes: int
    peak_reserved_bytes: int
    limit_bytes: int
    free_safe_bytes: int
    free_in_streams_bytes: int
    free_pending_bytes: int       # freed behind several streams, safe once each has passed it
    spare_bytes: int              # physical memory reserved and mapped nowhere (segments' spare pieces)
    waiting_on_events_bytes: int
    largest_free_block_bytes: int
    allocations: int
    live_allocations: int
    events_created: int
    streams_accepted: int
    slow_allocations: int
    chunks_allocated: int
    event_polls: int
    stream_polls: int
    events_recorded: int
    gpu_waits: int
    host_syncs: int
    oom: int
    leaks_reclaimed: int
    leaked_bytes_reclaimed: int
    runs_joined: int
    pieces_moved: int
    fast_steals: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
