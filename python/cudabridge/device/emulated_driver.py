"""The emulated device as the C paths' CUDA driver: a ``cb_driver`` table (jvm/cuda_driver.h)
whose entry points are this module's functions over one backend's public calls.

Why: from Java, copies and launches run C code that calls the driver through that table (the
JNI library's staging ring and page-locked copies, bridge/copies.h; the hot path's launch,
jvm/hotcore_kernels.h). On a GPU the table is libcuda's, resolved by the C code itself; here the
same C code gets this one, so CI runs it against the emulated device, under its race detector,
instead of running the Python reference in its place.

How each entry point maps (the C code passes handles as pointers; the backend's are ints):

* contexts: GPU ``n``'s primary context is the pointer ``n + 1``; ``cuCtxSetCurrent`` is the
  backend's ``set_device`` (per thread, as a current context is), ``cuCtxGetCurrent`` its
  ``get_device`` (a thread always has one: the emulated device has no context-less thread);
* copies: ``cuMemcpyHtoDAsync`` / ``cuMemcpyDtoHAsync`` take a host address; a range inside one
  of the backend's page-locked buffers or registered regions becomes a view of that buffer, so
  the copy is asynchronous exactly as from ``alloc_pinned`` memory, and any other range a raw
  view, which the backend treats as pageable (staged before return, or waited for);
* events and streams: the backend's own (``event_create`` ... ``stream_synchronize``), a pending
  event querying as ``CUDA_ERROR_NOT_READY``;
* ``cuLaunchKernel``: the function is a handle from :meth:`EmulatedDriver.function`, which names
  a host kernel; its parameters are read back from the C parameter buffer by the kernel's kinds
  (device/params.py) and it is queued with the backend's ``launch_host_kernel``. A pointer is
  passed on with the extent the caller gave just before, through the table's one entry that is
  not the driver's, ``cbLaunchExtents`` (cuda_driver.h): the bytes the kernel may touch there, as
  the Python path passes them (a ``DevicePointer``), so that the race detector sees the same
  accesses from both paths.

Errors: a call that raises :class:`CudaError` returns its code (the emulated codes are the
runtime's, which equal the driver's for every code used here); anything else returns
``CUDA_ERROR_UNKNOWN`` after writing the exception to ``sys.unraisablehook`` (a bug to see, never
to crash the caller: the C side runs without Python's frames above it). ctypes takes the GIL
for each call, so the C side calls these with or without it.

Lifetime: the table and its functions live as long as this object, which the backend keeps for
its own life and each C user keeps a reference to (HotCore's ``driver``). After the backend's
``close()`` every entry point returns ``CUDA_ERROR_DEINITIALIZED``.
"""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
from typing import Any

from ..errors import CudaError
from .launch_config import LaunchConfig
from .params import PARAM_KINDS, DevicePointer

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_DEINITIALIZED = 4
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_UNKNOWN = 999

# The driver's names of the codes the emulated device raises or these functions return.
ERROR_NAMES = {
    0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 4: "CUDA_ERROR_DEINITIALIZED",
    101: "CUDA_ERROR_INVALID_DEVICE", 201: "CUDA_ERROR_INVALID_CONTEXT", 400: "CUDA_ERROR_INVALID_HANDLE",
    500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", 713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
    719: "CUDA_ERROR_LAUNCH_FAILED", 801: "CUDA_ERROR_NOT_SUPPORTED", 999: "CUDA_ERROR_UNKNOWN",
}

_R = ctypes.c_int      # CUresult
_P = ctypes.c_void_p   # a handle, a host pointer
_PP = ctypes.POINTER(ctypes.c_void_p)
_U = ctypes.c_uint

