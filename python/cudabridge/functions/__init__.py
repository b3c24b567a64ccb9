"""Python functions called from Java inside the executor, over the task's memory and stream.

* :mod:`.function_table`: functions by reference (``"package.module:function"``) or pickled,
  resolved once per executor and kept by id; search paths checked as the module cache is;
* :mod:`.function_calls`: one call for a task, inside its lease, on its stream, with its memory;
* :mod:`.device_arrays`: task buffers as CuPy / torch / (emulated device) numpy arrays, and a
  function's arrays back as task allocations (no copy for the CuPy plug-in's own);
* :mod:`.batches`: a function over a dict of column batches (Spark's ``mapBatches``);
* :mod:`.dtypes`: the element types, one table (Java's ``DType`` reads it from the jar).

The Java front is ``org.cudabridge.PythonFunction`` (``CudaBridge.pythonFunction``), reached
through ``jvm/function_calls.py``; docs/python-functions.md says what a function may take and
return.
"""

from __future__ import annotations

from typing import Any

from .device_arrays import ArrayArgument, ResultArray
from .dtypes import DTYPES
from .function_calls import FunctionCalls
from .function_table import FunctionTable, PythonFunction, pickle_function

__all__ = ["ArrayArgument", "DTYPES", "FunctionCalls", "FunctionTable", "PythonFunction", "ResultArray",
           "array_module", "pickle_function"]


def array_module(array: Any) -> Any:
    """The array library of ``array``: ``cupy`` for a CuPy array (what functions get on a GPU),
    else ``numpy`` (the emulated device's arrays): ``xp = array_module(x); xp.sqrt(x)`` runs on
    either."""
    if type(array).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    import numpy

    return numpy
