"""RMM's device memory (and so cuDF's) from the service's pools, where ``rmm`` is installed:
``install(service)`` sets, for each GPU the service owns, a memory resource over the service's
``rmm`` allocator as RMM's current device resource (``rmm.mr.set_per_device_resource``; cuDF
allocates from ``rmm.mr.get_current_device_resource()``). library_allocator.py says whose each
allocation is and how frees are made.

The route: ``rmm.mr.CallbackMemoryResource``, two Python callables. RMM's documentation calls
it a debugging aid with a large cost; its Python API has no other way into memory it does not
own without compiling C++ against librmm at run time (a ``device_memory_resource`` subclass),
which an executor cannot be asked to do. What it costs is measured in bench/RESULTS.md.

RMM passes the allocation's stream (cuDF's, usually the default stream unless the caller gives
one) to both calls, and frees by address: the library allocator's pointer rules apply (an
address reclaimed at its task's release is never handed out again until RMM frees it).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgument
from . import allocator_for, import_library
from .library_allocator import LibraryAllocator, Service



def stream_handle(stream: Any) -> int:
    """The CUDA stream handle behind RMM's stream argument (an ``rmm`` ``Stream``, a
    ``cuda_stream_view``'s handle, or the CUDA stream protocol)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        return int(protocol()[1])
    value = getattr(stream, "value", None)
    if callable(value):
        return int(value())
    raise InvalidArgument(f"cannot read a CUDA stream handle from {type(stream).__name__}")


def make_resource(allocator: LibraryAllocator, rmm: Any, device: int) -> Any:
    """The memory resource of GPU ``device`` over ``allocator`` (``rmm`` the module or the tests'
    stand-in)."""
    allocate, free = allocator.allocate_pointer, allocator.free_pointer

    def on_allocate(size: int, stream: Any) -> int:
        return allocate(size, device, stream_handle(stream))

    def on_deallocate(ptr: int, size: int, stream: Any) -> None:
        free(ptr)

    return rmm.mr.CallbackMemoryResource(on_allocate, on_deallocate)


def install(service: Service, *, module: Any = None) -> LibraryAllocator:
    """Make RMM (and cuDF) allocate from ``service``'s pools on every GPU the service owns.
    ``module``: the ``rmm`` module to install into (default: ``import rmm``; the tests pass a
    stand-in with the same interface)."""
    rmm = module if module is not None else import_library("rmm", "rmm")
    allocator = allocator_for(service, "rmm")
    for device in sorted(service.gpus):
        rmm.mr.set_per_device_resource(device, make_resource(allocator, rmm, device))
    return allocator
