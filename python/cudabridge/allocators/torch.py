"""PyTorch's CUDA memory from the service's pools: ``install(service)`` makes a
``torch.cuda.memory.CUDAPluggableAllocator`` over this package's compiled part
(``_torch_allocator.cpp``: ``cb_torch_alloc`` / ``cb_torch_free``, and the ``record_stream`` and
``empty_cache`` hooks) PyTorch's current allocator, over the service's ``torch`` allocator
(library_allocator.py says whose each allocation is and how frees are made).

PyTorch takes a new allocator only before it has allocated (``change_current_allocator`` raises
after), so the service installs it when it starts, where the ``allocators`` setting names torch.

What PyTorch passes: the current stream of the device at each allocation, and the same stream at
its free, which the pool already knows from the allocation (and any stream named since through
``Tensor.record_stream``, which the hook forwards: without it ``record_stream`` would do nothing
under a pluggable allocator). PyTorch allocates on threads of its own (autograd's backward): an
allocation on a thread not attached to a task is the task's whose stream it names, if one task
has that stream (``by_stream``). Streams PyTorch names that the pool does not know are registered
with the GPU's pool for the service's life: PyTorch's own streams (``torch.cuda.Stream()``) come
from its stream pool, made once and never destroyed; an ``ExternalStream`` over a stream of your
own must outlive the service.

What PyTorch gives up under a pluggable allocator: its caching (each tensor is one pool call; the
pool's own free lists take that role), and its statistics, which raise there
(``torch.cuda.memory_stats``, ``memory_allocated``, ``max_memory_allocated``,
``reset_peak_memory_stats``, ``memory_snapshot``): read the service's instead
(``allocator_torch_in_use_bytes``, and the pool's ``peak_in_use_bytes`` for the executor's peak, in
``service.statistics()`` and the executor's metrics). ``torch.cuda.MemPool(allocator)`` would keep
torch's caching above our pool for one thread's allocations; docs/allocators.md says why the
global swap is the default.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from ..errors import InvalidArgument
from . import allocator_for, import_library
from .library_allocator import LibraryAllocator, Service


# The compiled part's symbols (torch loads them by name).
ALLOC, FREE = "cb_torch_alloc", "cb_torch_free"


def compiled_part() -> Any:
    """The compiled part (``cudabridge.allocators._torch_allocator``)."""
    try:
        from . import _torch_allocator as part
    except ImportError as exc:
        raise InvalidArgument(f"the torch allocator's compiled part is not built ({exc}): reinstall "
                              f"spark-cuda-bridge, or python -m cudabridge.memory.build_fastpath") from exc
    return part


def attach(service: Service) -> LibraryAllocator:
    """Point the compiled part at ``service``'s torch allocator, without touching torch: its four
    functions call the allocator's methods directly (its C twin's, where built: no Python frame). The
    part serves one service at a time: a later service's attach takes the place of the last only
    once torch has freed every tensor the part made for it (a later free would reach the new
    service's allocator, which may have handed the same address out again); until then it raises
    :class:`~cudabridge.errors.InvalidArgument` and changes nothing."""
    part = compiled_part()
    token = _owner_token(service)
    part.check_owner(token)   # before the allocator is made; connect checks again as it switches
    allocator = allocator_for(service, "torch", by_stream=True, register_streams=True)
    part.connect(token, allocator.allocate_pointer_owned, allocator.free_pointer, allocator.record_stream_pointer,
                 allocator.drain, allocator.owner_for)
    part.keep_at_most(service.config.torch_kept_frees)   # once connected: a refused connect changes nothing
    allocator.pending_frees = part.flush   # torch's frees wait in the part, GIL-free, until a drain takes them
    allocator.reused_frees = functools.partial(part.reuses, token)   # and the kept ones its allocations took back
    return allocator


# The compiled part's owner for each service: a bare object made once per service, so that the part,
# which keeps its last owner, never keeps a closed service alive (and, unlike an id, it cannot be
# reused by another service while the part holds it).
_owner_tokens: "weakref.WeakKeyDictionary[Any, object]" = weakref.WeakKeyDictionary()


def _owner_token(service: Service) -> object:
    token = _owner_tokens.get(service)
    if token is None:
        token = _owner_tokens.setdefault(service, object())
    return token


def detach() -> None:
    """Disconnect the compiled part: allocations through it fail, frees are dropped (tests)."""
    compiled_part().disconnect()


def install(service: Service) -> LibraryAllocator:
    """Make PyTorch allocate from ``service``'s pools, process-wide. Before PyTorch's first CUDA
    allocation: PyTorch refuses a new allocator after it."""
    torch = import_library("torch", "torch")
    part = compiled_part()
    pluggable = torch.cuda.memory.CUDAPluggableAllocator(part.__file__, ALLOC, FREE)
    native = pluggable.allocator()
    addresses = part.addresses()
    for hook, fn in (("set_record_stream_fn", "record_stream"), ("set_reset_fn", "reset")):
        setter = getattr(native, hook, None)
        if setter is not None:   # older PyTorch: record_stream does nothing, empty_cache drains nothing
            setter(addresses[fn])
    allocator = attach(service)
    try:
        torch.cuda.memory.change_current_allocator(pluggable)
    except RuntimeError as exc:
        raise InvalidArgument(f"PyTorch refused cudabridge's allocator ({exc}): it has allocated already; install "
                              f"it first (spark.cudabridge.allocators=torch does, at the service's start)") from exc
    return allocator
