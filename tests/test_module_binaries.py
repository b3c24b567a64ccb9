"""Modules built ahead of time on a GPU (issue 15): a cubin and a fatbin made with nvcc (or, where
the machine has no nvcc, PTX from NVRTC) load and run through the bridge; PTX for an architecture
newer than the GPU's is refused with an error that names both, and the executor goes on."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from cudabridge.config import ServiceConfig
from cudabridge.kernels import LaunchConfig
from cudabridge.kernels.modules import ModuleLoadError, ModuleSource
from cudabridge.service import CudaBridgeService

pytestmark = pytest.mark.gpu

SCALE = r"""
extern "C" __global__ void scale(float* p, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= a;
}
"""


@pytest.fixture(scope="module")
def service():
    with CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=2, high_priority_streams=0)) as s:
        yield s


def _nvcc() -> str | None:
    for candidate in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _runs(service, source: ModuleSource, task: int) -> None:
    """scale() of ``source`` doubles 1024 floats on the task's stream."""
    reg, be = service.registry, service.backend
    b = reg.bind(task)
    n = 1024
    p = reg.allocate(task, 4 * n)
    be.copy_to_device_async(p.ptr, bytearray(np.arange(n, dtype=np.float32).tobytes()), b.stream)
    k = service.load_module(source).kernel("scale")
    service.launch(task, k, LaunchConfig(n // 256, 256), [p, n, 2.0])
    out = bytearray(4 * n)
    be.copy_from_device_async(out, p.ptr, b.stream)
    be.stream_synchronize(b.stream)
    assert np.array_equal(np.frombuffer(out, dtype=np.float32), 2 * np.arange(n, dtype=np.float32))
    reg.release(task)


@pytest.mark.parametrize("kind", ["cubin", "fatbin"])
def test_a_binary_built_ahead_of_time_loads_and_runs(service, kind, tmp_path):
    nvcc = _nvcc()
    arch = service.backend.compute_arch(0).replace("compute_", "")        # "90" on an H200
    if nvcc is None:   # the fallback: PTX from NVRTC, loaded as PTX text
        from cudabridge.kernels.cuda_module import compile_to_ptx
        ptx, _ = compile_to_ptx(service.backend.nvrtc, ModuleSource.of(SCALE), f"compute_{arch}")
        _runs(service, ModuleSource.of(ptx, "ptx"), 1)
        pytest.skip("no nvcc on this machine: ran PTX from NVRTC instead")
    src = tmp_path / "scale.cu"
    src.write_text(SCALE)
    out = tmp_path / f"scale.{kind}"
    flags = [f"-arch=sm_{arch}"] if kind == "cubin" else [f"-gencode=arch=compute_{arch},code=[sm_{arch},compute_{arch}]"]
    subprocess.run([nvcc, f"-{kind}", *flags, str(src), "-o", str(out)], check=True, capture_output=True, timeout=120)
    # a binary has no PTX to read the parameters from: the signature is declared
    _runs(service, ModuleSource.of(out.read_bytes(), "cubin", signatures={"scale": "ptr, i32, f32"}), 2)


def test_ptx_for_a_newer_architecture_is_refused_naming_both(service):
    newer = "compute_100"    # Blackwell's: newer than any H100/H200
    source = ModuleSource.of(SCALE, options=[f"--gpu-architecture={newer}"])
    with pytest.raises(ModuleLoadError) as info:
        service.load_module(source)
    message = str(info.value)
    assert "sm_100" in message and service.backend.compute_arch(0).replace("compute_", "sm_") in message, message
    from cudabridge.kernels.cuda_module import compile_to_ptx
    ptx, _ = compile_to_ptx(service.backend.nvrtc, ModuleSource.of(SCALE), newer)
    with pytest.raises(ModuleLoadError, match="sm_100"):
        service.load_module(ModuleSource.of(ptx, "ptx"))
    _runs(service, ModuleSource.of(SCALE), 3)    # the executor goes on: the same source for its own GPU


def test_a_compile_does_not_hold_the_gil(service):
    """NVRTC runs without the GIL (cuda.bindings releases it around the C call): while one thread
    compiles a large module, another thread's Python keeps running. With the GIL held across the
    compile the counter would stand still for the compile's whole length (hundreds of ms here)."""
    import threading
    import time

    body = "".join(f"    x = x * 1.0001f + {i}.0f;\n" for i in range(20000))
    big = ModuleSource.of('extern "C" __global__ void big(float* p) {\n    float x = p[0];\n' + body + "    p[0] = x;\n}\n")
    done = threading.Event()
    spans: list[float] = []

    def compile_() -> None:
        t0 = time.monotonic()
        service.load_module(big)
        spans.append(time.monotonic() - t0)
        done.set()
    t = threading.Thread(target=compile_)
    ticks = 0
    t.start()
    while not done.is_set():
        ticks += 1
    t.join()
    assert spans and spans[0] > 0.05, spans            # a compile long enough to tell
    # the longest the main thread went without a tick would be the whole compile under the GIL;
    # here it ticks all along: at least one tick per 10 us of compile on any machine
    assert ticks > spans[0] * 1e5, (ticks, spans)


def test_a_declared_signature_the_compiled_kernel_does_not_have_is_refused(service):
    """cuFuncGetParamInfo gives the compiled kernel's parameter offsets and sizes: a declared
    signature that lays them out otherwise is refused when the kernel is asked for (a launch
    would put the arguments at the wrong places). Sizes cannot tell i32 from f32, so only the
    layout is checked."""
    from cudabridge.errors import InvalidArgument
    wrong = ModuleSource.of(SCALE, signatures={"scale": "ptr, i64, f32"})
    with pytest.raises(InvalidArgument, match=r"\(offset, size\) \[\(0, 8\), \(8, 8\), \(16, 4\)\], the compiled "
                                              r"kernel's are \[\(0, 8\), \(8, 4\), \(12, 4\)\]"):
        service.load_module(wrong).kernel("scale")
    short = ModuleSource.of(SCALE, signatures={"scale": "ptr, i32"})
    with pytest.raises(InvalidArgument, match="cuFuncGetParamInfo"):
        service.load_module(short).kernel("scale")
    assert service.load_module(ModuleSource.of(SCALE, signatures={"scale": "ptr, i32, f32"})).kernel("scale")
