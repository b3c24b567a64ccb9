"""Host waits with a deadline, for the pool's last-resort synchronizations.

``cudaStreamSynchronize`` has no timeout: a stream that never finishes (a kernel in an endless
loop, a hung device) would hang the allocating task thread, and with it the executor, forever.
So the pool waits by querying (``cudaStreamQuery`` / ``cudaEventQuery``), at first back to back,
then sleeping with the GIL released, up to 1 ms between queries, and raises
:class:`~cudabridge.errors.HostWaitTimeout` naming the stream once the deadline passes. These
waits are the step before out-of-memory, so the wake-up latency (under 1 ms) does not matter;
with no deadline (``None``) the blocking CUDA call is used.
"""

from __future__ import annotations

import time

from ..device import DeviceBackend
from ..errors import HostWaitTimeout

_SPIN_QUERIES = 8        # back-to-back queries before the first sleep
_MAX_PAUSE_S = 0.001


class HostWait:
    __slots__ = ("backend", "timeout_s")

    def __init__(self, backend: DeviceBackend, timeout_s: float | None) -> None:
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not timeout_s > 0):
            raise ValueError(f"host wait timeout must be a positive number of seconds or None, got {timeout_s!r}")
        self.backend = backend
        self.timeout_s = timeout_s

    def stream(self, handle: int, name: str) -> None:
        """Return once everything queued on ``handle`` so far has completed."""
        if self.timeout_s is None:
            self.backend.stream_synchronize(handle)
            return
        self._until(lambda: self.backend.stream_query(handle), name)

    def event(self, event: int, name: str) -> None:
        """Return once the event's latest record has completed (it was recorded on ``name``)."""
        if self.timeout_s is None:
            self.backend.event_synchronize(event)
            return
        self._until(lambda: self.backend.event_query(event), name)

    def _until(self, done, name: str) -> None:
        for _ in range(_SPIN_QUERIES):
            if done():
                return
        start = time.monotonic()
        deadline = start + self.timeout_s
        pause = 0.00002
        while not done():
            now = time.monotonic()
            if now >= deadline:
                raise HostWaitTimeout(f"waited {now - start:.3g} s (host_wait_timeout={self.timeout_s:g} s) for "
                                      f"{name} to finish its queued work; it has not: the stream may be hung")
            time.sleep(min(pause, deadline - now))
            pause = min(_MAX_PAUSE_S, pause * 2)
