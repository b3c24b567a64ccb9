"""Python functions called for a task on a GPU (the GPU machine's CuPy and PyTorch): arrays over
the task's buffers, the task's stream current for the libraries, a CuPy result handed over with no
copy, a torch result copied. Each in a process of its own (the CuPy plug-in is process-wide)."""

from __future__ import annotations

from pathlib import Path

import gpu_subprocess
import pytest

pytestmark = pytest.mark.gpu

FUNCTIONS = str(Path(__file__).resolve().parent / "python_functions")
PRELUDE = f"""
import json, numpy as np
from cudabridge.config import ServiceConfig
from cudabridge.service import CudaBridgeService
from cudabridge.jvm.hot_path import JavaHotPath
from cudabridge.functions.dtypes import CODES
service = CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=4, high_priority_streams=0))
hot = JavaHotPath(service)
def fid(name):
    return hot.functions.resolve("functions_for_tests:" + name, [{FUNCTIONS!r}])
def buffer(task, values):
    data = np.asarray(values, dtype=np.float64)
    h, _ = hot.allocate(task, data.nbytes)
    hot.copy_in(h, 0, memoryview(data).cast("B"))
    return h
def read(h, n):
    out = bytearray(8 * n)
    hot.copy_out(h, 0, memoryview(out))
    return np.frombuffer(bytes(out), dtype=np.float64).tolist()
F64 = CODES.index("float64")
out = {{}}
"""


def _run(library: str, body: str) -> dict:
    return gpu_subprocess.run(PRELUDE, library, body)


def test_cupy_arrays_over_task_buffers_on_the_tasks_stream_and_a_result_handed_over():
    out = _run("cupy", """
        import cupy
        from cudabridge.allocators import cupy as cb_cupy
        allocator = cb_cupy.install(service)
        b = service.bind_task(1)
        h = buffer(1, [1.0, 2.0, 3.0])
        out["total"] = hot.call_function(1, fid("total"), ((h, 0, F64, 0, 3),))
        hot.call_function(1, fid("scale"), ((h, 0, F64, 0, 3), 10.0))
        out["scaled"] = read(h, 3)
        stream_fid = hot.functions.table.keep("stream", "stream", lambda: (lambda: cupy.cuda.get_current_stream().ptr)).id
        out["stream"] = hot.call_function(1, stream_fid, ()) == b.stream
        r = hot.call_function(1, fid("squares_like"), ((h, 0, F64, 0, 3),))
        out["squares"] = read(r[0], 3)
        out["handed_over"] = allocator.statistics().allocations_handed_over
        out["leaks"] = service.release_task(1).leaks_reclaimed
        out["in_use"] = service.memory_pool(0).statistics().in_use_bytes
    """)
    assert out["total"] == 6.0 and out["scaled"] == [10.0, 20.0, 30.0] and out["stream"]
    assert out["squares"] == [100.0, 400.0, 900.0] and out["handed_over"] == 1
    assert out["leaks"] == 2 and out["in_use"] == 0   # the argument and the result: the task's, reclaimed


def test_torch_tensors_over_task_buffers_on_the_tasks_stream_and_a_result_copied():
    out = _run("torch", """
        import torch
        b = service.bind_task(2)
        h = buffer(2, [1.0, -2.0, 3.0])
        double = hot.functions.table.keep("double", "double", lambda: (lambda t: (t * 2, torch.cuda.current_stream().cuda_stream))).id
        r, stream = hot.call_function(2, double, ((h, 0, F64, 1, 3),))   # framework 1: torch
        out["doubled"] = read(r[0], 3)
        out["stream"] = stream == b.stream
        out["leaks"] = service.release_task(2).leaks_reclaimed
    """)
    assert out["doubled"] == [2.0, -4.0, 6.0] and out["stream"] and out["leaks"] == 2