# cb_driver's fields in its order (cuda_driver.h): name, ctypes prototype
_ENTRY_POINTS: tuple[tuple[str, Any], ...] = (
    ("cuInit", ctypes.CFUNCTYPE(_R, _U)),
    ("cuDeviceGet", ctypes.CFUNCTYPE(_R, ctypes.POINTER(ctypes.c_int), ctypes.c_int)),
    ("cuDevicePrimaryCtxRetain", ctypes.CFUNCTYPE(_R, _PP, ctypes.c_int)),
    ("cuDevicePrimaryCtxRelease", ctypes.CFUNCTYPE(_R, ctypes.c_int)),
    ("cuCtxGetCurrent", ctypes.CFUNCTYPE(_R, _PP)),
    ("cuCtxSetCurrent", ctypes.CFUNCTYPE(_R, _P)),
    ("cuLaunchKernel", ctypes.CFUNCTYPE(_R, _P, _U, _U, _U, _U, _U, _U, _U, _P, _PP, _PP)),
    ("cuGetErrorName", ctypes.CFUNCTYPE(_R, _R, ctypes.POINTER(ctypes.c_char_p))),
    ("cuMemHostAlloc", ctypes.CFUNCTYPE(_R, _PP, ctypes.c_size_t, _U)),
    ("cuMemFreeHost", ctypes.CFUNCTYPE(_R, _P)),
    ("cuMemcpyHtoDAsync", ctypes.CFUNCTYPE(_R, ctypes.c_ulonglong, _P, ctypes.c_size_t, _P)),
    ("cuMemcpyDtoHAsync", ctypes.CFUNCTYPE(_R, _P, ctypes.c_ulonglong, ctypes.c_size_t, _P)),
    ("cuEventCreate", ctypes.CFUNCTYPE(_R, _PP, _U)),
    ("cuEventDestroy", ctypes.CFUNCTYPE(_R, _P)),
    ("cuEventRecord", ctypes.CFUNCTYPE(_R, _P, _P)),
    ("cuEventSynchronize", ctypes.CFUNCTYPE(_R, _P)),
    ("cuEventQuery", ctypes.CFUNCTYPE(_R, _P)),
    ("cuStreamSynchronize", ctypes.CFUNCTYPE(_R, _P)),
    # not the driver's: the model's (cuda_driver.h): each parameter's extent, before a launch
    ("cbLaunchExtents", ctypes.CFUNCTYPE(_R, ctypes.POINTER(ctypes.c_longlong), ctypes.c_int)),
)


class DriverTable(ctypes.Structure):
    """``cb_driver`` (jvm/cuda_driver.h), field for field; tests/test_emulated_driver.py checks the
    header still lists these entry points in this order."""

    _fields_ = [("ready", ctypes.c_int), ("failure", ctypes.c_char * 256)] + list(_ENTRY_POINTS)


def _int(handle: int | None) -> int:
    return 0 if handle is None else int(handle)


