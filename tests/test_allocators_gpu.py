"""The real libraries on a GPU through cudabridge.allocators (CuPy, PyTorch, Numba on the GPU
machine's image; RMM where it is installed). Each runs in a process of its own: an allocator is
process-wide, and PyTorch and Numba take one only before their first allocation."""

from __future__ import annotations


import gpu_subprocess
import pytest

pytestmark = pytest.mark.gpu

PRELUDE = """
import gc, json, threading
from cudabridge.config import ServiceConfig
from cudabridge.service import CudaBridgeService
MIB = 1 << 20
service = CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=4, high_priority_streams=0))
out = {}
"""


def _run(library: str, body: str) -> dict:
    return gpu_subprocess.run(PRELUDE, library, body)


def test_cupy_computes_on_the_tasks_stream_from_the_pool_and_forgotten_arrays_are_reclaimed():
    out = _run("cupy", """
        import cupy
        from cudabridge.allocators import cupy as cb_cupy
        allocator = cb_cupy.install(service)
        b = service.bind_task(1)
        def task():
            service.registry.attach(1)
            with cb_cupy.task_stream(service):
                x = cupy.arange(1 << 20, dtype=cupy.float32)
                y = (x * 2 + 1).sum()
                out["sum"] = float(y.get())
                out["owned"] = len(service.memory_pool(0).owned_by(1))
                out["stream"] = cupy.cuda.get_current_stream().ptr == b.stream
                globals()["kept"] = cupy.ones(4 * MIB, dtype=cupy.uint8)   # forgotten by the task
        t = threading.Thread(target=task); t.start(); t.join()
        out["leaks"] = service.release_task(1).leaks_reclaimed
        del kept; gc.collect()
        s = allocator.statistics()
        out["after"] = s.frees_after_reclaim
        out["in_use"] = service.memory_pool(0).statistics().in_use_bytes
    """)
    n = 1 << 20
    assert out["sum"] == pytest.approx(float(n) * (n - 1) + n, rel=1e-3)
    assert out["owned"] >= 1 and out["stream"]
    assert out["leaks"] >= 1 and out["after"] >= 1 and out["in_use"] == 0


def test_torch_runs_an_mlp_step_on_the_pool_with_record_stream_and_a_refused_allocation():
    out = _run("torch", """
        import torch
        from cudabridge.allocators import torch as cb_torch
        allocator = cb_torch.install(service)
        b = service.bind_task(2)
        s = torch.cuda.ExternalStream(b.stream)
        def task():
            service.registry.attach(2)
            with torch.cuda.stream(s):
                model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).cuda()
                x = torch.randn(64, 256, device="cuda")
                loss = model(x).square().mean()
                loss.backward()
                out["loss"] = float(loss)
                side = torch.cuda.Stream()
                t = torch.empty(MIB, device="cuda", dtype=torch.uint8)
                t.record_stream(side)
                with torch.cuda.stream(side):
                    t.fill_(1)
                del t
            torch.cuda.synchronize()
            try:
                torch.empty(1 << 45, device="cuda", dtype=torch.uint8)
                out["refused"] = False
            except RuntimeError as exc:
                out["refused"] = "cudabridge torch allocator" in str(exc)
        t = threading.Thread(target=task); t.start(); t.join()
        st = allocator.statistics()
        out["allocations"] = st.allocations
        out["release"] = service.release_task(2).leaks_reclaimed
    """)
    assert out["refused"] and out["allocations"] > 4 and out["loss"] > 0
    assert out["release"] >= 1   # the model's parameters, still referenced at the release


def test_a_repeated_torch_training_step_is_served_from_the_parts_kept_frees():
    # torch's MLP step (forward, backward on autograd's device thread, SGD) repeated on a task's
    # stream: after its first steps every allocation takes back a free the compiled part kept
    # (same size, stream and task), none reaches the pool; the library still counts each one.
    out = _run("torch", """
        import torch
        from cudabridge.allocators import torch as cb_torch
        allocator = cb_torch.install(service)
        part = cb_torch.compiled_part()
        b = service.bind_task(4)
        pool = service.memory_pool(0)
        def task():
            service.registry.attach(4)
            with torch.cuda.stream(torch.cuda.ExternalStream(b.stream)):
                model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                            torch.nn.Linear(4096, 1024)).cuda()
                opt = torch.optim.SGD(model.parameters(), lr=1e-3)
                x = torch.randn(256, 1024, device="cuda")
                def step():
                    opt.zero_grad(set_to_none=True)
                    model(x).square().mean().backward()
                    opt.step()
                for _ in range(5):
                    step()
                before, reused = pool.statistics(), part.reuses(part.owner())[0]
                for _ in range(20):
                    step()
                torch.cuda.synchronize()
                after = pool.statistics()
                out["reused"] = part.reuses(part.owner())[0] - reused
                out["slow"] = after.slow_allocations - before.slow_allocations
                out["allocations"] = after.allocations - before.allocations
                del model, opt, x
        t = threading.Thread(target=task); t.start(); t.join()
        gc.collect()
        out["leaks"] = service.release_task(4).leaks_reclaimed
        out["kept"] = part.kept()
    """)
    assert out["reused"] >= 20 * 10, out
    assert (out["allocations"], out["slow"], out["kept"]) == (0, 0, 0), out


def test_numba_allocates_from_the_pool_and_launches_on_the_tasks_stream():
    out = _run("numba", """
        import numpy as np
        from numba import cuda
        from cudabridge.allocators import numba as cb_numba
        if not hasattr(np, "row_stack"):   # numba-cuda 0.30 compiles every kernel through np.row_stack,
            np.row_stack = np.vstack       # which NumPy 2.4 removed (the GPU machine's image has both)
        allocator = cb_numba.install(service)
        b = service.bind_task(3)
        @cuda.jit
        def double(a):
            i = cuda.grid(1)
            if i < a.size:
                a[i] *= 2
        def task():
            service.registry.attach(3)
            stream = cb_numba.task_stream(service)
            d = cuda.to_device(np.arange(1000, dtype=np.float32), stream=stream)
            double[4, 256, stream](d)
            out["sum"] = float(d.copy_to_host(stream=stream).sum())
            out["stream"] = service.memory_pool(0).owned_by(3)[0].stream == b.stream
            del d
        t = threading.Thread(target=task); t.start(); t.join()
        gc.collect()
        out["frees"] = allocator.statistics().frees
        service.release_task(3)
    """)
    assert out["sum"] == 2 * sum(range(1000)) and out["stream"] and out["frees"] >= 1
