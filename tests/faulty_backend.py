"""Fault injection for tests: a device backend that wraps a real one and fails on request.

Test-only behaviour lives here, never as a flag in production code; it enters the service
through its documented extension point, the ``backend`` argument of ``CudaBridgeService`` (and
of ``StreamOrderedMemoryPool``), which takes any object with the ``DeviceBackend`` methods.

Faults:

* ``fail_next(call, times=1)``: the next ``times`` calls of ``call`` fail as the device would:
  ``malloc`` / ``phys_create`` (growth) with ``DeviceAllocationFailed``, ``event_record`` /
  ``event_query`` / ``stream_query`` with a transient ``CudaError`` (cudaErrorUnknown, 999).
* ``hang(stream)``: the stream stops at the work queued so far plus a host function that waits
  for the returned ``release()`` (a kernel that never ends, until the test ends it).
* ``make_sticky(stream)``: queued work on the stream fails as an out-of-bounds kernel does; the
  device's context is unusable from then on (every later call raises the sticky error).

The hang and the sticky error are queued with ``launch_host_func`` (cudaLaunchHostFunc), so
every completion mechanism of the wrapped backend (queries, events, synchronizes) sees them as
real work: nothing here imitates stream ordering.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from cudabridge.device import DeviceAllocationFailed
from cudabridge.device.emulated_driver import EmulatedDriver
from cudabridge.errors import CudaError

TRANSIENT = (999, "cudaErrorUnknown")
ILLEGAL_ADDRESS = (700, "cudaErrorIllegalAddress")
_FAILABLE = ("malloc", "phys_create", "event_record", "event_query", "stream_query", "event_create")


class FaultyBackend:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self._fail: dict[str, int] = {}
        self.injected: dict[str, int] = {}
        self._lock = threading.Lock()
        self._gates: list[threading.Event] = []
        self._driver: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def native_driver(self) -> Any:
        """The C paths' driver: on the emulated device one over this wrapper, not over the inner
        backend, so that the faults reach copies and launches from Java too (the installed
        driver of a GPU is the inner backend's: nothing here reaches it)."""
        inner = self.inner.native_driver
        if not isinstance(inner, EmulatedDriver):
            return inner
        with self._lock:
            if self._driver is None:
                self._driver = EmulatedDriver(self)
            return self._driver

    # faults ------------------------------------------------------------------------------------
    def fail_next(self, call: str, times: int = 1) -> None:
        if call not in _FAILABLE:
            raise ValueError(f"cannot fail {call!r}; one of {_FAILABLE}")
        with self._lock:
            self._fail[call] = self._fail.get(call, 0) + times

    def _due(self, call: str) -> bool:
        with self._lock:
            n = self._fail.get(call, 0)
            if not n:
                return False
            self._fail[call] = n - 1
            self.injected[call] = self.injected.get(call, 0) + 1
            return True

    def hang(self, stream: int) -> Callable[[], None]:
        gate = threading.Event()
        self._gates.append(gate)
        self.inner.launch_host_func(stream, gate.wait)
        return gate.set

    def make_sticky(self, stream: int) -> None:
        def kernel_fault() -> None:
            raise CudaError("kernel", *ILLEGAL_ADDRESS, "injected: an out-of-bounds write")

        self.inner.launch_host_func(stream, kernel_fault)

    def release_all(self) -> None:
        for gate in self._gates:
            gate.set()

    # the wrapped calls ---------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        if self._due("malloc"):
            raise DeviceAllocationFailed(nbytes, "injected")
        return self.inner.malloc(nbytes)

    def phys_create(self, nbytes: int) -> int:
        if self._due("phys_create"):
            raise DeviceAllocationFailed(nbytes, "injected")
        return self.inner.phys_create(nbytes)

    def event_create(self) -> int:
        if self._due("event_create"):
            raise CudaError("cudaEventCreateWithFlags", *TRANSIENT, "injected")
        return self.inner.event_create()

    def event_record(self, event: int, stream: int) -> None:
        if self._due("event_record"):
            raise CudaError("cudaEventRecord", *TRANSIENT, "injected")
        self.inner.event_record(event, stream)

    def event_query(self, event: int) -> bool:
        if self._due("event_query"):
            raise CudaError("cudaEventQuery", *TRANSIENT, "injected")
        return self.inner.event_query(event)

    def stream_query(self, stream: int) -> bool:
        if self._due("stream_query"):
            raise CudaError("cudaStreamQuery", *TRANSIENT, "injected")
        return self.inner.stream_query(stream)

    def close(self, timeout_s: float | None = None) -> None:
        self.release_all()
        self.inner.close(timeout_s)
        if self._driver is not None:
            self._driver.close()


def from_env(backend: Any) -> "FaultyBackend":
    """For the ``backend_wrapper`` test setting in a Spark executor (``faulty_backend:from_env``):
    faults described by environment variables (``spark.executorEnv.*``).

    ``CUDABRIDGE_FAULT_STICKY_AFTER_COPIES=N``: after the N-th copy to the device, the stream it
    was queued on fails as an out-of-bounds kernel does (a sticky error); with
    ``CUDABRIDGE_FAULT_ONCE_FILE=path`` only in the first process that creates that file, so that
    the executor Spark starts in its place runs clean."""
    import os

    faulty = FaultyBackend(backend)
    after = int(os.environ.get("CUDABRIDGE_FAULT_STICKY_AFTER_COPIES", "0"))
    once = os.environ.get("CUDABRIDGE_FAULT_ONCE_FILE")
    if after > 0:
        count = [0]
        inner_copy = backend.copy_to_device_async

        def copy_to_device_async(dst: int, host: Any, stream: int) -> None:
            inner_copy(dst, host, stream)
            count[0] += 1
            if count[0] == after:
                if once:
                    try:
                        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                    except FileExistsError:
                        return
                faulty.make_sticky(stream)

        faulty.copy_to_device_async = copy_to_device_async  # type: ignore[method-assign]
    return faulty


def slow_event_queries(backend: Any) -> "FaultyBackend":
    """For the ``backend_wrapper`` test setting (``faulty_backend:slow_event_queries``): every
    ``event_query`` first sleeps 2 ms, as a busy device's query can take a while. ``time.sleep`` drops the GIL, as any Python the emulated
    driver runs may: a C path that made a driver call while holding a mutex that threads holding
    the GIL also take would deadlock here (StagingDriverCallTest)."""
    import time

    faulty = FaultyBackend(backend)
    pause = 0.002
    inner_query = backend.event_query

    def event_query(event: int) -> bool:
        time.sleep(pause)
        return inner_query(event)

    faulty.event_query = event_query  # type: ignore[method-assign]
    return faulty
