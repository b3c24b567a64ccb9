"""A deterministic device for single-threaded model-based tests: streams run only when told.

Wraps an emulated backend (test-only; it enters through the ``backend`` argument of the service
and the pool). Before the first work queued on a stream after it last ran dry, the wrapper queues
a latch: a host function (``launch_host_func``, cudaLaunchHostFunc) that waits until the test
calls :meth:`complete`. So a stream's work, and every event recorded behind it, completes
exactly when a rule says so, and queries answer the same way on every run. A blocking
synchronize (stream, event, device) opens the latches it waits for, as a real device would
eventually get there; pools under this wrapper must have no host-wait deadline
(``host_wait_timeout_s=None``), since a deadline is measured in wall time.
"""

from __future__ import annotations

import threading
from typing import Any

import device_kernels


class LatchedBackend:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self._latches: dict[int, threading.Event] = {}   # stream handle -> the latch it waits at
        self._recorded_on: dict[int, int] = {}            # event -> stream of its latest record
        self._waits_for: dict[int, set[int]] = {}        # stream -> streams its queued work waits for

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _latch(self, stream: int) -> None:
        key = 1 if stream == 0 else stream
        if key not in self._latches:
            gate = threading.Event()
            self.inner.launch_host_func(stream, gate.wait)
            self._latches[key] = gate

    def complete(self, stream: int) -> None:
        """Let ``stream`` run everything queued on it so far, and wait until it has. The streams
        it waits for (``stream_wait_event``) run too: the device would have to get there first."""
        order: list[int] = []
        todo = [1 if stream == 0 else stream]
        while todo:
            key = todo.pop()
            if key in order:
                continue
            order.append(key)
            todo.extend(self._waits_for.pop(key, ()))
        for key in order:
            gate = self._latches.pop(key, None)
            if gate is not None:
                gate.set()
        for key in reversed(order):
            self.inner.stream_synchronize(key)

    def complete_all(self) -> None:
        for stream in list(self._latches):
            self.complete(stream)

    @property
    def latched(self) -> list[int]:
        return sorted(self._latches)

    # work that is queued: latched first --------------------------------------------------------
    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        self._latch(stream)
        self.inner.memset_async(ptr, value, nbytes, stream)

    def fill_u32_async(self, ptr: int, count: int, value: int, stream: int, delay_s: float = 0.0) -> None:
        """The tests' slow writer (device_kernels.py, which calls this for this wrapper), latched."""
        self._latch(stream)
        device_kernels.fill_u32_async(self.inner, ptr, count, value, stream, delay_s)

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._latch(stream)
        self.inner.memcpy_async(dst, src, nbytes, stream)

    def event_record(self, event: int, stream: int) -> None:
        self._latch(stream)
        self.inner.event_record(event, stream)
        self._recorded_on[event] = 1 if stream == 0 else stream

    def stream_wait_event(self, stream: int, event: int) -> None:
        self._latch(stream)
        self.inner.stream_wait_event(stream, event)
        source = self._recorded_on.get(event)
        key = 1 if stream == 0 else stream
        if source is not None and source != key:
            self._waits_for.setdefault(key, set()).add(source)

    # blocking waits: the device gets there ------------------------------------------------------
    def stream_synchronize(self, stream: int) -> None:
        self.complete(stream)

    def event_synchronize(self, event: int) -> None:
        self.complete_all()
        self.inner.event_synchronize(event)

    def device_synchronize(self) -> None:
        self.complete_all()
        self.inner.device_synchronize()

    def close(self, timeout_s: float | None = None) -> None:
        self.complete_all()
        self.inner.close(timeout_s)

