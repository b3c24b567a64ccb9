"""One pool of CUDA streams per GPU: created once, handed out, never returned, destroyed with the pool.

Anchors: RMM's ``cuda_stream_pool`` (16 streams, round-robin, all created up front) and
PyTorch's per-device pools (32 per priority, round-robin). A Spark executor runs many short
tasks, so creating a stream per task is wasted work (a create and destroy costs many times a
round-robin acquire: bench/RESULTS.md, "bench_core, H200 (run 4, current code)") and unbounded;
a fixed pool is neither.

Handles are plain integers. Other libraries wrap them as external streams:
``cupy.cuda.ExternalStream(handle)``, ``torch.cuda.ExternalStream(handle)``,
``numba.cuda.external_stream(handle)``, ``cuda.core``'s ``Stream.from_handle(handle)``.

Hardware queues: a GPU runs at most ``CUDA_DEVICE_MAX_CONNECTIONS`` streams truly in parallel
(default 8); more streams alias onto those queues and false dependencies serialize unrelated
tasks. :func:`ensure_hardware_queues` raises it to the pool size before the CUDA context
exists, unless the user set it.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from typing import Iterator

from .device import DeviceBackend
from .errors import InvalidArgument, PoolClosed
from .modes import Mode

log = logging.getLogger(__name__)

MAX_CONNECTIONS_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
HARDWARE_QUEUE_LIMIT = 32


class Priority(Mode):
    """A stream's priority: a pool of its own per priority (``high``: the device's greatest)."""
    NORMAL = "normal"
    HIGH = "high"


class StreamPolicy(Mode):
    """How a task's stream is picked."""
    ROUND_ROBIN = "round-robin"   # one atomic step
    IDLE_FIRST = "idle-first"     # queries streams, takes the first with no pending work


def ensure_hardware_queues(streams: int) -> str:
    """Set ``CUDA_DEVICE_MAX_CONNECTIONS`` to ``min(streams, 32)`` unless already set; returns
    the value in force. Only takes effect if no CUDA context exists yet in this process."""
    current = os.environ.get(MAX_CONNECTIONS_ENV)
    if current is not None:
        log.info("%s=%s set by the user; left as it is", MAX_CONNECTIONS_ENV, current)
        return current
    value = str(max(1, min(streams, HARDWARE_QUEUE_LIMIT)))
    os.environ[MAX_CONNECTIONS_ENV] = value
    log.info("set %s=%s so that %d pool streams get their own hardware queues", MAX_CONNECTIONS_ENV, value, streams)
    return value


