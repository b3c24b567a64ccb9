"""A faithful CPU model of a CUDA device, for machines without a GPU.

What is modelled, because the service's correctness depends on it:

* Device memory is host memory (anonymous ``mmap``, zero-filled lazily) behind fake device
  addresses. Chunks are never adjacent in the address space, so a pool that coalesces across
  two ``malloc`` results is caught. Every access is bounds-checked against one allocation.
* Each stream is an ordered work queue run by its own worker thread. Work on different streams
  runs concurrently and in no particular order relative to each other.
* An event completes exactly when the work queued on its stream before its latest record has
  run. An event that was never recorded queries as complete. ``stream_wait_event`` waits for the
  record that was latest *at the time of the call*, as ``cudaStreamWaitEvent`` does.
* ``PER_THREAD_STREAM`` names the calling thread's own stream: the same handle is a different
  stream on every thread. ``LEGACY_STREAM`` (and ``0``) is one stream per device.
* The current device is per thread; ``malloc`` allocates on it; an event and the stream it is
  recorded on must belong to the same device.
* Virtual memory (``va_reserve`` / ``phys_create`` / ``mem_map`` / ``mem_unmap``): a reservation
  costs no memory, physical handles count against the device's memory, and touching a page of a
  reservation with nothing mapped is an illegal address. Unmapping discards the pages' contents.
  A handle can be mapped at one place at a time here (CUDA allows several; the pool never does).
* An error inside queued work (for example an out-of-bounds kernel write, or any exception a
  host kernel raises, ``SystemExit`` and ``KeyboardInterrupt`` included) is sticky, as CUDA's are:
  every later call on that device raises it. The stream's worker goes on: what was queued behind
  the failed work still completes, so that synchronize and close return.
* Host registration refuses what ``cudaHostRegister`` refuses (memory that is not mapped readable
  and writable in the process, ranges that wrap or reach the kernel's half of the address space),
  with the driver's error codes, instead of accepting a range that a later copy would fault on.

Exceptions, asynchronous ones included (``PyThreadState_SetAsyncExc``, a SIGINT's
``KeyboardInterrupt``), landing anywhere in a thread that calls the device or in a stream's own
worker, leave no lock of the device held and no books of it half changed (see ``_EmuStream``,
``_EmuDevice``, ``_DeviceThread`` and ``_RaceDetector`` for how); ``tests/test_emulated_interruptions.py``
injects them. A call cut short may have taken effect already, as a CUDA call interrupted after it
reached the driver: work it queued runs, memory it allocated stays allocated, and a stream it made
may be left unreachable (its worker idle).

The parts, bottom up, each importing only those below it: emulated_device_thread.py (the thread
that starts the streams' workers and writes the log lines), emulated_device.py (a GPU's memory,
virtual memory and sticky error; the error codes), emulated_host_memory.py (page-locked host
memory), emulated_streams.py (streams and events), race_detector.py (on those streams and events).
This file composes them behind the :class:`~cudabridge.device.backend.DeviceBackend` interface:
the devices and the current one per thread, stream and event handles, per-thread default streams,
and which memory each call reads and writes.

Race detector (``race_check=True``, or ``CUDABRIDGE_EMULATED_RACE_CHECK=1`` in the environment;
off by default): race_detector.py says what it reports and what orders two accesses. The accesses
each call makes: ``memcpy_async`` (writes dst, reads src), ``copy_to_device_async`` (writes),
``copy_from_device_async`` (reads), ``memset_async`` (writes), ``launch_host_kernel`` (its
pointers' buffers and module globals); ``launch_host_func`` touches nothing.
``free``, ``mem_unmap`` and ``va_release`` forget their range's history.

Not modelled: the implicit synchronization of the legacy stream with blocking streams (the
service creates only non-blocking streams, and leaving it out only makes races easier to see),
and stream priorities (accepted and reported, not scheduled).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any, Callable

from ..config import BY_KEY
from ..errors import CudaError, InvalidArgument, StreamOrderRace
from .backend import (
    DEFAULT_STREAM,
    LEGACY_STREAM,
    PER_THREAD_STREAM,
    DeviceBackend,
    host_view,
)
from .emulated_device import (
    _ADDRESS_BASE,
    _ALLOC_GRANULE,
    _DEVICE_WINDOW,
    _ERR_INVALID_DEVICE,
    _ERR_INVALID_HANDLE,
    _ERR_INVALID_VALUE,
    _EmuDevice,
    _fail,
)
from .emulated_driver import ERROR_NAMES, EmulatedDriver
from .emulated_host_memory import _PageLockedHostMemory
from .emulated_streams import _EmuEvent, _EmuStream
from .launch_config import DeviceLimits, check_launch
from .params import DevicePointer, check_args
# the race detector's switch, importable from the backend that it is a setting of
from .race_detector import RACE_CHECK_ENV, _RaceDetector, race_check_from_env  # noqa: F401

log = logging.getLogger(__name__)


class EmulatedBackend(DeviceBackend):
    """See the module docstring. ``devices`` emulated GPUs of ``memory_bytes`` each.

    ``race_check``: run the stream-ordering race detector (``None``: as
    ``CUDABRIDGE_EMULATED_RACE_CHECK`` says, off when unset). Races found are raised as
    :class:`~cudabridge.errors.StreamOrderRace` and also kept in :attr:`races`.
    """

    name = "emulated"

    def __init__(self, devices: int = 1, memory_bytes: int = 16 << 30, race_check: bool | None = None) -> None:
        if devices < 1:
            raise ValueError(f"an emulated backend needs at least one device, got {devices}")
        if memory_bytes > _DEVICE_WINDOW:   # each GPU's memory must fit its address window
            raise InvalidArgument(f"memory_bytes={memory_bytes}: an emulated GPU has at most {_DEVICE_WINDOW} bytes "
                                  f"(1 TiB, its address window; {BY_KEY['emulatedMemory'].name} is bounded by it)")
        if race_check is None:
            race_check = race_check_from_env()
        #: every race the detector found, in order (also raised); a test can check it is empty
        #: even where the code under test swallowed the exception
        self.races: list[StreamOrderRace] = []
        self._race: _RaceDetector | None = _RaceDetector(self.races) if race_check else None
        self._devices = [_EmuDevice(i, memory_bytes) for i in range(devices)]
        self._handles = itertools.count(0x1000, 0x10)
        self._streams: dict[int, _EmuStream] = {}
        self._events: dict[int, _EmuEvent] = {}
        self._local = threading.local()
        self._lock = threading.Lock()   # publishes a device's legacy stream (_legacy)
        self._ptds: list[_EmuStream] = []
        self._destroyed: list[_EmuStream] = []   # destroyed streams whose work may still run
        self._host = _PageLockedHostMemory()
        self._driver: EmulatedDriver | None = None   # native_driver, made on first use
        self._closed = False

    @property
    def race_check(self) -> bool:
        """Whether the stream-ordering race detector is on (``races`` stays empty when it is off)."""
        return self._race is not None

    # the C paths' driver (emulated_driver.py) ---------------------------------------------
    runs_host_kernels = True

    @property
    def native_driver(self) -> EmulatedDriver:
        """The driver table the C paths call on this device, made on first use."""
        with self._lock:
            if self._driver is None:
                self._driver = EmulatedDriver(self)
            return self._driver

    def driver_error(self, call: str, code: int) -> CudaError:
        return CudaError(call, code, ERROR_NAMES.get(code, f"CUresult {code}"))

    def device_limits(self, ordinal: int) -> DeviceLimits:
        """What GPU ``ordinal`` allows a launch: the modelled device's (an H100's)."""
        if not 0 <= ordinal < len(self._devices):
            raise _fail("cudaDeviceGetAttribute", _ERR_INVALID_DEVICE, f"ordinal {ordinal}")
        return DeviceLimits()

    def host_view_at(self, address: int, nbytes: int) -> memoryview:
        """Host memory by address, as a copy by address sees it (page-locked or not)."""
        return self._host.view_at(address, nbytes)

    def device_view(self, ptr: int, nbytes: int) -> memoryview:
        """The emulated device's memory [ptr, ptr + nbytes) as host memory, for the host code that
        stands in for GPU code (Python functions called from Java see their device arrays as numpy
        arrays over it). The range must lie inside one allocation. The caller orders its accesses
        itself: no stream works on the range meanwhile (the functions synchronize the task's stream
        first); the race detector does not see them."""
        return self._device_of(ptr).view("device_view", ptr, nbytes)

    # helpers -------------------------------------------------------------------------------
    def _current(self) -> _EmuDevice:
        dev = self._devices[getattr(self._local, "device", 0)]
        if dev.sticky is not None:
            raise dev.sticky
        dev.context_created = True
        return dev

    def _stream(self, call: str, handle: int) -> _EmuStream:
        if handle == PER_THREAD_STREAM:
            dev = self._current()
            per_thread = getattr(self._local, "ptds", None)
            if per_thread is None:
                per_thread = self._local.ptds = _PerThreadStreams(self)
            stream = per_thread.get(dev)
        elif handle in (LEGACY_STREAM, DEFAULT_STREAM):
            dev = self._current()
            stream = dev.legacy
            if stream is None:
                stream = self._legacy(dev)
        else:
            stream = self._streams.get(handle)
            if stream is None:
                raise _fail(call, _ERR_INVALID_HANDLE, f"no stream {handle:#x}")
        if stream.device.sticky is not None:
            raise stream.device.sticky
        return stream

    def _legacy(self, dev: _EmuDevice) -> _EmuStream:
        """The device's legacy stream, made on first use: made whole outside the lock (making one
        calls into ``threading``), then published under it with a plain store; a thread that lost
        the race closes its own."""
        fresh = _EmuStream(dev, next(self._handles), 0, "legacy")
        if self._race is not None:
            self._race.add_stream(fresh)
        with self._lock:
            if dev.legacy is None:
                dev.legacy = fresh
            stream = dev.legacy
        if stream is not fresh:
            fresh.close()
        return stream

    def _event(self, call: str, handle: int) -> _EmuEvent:
        ev = self._events.get(handle)
        if ev is None:
            raise _fail(call, _ERR_INVALID_HANDLE, f"no event {handle:#x}")
        return ev

    # devices -------------------------------------------------------------------------------
    def device_count(self) -> int:
        return len(self._devices)

    def set_device(self, ordinal: int) -> None:
        if not 0 <= ordinal < len(self._devices):
            raise _fail("cudaSetDevice", _ERR_INVALID_DEVICE, f"ordinal {ordinal} of {len(self._devices)} devices")
        self._local.device = ordinal

    def get_device(self) -> int:
        return getattr(self._local, "device", 0)

    def device_uuid(self, ordinal: int) -> str:
        if not 0 <= ordinal < len(self._devices):
            raise _fail("cudaGetDeviceProperties", _ERR_INVALID_DEVICE, f"ordinal {ordinal}")
        return self._devices[ordinal].uuid

    def vmm_granularity(self) -> int:
        self._current()
        return _ALLOC_GRANULE

    def va_reserve(self, nbytes: int) -> int:
        return self._current().va_reserve(nbytes)

    def va_release(self, ptr: int, nbytes: int) -> None:
        self._current().va_release(ptr, nbytes)
        if self._race is not None:
            self._race.forget(ptr, ptr + nbytes)

    def phys_create(self, nbytes: int) -> int:
        return self._current().phys_create(nbytes)

    def phys_release(self, handle: int) -> None:
        self._current().phys_release(handle)

    def mem_map(self, ptr: int, nbytes: int, handle: int) -> None:
        self._current().mem_map(ptr, nbytes, handle)

    def mem_unmap(self, ptr: int, nbytes: int) -> None:
        self._current().mem_unmap(ptr, nbytes)
        if self._race is not None:
            self._race.forget(ptr, ptr + nbytes)

    def mem_get_info(self) -> tuple[int, int]:
        dev = self._current()
        return dev.total - dev.used, dev.total

    def context_active(self, ordinal: int) -> bool:
        if not 0 <= ordinal < len(self._devices):
            raise _fail("cuDevicePrimaryCtxGetState", _ERR_INVALID_DEVICE, f"ordinal {ordinal}")
        return self._devices[ordinal].context_created

    def device_synchronize(self) -> None:
        dev = self._current()
        streams = [s for s in list(self._streams.values()) + list(self._ptds) + list(self._destroyed) + [dev.legacy]
                   if s is not None and s.device is dev]
        race = self._race
        snap = race.device_snapshot(dev.ordinal, streams) if race is not None else None
        for stream in streams:
            stream.synchronize()
        for stream in [d for d in list(self._destroyed) if d.idle()]:   # destroyed and done: forgotten
            try:
                self._destroyed.remove(stream)
            except ValueError:   # by another thread meanwhile
                pass
        if dev.sticky is not None:
            raise dev.sticky
        if snap is not None:
            race.observe(snap)

    # memory --------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        if nbytes <= 0:
            raise _fail("cudaMalloc", _ERR_INVALID_VALUE, f"size {nbytes}")
        return self._current().malloc(nbytes)

    def free(self, ptr: int) -> None:
        span = self._current().free(ptr)
        if self._race is not None:
            self._race.forget(ptr, ptr + span)

    # streams -------------------------------------------------------------------------------
    def stream_priority_range(self) -> tuple[int, int]:
        return 0, -5  # what an H100/H200 reports

    def stream_create(self, priority: int = 0) -> int:
        dev = self._current()
        handle = next(self._handles)
        stream = _EmuStream(dev, handle, max(-5, min(0, priority)), "pool")
        if self._race is not None:
            self._race.add_stream(stream)
        self._streams[handle] = stream
        return handle

    def stream_destroy(self, stream: int) -> None:
        """As cudaStreamDestroy: returns at once; the work queued on the stream still runs, and a
        device synchronize (or the backend's close) still waits for it."""
        s = self._streams.get(stream)
        if s is None:
            raise _fail("cudaStreamDestroy", _ERR_INVALID_HANDLE, f"no stream {stream:#x}")
        self._destroyed.append(s)   # first: a destroy cut short leaves it reachable, never lost
        s.close(timeout=0)
        # dropped after its close: a destroy cut short leaves a closed stream that a later destroy
        # (or the backend's close) finishes, never a live worker nobody can reach
        if self._streams.pop(stream, None) is s and self._race is not None:
            # Not a host synchronization (cudaStreamDestroy returns at once in CUDA), but its
            # work still counts for a later device synchronize.
            self._race.retire(s)

    def stream_query(self, stream: int) -> bool:
        s = self._stream("cudaStreamQuery", stream)
        if self._race is not None:
            return self._race.stream_idle(s)
        return s.idle()

    def stream_synchronize(self, stream: int) -> None:
        s = self._stream("cudaStreamSynchronize", stream)
        race = self._race
        snap = race.stream_snapshot(s) if race is not None else None
        s.synchronize()
        if s.device.sticky is not None:
            raise s.device.sticky
        if race is not None:
            race.stream_synchronized(s, snap)

    def stream_wait_event(self, stream: int, event: int) -> None:
        s = self._stream("cudaStreamWaitEvent", stream)
        ev = self._event("cudaStreamWaitEvent", event)
        if self._race is not None:
            self._race.wait_event(s, ev)
            return
        source, seq = ev.stream, ev.seq  # the record that is latest now, not at run time
        if source is None:
            return
        s.enqueue(lambda: source.wait_for(seq))

    # events --------------------------------------------------------------------------------
    def event_create(self) -> int:
        dev = self._current()
        handle = next(self._handles)
        self._events[handle] = _EmuEvent(dev)
        return handle

    def event_destroy(self, event: int) -> None:
        if self._events.pop(event, None) is None:
            raise _fail("cudaEventDestroy", _ERR_INVALID_HANDLE, f"no event {event:#x}")

    def event_record(self, event: int, stream: int) -> None:
        ev = self._event("cudaEventRecord", event)
        s = self._stream("cudaEventRecord", stream)
        if s.device is not ev.device:
            raise _fail("cudaEventRecord", _ERR_INVALID_HANDLE,
                        f"event of GPU {ev.device.ordinal} recorded on a stream of GPU {s.device.ordinal}")
        if self._race is not None:
            self._race.record(ev, s)
            return
        seq = s.marker()
        ev.stream, ev.seq = s, seq

    def event_query(self, event: int) -> bool:
        ev = self._event("cudaEventQuery", event)
        if ev.device.sticky is not None:
            raise ev.device.sticky
        if self._race is not None:
            return self._race.event_done(ev)
        return ev.done()

    def event_synchronize(self, event: int) -> None:
        ev = self._event("cudaEventSynchronize", event)
        race = self._race
        if race is not None:
            stream, seq, clock = race.event_snapshot(ev)
        else:
            stream, seq, clock = ev.stream, ev.seq, None
        if stream is not None:
            stream.wait_for(seq)
        if ev.device.sticky is not None:
            raise ev.device.sticky
        if clock:
            race.observe(clock)

    # page-locked host memory ---------------------------------------------------------------
    def alloc_pinned(self, nbytes: int) -> Any:
        return self._host.alloc(nbytes)

    def free_pinned(self, buffer: Any) -> None:
        self._host.free(buffer)

    def host_register(self, address: int, nbytes: int) -> Any:
        return self._host.register(address, nbytes)

    def host_unregister(self, region: Any) -> None:
        self._host.unregister(region)

    def _is_pinned(self, view: memoryview) -> bool:
        return self._host.holds(view)

    # copies --------------------------------------------------------------------------------
    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        s = self._stream("cudaMemcpyAsync", stream)
        if nbytes == 0:
            return
        d = self._device_of(dst).view("cudaMemcpyAsync", dst, nbytes)
        sv = self._device_of(src).view("cudaMemcpyAsync", src, nbytes)

        def copy() -> None:
            d[:] = sv
        if self._race is None:
            s.enqueue(copy)
        else:
            self._race.enqueue(s, copy, "cudaMemcpyAsync", reads=((src, nbytes),), writes=((dst, nbytes),))

    def copy_to_device_async(self, dst: int, host: Any, stream: int) -> None:
        view = host_view(host, writable=False)
        s = self._stream("cudaMemcpyAsync", stream)
        d = s.device.view("cudaMemcpyAsync", dst, len(view))
        if not self._is_pinned(view):
            view = memoryview(bytes(view))  # pageable: CUDA stages the data before returning

        def copy() -> None:
            d[:] = view
        if self._race is None:
            s.enqueue(copy)
        else:
            n = len(view)
            self._race.enqueue(s, copy, "cudaMemcpyAsync", writes=((dst, n),) if n else ())

    def copy_from_device_async(self, host: Any, src: int, stream: int) -> None:
        view = host_view(host, writable=True)
        s = self._stream("cudaMemcpyAsync", stream)
        sv = s.device.view("cudaMemcpyAsync", src, len(view))

        def copy() -> None:
            view[:] = sv
        pageable = not self._is_pinned(view)
        race = self._race
        if race is None:
            seq, clock = s.enqueue(copy), None
        else:
            n = len(view)
            seq, clock = race.enqueue(s, copy, "cudaMemcpyAsync", reads=((src, n),) if n else (),
                                      keep_clock=pageable)
        if pageable:
            s.wait_for(seq)  # pageable: CUDA returns only once the copy (and all before it) is done
            if s.device.sticky is not None:
                raise s.device.sticky
            if clock is not None:
                race.observe(clock)  # the host saw it complete

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        s = self._stream("cudaMemsetAsync", stream)
        if not 0 <= value <= 255:
            value &= 0xFF
        d = s.device.view("cudaMemsetAsync", ptr, nbytes)
        fill = bytes([value])

        def memset() -> None:
            d[:] = fill * len(d)
        if self._race is None:
            s.enqueue(memset)
        else:
            self._race.enqueue(s, memset, "cudaMemsetAsync", writes=((ptr, nbytes),) if nbytes else ())

    def _device_of(self, ptr: int) -> _EmuDevice:
        index = (ptr - _ADDRESS_BASE) // _DEVICE_WINDOW
        if 0 <= index < len(self._devices):
            return self._devices[index]
        raise _fail("cudaMemcpyAsync", _ERR_INVALID_VALUE, f"{ptr:#x} is not a device address")

    # kernels -------------------------------------------------------------------------------
    def launch_host_kernel(self, stream: int, host_kernel: Any, config: Any, args: list[Any]) -> None:
        """Queue a user kernel's host kernel (kernels/host_kernels.py) on ``stream``: checked now
        (argument count and kinds, every pointer inside an allocation), run in stream order on
        the stream's worker. The race detector counts it as reading and writing each pointer's
        buffer: a ``DevicePointer``'s extent, a plain address's allocation from there on; and as
        reading each module global bound to it (``host_kernel.bound``), writing the non-constant ones."""
        call = f"cuLaunchKernel({host_kernel.name})"
        s = self._stream(call, stream)
        # the modelled device's limits (an H100's) and the host kernel's (any dynamic shared memory)
        check_launch(config, self.device_limits(s.device.ordinal), host_kernel.limits, host_kernel.name)
        grid, block = config.grid, config.block
        kinds = host_kernel.signature
        values = check_args(kinds, args, host_kernel.name)
        views: list[Any] = []
        touched: list[tuple[int, int]] = []
        for i, (kind, value) in enumerate(zip(kinds, values)):
            if kind == "ptr":
                if value.__class__ is DevicePointer:
                    ptr, n = value
                    values[i] = ptr
                else:
                    ptr, n = value, s.device.extent(call, value)
                views.append(s.device.view(call, ptr, n))
                touched.append((ptr, n))
            else:
                views.append(None)
        # the module globals the host kernel reads (its module's copies): after the arguments, read-only
        # for a __constant__; a __device__ variable kernels write counts as written too
        global_views = [(s.device.view(call, g.address, g.nbytes), g.constant) for g in host_kernel.bound]
        global_reads = tuple((g.address, g.nbytes) for g in host_kernel.bound)
        global_writes = tuple((g.address, g.nbytes) for g in host_kernel.bound if not g.constant)
        fn = host_kernel.fn

        def kernel() -> None:
            import numpy as np
            arrays = [v if view is None else np.frombuffer(view, dtype=np.uint8) for v, view in zip(values, views)]
            for view, constant in global_views:
                array = np.frombuffer(view, dtype=np.uint8)
                if constant:
                    array.flags.writeable = False
                arrays.append(array)
            fn(grid, block, *arrays)
        if self._race is None:
            s.enqueue(kernel)
        else:
            accesses = tuple(touched)
            self._race.enqueue(s, kernel, call, reads=accesses + global_reads, writes=accesses + global_writes)

    def launch_host_func(self, stream: int, fn: Callable[[], None]) -> None:
        s = self._stream("cudaLaunchHostFunc", stream)
        if self._race is None:
            s.enqueue(fn)
        else:  # touches no device memory; queued through the detector so that positions stay exact
            self._race.enqueue(s, fn, "cudaLaunchHostFunc")

    # How long close() waits, in all, for the streams' queued work at most (the service passes its
    # hostWaitTimeout when shorter): a host kernel that never returns (a hung kernel) must not hang
    # the service's close; its worker, a daemon thread, is left.
    CLOSE_WAIT_S = 5.0

    def close(self, timeout_s: float | None = None) -> None:
        if self._closed:
            return
        wait_s = self.CLOSE_WAIT_S if timeout_s is None else min(timeout_s, self.CLOSE_WAIT_S)
        end = time.monotonic() + wait_s
        streams = (list(self._streams.values()) + list(self._destroyed)
                   + [dev.legacy for dev in self._devices if dev.legacy is not None] + list(self._ptds))
        left = []
        for s in streams:   # each close is repeatable
            if not s.close(timeout=max(0.0, end - time.monotonic())):
                left.append(s.label)
        if left:
            log.warning("emulated device closed with work still running on %d stream(s) after %g s (%s): "
                        "their workers are left to finish", len(left), wait_s, ", ".join(left[:4]))
        self._streams.clear()
        self._destroyed.clear()
        if self._driver is not None:
            self._driver.close()
        self._closed = True   # last: a close cut short by an exception can be called again, and finishes


class _PerThreadStreams:
    """The calling thread's per-thread default streams, one per device, closed with the thread."""

    def __init__(self, backend: EmulatedBackend) -> None:
        self._backend = backend
        self._streams: dict[int, _EmuStream] = {}

    def get(self, dev: _EmuDevice) -> _EmuStream:
        stream = self._streams.get(dev.ordinal)
        if stream is None:
            stream = _EmuStream(dev, next(self._backend._handles), 0, "per-thread")
            if self._backend._race is not None:
                self._backend._race.add_stream(stream)
            # list.append and list.remove are single steps under the GIL (no lock needed): the
            # backend's list first, so that device synchronize and close see every published stream
            self._backend._ptds.append(stream)
            self._streams[dev.ordinal] = stream
        return stream

    def __del__(self) -> None:  # the owning thread ended: its default streams go with it
        for stream in list(self._streams.values()):
            try:
                stream.close()
                try:
                    self._backend._ptds.remove(stream)
                except ValueError:   # removed already
                    pass
                if self._backend._race is not None:
                    # no lock here (this may run inside any call, by GC): the detector takes
                    # it in at the next device synchronize
                    self._backend._race.retiring.append((stream.device.ordinal, stream.clock))
            except BaseException:  # noqa: BLE001 - interpreter shutdown, or an exception landing here:
                pass               # the thread's other streams still close (and the backend's close)
