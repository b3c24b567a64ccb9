"""A Python function called for a task: inside the task's lease, on the task's stream, with the
task's memory; what it returns becomes values Java can hold.

One call (:meth:`FunctionCalls.call`), on the calling (Java task) thread:

1. **The task guard.** The call enters the task's lease (task_registry.py's lease protocol) for
   its whole length: refused with :class:`~cudabridge.errors.UnknownTask` once the task's release
   has begun, and a release waits for the call to end. So no function runs, and no memory is
   handed to a task, after its release began.
2. **The task's context.** The thread is attached to the task for the call (its GPU current; the
   allocator plug-ins' allocations are the task's, ``allocators/``), and where CuPy and PyTorch
   are imported, the task's stream is their current stream (``cupy.cuda.Stream.from_external``,
   ``torch.cuda.ExternalStream``; kept per stream). The previous attachment comes back after.
3. **Arguments.** Arrays over the task's buffers (``device_arrays.py``; the buffers must be the
   task's own and live); on the emulated device the stream is synchronized first.
4. **The function.** Whatever it raises that is not the service's own error becomes
   :class:`~cudabridge.errors.FunctionFailed` with its type and traceback; the service's errors
   (out of device memory, a release that began) reach the caller as themselves.
5. **Results.** :class:`~.device_arrays.ResultTaker`: arrays become the task's allocations. If the
   results cannot be taken, what was made for them is freed: a failed call leaves nothing behind.

All tasks share one interpreter: Python code of one call runs while no other thread runs Python
(the GIL); CuPy and PyTorch release it while they wait for the GPU.
"""

from __future__ import annotations

import sys
import traceback
from threading import get_ident
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from ..errors import CudaBridgeError, FunctionFailed, InvalidArgument
from .device_arrays import ArrayArgument, DeviceArrays, ResultTaker
from .function_table import FunctionTable, PythonFunction

if TYPE_CHECKING:
    from ..allocators import LibraryAllocator
    from ..memory import Allocation
    from ..task_registry import GpuResources, TaskBinding, TaskRegistry


class Service(Protocol):
    """What the calls need of the service (``CudaBridgeService`` is one)."""

    registry: "TaskRegistry"
    gpus: "Mapping[int, GpuResources]"
    backend: Any
    library_allocators: "dict[str, LibraryAllocator]"


