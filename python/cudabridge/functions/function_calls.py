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
import threading
import traceback
from threading import get_ident
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from ..errors import CudaBridgeError, FunctionFailed, InvalidArgument
from .device_arrays import ArrayArgument, DeviceArrays, ResultTaker
from .function_table import FunctionTable, PythonFunction

# results handed back as they are (anything else goes through ResultTaker); an int must fit 64 bits
_PLAIN = frozenset({bool, float, str, bytes})
_I64 = (-(1 << 63), (1 << 63) - 1)

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
        self._multi_gpu = len(service.gpus) > 1
        self._set_device = service.backend.set_device
        self._local = service.registry.attachments   # the thread's attachment (TaskRegistry.attach)
        # per libraries imported (contexts_state): stream -> the contexts that make it CuPy's and
        # PyTorch's current stream; read by the C twin too (_call_core.c)
        self.contexts: tuple[dict[int, tuple], ...] = ({}, {}, {}, {})

    def call(self, task_id: int, function: PythonFunction | int, args: Sequence[Any],
             kwargs: Mapping[str, Any] | None = None, finish: Callable[[Any], Any] | None = None) -> Any:
        """``function(*args, **kwargs)`` for ``task_id`` (module docstring); array arguments are
        :class:`ArrayArgument`. Returns the function's result as :class:`ResultTaker` makes it,
        passed through ``finish`` (still inside the task's lease: the Java front gives the result
        arrays their handles there, so that a release that follows finds them).

        The reference of the C twin (``_call_core.c``), which takes the same steps in this order
        for calls with no array argument and returns plain results as they are."""
        f = function if isinstance(function, PythonFunction) else self.table.get(function)
        lease = self._leases.lease_of(task_id)
        me = get_ident()
        try:
            lease.inside.append(me)
            if not lease.open:
                raise self._leases.refusal(task_id, lease)
            b = lease.binding
            local = self._local.__dict__
            previous = local.get("task")
            local["task"] = b.task_id   # attached: the allocator plug-ins give its allocations to the task
            try:
                if self._multi_gpu:
                    self._set_device(b.gpu)
                values = self._arguments(b, args, f.name)
                contexts = self._contexts(b)
                out = self._run(f, contexts, values, kwargs or {})
                del values
                if out is None or out.__class__ in _PLAIN or (out.__class__ is int and _I64[0] <= out <= _I64[1]):
                    return out
                return self.result(b, f.name, out, finish)
            finally:
                local["task"] = previous
        finally:
            lease.inside.remove(me)

    def _run(self, f: PythonFunction, contexts: tuple, values: list, kwargs: Mapping[str, Any]) -> Any:
        entered = 0
        try:
            for c in contexts:
                c.__enter__()
                entered += 1
            return f.fn(*values, **kwargs)
        except CudaBridgeError:
            raise
        except BaseException as exc:   # noqa: BLE001 - SystemExit too: the executor goes on
            raise self.failure(f.id, exc) from exc
        finally:
            for c in reversed(contexts[:entered]):
                c.__exit__(None, None, None)

    def failure(self, function_id: int, exc: BaseException) -> FunctionFailed:
        """What a call raises when the function raised ``exc`` (not an error of the service's)."""
        f = self.table.get(function_id)
        return FunctionFailed(f.name, exc, "".join(traceback.format_exception(exc)))

    def result(self, b: "TaskBinding", name: str, out: Any, finish: Callable[[Any], Any] | None) -> Any:
        """A result that is not a plain value (arrays, lists, numpy scalars; bad ones refused) as
        :class:`ResultTaker` makes it, through ``finish``; inside the task's lease. What was made
        for it is freed if it cannot be handed over."""
        taker = self._taker(b)
        try:
            result = taker.take(out, f"{name} returned")
            return result if finish is None else finish(result)
        except BaseException:
            taker.undo()
            raise

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

    def _contexts(self, b: "TaskBinding") -> tuple:
        """The contexts that make the task's stream CuPy's and PyTorch's current stream, for the
        libraries imported now (none on the emulated device), kept per stream."""
        state = contexts_state()
        table = self.contexts[state]
        found = table.get(b.stream)
        if found is not None:
            return found
        made: list[Any] = []
        if not self.arrays.on_host:
            if state & 1:
                from ..allocators.cupy import task_stream

                made.append(task_stream(self._service, b.task_id))  # type: ignore[arg-type]
            if state & 2:
                made.append(_TorchStream(sys.modules["torch"], b.stream, b.gpu))
        return table.setdefault(b.stream, tuple(made))


def contexts_state() -> int:
    """Which of CuPy (1) and PyTorch (2) the process has imported: the task's stream is made
    current for those (a library imported later is met at the next call)."""
    modules = sys.modules
    return ("cupy" in modules) | ("torch" in modules) << 1


class _TorchStream:
    """The task's stream as PyTorch's current stream on its GPU, restored after; one per stream,
    entered by any number of threads at once (each keeps what it replaced on its own stack)."""

    def __init__(self, torch: Any, stream: int, gpu: int) -> None:
        self._torch = torch
        self._stream = torch.cuda.ExternalStream(stream, device=gpu)
        self._gpu = gpu
        self._local = threading.local()

    def __enter__(self) -> None:
        cuda = self._torch.cuda
        stack = self._local.__dict__.setdefault("previous", [])
        stack.append(cuda.current_stream(self._gpu))
        cuda.set_stream(self._stream)

    def __exit__(self, *exc: object) -> None:
        self._torch.cuda.set_stream(self._local.previous.pop())
