"""Stand-ins for CuPy, Numba and RMM on the emulated device (which none of them runs on): each
offers the slice of its library's interface that cudabridge.allocators uses, and allocates and
frees the way the library does, so that the plug-ins' own code runs unchanged against them.

* CuPy (:class:`StandinCupy`): ``cuda.set_allocator(malloc)`` with ``malloc(size) ->
  MemoryPointer``; ``UnownedMemory(ptr, size, owner, device)`` keeps its owner until the memory
  object goes, which happens when the last array over it is dropped, on whatever thread drops it
  (CuPy's ``__dealloc__``); ``get_current_stream()`` is per thread (``with stream:``);
  ``cuda.Stream.from_external(obj)`` over the CUDA stream protocol.
* Numba (:class:`StandinNumbaCuda`): ``set_memory_manager(cls)``, and a context that instantiates
  it (``cls(context=ctx)``), calls ``initialize()`` and then ``memalloc(size)`` per device array;
  Numba's ``MemoryPointer`` runs its finalizer when the pointer object is collected
  (``weakref.finalize``); no stream anywhere.
* RMM (:class:`StandinRmm`): ``mr.CallbackMemoryResource(allocate(size, stream) -> int,
  deallocate(ptr, size, stream))`` and ``mr.set_per_device_resource``; a ``DeviceBuffer`` asks its
  device's resource and gives its address back by value when it goes.

Device work is the tests' slow writer (device_kernels.fill_u32_async) on the library's stream, so
that the emulated device's race detector sees the libraries' accesses.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from types import SimpleNamespace
from typing import Any, Callable

from device_kernels import fill_u32_async


# CuPy ------------------------------------------------------------------------------------------
class _UnownedMemory:
    def __init__(self, ptr: int, size: int, owner: Any, device_id: int = -1) -> None:
        self.ptr, self.size, self._owner, self.device_id = ptr, size, owner, device_id


class _MemoryPointer:
    def __init__(self, mem: _UnownedMemory, offset: int) -> None:
        self.mem, self.ptr = mem, mem.ptr + offset


class _CupyStream:
    """A stream as CuPy sees it: a handle, and ``with s:`` makes it current on the thread."""

    def __init__(self, library: "StandinCupy", ptr: int) -> None:
        self._library, self.ptr = library, ptr

    def __enter__(self) -> "_CupyStream":
        stack = self._library._local.__dict__.setdefault("streams", [])
        stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._library._local.streams.pop()


class StandinArray:
    """A CuPy array: holds its memory pointer; dropping the last one frees the memory."""

    def __init__(self, data: _MemoryPointer, nbytes: int) -> None:
        self.data, self.nbytes = data, nbytes


class StandinCupy:
    def __init__(self, backend: Any, device: int = 0) -> None:
        self.backend = backend
        self._device = device
        self._allocator: Callable[[int], _MemoryPointer] | None = None
        self._local = threading.local()
        library = self

        class Stream:
            @staticmethod
            def from_external(obj: Any) -> _CupyStream:
                return _CupyStream(library, obj.__cuda_stream__()[1])

        memory = SimpleNamespace(UnownedMemory=_UnownedMemory, MemoryPointer=_MemoryPointer)
        runtime = SimpleNamespace(getDevice=lambda: self._device)
        self.cuda = SimpleNamespace(memory=memory, runtime=runtime, set_allocator=self._set_allocator,
                                    get_current_stream=self.get_current_stream, Stream=Stream)

    def _set_allocator(self, allocator: Callable[[int], _MemoryPointer] | None) -> None:
        self._allocator = allocator

    def get_current_stream(self) -> _CupyStream:
        stack = self._local.__dict__.get("streams")
        return stack[-1] if stack else _CupyStream(self, 0)   # CuPy's default: the null stream

    def stream(self, handle: int) -> _CupyStream:
        return _CupyStream(self, handle)

    def empty(self, nbytes: int) -> StandinArray:
        return StandinArray(self._allocator(nbytes), nbytes)

    def fill(self, array: StandinArray, value: int, delay_s: float = 0.0) -> None:
        """A kernel on the current stream writing every word of ``array``."""
        fill_u32_async(self.backend, array.data.ptr, array.nbytes // 4, value, self.get_current_stream().ptr, delay_s)


# Numba -----------------------------------------------------------------------------------------
class _NumbaMemoryPointer:
    def __init__(self, context: Any, pointer: Any, size: int, owner: Any = None, finalizer: Any = None) -> None:
        self.context, self.device_pointer, self.size = context, pointer, size
        if finalizer is not None:
            weakref.finalize(self, finalizer)

    @property
    def device_ctypes_pointer(self) -> Any:
        return self.device_pointer


class _HostOnlyCUDAMemoryManager:
    def __init__(self, *args: Any, context: Any = None, **kwargs: Any) -> None:
        self.context = context


class StandinNumbaCuda:
    """``numba.cuda`` as the plug-in reaches it; ``device_array(nbytes)`` allocates the way Numba does."""

    HostOnlyCUDAMemoryManager = _HostOnlyCUDAMemoryManager
    MemoryPointer = _NumbaMemoryPointer

    def __init__(self, backend: Any, device: int = 0) -> None:
        self.backend = backend
        self.cudadrv = SimpleNamespace(driver=SimpleNamespace(
            USE_NV_BINDING=False, MemoryInfo=lambda free, total: SimpleNamespace(free=free, total=total)))
        self._device = SimpleNamespace(id=device)
        self._manager_class: type | None = None
        self._manager: Any = None

    def set_memory_manager(self, cls: type) -> None:
        if self._manager is not None:
            raise RuntimeError("the memory manager cannot change once a context exists")
        self._manager_class = cls

    def _context(self) -> Any:
        if self._manager is None:   # Numba's first context: the manager is made and initialized
            context = SimpleNamespace(device=self._device)
            self._manager = self._manager_class(context=context)
            self._manager.initialize()
        return self._manager

    def device_array(self, nbytes: int) -> _NumbaMemoryPointer:
        return self._context().memalloc(nbytes)

    def get_memory_info(self) -> Any:
        return self._context().get_memory_info()

    @staticmethod
    def external_stream(ptr: int) -> Any:
        return SimpleNamespace(handle=ctypes.c_void_p(ptr))


# RMM -------------------------------------------------------------------------------------------
class _CallbackMemoryResource:
    def __init__(self, allocate: Callable[[int, Any], int], deallocate: Callable[[int, int, Any], None]) -> None:
        self.allocate, self.deallocate = allocate, deallocate


class StandinDeviceBuffer:
    """RMM's DeviceBuffer: memory from its device's current resource, given back by address."""

    def __init__(self, library: "StandinRmm", size: int, stream: int = 0, device: int = 0) -> None:
        self._mr, self.size, self.stream = library.resources[device], size, stream
        self.ptr = self._mr.allocate(size, stream)

    def __del__(self) -> None:
        self._mr.deallocate(self.ptr, self.size, self.stream)


class StandinRmm:
    def __init__(self) -> None:
        self.resources: dict[int, _CallbackMemoryResource] = {}
        self.mr = SimpleNamespace(CallbackMemoryResource=_CallbackMemoryResource,
                                  set_per_device_resource=self.resources.__setitem__)

    def device_buffer(self, size: int, stream: int = 0, device: int = 0) -> StandinDeviceBuffer:
        return StandinDeviceBuffer(self, size, stream, device)
