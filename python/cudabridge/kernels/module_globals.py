"""Module globals: the ``__constant__`` and ``__device__`` variables of a loaded module, and copies
to and from them on a task's stream.

A global belongs to a loaded module, so there is one per executor, GPU and module (the module
cache loads each source once per GPU): every task that uses the module on that GPU sees the same
variable. Writing it is ordered with the writing task's own work only; two tasks that write
different values to one global while either's kernels may read it race, on a GPU as on the
emulated device (whose race detector reports it). Per-task values belong in kernel arguments;
a global suits what is the same for every task (a table, a scale set once by each task alike).

Copies run inside the task's lease (``TaskRegistry.enter`` / ``leave``), so none is queued once
the task's release has begun, and on the task's stream, so that they are ordered with its
kernels: a value written before a launch is what the kernel reads, and a read after a launch
sees what the kernel wrote. A copy into pageable host memory returns once the bytes are there;
from pageable memory the bytes are staged before it returns (the backend's copy contract).
"""

from __future__ import annotations

from threading import get_ident
from typing import Any, NamedTuple, Protocol

from ..device.backend import host_view
from ..errors import InvalidArgument, index_int


class Tasks(Protocol):
    """What a copy to or from a global needs of the task registry, which is passed in
    (``TaskRegistry`` is one; kernels sit below the registry and never import it): ``leases``, the
    table of task leases (its ``lease_of`` and ``refusal``, and the lease's ``binding``, ``inside``
    and ``open``: task_registry.py, "The lease protocol"), and ``gpu(ordinal)``, whose
    ``memory.backend`` queues the copy."""

    leases: Any

    def gpu(self, ordinal: int) -> Any: ...


class ModuleGlobal(NamedTuple):
    """A global of a loaded module: [address, address + size) on GPU ``gpu``."""

    name: str
    address: int
    size: int
    gpu: int


def _checked(glob: Any, call: str, offset: Any, nbytes: int) -> int:
    if glob.__class__ is not ModuleGlobal:
        raise InvalidArgument(f"{call}: expects a module's global (module.global_(name)), got {type(glob).__name__}")
    offset = index_int(offset, f"{call}: offset")
    if offset < 0 or nbytes > glob.size - offset:
        raise InvalidArgument(f"{call}: {nbytes} byte(s) at offset {offset} do not fit global {glob.name!r} "
                              f"of {glob.size} bytes")
    return offset


def _view(call: str, host: Any, writable: bool) -> memoryview:
    try:
        return host_view(host, writable=writable)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{call}: {exc}") from None


def copy_to_global(registry: Tasks, task_id: int, glob: ModuleGlobal, host: Any, offset: int = 0) -> None:
    """Copy the bytes of ``host`` (any contiguous buffer) into ``glob`` from byte ``offset``, on the
    task's stream: ordered after the task's work queued before it and before its work after."""
    view = _view("copy_to_global", host, writable=False)
    offset = _checked(glob, "copy_to_global", offset, len(view))
    _on_task_stream(registry, task_id, glob, "copy_to_global",
                    lambda backend, stream: backend.copy_to_device_async(glob.address + offset, view, stream))


def copy_from_global(registry: Tasks, task_id: int, glob: ModuleGlobal, host: Any, offset: int = 0) -> None:
    """Copy ``len(host)`` bytes of ``glob`` from byte ``offset`` into ``host`` (writable, contiguous),
    on the task's stream: after the task's kernels queued before it. Into pageable memory it
    returns once the bytes are there; into pinned memory it is asynchronous (synchronize first)."""
    view = _view("copy_from_global", host, writable=True)
    offset = _checked(glob, "copy_from_global", offset, len(view))
    _on_task_stream(registry, task_id, glob, "copy_from_global",
                    lambda backend, stream: backend.copy_from_device_async(view, glob.address + offset, stream))


def _on_task_stream(registry: Tasks, task_id: int, glob: ModuleGlobal, call: str, queue: Any) -> None:
    """Run ``queue(backend, stream)`` inside the task's lease, with the task's GPU current."""
    lease = registry.leases.lease_of(task_id)
    me = get_ident()
    try:   # entered and left by single built-in calls (task_registry's "Interruptions")
        lease.inside.append(me)
        if not lease.open:
            raise registry.leases.refusal(task_id, lease)
        b = lease.binding
        if b.gpu != glob.gpu:
            raise InvalidArgument(f"{call}: global {glob.name!r} is of a module on GPU {glob.gpu}, task "
                                  f"{b.task_id} runs on GPU {b.gpu}")
        backend = registry.gpu(b.gpu).memory.backend
        prev = backend.get_device()
        if prev != b.gpu:
            backend.set_device(b.gpu)
        try:
            queue(backend, b.stream)
        finally:
            if prev != b.gpu:
                backend.set_device(prev)
    finally:
        lease.inside.remove(me)
