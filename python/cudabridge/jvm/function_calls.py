"""Python functions called from Java: the adapter between the JNI native ``callFunction``
(bridge/function_calls.h) and :class:`~cudabridge.functions.FunctionCalls`.

The native hands :meth:`JavaFunctions.call` the task, the function's id and a tuple of arguments
built in C from what Java encoded (``org.cudabridge.PythonFunction``): None, int, float, bool,
str, bytes, a memoryview over a direct ByteBuffer's memory, or, for a device array, a tuple
``(handle, offset, dtype code, framework code, *shape)``. This adapter turns handles into the
task's allocations (a handle that is not live is refused as every hot call refuses it), calls,
and gives each result array a handle (inside the task's lease: a release that follows finds it)
as a tuple ``(handle, device pointer, bytes, dtype code, *shape)`` for the native to hand Java.

A direct ByteBuffer's view is valid only during the call: the native releases it when the call
returns, and fails a call that left something holding it (a numpy array over it, say) after
freeing its results, since Java may free that memory as soon as the call returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..errors import CudaBridgeError, InvalidArgument
from ..memory import FastPath
from ..memory.native import load as load_native
from ..functions import ArrayArgument, FunctionCalls, FunctionTable, ResultArray
from ..functions.batches import batch_function
from ..functions.device_arrays import FRAMEWORKS
from ..functions.dtypes import CODES, dtype_of_code
from .handles import GPU_BITS, HandleTable

if TYPE_CHECKING:
    from ..service import CudaBridgeService


class JavaFunctions:
    """The executor's Python functions as Java reaches them."""

    def __init__(self, service: "CudaBridgeService", handles: HandleTable, fast_path: str = "auto") -> None:
        self.table = FunctionTable()
        self.calls = FunctionCalls(service, self.table)   # type: ignore[arg-type]
        self._handles = handles
        fast_path = FastPath.parse(fast_path, "fast_path")
        # the C twin of call (functions/_call_core.c) where it is built; call stays its reference
        self._core = None
        module = load_native("cudabridge.functions._call_core") if fast_path != "python" else None
        if module is None and fast_path == "native":
            raise InvalidArgument("fast_path='native': the function calls' C twin is not built here")
        if module is not None:
            calls = self.calls
            self._core = module.CallCore(
                leases=service.registry.leases.table, local=service.registry.attachments,
                callables=self.table.callables, names=self.table.names, contexts=calls.contexts,
                set_device=service.backend.set_device if len(service.gpus) > 1 else None,
                reference=type(self).call.__get__(self), failure=calls.failure, result=calls.result,
                finish=self._to_java, service_error=CudaBridgeError)
            self.call = self._core.call   # type: ignore[method-assign]

    @property
    def fast_path(self) -> str:
        """"native" (the C twin) or "python"."""
        return "python" if self._core is None else "native"

    # resolving (the control plane: once per function and executor) ------------------------------
    def resolve(self, reference: str, search_paths: Sequence[str] = ()) -> int:
        return self.table.resolve(str(reference), [str(p) for p in search_paths]).id

    def resolve_pickled(self, payload: bytes) -> int:
        return self.table.resolve_pickled(bytes(payload)).id

    def batches(self, function_id: int, inputs: Sequence[str], outputs: Sequence[str], dtypes: Sequence[str]) -> int:
        """A function over column batches (functions/batches.py) of function ``function_id``, with
        these input column names and output columns (names and element types); kept by id as any
        function is."""
        f = self.table.get(int(function_id))
        ins, outs, types = [str(n) for n in inputs], [str(n) for n in outputs], [str(t) for t in dtypes]
        if len(outs) != len(types):
            raise InvalidArgument("batches: one element type per output column")
        key = f"batches:{f.id}:{ins}:{list(zip(outs, types))}"
        return self.table.keep(key, f"batches of {f.name}",
                               lambda: batch_function(f.fn, f.name, ins, list(zip(outs, types)))).id

    # calling (the hot native) ------------------------------------------------------------------
    def call(self, task: int, function_id: int, args: tuple) -> Any:
        values = [self._array(a, i) if a.__class__ is tuple else a for i, a in enumerate(args)]
        return self.calls.call(task, function_id, values, finish=self._to_java)

    def _array(self, a: tuple, i: int) -> ArrayArgument:
        if len(a) < 4:
            raise InvalidArgument(f"call: argument {i}: an array is (handle, offset, dtype, framework, *shape)")
        handle, offset, dtype, framework, *shape = a
        allocation = self._handles.get(handle) if handle.__class__ is int else None
        if allocation is None:
            raise self._handles.dead(handle, "call")
        if framework.__class__ is not int or not 0 <= framework < len(FRAMEWORKS):
            raise InvalidArgument(f"call: argument {i}: unknown framework code {framework!r}")
        return ArrayArgument(allocation, offset, dtype_of_code(dtype), tuple(shape), FRAMEWORKS[framework])

    def _to_java(self, result: Any) -> Any:
        if result.__class__ is list:
            return [self._one(r) for r in result]
        return self._one(result)

    def _one(self, r: Any) -> Any:
        if r.__class__ is not ResultArray:
            return r
        a = r.allocation
        handle = a.id << GPU_BITS | a.device
        self._handles.insert(handle, a)
        return (handle, a.ptr, max(r.nbytes, 1), CODES.index(r.dtype), *r.shape)