class StreamPool:
    """``size`` non-blocking streams of normal priority and ``high_priority_size`` of the
    device's greatest priority, all created here on GPU ``device``."""

    def __init__(self, backend: DeviceBackend, device: int = 0, size: int = 32,
                 high_priority_size: int = 4, policy: str = StreamPolicy.ROUND_ROBIN,
                 wait_timeout_s: float | None = None) -> None:
        for name, value, low in (("size", size, 1), ("high_priority_size", high_priority_size, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= 1024:
                raise InvalidArgument(f"stream pool {name} must be an int in [{low}, 1024], got {value!r}")
        policy = StreamPolicy.parse(policy, "stream policy")
        self.backend = backend
        self.device = device
        self.policy = policy
        self.wait_timeout_s = wait_timeout_s   # how long close() waits for each stream (None: no end)
        if backend.context_active(device) and os.environ.get(MAX_CONNECTIONS_ENV) in (None, "8"):
            log.warning("GPU %d: the CUDA context existed before the stream pool; %s=%s cannot take "
                        "effect, so %d streams share %s hardware queues", device, MAX_CONNECTIONS_ENV,
                        os.environ.get(MAX_CONNECTIONS_ENV, "unset (8)"), size + high_priority_size,
                        os.environ.get(MAX_CONNECTIONS_ENV, "8"))
        prev = backend.get_device()
        backend.set_device(device)
        self._streams: dict[str, list[int]] = {p: [] for p in Priority}
        try:
            least, greatest = backend.stream_priority_range()
            self.priority_values = {Priority.NORMAL: least, Priority.HIGH: greatest}
            for prio, count in ((Priority.NORMAL, size), (Priority.HIGH, high_priority_size)):
                for _ in range(count):
                    self._streams[prio].append(backend.stream_create(self.priority_values[prio]))
        except BaseException:
            for handles in self._streams.values():
                for h in handles:
                    backend.stream_destroy(h)
            raise
        finally:
            if prev != device:
                backend.set_device(prev)
        # priority -> its round-robin cycle (a priority with no streams has none). Read by a caller
        # that takes streams itself under the round-robin policy (the task registry's C twin: one
        # next() is acquire()); emptied in place at close, so that nothing hands out a closed
        # pool's streams.
        self.cycles: dict[str, Iterator[int]] = {p: itertools.cycle(h) for p, h in self._streams.items() if h}
        self._lock = threading.Lock()
        self._closed = False
        self.idle_queries = 0

    @property
    def handles(self) -> list[int]:
        return [h for p in Priority for h in self._streams[p]]

    def streams(self, priority: str = Priority.NORMAL) -> list[int]:
        self._check_priority(priority)
        return list(self._streams[priority])

    def owns(self, handle: int) -> bool:
        return any(handle in hs for hs in self._streams.values())

    def acquire(self, priority: str = Priority.NORMAL, policy: str | None = None) -> int:
        """A stream of the pool; nothing to return. ``round-robin`` costs one atomic step;
        ``idle-first`` queries streams from the round-robin position and takes the first with no
        pending work (falling back to round-robin when all are busy)."""
        cycle = self.cycles.get(priority)
        if cycle is None:
            if self._closed:
                raise PoolClosed(f"acquire on the stream pool of GPU {self.device} after close()")
            self._check_priority(priority)
            raise InvalidArgument(f"GPU {self.device}'s stream pool has no {priority!r} streams")
        if (policy or self.policy) == StreamPolicy.ROUND_ROBIN:
            return next(cycle)
        if policy is not None:
            StreamPolicy.parse(policy, "stream policy")
        first = next(cycle)
        candidate = first
        for _ in range(len(self._streams[priority])):
            self.idle_queries += 1
            if self.backend.stream_query(candidate):
                return candidate
            candidate = next(cycle)
        return first

    def _check_priority(self, priority: str) -> None:
        Priority.parse(priority, "stream priority")

    def synchronize(self) -> None:
        for h in self.handles:
            self.backend.stream_synchronize(h)

    def close(self) -> None:
        """Synchronize and destroy every stream. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.cycles.clear()
        first: BaseException | None = None
        handles = self.handles
        self._streams = {p: [] for p in Priority}
        prev = self.backend.get_device()
        self.backend.set_device(self.device)
        try:
            for h in handles:   # each is tried whatever the one before met; the first error is raised
                try:
                    self._wait(h)
                    self.backend.stream_destroy(h)
                except Exception as exc:   # noqa: BLE001
                    first = first or exc
        finally:
            if prev != self.device:
                try:
                    self.backend.set_device(prev)
                except Exception as exc:   # noqa: BLE001
                    first = first or exc
        if first is not None:
            raise first

    def _wait(self, handle: int) -> None:
        """Wait for a stream before destroying it: within ``wait_timeout_s`` when one is set (a
        hung stream is then destroyed with its work pending, which CUDA allows: its resources
        go once the work ends)."""
        if self.wait_timeout_s is None:
            self.backend.stream_synchronize(handle)
            return
        deadline = time.monotonic() + self.wait_timeout_s
        pause = 0.00002
        while not self.backend.stream_query(handle):
            if time.monotonic() >= deadline:
                log.error("GPU %d: stream %#x still busy after %g s at close; destroyed with its work pending",
                          self.device, handle, self.wait_timeout_s)
                return
            time.sleep(pause)
            pause = min(0.001, pause * 2)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "StreamPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
