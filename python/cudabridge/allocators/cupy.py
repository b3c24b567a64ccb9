"""CuPy's device memory from the service's pools: ``install(service)`` sets CuPy's allocator
(``cupy.cuda.set_allocator``, process-wide) to one over the service's ``cupy`` allocator
(library_allocator.py says whose each allocation is and how frees are made).

CuPy passes no stream: an allocation is ordered on CuPy's current stream of the thread and device
(``cupy.cuda.get_current_stream()``), so task code runs CuPy on the task's stream::

    with cudabridge.allocators.cupy.task_stream(service):   # the thread's task (attach)
        y = cupy.asarray(x) * 2                             # allocated and run on the task's stream

On CuPy's default stream, allocations are still safe (ordered on the legacy default stream) but
the work does not run on the task's stream. Another stream of the user's own is refused unless it
is registered with the GPU's pool (``service.memory_pool(gpu).register_stream(s.ptr)``).

Each allocation is a ``cupy.cuda.UnownedMemory`` whose owner frees it (queued: safe in CuPy's
``__dealloc__`` on any thread) when CuPy drops the memory: the free is tied to the allocation
itself, not to its address, so a late free of memory reclaimed at its task's release is counted
and dropped.

A Python callable, not ``cupy.cuda.memory.CFunctionAllocator``, although the C route would save
the callable's frame: CuPy gives a C ``malloc`` no way to fail. ``CFunctionAllocatorMemory``
stores whatever address it returns (``self.ptr = _call_malloc(...)``, cupy/cuda/memory.pyx), so
an allocation the pool refuses (out of memory, a task being released, a stream it does not know)
would become an array at address 0 with an exception left pending, not an error at the call;
and its free names only the address. The callable raises CuPy's caller a typed error. It is a C
object where the allocator runs on its C twin (``_library_core.c``'s ``CupyMalloc``, with the
``CupyOwner`` as the memory's owner): no Python frame of ours per allocation or free. What it
costs against CuPy's own pool pair is measured by bench/bench_allocators.py.
"""

from __future__ import annotations

from typing import Any

from . import allocator_for, import_library
from .library_allocator import LibraryAllocator, Service



class _Release:
    """The owner of one allocation's ``UnownedMemory``: dropped with it, it queues the free."""

    __slots__ = ("allocator", "allocation")

    def __init__(self, allocator: LibraryAllocator, allocation: Any) -> None:
        self.allocator = allocator
        self.allocation = allocation

    def __del__(self) -> None:
        a = self.allocation
        if a is not None:   # None: handed over (hand_over), the task's now
            self.allocator.free(a)


def hand_over(array: Any, task_id: int) -> Any:
    """The allocation under a CuPy ``array`` made by this plug-in for task ``task_id``, detached
    from CuPy (dropping the array no longer frees it) and now the task's alone; None when the
    array's memory is not such an allocation from its start (another library's, a view into the
    middle, another task's, handed over already): the caller copies it then. Python code must
    keep no other reference to the array: its memory is freed by whoever the task hands it to."""
    data = getattr(array, "data", None)
    mem = getattr(data, "mem", None)
    owner = getattr(mem, "_owner", None)
    if owner.__class__ not in _OWNERS:
        return None
    a = owner.allocation
    if a is None or a.owner != task_id or data.ptr != a.ptr or not a.alive:
        return None
    owner.allocator.hand_over(a)
    owner.allocation = None
    return a


# The owners of this plug-in's allocations: the reference's, and the C twin's where it is built
# (whether or not the switch lets it run now: an allocator made later may run on it).
try:
    from ._library_core import CupyOwner as _CupyOwner
    _OWNERS: tuple[type, ...] = (_Release, _CupyOwner)
except ImportError:
    _OWNERS = (_Release,)

# The cupy module install() set the allocator of (task_stream() makes its streams).
_module: Any = None


def _cupy() -> Any:
    """The module installed into, else the library imported."""
    return _module if _module is not None else _import_cupy()


def _import_cupy() -> Any:
    return import_library("cupy", "cupy")


def reference_malloc(allocator: LibraryAllocator, cupy: Any) -> Any:
    """The Python ``malloc`` (``size`` -> ``MemoryPointer``): the C twin's reference, which it hands
    every call it does not take, and CuPy's callable where the allocator has no C twin."""
    memory = cupy.cuda.memory
    unowned, pointer = memory.UnownedMemory, memory.MemoryPointer
    get_device = cupy.cuda.runtime.getDevice
    current_stream = cupy.cuda.get_current_stream
    # the reference allocate (also where the C twin runs: the calls the C malloc hands over were
    # handed over by the allocation's twin already)
    allocate = type(allocator).allocate.__get__(allocator)

    def malloc(size: int) -> Any:
        device = get_device()
        if size == 0:   # CuPy asks for empty arrays too; the pool refuses 0 bytes
            return pointer(unowned(0, 0, None, device), 0)
        a = allocate(size, device, current_stream().ptr)
        return pointer(unowned(a.ptr, a.size, _Release(allocator, a), device), 0)

    return malloc


def make_malloc(allocator: LibraryAllocator, cupy: Any) -> Any:
    """The callable CuPy calls for each allocation (``size`` -> ``MemoryPointer``): the C twin
    (``_library_core.c``'s ``CupyMalloc``, whose allocations' owner is its ``CupyOwner``) where the
    allocator runs on its C twin, else :func:`reference_malloc`."""
    malloc = reference_malloc(allocator, cupy)
    core = allocator.core
    if core is None:
        return malloc
    memory = cupy.cuda.memory
    return core.cupy_malloc(allocator, memory.UnownedMemory, memory.MemoryPointer, cupy.cuda.runtime.getDevice,
                            cupy.cuda.get_current_stream, malloc)


def install(service: Service, *, module: Any = None) -> LibraryAllocator:
    """Make CuPy allocate from ``service``'s pools, process-wide. Returns the library's allocator.
    ``module``: the ``cupy`` module to install into (default: ``import cupy``; the tests pass a
    stand-in with the same interface)."""
    global _module
    cupy = module if module is not None else _import_cupy()
    allocator = allocator_for(service, "cupy")
    cupy.cuda.set_allocator(make_malloc(allocator, cupy))
    _module = cupy
    return allocator


def uninstall() -> None:
    """Give CuPy its own memory pool back (memory already allocated stays with our pools)."""
    cupy = _cupy()
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)


class _TaskStream:
    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:   # the CUDA stream protocol (version 0)
        return (0, self.handle)


def task_stream(service: Service, task_id: int | None = None) -> Any:
    """The task's stream as a CuPy stream (a context manager: ``with task_stream(service):``),
    for ``task_id`` or the calling thread's task. CuPy neither owns nor destroys it."""
    cupy = _cupy()
    registry = service.registry
    binding = registry.current() if task_id is None else registry.binding(task_id)
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:   # CuPy 14: ExternalStream is deprecated
        return from_external(_TaskStream(binding.stream))
    return cupy.cuda.ExternalStream(binding.stream, binding.gpu)