class EmulatedDriver:
    """One backend's driver table (see the module docstring). ``address`` is the table's, for the
    C paths; :meth:`function` gives a host kernel the function handle they launch it by."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._closed = False
        self._lock = threading.Lock()
        self._functions: dict[int, Any] = {}     # handle -> host kernel
        self._function_of: dict[int, int] = {}   # id(host kernel) -> handle
        self._host_allocs: dict[int, Any] = {}   # cuMemHostAlloc's address -> its buffer
        self._extents = threading.local()         # .pending: cbLaunchExtents' list, for the next launch
        self._names = {code: ctypes.c_char_p(name.encode()) for code, name in ERROR_NAMES.items()}
        self._callbacks = []                     # the ctypes functions: alive as long as the table
        table = DriverTable()
        for name, proto in _ENTRY_POINTS:
            fn = proto(self._entry(getattr(self, "_" + name)))
            self._callbacks.append(fn)
            setattr(table, name, fn)
        table.ready = 1
        self._table = table

    @property
    def address(self) -> int:
        """The ``cb_driver`` table's address (valid while this object lives)."""
        return ctypes.addressof(self._table)

    def close(self) -> None:
        """From now on every entry point returns ``CUDA_ERROR_DEINITIALIZED`` (the backend closed)."""
        self._closed = True

    def function(self, host_kernel: Any) -> int | None:
        """The function handle ``cuLaunchKernel`` takes for ``host_kernel`` (one per kernel object,
        kept while this driver lives, as a module keeps its functions): a host kernel of a loaded
        module, bound to its GPU as a CUDA function is; None for anything else (a bare host kernel
        runs on any GPU: the Python path launches it)."""
        if getattr(host_kernel, "fn", None) is None or getattr(host_kernel, "gpu", None) is None:
            return None
        with self._lock:
            handle = self._function_of.get(id(host_kernel))
            if handle is None or self._functions[handle] is not host_kernel:
                handle = 0x10 * (len(self._functions) + 1)
                self._functions[handle] = host_kernel
                self._function_of[id(host_kernel)] = handle
            return handle

    # the entry points ---------------------------------------------------------------------
    def _entry(self, fn: Any) -> Any:
        def call(*args: Any) -> int:
            if self._closed:
                return CUDA_ERROR_DEINITIALIZED
            try:
                rc = fn(*args)
            except CudaError as exc:
                return exc.code if exc.code else CUDA_ERROR_UNKNOWN
            except BaseException as exc:   # noqa: BLE001 - nothing may unwind into the C caller
                sys.unraisablehook(sys.UnraisableHookArgs(type(exc), exc, exc.__traceback__,  # type: ignore[attr-defined]
                                                          f"the emulated driver's {fn.__name__[1:]}", None))
                return CUDA_ERROR_UNKNOWN
            return CUDA_SUCCESS if rc is None else rc
        return call

    def _cuInit(self, flags: int) -> None:
        return None

    def _cuDeviceGet(self, out: Any, ordinal: int) -> int | None:
        if not 0 <= ordinal < self._backend.device_count():
            return 101   # CUDA_ERROR_INVALID_DEVICE
        out[0] = ordinal
        return None

    def _cuDevicePrimaryCtxRetain(self, out: Any, device: int) -> int | None:
        if not 0 <= device < self._backend.device_count():
            return 101
        out[0] = device + 1
        return None

    def _cuDevicePrimaryCtxRelease(self, device: int) -> None:
        return None

    def _cuCtxGetCurrent(self, out: Any) -> None:
        out[0] = self._backend.get_device() + 1

    def _cuCtxSetCurrent(self, ctx: int | None) -> int | None:
        if ctx is None:   # no context current: the emulated device's threads always have one
            return None
        if not 1 <= ctx <= self._backend.device_count():
            return CUDA_ERROR_INVALID_CONTEXT
        self._backend.set_device(ctx - 1)
        return None

    def _cuGetErrorName(self, code: int, out: Any) -> int | None:
        name = self._names.get(code)
        if name is None:
            return CUDA_ERROR_INVALID_VALUE
        out[0] = name.value
        return None

    def _cuMemHostAlloc(self, out: Any, nbytes: int, flags: int) -> None:
        buffer = self._backend.alloc_pinned(nbytes)
        address = ctypes.addressof(buffer)
        self._host_allocs[address] = buffer
        out[0] = address

    def _cuMemFreeHost(self, address: int | None) -> int | None:
        buffer = self._host_allocs.pop(_int(address), None)
        if buffer is None:
            return CUDA_ERROR_INVALID_VALUE
        self._backend.free_pinned(buffer)
        return None

    def _cuMemcpyHtoDAsync(self, dst: int, src: int | None, nbytes: int, stream: int | None) -> None:
        if nbytes:
            self._backend.copy_to_device_async(dst, self._backend.host_view_at(_int(src), nbytes), _int(stream))

    def _cuMemcpyDtoHAsync(self, dst: int | None, src: int, nbytes: int, stream: int | None) -> None:
        if nbytes:
            self._backend.copy_from_device_async(self._backend.host_view_at(_int(dst), nbytes), src, _int(stream))

    def _cuEventCreate(self, out: Any, flags: int) -> None:
        out[0] = self._backend.event_create()

    def _cuEventDestroy(self, event: int | None) -> None:
        self._backend.event_destroy(_int(event))

    def _cuEventRecord(self, event: int | None, stream: int | None) -> None:
        self._backend.event_record(_int(event), _int(stream))

    def _cuEventSynchronize(self, event: int | None) -> None:
        self._backend.event_synchronize(_int(event))

    def _cuEventQuery(self, event: int | None) -> int:
        return CUDA_SUCCESS if self._backend.event_query(_int(event)) else CUDA_ERROR_NOT_READY

    def _cuStreamSynchronize(self, stream: int | None) -> None:
        self._backend.stream_synchronize(_int(stream))

    def _cbLaunchExtents(self, extents: Any, n: int) -> None:
        self._extents.pending = [extents[i] for i in range(n)]

    def _cuLaunchKernel(self, function: int | None, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                        shared: int, stream: int | None, params: Any, extra: Any) -> int | None:
        kernel = self._functions.get(_int(function))
        if kernel is None:
            return CUDA_ERROR_INVALID_HANDLE
        if extra:
            return CUDA_ERROR_INVALID_VALUE   # the C paths pass their parameters in kernelParams alone
        extents, self._extents.pending = getattr(self._extents, "pending", None), None
        if extents is not None and len(extents) != len(kernel.signature):
            return CUDA_ERROR_INVALID_VALUE
        args: list[Any] = []
        for i, kind in enumerate(kernel.signature):
            fmt, size = PARAM_KINDS[kind]
            value = struct.unpack("<" + fmt, ctypes.string_at(params[i], size))[0]
            if kind == "ptr" and extents is not None and extents[i] > 0:
                value = DevicePointer(value, extents[i])   # the bytes it may touch (cbLaunchExtents)
            args.append(value)
        self._backend.launch_host_kernel(_int(stream), kernel, LaunchConfig((gx, gy, gz), (bx, by, bz), shared), args)
        return None