class FunctionCalls:
    """Calls of the functions of ``table`` for the tasks of ``service``."""

    def __init__(self, service: Service, table: FunctionTable | None = None) -> None:
        self.table = table if table is not None else FunctionTable()
        self._service = service
        self._registry = service.registry
        self._leases = service.registry.leases
        self._backend = service.backend
        self.arrays = DeviceArrays(getattr(service.backend, "device_view", None))
        self._cupy_streams: dict[tuple[int, int], Any] = {}
        self._torch_streams: dict[tuple[int, int], Any] = {}
        self.calls = 0
        self.failures = 0

    def call(self, task_id: int, function: PythonFunction | int, args: Sequence[Any],
             kwargs: Mapping[str, Any] | None = None, finish: Callable[[Any], Any] | None = None) -> Any:
        """``function(*args, **kwargs)`` for ``task_id`` (module docstring); array arguments are
        :class:`ArrayArgument`. Returns the function's result as :class:`ResultTaker` makes it,
        passed through ``finish`` (still inside the task's lease: the Java front gives the result
        arrays their handles there, so that a release that follows finds them)."""
        f = function if isinstance(function, PythonFunction) else self.table.get(function)
        lease = self._leases.lease_of(task_id)
        me = get_ident()
        try:
            lease.inside.append(me)
            if not lease.open:
                raise self._leases.refusal(task_id, lease)
            return self._call(lease.binding, f, args, kwargs or {}, finish)
        finally:
            lease.inside.remove(me)

    def _call(self, b: "TaskBinding", f: PythonFunction, args: Sequence[Any], kwargs: Mapping[str, Any],
              finish: Callable[[Any], Any] | None) -> Any:
        registry = self._registry
        previous = registry.attached_task()
        registry.attach(b.task_id)
        try:
            values = self._arguments(b, args, f.name)
            taker = self._taker(b)
            with self._streams(b):
                self.calls += 1
                try:
                    out = f.fn(*values, **kwargs)
                except CudaBridgeError:
                    self.failures += 1
                    raise
                except BaseException as exc:   # noqa: BLE001 - SystemExit too: the executor goes on
                    self.failures += 1
                    raise FunctionFailed(f.name, exc, traceback.format_exc()) from exc
                finally:
                    del values
                try:
                    result = taker.take(out, f"{f.name} returned")
                    return result if finish is None else finish(result)
                except BaseException:
                    taker.undo()
                    raise
        finally:
            if previous is None:
                registry.detach()
            else:
                registry.attach(previous)

    def _arguments(self, b: "TaskBinding", args: Sequence[Any], name: str) -> list[Any]:
        """The values the function gets: arrays built over the task's buffers (checked first:
        each live, the task's own, its shape inside it), the rest as they are."""
        arrays = [(i, a) for i, a in enumerate(args) if isinstance(a, ArrayArgument)]
        for i, a in arrays:
            what = f"{name}: argument {i}"
            if not a.allocation.alive:
                raise InvalidArgument(f"{what}: the device buffer was freed")
            if a.allocation.owner != b.task_id:
                raise InvalidArgument(f"{what}: the device buffer belongs to task {a.allocation.owner}, "
                                      f"not to the calling task {b.task_id}")
            a.check(what)
        values = list(args)
        if arrays and self.arrays.on_host:
            self._backend.stream_synchronize(b.stream)   # the host reads what the stream wrote
        for i, a in arrays:
            values[i] = self.arrays.argument(a)
        return values

    def _taker(self, b: "TaskBinding") -> ResultTaker:
        pool = self._service.gpus[b.gpu].memory
        backend = self._backend
        stream = b.stream
        cupy_allocator = self._service.library_allocators.get("cupy")

        def allocate(nbytes: int) -> "Allocation":
            return pool.allocate(nbytes, stream, b.task_id)

        def hand_over(array: Any) -> "Allocation | None":
            if cupy_allocator is None or type(array).__module__.split(".")[0] != "cupy":
                return None
            from ..allocators.cupy import hand_over as cupy_hand_over

            return cupy_hand_over(array, b.task_id)

        def copy_device(dst: int, src: int, nbytes: int) -> None:
            backend.memcpy_async(dst, src, nbytes, stream)

        def copy_host(dst: int, view: memoryview) -> None:
            backend.copy_to_device_async(dst, view, stream)   # pageable: complete on return

        return ResultTaker(b, allocate, hand_over, copy_device, copy_host, pool.free)

    def _streams(self, b: "TaskBinding") -> "_TaskStreams":
        """The task's stream as CuPy's and PyTorch's current stream, where they are imported."""
        entered = []
        if not self.arrays.on_host:
            key = (b.gpu, b.stream)
            if "cupy" in sys.modules:
                s = self._cupy_streams.get(key)
                if s is None:
                    from ..allocators.cupy import task_stream

                    s = self._cupy_streams.setdefault(key, task_stream(self._service, b.task_id))  # type: ignore[arg-type]
                entered.append(s)
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_initialized():
                s = self._torch_streams.get(key)
                if s is None:
                    s = self._torch_streams.setdefault(key, torch.cuda.ExternalStream(b.stream, device=b.gpu))
                entered.append(torch.cuda.stream(s))
        return _TaskStreams(entered)


class _TaskStreams:
    """Enters each context in order, leaves them in reverse."""

    __slots__ = ("_contexts", "_left")

    def __init__(self, contexts: list[Any]) -> None:
        self._contexts = contexts

    def __enter__(self) -> None:
        done = []
        try:
            for c in self._contexts:
                c.__enter__()
                done.append(c)
        except BaseException:
            for c in reversed(done):
                c.__exit__(None, None, None)
            raise
        self._left = done

    def __exit__(self, *exc: object) -> None:
        for c in reversed(self._left):
            c.__exit__(None, None, None)
