"""Device memory as the arrays a Python function works on, and a function's arrays back as task
memory.

**Arguments.** An :class:`ArrayArgument` names a range of a task's allocation with an element
type and a shape. On a GPU it becomes a CuPy array over the same memory (``UnownedMemory`` whose
owner is the allocation: no copy, no free), or on request a torch tensor over it (DLPack through
CuPy; the CUDA array interface where CuPy is absent). On the emulated device it becomes a numpy
array over the device memory itself, after the task's stream has run its queued work (the
function runs on the host in place of GPU code; nothing else of the task runs on the stream
meanwhile: the call holds the task's lease).

**Results.** :func:`take_result` turns what a function returned into values Java can hold:
``None``, bool, int (64-bit), float, str, bytes, or a :class:`ResultArray`: an allocation of the
task with an element type and a shape. A CuPy array whose memory the CuPy plug-in allocated for
the task, from its start, is handed over with no copy (``allocators.cupy.hand_over``); any other
array (another library's memory, a view into the middle of one, host memory, the emulated
device's numpy arrays) is copied into a new allocation of the task on its stream. Arrays must
be C-contiguous, of a type in :data:`~.dtypes.DTYPES`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..errors import InvalidArgument
from .dtypes import DTYPES, dtype_of_typestr, itemsize

if TYPE_CHECKING:
    from ..memory import Allocation
    from ..task_registry import TaskBinding

FRAMEWORKS = ("cupy", "torch")   # what an array argument becomes on a GPU (numpy on the emulated device)
_I64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class ArrayArgument:
    """``allocation``'s bytes from ``offset`` as an array of ``dtype`` and ``shape``."""

    allocation: "Allocation"
    offset: int
    dtype: str
    shape: tuple[int, ...]
    framework: str = "cupy"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)

    def check(self, what: str) -> None:
        """Refuses a shape or element type that does not fit the allocation (before any call)."""
        if self.dtype not in DTYPES:
            raise InvalidArgument(f"{what}: unknown element type {self.dtype!r}")
        if self.framework not in FRAMEWORKS:
            raise InvalidArgument(f"{what}: an array is one of {FRAMEWORKS}, not {self.framework!r}")
        if any(d.__class__ is not int or d < 0 for d in self.shape) or len(self.shape) > 32:
            raise InvalidArgument(f"{what}: shape {self.shape} must be up to 32 non-negative ints")
        size = self.allocation.size
        if self.offset.__class__ is not int or not 0 <= self.offset <= size:
            raise InvalidArgument(f"{what}: offset {self.offset} is outside the buffer of {size} bytes")
        if self.offset % itemsize(self.dtype):
            raise InvalidArgument(f"{what}: offset {self.offset} is not a multiple of {self.dtype}'s "
                                  f"{itemsize(self.dtype)} bytes")
        if self.offset + self.nbytes > size:
            raise InvalidArgument(f"{what}: a {self.dtype} array of shape {self.shape} needs {self.nbytes} bytes from "
                                  f"offset {self.offset}; the buffer holds {size}")


@dataclass(frozen=True)
class ResultArray:
    """A function's array as the task's memory: ``allocation`` (the task's, on its stream) holds
    ``shape`` elements of ``dtype`` from its start."""

    allocation: "Allocation"
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)


class _CudaArray:
    """A range of device memory through the CUDA array interface (version 3; ``stream`` None:
    the consumer inserts no wait, the work is on the task's stream already)."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: str, keep: Any) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": DTYPES[dtype][1], "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}
        self._keep = keep


class DeviceArrays:
    """Arrays for one GPU backend: ``device_view`` is the emulated device's host view of its
    memory (arrays are numpy there), None on a GPU."""

    def __init__(self, device_view: Callable[[int, int], memoryview] | None) -> None:
        self._device_view = device_view

    @property
    def on_host(self) -> bool:
        """Whether arrays are host (numpy) arrays over the emulated device's memory."""
        return self._device_view is not None

    def argument(self, arg: ArrayArgument) -> Any:
        ptr = arg.allocation.ptr + arg.offset
        if self._device_view is not None:
            import numpy as np

            view = self._device_view(ptr, arg.nbytes) if arg.nbytes else memoryview(bytearray(0))
            array = np.frombuffer(view, dtype=arg.dtype).reshape(arg.shape)
            if arg.framework == "torch":
                return _import("torch", arg).from_numpy(array)
            return array
        if arg.framework == "torch":
            torch = _import("torch", arg)
            if "cupy" in sys.modules or _importable("cupy"):
                return torch.from_dlpack(self._cupy_array(arg, ptr))
            return torch.as_tensor(_CudaArray(ptr, arg.shape, arg.dtype, arg.allocation),
                                   device=f"cuda:{arg.allocation.device}")
        return self._cupy_array(arg, ptr)

    @staticmethod
    def _cupy_array(arg: ArrayArgument, ptr: int) -> Any:
        cupy = _import("cupy", arg)
        memory = cupy.cuda.memory
        mem = memory.UnownedMemory(ptr, arg.nbytes, arg.allocation, arg.allocation.device)
        return cupy.ndarray(arg.shape, dtype=arg.dtype, memptr=memory.MemoryPointer(mem, 0))


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _import(name: str, arg: Any) -> Any:
    try:
        return __import__(name)
    except ImportError as exc:
        raise InvalidArgument(f"a {getattr(arg, 'framework', name)} array needs {name} in the executor's Python: "
                              f"{exc}") from exc


