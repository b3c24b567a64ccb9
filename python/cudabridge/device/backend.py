"""The one small interface every device backend implements.

Handles (streams, events, device pointers) are plain integers, so that they can cross into
Java, CuPy, PyTorch or Numba unchanged. Two stream handles are special, as in CUDA:
``LEGACY_STREAM`` (also ``0``) is the device's legacy default stream, and ``PER_THREAD_STREAM``
names *the calling thread's* per-thread default stream: the same integer means a different
stream on every thread.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, NamedTuple

from ..errors import CudaError

LEGACY_STREAM = 1
PER_THREAD_STREAM = 2
DEFAULT_STREAM = 0  # the legacy default stream under the runtime API's default compilation


class DeviceBackend(abc.ABC):
    """Streams, events, device memory, asynchronous copies and memset, host functions. (Kernels
    are launched through what each backend offers user modules, kernels/; the tests' two kernels,
    a slow writer and a spinner, are tests/device_kernels.py's.)

    Calls act on the calling thread's current device, as the CUDA runtime does. Every method
    either succeeds or raises :class:`cudabridge.errors.CudaError` naming the call.
    """

    name: str = "abstract"

    # what the service's paths depend on (properties of the backend, never its name) ----------
    #: whether user kernels run as host kernels (kernels/host_kernels.py): Python functions
    #: standing in for CUDA kernels, loaded from the emulatedKernels modules; False: compiled ones
    runs_host_kernels: bool = False

    @property
    def native_driver(self) -> Any | None:
        """The driver table the service's C paths call (``cb_driver``, jvm/cuda_driver.h): an
        object whose ``address`` is the table's, kept alive by whoever uses it, or ``address`` 0
        for the installed CUDA driver, which the C code resolves itself (libcuda). None: this
        backend has none, and the Python reference runs in their place. Its ``function(kernel)``
        gives the function handle the C launch queues a kernel by (a ``CUfunction``), or None: that
        kernel is launched by the Python path."""
        return None

    def driver_error(self, call: str, code: int) -> CudaError:
        """The error for a raw driver code that a C path got from :attr:`native_driver`."""
        return CudaError(call, code, f"CUresult {code}")

    # devices -------------------------------------------------------------------------------
    @abc.abstractmethod
    def device_count(self) -> int: ...

    @abc.abstractmethod
    def set_device(self, ordinal: int) -> None: ...

    @abc.abstractmethod
    def get_device(self) -> int: ...

    @abc.abstractmethod
    def device_uuid(self, ordinal: int) -> str:
        """The device's UUID in nvidia-smi's spelling, ``GPU-xxxxxxxx-xxxx-...``."""

    @abc.abstractmethod
    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device."""

    @abc.abstractmethod
    def context_active(self, ordinal: int) -> bool:
        """Whether the device's primary context already exists (settings read at context
        creation, such as ``CUDA_DEVICE_MAX_CONNECTIONS``, can no longer take effect)."""

    @abc.abstractmethod
    def device_synchronize(self) -> None: ...

    # memory --------------------------------------------------------------------------------
    @abc.abstractmethod
    def malloc(self, nbytes: int) -> int:
        """Device memory on the current device. Raises :class:`DeviceAllocationFailed` when the
        device has no room (the pool treats that as "cannot grow", not as a crash)."""

    @abc.abstractmethod
    def free(self, ptr: int) -> None: ...

    def native_stream_query(self) -> int:
        """Address of a C function ``int f(void *stream)`` with ``cuStreamQuery``'s contract
        (0 done, 600 not ready), for the pool's C fast path; 0 where there is none."""
        return 0

    # virtual memory (cuMemAddressReserve / cuMemCreate / cuMemMap) ----------------------------
    # The pool grows its large-block arena as one contiguous range of address space mapped in
    # pieces, so that memory added later coalesces with free memory already there (separate
    # cudaMalloc chunks never can). A backend without it returns 0 and the pool uses chunks.
    def vmm_granularity(self) -> int:
        """Mapping granularity in bytes on the current device; 0 if virtual memory management
        is unsupported there."""
        return 0

    def va_reserve(self, nbytes: int) -> int:
        """Reserve ``nbytes`` (a multiple of the granularity) of device address space."""
        raise NotImplementedError(f"{self.name}: no virtual memory management")

    def va_release(self, ptr: int, nbytes: int) -> None:
        """Return a reservation; every mapping in it must be unmapped first."""
        raise NotImplementedError(f"{self.name}: no virtual memory management")

    def phys_create(self, nbytes: int) -> int:
        """Physical memory on the current device (a handle); raises DeviceAllocationFailed."""
        raise NotImplementedError(f"{self.name}: no virtual memory management")

    def phys_release(self, handle: int) -> None:
        raise NotImplementedError(f"{self.name}: no virtual memory management")

    def mem_map(self, ptr: int, nbytes: int, handle: int) -> None:
        """Map all of ``handle`` at ``ptr`` (inside a reservation) and make it readable and
        writable from the current device."""
        raise NotImplementedError(f"{self.name}: no virtual memory management")

    def mem_unmap(self, ptr: int, nbytes: int) -> None:
        raise NotImplementedError(f"{self.name}: no virtual memory management")

    # streams -------------------------------------------------------------------------------
    @abc.abstractmethod
    def stream_priority_range(self) -> tuple[int, int]:
        """(least, greatest) priority; greatest is numerically lowest, as in CUDA."""

    @abc.abstractmethod
    def stream_create(self, priority: int = 0) -> int:
        """A non-blocking stream (it does not synchronize with the legacy default stream)."""

    @abc.abstractmethod
    def stream_destroy(self, stream: int) -> None: ...

    @abc.abstractmethod
    def stream_query(self, stream: int) -> bool:
        """True when all work queued on the stream has completed."""

    @abc.abstractmethod
    def stream_synchronize(self, stream: int) -> None: ...

    @abc.abstractmethod
    def stream_wait_event(self, stream: int, event: int) -> None:
        """Later work on ``stream`` waits, on the device, for the event's latest record."""

    # events --------------------------------------------------------------------------------
    @abc.abstractmethod
    def event_create(self) -> int:
        """An event with timing disabled (the cheap kind)."""

    @abc.abstractmethod
    def event_destroy(self, event: int) -> None: ...

    @abc.abstractmethod
    def event_record(self, event: int, stream: int) -> None: ...

    @abc.abstractmethod
    def event_query(self, event: int) -> bool:
        """True when the latest record has completed, and (as in CUDA) for a never-recorded event."""

    @abc.abstractmethod
    def event_synchronize(self, event: int) -> None: ...

    # copies --------------------------------------------------------------------------------
    @abc.abstractmethod
    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Device to device."""

    @abc.abstractmethod
    def alloc_pinned(self, nbytes: int) -> Any:
        """Page-locked host memory (a ctypes char array): copies to and from it are truly
        asynchronous. Freed with :meth:`free_pinned`."""

    @abc.abstractmethod
    def free_pinned(self, buffer: Any) -> None: ...

    @abc.abstractmethod
    def host_register(self, address: int, nbytes: int) -> Any:
        """Page-lock memory the caller owns (``cudaHostRegister``): copies to and from it become
        asynchronous, as from :meth:`alloc_pinned` memory. Returns a ctypes char array over it,
        the handle for :meth:`host_unregister`. A range overlapping a registered one fails."""

    @abc.abstractmethod
    def host_unregister(self, region: Any) -> None: ...

    @abc.abstractmethod
    def copy_to_device_async(self, dst: int, host: Any, stream: int) -> None:
        """Copy a host buffer (buffer protocol, contiguous) to ``dst``. From pinned memory the
        copy is asynchronous (keep the buffer unchanged until the stream passes it); from pageable
        memory CUDA stages the data before returning, so the buffer may be reused at once."""

    @abc.abstractmethod
    def copy_from_device_async(self, host: Any, src: int, stream: int) -> None:
        """Copy into a writable host buffer. Into pinned memory it is asynchronous (valid once the
        stream passes it); into pageable memory CUDA returns only when the copy is done, which
        waits for all earlier work on the stream."""

    @abc.abstractmethod
    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None: ...

    # host functions ------------------------------------------------------------------------
    def launch_host_func(self, stream: int, fn: Callable[[], None]) -> None:
        """Queue a host function on ``stream`` (``cudaLaunchHostFunc``): it runs once the work queued
        before it has completed, and later work waits for it. It must not call the device. Where
        the backend has no such call it raises NotImplementedError."""
        raise NotImplementedError(f"{self.name}: no cudaLaunchHostFunc")

    def close(self, timeout_s: float | None = None) -> None:
        """Release backend-wide resources (worker threads, modules). Idempotent. ``timeout_s``:
        how long to wait, at most, for work still queued (None: the backend's own bound)."""


class InstalledDriver(NamedTuple):
    """:attr:`DeviceBackend.native_driver` of a CUDA device: the installed driver, whose entry
    points the C code resolves itself (cuGetProcAddress, jvm/cuda_driver.h)."""

    address: int = 0

    def function(self, kernel: Any) -> int | None:
        """A compiled kernel's ``CUfunction`` (kernels/cuda_module.py), or None."""
        function = getattr(kernel, "function", None)
        return None if function is None else int(function)


INSTALLED_DRIVER = InstalledDriver()


class DeviceAllocationFailed(Exception):
    """Raised by :meth:`DeviceBackend.malloc` when the device has no room."""

    def __init__(self, nbytes: int, detail: str = "") -> None:
        self.nbytes = nbytes
        super().__init__(f"device allocation of {nbytes} bytes failed{': ' + detail if detail else ''}")


def host_view(buffer: Any, writable: bool) -> memoryview:
    """A flat byte view of a contiguous host buffer, with a clear error for anything else."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(f"host buffer must support the buffer protocol, got {type(buffer).__name__}") from None
    if not view.c_contiguous:
        raise ValueError("host buffer must be C-contiguous")
    if writable and view.readonly:
        raise ValueError("host buffer to copy into is read-only")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view
