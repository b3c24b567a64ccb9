"""Numba's device memory from the service's pools: an External Memory Management plugin (EMM,
``interface_version`` 1) over the service's ``numba`` allocator (library_allocator.py says whose
each allocation is and how frees are made).

Install it before Numba creates a CUDA context (its first array or kernel): ``install(service)``
calls ``numba.cuda.set_memory_manager``; or ``NUMBA_CUDA_MEMORY_MANAGER=cudabridge.allocators.numba``
in the environment, with ``install(service)`` called before the first allocation (until then this
module's manager refuses, naming the fix).

Numba's interface has no stream: on a thread working for a task, an allocation is ordered on the
task's stream, elsewhere on the legacy default stream. Numba launches kernels and copies on the
legacy default stream unless given one, so task code passes the task's stream::

    stream = cudabridge.allocators.numba.task_stream(service)     # numba.cuda.external_stream
    d = numba.cuda.to_device(x, stream=stream)
    kernel[blocks, threads, stream](d)

Frees come from Numba's finalizer of each allocation (queued: safe on any thread); Numba's own
deferred-deallocation machinery is not used under an EMM plugin, so ``defer_cleanup`` has nothing
to hold back.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any

from ..errors import InvalidArgument
from . import allocator_for, import_library
from .library_allocator import LibraryAllocator, Service


# The allocator the manager class allocates through: Numba instantiates the class itself (once per
# context), so it is found here, set by install().
_allocator: LibraryAllocator | None = None
_module: Any = None   # the numba.cuda module install() set the manager of (task_stream() uses it)


def _numba_cuda() -> Any:
    """The module installed into, else the library imported."""
    return _module if _module is not None else _import_numba_cuda()


def _import_numba_cuda() -> Any:
    return import_library("numba.cuda", "numba")


def _device_pointer(cuda: Any) -> Any:
    """How Numba wants a device address: the NVIDIA binding's ``CUdeviceptr`` (numba-cuda's default),
    else a ctypes integer."""
    driver = cuda.cudadrv.driver
    if getattr(driver, "USE_NV_BINDING", True):
        return driver.binding.CUdeviceptr
    import ctypes

    return ctypes.c_uint64


def manager_class(cuda: Any) -> type:
    """The EMM plugin class over ``cuda`` (the ``numba.cuda`` module, or the tests' stand-in)."""
    base = cuda.HostOnlyCUDAMemoryManager
    pointer_type = _device_pointer(cuda)
    memory_pointer = cuda.MemoryPointer
    memory_info = cuda.cudadrv.driver.MemoryInfo

    class CudaBridgeMemoryManager(base):   # type: ignore[misc, valid-type]
        """Numba's device memory from cudabridge's pools (cudabridge.allocators.numba)."""

        def initialize(self) -> None:
            if _allocator is None:
                raise InvalidArgument("Numba's memory manager is cudabridge's, but no service installed it: call "
                                      "cudabridge.allocators.numba.install(service) before Numba's first allocation")

        def memalloc(self, size: int) -> Any:
            allocator = _allocator
            if allocator is None:
                self.initialize()
            if size == 0:   # an empty array: no memory (the pool refuses 0 bytes), nothing to free
                return memory_pointer(self.context, pointer_type(0), 0)
            device = self.context.device.id
            a = allocator.allocate(size, device)
            return memory_pointer(self.context, pointer_type(a.ptr), size, finalizer=partial(allocator.free, a))

        def get_memory_info(self) -> Any:
            pool = _allocator._pools[self.context.device.id] if _allocator is not None else None
            if pool is None:
                self.initialize()
            stats = pool.statistics()
            return memory_info(free=max(0, stats.limit_bytes - stats.in_use_bytes), total=stats.limit_bytes)

        def get_ipc_handle(self, memory: Any) -> Any:
            raise InvalidArgument("cudabridge's pools do not export memory to other processes (no IPC handles)")

        def reset(self) -> None:
            if _allocator is not None:
                _allocator.drain()

        def defer_cleanup(self) -> Any:
            return contextlib.nullcontext()

        @property
        def interface_version(self) -> int:
            return 1

    return CudaBridgeMemoryManager


def install(service: Service, *, module: Any = None) -> LibraryAllocator:
    """Make Numba allocate from ``service``'s pools, process-wide (before Numba's first context).
    ``module``: the ``numba.cuda`` module to install into (default: imported; the tests pass a
    stand-in with the same interface)."""
    global _allocator, _module
    cuda = module if module is not None else _import_numba_cuda()
    allocator = allocator_for(service, "numba")
    if _allocator is not None and _allocator is not allocator and not _allocator.closed:
        raise InvalidArgument("Numba's memory manager is installed for another, open cudabridge service")
    _allocator = allocator
    cuda.set_memory_manager(manager_class(cuda))
    _module = cuda
    return allocator


def task_stream(service: Service, task_id: int | None = None) -> Any:
    """The task's stream as a Numba stream (``numba.cuda.external_stream``), for ``task_id`` or the
    calling thread's task."""
    cuda = _numba_cuda()
    registry = service.registry
    binding = registry.current() if task_id is None else registry.binding(task_id)
    return cuda.external_stream(binding.stream)


def __getattr__(name: str) -> Any:
    """``_numba_memory_manager``: what ``NUMBA_CUDA_MEMORY_MANAGER=cudabridge.allocators.numba``
    reads (made at the first read: it needs numba itself)."""
    if name == "_numba_memory_manager":
        return manager_class(_numba_cuda())
    raise AttributeError(name)
