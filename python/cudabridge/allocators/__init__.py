"""Python GPU libraries' device memory from the service's pools: one small module per library
(``cupy``, ``torch``, ``numba``, ``rmm``), each with ``install(service)``, over the shared rules of
:mod:`.library_allocator` (whose an allocation is, on which stream, frees from finalizers).

Installed at the service's start by the ``allocators`` setting
(``spark.cudabridge.allocators=cupy,torch``), or in plain Python::

    service = CudaBridgeService(...)
    cudabridge.allocators.cupy.install(service)

docs/allocators.md says what each library gets and what it gives up.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

from ..errors import InvalidArgument
from .library_allocator import LibraryAllocator, LibraryStatistics, Service


# The libraries with a plug-in here, in the order the setting's doc and the statistics name them.
LIBRARIES = ("cupy", "torch", "numba", "rmm")

__all__ = ["LIBRARIES", "LibraryAllocator", "LibraryStatistics", "allocator_for", "install", "statistic_names"]


# Held while an allocator is made: one made and dropped by a racing install would stay registered
# with the pools (a holder) and the registry (a release listener) for the service's life. A new
# one in a fork's child: the thread that held it there does not exist.
_making = threading.Lock()


def _new_lock_after_fork() -> None:
    global _making
    _making = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def allocator_for(service: Service, library: str, **options: bool) -> LibraryAllocator:
    """The service's allocator for ``library`` (one per service and library, made at the first
    call with ``options``: ``by_stream``, ``register_streams``, as :class:`LibraryAllocator` takes them)."""
    if library not in LIBRARIES:
        raise InvalidArgument(f"no cudabridge allocator for library {library!r} (known: {', '.join(LIBRARIES)})")
    table = service.library_allocators
    found = table.get(library)
    if found is None:
        with _making:
            found = table.get(library)
            if found is None:
                found = table[library] = LibraryAllocator(service, library, **options)
    return found


def import_library(module: str, library: str) -> Any:
    """``module`` imported for the ``library`` plug-in; its absence refused with InvalidArgument."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise InvalidArgument(f"the {library} allocator needs {module} in the executor's Python: {exc}") from exc


def install(service: Service, libraries: "tuple[str, ...] | list[str]") -> None:
    """Install the plug-ins of ``libraries`` (names from :data:`LIBRARIES`), in that order. An
    unknown name is refused before anything is installed."""
    unknown = [name for name in libraries if name not in LIBRARIES]
    if unknown:
        raise InvalidArgument(f"no cudabridge allocator for {', '.join(map(repr, unknown))} (known: {', '.join(LIBRARIES)})")
    for name in libraries:
        importlib.import_module(f"{__name__}.{name}").install(service)


def statistic_names() -> tuple[str, ...]:
    """The executor statistics of the plug-ins: ``allocator_<library>_<statistic>``, every library
    and statistic, whether installed or not (metric names are fixed when an executor starts)."""
    return tuple(f"allocator_{lib}_{name}" for lib in LIBRARIES for name in LibraryStatistics.names())
