"""The Java hot path's launch in C (jvm/_hotcore.c, issue 15 item 3), on a real GPU and on the
emulated device (whose driver table, device/emulated_driver.py, the same C calls; its host kernels:
host_kernels_for_tests and host_kernels_for_launch): the arguments marshalled in C, cuLaunchKernel
through the driver table (jvm/cuda_driver.h), under the task guard. Every input is run through both twins of the hot path on one service: the C one and the
Python reference must give the same outcome (a result on the device, or the same error type and
words), and the C one must take every launch it can (counted) rather than refer it."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import textwrap

import numpy as np
import pytest
from device_kernels import spin_async

from cudabridge.config import ServiceConfig
from cudabridge.errors import CudaBridgeError
from cudabridge.jvm.hot_path import KIND_CODES
from cudabridge.kernels.modules import ModuleSource
from cudabridge.service import CudaBridgeService

SOURCE = r"""
extern "C" __global__ void saxpy(const float* x, float* y, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
extern "C" __global__ void mixed(char c, short s, int i, long long l, float f, double d, bool b, long long* out) {
    out[0] = c; out[1] = s; out[2] = i; out[3] = l; out[4] = (long long)(f * 4); out[5] = (long long)(d * 4);
    out[6] = b;
}
extern "C" __global__ void wild(int* p) { *(int*)(0x10) = 1; }
"""
F32, F64 = KIND_CODES.index("f32"), KIND_CODES.index("f64")   # kind codes


def f32_bits(v: float) -> int:
    return int(np.array([v], np.float32).view(np.uint32)[0])


def f64_bits(v: float) -> int:
    return int(np.array([v], np.float64).view(np.int64)[0])


@pytest.fixture(scope="module", params=["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def gpu(request):
    from cudabridge.jvm.hot_path import JavaHotPath
    from cudabridge.memory import native as c_paths
    if request.param == "emulated" and (c_paths.load() is None or not c_paths.supported()[0]):
        pytest.skip("the C paths are not built or switched off")
    service = CudaBridgeService(ServiceConfig(backend=request.param, streams_per_gpu=4, high_priority_streams=0,
                                              emulated_kernels="host_kernels_for_tests,host_kernels_for_launch",
                                              emulated_memory="256m"))
    native, python = JavaHotPath(service, fast_path="native"), JavaHotPath(service, fast_path="python")
    assert native.native_api is not None and python.native_api is None
    yield service, native, python
    service.close()
    # the C path's launches and copies, seen by the emulated device's race detector
    assert not getattr(service.backend, "races", None), service.backend.races


def read(service, stream, ptr, n, dtype):
    out = bytearray(n * np.dtype(dtype).itemsize)
    service.backend.copy_from_device_async(out, ptr, stream)
    service.backend.stream_synchronize(stream)
    return np.frombuffer(out, dtype=dtype)


def test_the_c_path_launches_and_marshals_every_kind(gpu):
    service, native, python = gpu
    # a long long is a .u64 in PTX, as a pointer is: the signature is declared at load
    module = service.load_module(ModuleSource.of(SOURCE, signatures={"mixed": "i8,i16,i32,i64,f32,f64,bool,ptr"}))
    mixed = module.kernel("mixed")
    ids = {hot: hot.register_kernel(mixed) for hot in (native, python)}
    b = service.bind_task(1)
    for hot in (native, python):
        before = hot.counters
        h, ptr = hot.allocate(1, 64)
        values = (-7, -300, -70000, -(1 << 40), f32_bits(2.5), f64_bits(-1.25), 1, h)
        hot.launch(1, ids[hot], (1, 1, 1, 1, 1, 1), 0, values, bytes([1, 2, 3, 4, 5, 6, 7, 0]), (0,) * 7 + (8,))
        got = read(service, b.stream, ptr + 8, 7, np.int64)
        assert got.tolist() == [-7, -300, -70000, -(1 << 40), 10, -5, 1]
        after = hot.counters
        assert after["launches"] - before["launches"] == 1
        assert after["launches_referred"] == before["launches_referred"]   # the C path took it itself
        hot.free(h)
    service.release_task(1)


def test_both_twins_refuse_the_same_inputs_with_the_same_words(gpu):
    service, native, python = gpu
    saxpy = service.load_module(ModuleSource.of(SOURCE)).kernel("saxpy")
    ids = {hot: hot.register_kernel(saxpy) for hot in (native, python)}
    service.bind_task(2)
    service.bind_task(3)
    outcomes = {}
    for hot in (native, python):
        x, _ = hot.allocate(2, 4096)
        y, _ = hot.allocate(2, 4096)
        theirs, _ = hot.allocate(3, 4096)
        freed, _ = hot.allocate(2, 64)
        hot.free(freed)
        kid, k = ids[hot], bytes([0, 0, 3, F32])
        one = (1, 1, 1, 256, 1, 1)
        cases = {
            "count": (2, kid, one, 0, (x, y, 8), bytes([0, 0, 3]), (0, 0, 0)),
            "kind": (2, kid, one, 0, (x, y, f64_bits(8.0), 1), bytes([0, 0, F64, F32]), (0, 0, 0, 0)),
            "block": (2, kid, (1, 1, 1, 2048, 1, 1), 0, (x, y, 8, 0), k, (0,) * 4),
            "threads": (2, kid, (1, 1, 1, 32, 32, 2), 0, (x, y, 8, 0), k, (0,) * 4),
            "grid y": (2, kid, (1, 1 << 20, 1, 32, 1, 1), 0, (x, y, 8, 0), k, (0,) * 4),
            "shared": (2, kid, one, 1 << 30, (x, y, 8, 0), k, (0,) * 4),
            "theirs": (2, kid, one, 0, (x, theirs, 8, 0), k, (0,) * 4),
            "freed": (2, kid, one, 0, (x, freed, 8, 0), k, (0,) * 4),
            "offset": (2, kid, one, 0, (x, y, 8, 0), k, (0, 4097, 0, 0)),
            "unknown task": (9, kid, one, 0, (x, y, 8, 0), k, (0,) * 4),
            "unknown kernel": (2, 10_000, one, 0, (x, y, 8, 0), k, (0,) * 4),
        }
        for name, args in cases.items():
            before = hot.counters["launches"]
            with pytest.raises(CudaBridgeError) as info:
                hot.launch(*args)
            assert hot.counters["launches"] == before, name
            text = str(info.value)
            for h in (x, y, theirs, freed):   # handles and ids differ between the twins' allocations
                text = re.sub(rf"\b{h}\b", "<handle>", text)
            text = re.sub(r"Allocation\(#\d+", "Allocation(#<id>", text)
            text = re.sub(r"handle 0x[0-9a-f]+", "handle <handle>", text)
            outcomes.setdefault(name, {})[hot.fast_path] = (type(info.value).__name__, text)
        for h in (x, y, theirs):
            hot.free(h)
    for name, by_twin in outcomes.items():
        assert by_twin["native"] == by_twin["python"], (name, by_twin)
    service.release_task(2)
    service.release_task(3)


def test_opting_in_to_more_shared_memory_goes_through_the_reference_once(gpu):
    service, native, _ = gpu
    saxpy = service.load_module(ModuleSource.of(SOURCE)).kernel("saxpy")
    kid = native.register_kernel(saxpy)
    service.bind_task(4)
    x, _ = native.allocate(4, 4096)
    before = native.counters
    for _ in range(3):
        native.launch(4, kid, (1, 1, 1, 256, 1, 1), 100 << 10, (x, x, 0, 0), bytes([0, 0, 3, F32]), (0,) * 4)
    after = native.counters
    assert after["launches"] - before["launches"] == 3
    assert after["launches_referred"] - before["launches_referred"] <= 1   # only the opt-in, if not done before
    assert saxpy.limits.max_dynamic_shared >= 100 << 10
    native.free(x)
    service.release_task(4)


def test_a_thread_that_never_touched_cuda_launches(gpu):
    service, native, _ = gpu
    saxpy = service.load_module(ModuleSource.of(SOURCE)).kernel("saxpy")
    kid = native.register_kernel(saxpy)
    b = service.bind_task(5)
    n = 4096
    x, xp = native.allocate(5, 4 * n)
    y, yp = native.allocate(5, 4 * n)
    service.backend.copy_to_device_async(xp, bytearray(np.arange(n, dtype=np.float32).tobytes()), b.stream)
    service.backend.memset_async(yp, 0, 4 * n, b.stream)
    errors: list[BaseException] = []

    def fresh():
        try:
            native.launch(5, kid, (n // 256, 1, 1, 256, 1, 1), 0, (x, y, n, f32_bits(3.0)), bytes([0, 0, 3, F32]),
                          (0,) * 4)
        except BaseException as exc:
            errors.append(exc)
    t = threading.Thread(target=fresh)
    t.start()
    t.join()
    assert not errors, errors
    assert np.array_equal(read(service, b.stream, yp, n, np.float32), 3 * np.arange(n, dtype=np.float32))
    native.free(x)
    native.free(y)
    service.release_task(5)


def test_the_c_synchronize_waits_without_the_gil_and_clears_the_launch_log(gpu):
    """synchronize's C twin: the stream waited for in C (counted by the core), the stream's launch
    log cleared as the reference clears it, other Python threads running meanwhile; an unknown
    task goes to the reference, which refuses it in its own words."""
    service, native, python = gpu
    saxpy = service.load_module(ModuleSource.of(SOURCE)).kernel("saxpy")
    kid = native.register_kernel(saxpy)
    b = service.bind_task(6)
    x, _ = native.allocate(6, 4096)
    native.launch(6, kid, (1, 1, 1, 32, 1, 1), 0, (x, x, 8, 0), bytes([0, 0, 3, F32]), (0,) * 4)
    log = service.registry.launch_log
    assert log.candidates(b.stream)[0] == ["saxpy"]
    spin_async(service.backend, b.stream, 0.3)               # the wait takes 0.3 s...
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.wait(0.001):
            ticks.append(1)
    ticker = threading.Thread(target=tick)
    ticker.start()
    core_before = native._core.counts()["synchronizes"]
    native.synchronize(6)
    stop.set()
    ticker.join()
    assert native._core.counts()["synchronizes"] == core_before + 1   # the C twin waited, not the reference
    assert len(ticks) > 50                                    # ...and Python ran meanwhile: the GIL was free
    assert log.candidates(b.stream) == ([], 0)
    outcomes = []
    for hot in (native, python):
        with pytest.raises(CudaBridgeError) as info:
            hot.synchronize(99)
        outcomes.append((type(info.value), str(info.value)))
    assert outcomes[0] == outcomes[1]
    native.free(x)
    service.release_task(6)


@pytest.mark.gpu
def test_a_faulting_kernel_is_named_at_the_next_synchronize_and_everything_fails_fast_after():
    """In a process of its own: the fault leaves the process's CUDA context unusable."""
    script = textwrap.dedent(f"""
        import pytest
        from cudabridge.config import ServiceConfig
        from cudabridge.errors import DeviceUnusable, KernelFault, CudaError
        from cudabridge.jvm.hot_path import JavaHotPath
        from cudabridge.kernels.modules import ModuleSource
        from cudabridge.service import CudaBridgeService
        service = CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=2, high_priority_streams=0,
                                                  log_level="CRITICAL"))
        hot = JavaHotPath(service, fast_path="native")
        m = service.load_module(ModuleSource.of({SOURCE!r}))
        saxpy, wild = hot.register_kernel(m.kernel("saxpy")), hot.register_kernel(m.kernel("wild"))
        service.bind_task(1)
        x, _ = hot.allocate(1, 4096)
        hot.launch(1, saxpy, (1, 1, 1, 32, 1, 1), 0, (x, x, 8, 0), bytes([0, 0, 3, 5]), (0,) * 4)
        hot.launch(1, wild, (1, 1, 1, 1, 1, 1), 0, (x,), bytes([0]), (0,))
        with pytest.raises(KernelFault) as info:
            hot.synchronize(1)
        assert info.value.candidates == ["saxpy", "wild"], info.value.candidates
        assert info.value.sticky
        assert hot.counters["launches_referred"] == 0
        with pytest.raises(DeviceUnusable):
            hot.launch(1, saxpy, (1, 1, 1, 32, 1, 1), 0, (x, x, 8, 0), bytes([0, 0, 3, 5]), (0,) * 4)
        with pytest.raises(DeviceUnusable):
            hot.allocate(1, 64)
        print("FAULT-OK", info.value)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "FAULT-OK" in proc.stdout, proc.stdout + proc.stderr