# results ---------------------------------------------------------------------------------------
class ResultTaker:
    """Turns a function's return value into values for Java, for one call of task ``binding``.
    ``allocate(nbytes)`` makes the task's allocations (on its stream); ``hand_over(array)`` takes
    a CuPy array's own allocation without a copy, or returns None; ``copy_device(dst, src, n)`` and
    ``copy_host(dst, view)`` queue copies on the task's stream (the host one complete on return)."""

    def __init__(self, binding: "TaskBinding", allocate: Callable[[int], "Allocation"],
                 hand_over: Callable[[Any], "Allocation | None"], copy_device: Callable[[int, int, int], None],
                 copy_host: Callable[[int, memoryview], None], free: Callable[["Allocation"], None]) -> None:
        self.binding = binding
        self._allocate, self._hand_over = allocate, hand_over
        self._copy_device, self._copy_host, self._free = copy_device, copy_host, free
        self.made: list["Allocation"] = []   # what this call allocated or took over (freed if the call fails)

    def take(self, value: Any, what: str) -> Any:
        """A list or tuple becomes a list of results (one level); anything else one result."""
        if isinstance(value, (list, tuple)):
            return [self._one(v, f"{what}[{i}]") for i, v in enumerate(value)]
        return self._one(value, what)

    def undo(self) -> None:
        """Frees what this call made (its result could not be handed to Java)."""
        made, self.made = self.made, []
        for a in made:
            try:
                self._free(a)
            except Exception:   # noqa: BLE001 - reclaimed with its task anyway
                pass

    def _one(self, v: Any, what: str) -> Any:
        if v is None or v.__class__ in (bool, float, str):
            return v
        if isinstance(v, int):   # bool went back above: an int, or an int subclass (numpy's are not)
            v = int(v)
            if not _I64[0] <= v <= _I64[1]:
                raise InvalidArgument(f"{what}: int {v} does not fit a Java long")
            return v
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v)
        if getattr(v, "shape", None) == () and hasattr(v, "item"):   # a numpy scalar, a 0-d array (CuPy's sum)
            return self._one(v.item(), what)
        if hasattr(v, "__cuda_array_interface__"):
            return self._device_array(v, what)
        if hasattr(v, "__array_interface__") or _is_torch_cpu(v):
            return self._host_array(v, what)
        raise InvalidArgument(f"{what}: a {type(v).__module__}.{type(v).__qualname__} cannot be returned to Java "
                              f"(None, bool, int, float, str, bytes, a device or numpy array, or a list of them)")

    def _device_array(self, v: Any, what: str) -> ResultArray:
        cai = v.__cuda_array_interface__
        dtype = dtype_of_typestr(cai["typestr"], what)
        shape = tuple(int(d) for d in cai["shape"])
        _check_contiguous(shape, cai.get("strides"), itemsize(dtype), what)
        nbytes = math.prod(shape) * itemsize(dtype)
        a = self._hand_over(v) if nbytes else None
        if a is not None:
            self.made.append(a)
            return ResultArray(a, dtype, shape)
        dst = self._new(nbytes)
        if nbytes:
            self._copy_device(dst.ptr, int(cai["data"][0]), nbytes)
        return ResultArray(dst, dtype, shape)

    def _host_array(self, v: Any, what: str) -> ResultArray:
        import numpy as np

        if _is_torch_cpu(v):
            v = v.numpy()
        array = np.asarray(v)
        dtype = dtype_of_typestr(array.__array_interface__["typestr"], what)
        array = np.ascontiguousarray(array)
        shape = tuple(int(d) for d in array.shape)
        dst = self._new(array.nbytes)
        if array.nbytes:
            self._copy_host(dst.ptr, memoryview(array).cast("B"))
        return ResultArray(dst, dtype, shape)

    def _new(self, nbytes: int) -> "Allocation":
        a = self._allocate(max(nbytes, 1))   # an empty array still gets a buffer: Java's buffers are never empty
        self.made.append(a)
        return a


def _is_torch_cpu(v: Any) -> bool:
    return type(v).__module__.startswith("torch") and hasattr(v, "numpy") and not hasattr(v, "__cuda_array_interface__")


def _check_contiguous(shape: tuple[int, ...], strides: Any, item: int, what: str) -> None:
    if strides is None:
        return
    expected, step = [], item
    for d in reversed(shape):
        expected.append(step)
        step *= d
    if tuple(int(s) for s in strides) != tuple(reversed(expected)) and math.prod(shape) > 1:
        raise InvalidArgument(f"{what}: the array is not C-contiguous (strides {tuple(strides)}); return "
                              f"ascontiguousarray(...) of it")
