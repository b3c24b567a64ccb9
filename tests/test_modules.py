"""CUDA modules (issue 15): sources checked before anything loads, loaded once per executor and
GPU whatever the concurrency, failed loads kept; on the emulated device a module's kernels are the
host kernels of the names it defines; on a GPU (marked `gpu`) NVRTC compiles the source and the
kernels run through the task registry's guard."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from cudabridge.config import ServiceConfig
from cudabridge.errors import CudaError, InvalidArgument
from cudabridge.kernels import LaunchConfig
from cudabridge.kernels.modules import ModuleCache, ModuleLoadError, ModuleSource, ptx_entries, source_kernels
from cudabridge.service import CudaBridgeService

SAXPY = r'''
extern "C" __global__ void saxpy(const float* x, float* y, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
extern "C" __global__ void histogram(const unsigned* data, int n, unsigned* bins) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&bins[data[i] % 16], 1u);
}
'''

PTX = r'''
.version 8.0
.target sm_90
.address_size 64
.visible .entry saxpy(
	.param .u64 saxpy_param_0,
	.param .u64 saxpy_param_1,
	.param .u32 saxpy_param_2,
	.param .f32 saxpy_param_3
)
{ ret; }
.visible .entry by_value(
	.param .align 8 .b8 by_value_param_0[16]
)
{ ret; }
'''


def test_a_source_is_checked_before_anything_loads():
    for bad, message in [
        (dict(code=""), "needs its text"), (dict(code=SAXPY, kind="fatbin"), "kind must be one of"),
        (dict(code="x", kind="cubin"), "needs its bytes"), (dict(code=SAXPY, options=["-O3", ""]), "non-empty strs"),
        (dict(code=SAXPY, headers={"h.h": 3}), "headers map"), (dict(code=PTX, kind="ptx", options=["-O3"]),
                                                              "for CUDA source"),
        (dict(code=SAXPY, signatures={"saxpy": "ptr, float"}), "unknown parameter kind"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            ModuleSource.of(**bad)


def test_the_cache_key_covers_everything_that_changes_the_result():
    a = ModuleSource.of(SAXPY)
    assert a.digest("sm_90") == ModuleSource.of(SAXPY).digest("sm_90")
    others = [ModuleSource.of(SAXPY, options=["-DX=1"]), ModuleSource.of(SAXPY, headers={"h.h": "//"}),
              ModuleSource.of(SAXPY, name_expressions=["f<int>"]), ModuleSource.of(SAXPY + " "),
              ModuleSource.of(SAXPY, signatures={"saxpy": "ptr, ptr, i32, f32"})]
    keys = {a.digest("sm_90"), a.digest("sm_80"), *(o.digest("sm_90") for o in others)}
    assert len(keys) == 2 + len(others)


def test_kernel_names_and_kinds_are_read_from_source_and_ptx():
    assert source_kernels(SAXPY) == {"saxpy", "histogram"}
    assert ptx_entries(PTX) == {"saxpy": ("ptr", "ptr", "i32", "f32"), "by_value": None}


def test_each_source_loads_once_however_many_ask_at_once():
    loads = []

    def loader(source, gpu):
        loads.append((source.code[:10], gpu))
        time.sleep(0.05)          # others ask meanwhile: they wait for this load
        return object()
    cache = ModuleCache(loader, lambda gpu: "t")
    src = ModuleSource.of(SAXPY)
    got = []
    threads = [threading.Thread(target=lambda: got.append(cache.load(src, 0))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and len(set(map(id, got))) == 1
    assert (cache.loads, cache.hits) == (1, 7)
    cache.load(src, 1)            # another GPU: its own load
    assert len(loads) == 2


def test_a_failed_load_is_kept_and_raised_again_without_loading_again():
    calls = []

    def loader(source, gpu):
        calls.append(1)
        raise ModuleLoadError("the module did not compile", "module.cu(3): error: identifier \"q\" is undefined")
    cache = ModuleCache(loader, lambda gpu: "t")
    src = ModuleSource.of(SAXPY)
    for _ in range(3):
        with pytest.raises(ModuleLoadError, match="did not compile") as info:
            cache.load(src, 0)
        assert "identifier \"q\" is undefined" in info.value.log
    assert len(calls) == 1 and cache.failures == 1


@pytest.fixture
def service():
    config = ServiceConfig(backend="emulated", emulated_kernels="host_kernels_for_tests", emulated_memory="64m",
                           streams_per_gpu=4, high_priority_streams=0)
    with CudaBridgeService(config) as s:
        yield s


def test_an_emulated_modules_kernels_are_its_names_host_kernels(service):
    m = service.load_module(ModuleSource.of(SAXPY))
    assert service.load_module(ModuleSource.of(SAXPY)) is m
    assert m.kernel("saxpy").origin == "host_kernels_for_tests.saxpy"
    with pytest.raises(InvalidArgument, match="defines no kernel 'faults'"):
        m.kernel("faults")        # a host kernel exists, but this source defines no such kernel
    with pytest.raises(InvalidArgument, match="not one of|not owned"):
        service.load_module(ModuleSource.of(SAXPY), gpu=3)
    declared = service.load_module(ModuleSource.of(SAXPY, signatures={"saxpy": "ptr, ptr, i64, f32"}))
    with pytest.raises(InvalidArgument, match="declared at load .* is not its host kernel's"):
        declared.kernel("saxpy")
    no_host_kernel = service.load_module(ModuleSource.of("extern \"C\" __global__ void reduce(float* p) {}"))
    with pytest.raises(InvalidArgument, match="has no host kernel"):
        no_host_kernel.kernel("reduce")


def test_a_task_runs_a_modules_kernel_on_its_stream(service):
    reg = service.registry
    b = reg.bind(1)
    n = 1000
    data, bins = reg.allocate(1, 4 * n), reg.allocate(1, 64)
    be = service.backend
    values = np.arange(n, dtype=np.uint32)
    be.copy_to_device_async(data.ptr, bytearray(values.tobytes()), b.stream)
    be.memset_async(bins.ptr, 0, 64, b.stream)
    hist = service.load_module(ModuleSource.of(SAXPY)).kernel("histogram")
    reg.launch(1, hist, LaunchConfig(-(-n // 256), 256), [data, n, bins])
    out = bytearray(64)
    be.copy_from_device_async(out, bins.ptr, b.stream)
    be.stream_synchronize(b.stream)
    assert np.array_equal(np.frombuffer(out, dtype=np.uint32), np.bincount(values % 16, minlength=16))
    reg.release(1)


@pytest.mark.gpu
def test_on_a_gpu_nvrtc_compiles_once_and_the_kernel_runs_through_the_guard():
    with CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=4, high_priority_streams=0)) as service:
        m = service.load_module(ModuleSource.of(SAXPY))
        assert service.load_module(ModuleSource.of(SAXPY)) is m and service.modules.loads == 1
        k = m.kernel("saxpy")
        assert k.signature == ("ptr", "ptr", "i32", "f32")
        reg = service.registry
        b = reg.bind(1)
        n = 1 << 20
        x, y = reg.allocate(1, 4 * n), reg.allocate(1, 4 * n)
        be = service.backend
        be.copy_to_device_async(x.ptr, bytearray(np.arange(n, dtype=np.float32).tobytes()), b.stream)
        be.copy_to_device_async(y.ptr, bytearray(np.ones(n, dtype=np.float32).tobytes()), b.stream)
        reg.launch(1, k, LaunchConfig(n // 256, 256), [x, y, n, 2.0])
        out = bytearray(4 * n)
        be.copy_from_device_async(out, y.ptr, b.stream)
        be.stream_synchronize(b.stream)
        assert np.array_equal(np.frombuffer(out, dtype=np.float32), 1 + 2 * np.arange(n, dtype=np.float32))
        with pytest.raises(InvalidArgument, match="defines no kernel 'reduce'"):
            m.kernel("reduce")
        with pytest.raises(InvalidArgument, match="threads per block|exceeds the device"):
            reg.launch(1, k, LaunchConfig(1, (32, 32, 2)), [x, y, n, 2.0])
        before = k.limits.max_dynamic_shared
        with pytest.raises(InvalidArgument, match=r"parameter 2 \(i32\)"):   # refused: no opt-in either
            reg.launch(1, k, LaunchConfig(n // 256, 256, 80 << 10), [x, y, 1.5, 2.0])
        assert k.limits.max_dynamic_shared == before
        reg.launch(1, k, LaunchConfig(n // 256, 256, 64 << 10), [x, y, 0, 0.0])   # opts in past 48 KiB
        assert k.limits.max_dynamic_shared == 64 << 10
        # a thread whose first GPU call is the launch
        errors: list[BaseException] = []

        def fresh_thread():
            try:
                reg.launch(1, k, LaunchConfig(n // 256, 256), [x, y, n, -1.0])
            except BaseException as exc:
                errors.append(exc)
        t = threading.Thread(target=fresh_thread)
        t.start()
        t.join()
        assert not errors, errors
        be.copy_from_device_async(out, y.ptr, b.stream)
        be.stream_synchronize(b.stream)
        assert np.array_equal(np.frombuffer(out, dtype=np.float32), 1 + np.arange(n, dtype=np.float32))
        with pytest.raises(InvalidArgument, match=r"parameter 2 \(i32\)"):
            reg.launch(1, k, LaunchConfig(1, 256), [x, y, 1.5, 2.0])
        reg.release(1)
        bad = ModuleSource.of('extern "C" __global__ void f(float* p) { p[0] = q; }')
        for _ in range(2):
            with pytest.raises(ModuleLoadError, match="did not compile") as info:
                service.load_module(bad)
            assert "q" in info.value.log and "undefined" in info.value.log
        assert service.modules.failures == 1


def test_ptx_for_a_newer_architecture_is_said_plainly():
    """The driver's refusal of PTX whose .target is newer than the GPU's names both (the GPU test
    in test_module_binaries.py runs the real load)."""
    from cudabridge.kernels.cuda_module import _load_refusal
    refused = ModuleLoadError("cuModuleLoadData failed: CUDA_ERROR_INVALID_PTX")
    newer = _load_refusal(refused, ".version 8.8\n.target sm_100\n.address_size 64\n", "compute_90", 0)
    assert "targets sm_100, newer than GPU 0's sm_90" in str(newer) and "CUDA_ERROR_INVALID_PTX" in str(newer)
    assert _load_refusal(refused, ".target sm_80\n", "compute_90", 0) is refused       # not newer: as it was
    assert _load_refusal(refused, "", "compute_90", 0) is refused                       # a cubin: no PTX


def test_a_template_instantiation_is_a_weak_entry_and_is_found():
    """NVRTC emits a template's instantiation as ``.weak .entry`` (found missing on the H200: a
    template kernel was 'not defined')."""
    from cudabridge.kernels.modules import ptx_entries
    ptx = (".weak .entry _Z5scaleIfEvPT_iS0_(\n .param .u64 p0,\n .param .u32 p1,\n .param .f32 p2\n)\n"
           ".visible .entry plain(.param .u64 a)\n")
    assert ptx_entries(ptx) == {"_Z5scaleIfEvPT_iS0_": ("ptr", "i32", "f32"), "plain": ("ptr",)}


def test_a_compile_leaves_the_interpreters_shared_bytes_alone(nvrtc):
    """NVRTC writes the compile log into the buffer it is given. An empty log is one NUL byte, and
    ``b" " * 1`` is the interpreter's shared one-byte object: writing into it made every b" " in
    the process b"\\0" (on the H200 a later ``import torch`` failed parsing "annotate(strtag)").
    Needs NVRTC, not a GPU."""
    from cudabridge.kernels.cuda_module import compile_to_ptx
    ptx, _ = compile_to_ptx(nvrtc, ModuleSource.of('extern "C" __global__ void k() {}'), "compute_90")
    assert ".entry k" in ptx
    assert b" " == bytes([32]) and b" ".join([b"a", b"b"]) == b"a b"


# --- issue 23, 6.5: only a bad source's own errors are kept ---------------------------------------

def test_an_interrupted_load_is_not_kept_and_the_threads_waiting_on_it_load_again():
    """A Ctrl-C landing in a load is the loading thread's, not the source's: that thread gets its
    KeyboardInterrupt, the threads waiting on the load load again themselves (one loads, the others
    wait for it), and later asks get the module; nothing keeps the interruption."""
    loading, go_on = threading.Event(), threading.Event()
    calls: list[str] = []

    def loader(source, gpu):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            loading.set()
            go_on.wait(10)
            raise KeyboardInterrupt
        return "module"
    cache = ModuleCache(loader, lambda gpu: "t")
    src = ModuleSource.of(SAXPY)
    outcome: dict[str, object] = {}

    def ask():
        try:
            outcome[threading.current_thread().name] = cache.load(src, 0)
        except BaseException as exc:       # whatever reaches the caller, KeyboardInterrupt included
            outcome[threading.current_thread().name] = exc
    first = threading.Thread(target=ask, name="first")
    first.start()
    assert loading.wait(10)
    waiters = [threading.Thread(target=ask, name=f"waiter{i}") for i in range(6)]
    for t in waiters:
        t.start()
    deadline = time.monotonic() + 10
    while cache.hits < len(waiters) and time.monotonic() < deadline:   # all six wait on the first load
        time.sleep(0.001)
    go_on.set()
    for t in [first, *waiters]:
        t.join(10)
    assert isinstance(outcome.pop("first"), KeyboardInterrupt)
    assert outcome == {f"waiter{i}": "module" for i in range(6)}
    assert len(calls) == 2 and calls[1].startswith("waiter")        # one waiter loaded; the rest waited for it
    assert _load_or_fail(cache, src) == "module" and len(calls) == 2 and cache.failures == 0 and len(cache) == 1


@pytest.mark.parametrize("make", [
    KeyboardInterrupt, lambda: SystemExit(3), MemoryError, lambda: OSError(5, "Input/output error"),
    lambda: RuntimeError("transient"), lambda: CudaError("cuModuleLoadData", 2, "CUDA_ERROR_OUT_OF_MEMORY"),
    lambda: ModuleLoadError("nvrtcCreateProgram failed: NVRTC_ERROR_OUT_OF_MEMORY", transient=True),
], ids=["KeyboardInterrupt", "SystemExit", "MemoryError", "OSError", "RuntimeError", "CudaError",
        "transient-ModuleLoadError"])
def test_a_failure_that_is_not_the_sources_is_raised_once_and_the_next_ask_loads_again(make):
    failure = make()
    calls = []

    def loader(source, gpu):
        calls.append(1)
        if len(calls) == 1:
            raise failure
        return "module"
    cache = ModuleCache(loader, lambda gpu: "t")
    src = ModuleSource.of(SAXPY)
    with pytest.raises(type(failure)):
        cache.load(src, 0)
    assert _load_or_fail(cache, src) == "module" and len(calls) == 2 and cache.failures == 0
    assert (cache.abandoned, len(cache)) == (1, 1)


def _load_or_fail(cache, src):
    """``cache.load(src, 0)``; a kept KeyboardInterrupt or SystemExit raised again fails the test
    instead of ending the test session."""
    try:
        return cache.load(src, 0)
    except BaseException as exc:
        pytest.fail(f"the first load's failure was kept: a later ask raised {exc!r}")


def test_a_bad_sources_invalid_argument_is_kept_as_its_compile_error_is():
    calls = []

    def loader(source, gpu):
        calls.append(1)
        raise InvalidArgument("an emulated module with globals needs the device backend to hold them")
    cache = ModuleCache(loader, lambda gpu: "t")
    for _ in range(3):
        with pytest.raises(InvalidArgument, match="needs the device backend"):
            cache.load(ModuleSource.of(SAXPY), 0)
    assert len(calls) == 1 and cache.failures == 1


# --- issue 23, 6.11: wrong types refused with InvalidArgument, naming what was asked -----------------

@pytest.mark.parametrize("kw, message", [
    (dict(options="-DTILE=256"), r"options: a list of strs, got one str '-DTILE=256' \(write \['-DTILE=256'\]\)"),
    (dict(name_expressions="scale<float>"), r"name_expressions: a list of strs, got one str 'scale<float>'"),
    (dict(options=5), "options: a list of strs, got int"),
    (dict(options=[b"-O3"]), "options: compile options are non-empty strs, got"),
    (dict(headers=[("h.h", "//")]), "headers: a mapping of include names to their text, got list"),
    (dict(headers={1: "x", "a.h": "y"}), "headers map include names to their text"),
    (dict(signatures={"saxpy": 5}), r"signatures\['saxpy'\]: a str of kinds .* or a list of kinds, got int"),
    (dict(signatures={"saxpy": None}), r"signatures\['saxpy'\]: a str of kinds"),
    (dict(signatures={"saxpy": ["ptr", ["i32"]]}), r"unknown parameter kind\(s\) \[\['i32'\]\]"),
    (dict(signatures={5: "ptr"}), "signatures: kernel names are non-empty strs, got 5"),
    (dict(signatures=["saxpy"]), "signatures: a mapping of kernel names to signatures, got list"),
    (dict(code="__global__ void k() {} // \ud800"), r"the source text: not UTF-8 \(a lone surrogate '\\ud800' at index \d+\)"),
    (dict(options=["-DX=\udc80"]), r"option '-DX=\\udc80': not UTF-8"),
    (dict(headers={"h.h": "\ud800"}), r"header 'h.h': not UTF-8"),
    (dict(headers={"\ud800.h": ""}), r"header name '\\ud800.h': not UTF-8"),
    (dict(name_expressions=["f<\ud800>"]), r"name expression 'f<\\ud800>': not UTF-8"),
    (dict(signatures={"k\ud800": "ptr"}), r"signature name 'k\\ud800': not UTF-8"),
], ids=["options-str", "names-str", "options-int", "options-bytes", "headers-list", "headers-key",
        "signature-int", "signature-none", "signature-nested", "signature-key", "signatures-list", "surrogate-code",
        "surrogate-option", "surrogate-header", "surrogate-header-name", "surrogate-name", "surrogate-signature"])
def test_a_source_of_the_wrong_types_is_refused_naming_the_part(kw, message):
    kw = {"code": SAXPY, **kw}
    with pytest.raises(InvalidArgument, match=message):
        ModuleSource.of(**kw)


def test_a_single_option_and_name_expression_in_a_list_still_work():
    src = ModuleSource.of(SAXPY, options=("-DTILE=256",), name_expressions=["scale<float>"],
                          signatures={"scale<float>": ["ptr", "i32", "f32"]})
    assert src.options == ("-DTILE=256",) and src.name_expressions == ("scale<float>",)
    assert src.declared("scale<float>") == ("ptr", "i32", "f32")
    assert ModuleSource.of(SAXPY, options=None, name_expressions=None) == ModuleSource.of(SAXPY)


@pytest.mark.parametrize("source, gpu, message", [
    ("extern \"C\" __global__ void k() {}", 0,
     r"load_module: expects a ModuleSource \(ModuleSource.of\(code, ...\)\), got str"),
    (None, 0, "load_module: expects a ModuleSource .*, got NoneType"),
    (ModuleSource.of(SAXPY), False, r"load_module: gpu must be an int, got a bool \(False\)"),
    (ModuleSource.of(SAXPY), True, r"load_module: gpu must be an int, got a bool \(True\)"),
    (ModuleSource.of(SAXPY), 0.0, "load_module: gpu must be an int, got float"),
], ids=["text", "none", "gpu-false", "gpu-true", "gpu-float"])
def test_load_module_refuses_what_is_not_a_source_or_a_gpu_and_changes_nothing(service, source, gpu, message):
    calls = []
    cache = ModuleCache(lambda s, g: calls.append(1), lambda g: "t")
    with pytest.raises(InvalidArgument, match=message):
        cache.load(source, gpu)
    assert (calls, len(cache), cache.loads, cache.hits) == ([], 0, 0, 0)
    # the service's (its GPU check may refuse the ordinal first, in its own words)
    with pytest.raises(InvalidArgument, match=message if gpu == 0 and gpu.__class__ is int else repr(gpu)):
        service.load_module(source, gpu)
    assert (len(service.modules), service.modules.loads, service.modules.hits) == (0, 0, 0)
