"""Module globals (``__constant__`` / ``__device__`` variables): found by name in a loaded module,
written and read on a task's stream inside its lease, ordered with its kernels; on the emulated
device declared with ``host_global`` and read by host kernels (tests/host_kernels_for_globals.py); on
a GPU (marked `gpu`) compiled by NVRTC and found with ``cuModuleGetGlobal``."""

from __future__ import annotations

import numpy as np
import pytest

from cudabridge.config import ServiceConfig
from cudabridge.errors import CudaError, InvalidArgument, KernelFault, StreamOrderRace, UnknownTask
from cudabridge.kernels import LaunchConfig, ModuleGlobal, copy_from_global, copy_to_global, host_global
from cudabridge.kernels.host_kernels import HostKernels, host_kernel
from cudabridge.kernels.modules import ModuleSource, ptx_globals, source_globals
from cudabridge.service import CudaBridgeService

GLOBALS_SOURCE = r'''
__constant__ float scale;                            // written by the host before the launch
__constant__ int offsets[4] = {1, 2, 3, 4};
__device__ unsigned long long launches;              // written by the kernel, read by the host
extern "C" __global__ void scale_by(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * scale + offsets[i % 4];
    if (i == 0) launches += 1;
}
__constant__ float unused_here;                      // defined, but no host_global declares it
'''
# a kernel that writes a __constant__: no CUDA compiler takes it; the emulated device's host kernel fails
WRITER_SOURCE = 'extern "C" __global__ void write_scale(float v) {}\n__constant__ float scale;\n'


def test_the_globals_a_module_defines_are_read_from_ptx_and_source():
    ptx = ("\n.const .align 4 .f32 scale;\n.visible .global .align 8 .u64 _ZN2ns8launchesE;\n"
           ".const .align 4 .b8 _ZN2ns5tableE[16] = {1, 0, 0, 0, 2};\n.extern .global .align 4 .u32 elsewhere;\n"
           "\tld.global.u32 %r12, [hidden];\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{ ret; }\n")
    assert ptx_globals(ptx) == {"scale", "_ZN2ns8launchesE", "_ZN2ns5tableE"}
    assert source_globals(GLOBALS_SOURCE) == {"scale", "offsets", "launches", "unused_here"}
    assert source_globals("__device__ float f(float x) { return x; }\n// __device__ int no;\n"
                          "static __device__ int a, b[3];\n__device__ int c{3};\n"
                          "template <class T> __device__ T g(T x);") == {"a", "b", "c"}


def test_a_host_global_declaration_is_checked():
    for bad, message in [(("", 4), "non-empty str"), (("x", 0), "must be positive"), (("x", 4.0), "must be an int"),
                         (("x", True), "got a bool"), (("x", 2, ), None)]:
        if message is None:
            with pytest.raises(InvalidArgument, match="initial has 4 bytes"):
                host_global(*bad, initial=b"abcd")
            continue
        with pytest.raises(InvalidArgument, match=message):
            host_global(*bad)
    with pytest.raises(InvalidArgument, match="constant must be a bool"):
        host_global("x", 4, constant=1)
    with pytest.raises(InvalidArgument, match="bytes-like"):
        host_global("x", 4, initial="text")
    with pytest.raises(InvalidArgument, match="distinct non-empty names"):
        host_kernel("k", "ptr", globals=["a", "a"])
    g = host_global("x", 8, initial=np.float32(2).tobytes())
    assert (g.name, g.nbytes, g.constant, g.initial) == ("x", 8, True, np.float32(2).tobytes())


def test_two_different_declarations_of_one_global_are_refused(tmp_path, monkeypatch):
    (tmp_path / "twins_a.py").write_text("from cudabridge.kernels import host_global\ns = host_global('s', 4)\n")
    (tmp_path / "twins_b.py").write_text("from cudabridge.kernels import host_global\ns = host_global('s', 8)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidArgument, match="two different declarations of global 's'"):
        HostKernels(["twins_a", "twins_b"])
    assert HostKernels(["twins_a"]).global_names() == ["s"]


def _service(**kw) -> CudaBridgeService:
    config = dict(backend="emulated", emulated_kernels="host_kernels_for_globals", emulated_memory="64m",
                  streams_per_gpu=4, high_priority_streams=0, emulated_race_check=True)
    config.update(kw)
    return CudaBridgeService(ServiceConfig(**config))


@pytest.fixture
def service():
    with _service() as s:
        yield s
        assert not s.backend.races, s.backend.races


def _floats(values) -> bytearray:
    return bytearray(np.asarray(values, dtype=np.float32).tobytes())


def test_a_kernel_reads_the_constant_the_host_wrote_and_the_host_reads_what_it_wrote(service):
    reg, be = service.registry, service.backend
    module = service.load_module(ModuleSource.of(GLOBALS_SOURCE))
    scale = module.global_("scale")
    assert scale == ModuleGlobal("scale", scale.address, 4, 0) and module.global_("scale") is scale
    offsets, launches = module.global_("offsets"), module.global_("launches")
    assert (offsets.size, launches.size) == (16, 8)
    b = reg.bind(1)
    n = 8
    y = reg.allocate(1, 4 * n)
    be.copy_to_device_async(y.ptr, _floats(np.arange(n)), b.stream)
    copy_to_global(reg, 1, scale, _floats([2.5]))            # before the launch, on the same stream
    kernel = module.kernel("scale_by")
    reg.launch(1, kernel, LaunchConfig(1, 32), [y, n])
    reg.launch(1, kernel, LaunchConfig(1, 32), [y, n])
    count = bytearray(8)
    copy_from_global(reg, 1, launches, count)                # after both launches: complete on return
    assert np.frombuffer(count, dtype=np.uint64)[0] == 2
    out = bytearray(4 * n)
    be.copy_from_device_async(out, y.ptr, b.stream)
    once = np.arange(n, dtype=np.float32) * 2.5 + np.arange(1, 5, dtype=np.float32)[np.arange(n) % 4]
    twice = once * 2.5 + np.arange(1, 5, dtype=np.float32)[np.arange(n) % 4]
    assert np.array_equal(np.frombuffer(out, dtype=np.float32), twice)
    initial = bytearray(16)
    copy_from_global(reg, 1, offsets, initial)               # the declaration's initial bytes
    assert list(np.frombuffer(initial, dtype=np.int32)) == [1, 2, 3, 4]
    part = bytearray(4)
    copy_from_global(reg, 1, offsets, part, offset=8)        # from a byte offset
    assert np.frombuffer(part, dtype=np.int32)[0] == 3
    reg.release(1)


def test_each_loaded_module_has_its_own_globals(service):
    a = service.load_module(ModuleSource.of(GLOBALS_SOURCE))
    b = service.load_module(ModuleSource.of(GLOBALS_SOURCE + "\n"))           # another source: another module
    assert a.global_("scale").address != b.global_("scale").address
    assert service.load_module(ModuleSource.of(GLOBALS_SOURCE)).global_("scale") == a.global_("scale")
    assert service.load_module(ModuleSource.of(SAXPY_ONLY)).global_names == set()   # no globals: nothing placed


SAXPY_ONLY = 'extern "C" __global__ void saxpy(const float* x, float* y, int n, float a) {}'


def test_an_unknown_global_says_what_the_module_defines_and_how_to_declare_one(service):
    module = service.load_module(ModuleSource.of(GLOBALS_SOURCE))
    with pytest.raises(InvalidArgument, match=r"defines no global 'scal' \(it defines: launches, offsets, scale, "
                                              r"unused_here\)"):
        module.global_("scal")
    with pytest.raises(InvalidArgument, match=r"global 'unused_here' has no declaration for the emulated device: "
                                              r"declare it with host_global\('unused_here', <bytes>\) in a module "
                                              r"named by spark.cudabridge.emulatedKernels"):
        module.global_("unused_here")
    with pytest.raises(InvalidArgument, match="non-empty str"):
        module.global_("")
    # a host kernel that reads a global its module does not define cannot be bound to it
    no_scale = service.load_module(ModuleSource.of('extern "C" __global__ void scale_by(float* y, int n) {}'))
    with pytest.raises(InvalidArgument, match="kernel 'scale_by': its host kernel .* reads global 'scale': the module "
                                              "defines no global 'scale'"):
        no_scale.kernel("scale_by")


def test_every_bad_copy_is_refused_and_changes_nothing(service):
    reg = service.registry
    module = service.load_module(ModuleSource.of(GLOBALS_SOURCE))
    scale = module.global_("scale")
    reg.bind(1)
    copy_to_global(reg, 1, scale, _floats([7.0]))
    for call, args, message in [
        (copy_to_global, (scale, _floats([1, 2])), r"8 byte\(s\) at offset 0 do not fit global 'scale' of 4 bytes"),
        (copy_to_global, (scale, _floats([1]), 1), r"4 byte\(s\) at offset 1 do not fit"),
        (copy_to_global, (scale, _floats([1]), -4), "at offset -4 do not fit"),
        (copy_to_global, (scale, _floats([1]), 1.0), "offset must be an int"),
        (copy_to_global, ("scale", _floats([1])), "expects a module's global"),
        (copy_to_global, (scale, 3.0), "buffer protocol"),
        (copy_from_global, (scale, bytearray(8)), r"8 byte\(s\) at offset 0 do not fit"),
        (copy_from_global, (scale, b"1234"), "read-only"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            call(reg, 1, *args)
    with pytest.raises(UnknownTask, match="task 9 is not bound"):
        copy_to_global(reg, 9, scale, _floats([1]))
    got = bytearray(4)
    copy_from_global(reg, 1, scale, got)
    assert np.frombuffer(got, dtype=np.float32)[0] == 7.0          # nothing was written by the refusals
    reg.release(1)
    with pytest.raises(UnknownTask, match="task 1 is not bound"):   # released: nothing more is queued
        copy_to_global(reg, 1, scale, _floats([1]))


def test_a_global_of_another_gpus_module_is_refused():
    with _service(emulated_devices=2) as service:
        reg = service.registry
        on_gpu1 = service.load_module(ModuleSource.of(GLOBALS_SOURCE), gpu=1).global_("scale")
        assert on_gpu1.gpu == 1
        reg.bind(1, gpu=0)
        with pytest.raises(InvalidArgument, match="is of a module on GPU 1, task 1 runs on GPU 0"):
            copy_to_global(reg, 1, on_gpu1, _floats([1]))
        reg.bind(2, gpu=1)
        copy_to_global(reg, 2, on_gpu1, _floats([3]))
        got = bytearray(4)
        copy_from_global(reg, 2, on_gpu1, got)
        assert np.frombuffer(got, dtype=np.float32)[0] == 3.0
        assert service.backend.get_device() == 0                    # the caller's device is left as it was


def test_a_global_is_shared_by_the_tasks_so_an_unordered_write_is_a_race(service):
    """One module per executor and GPU, so one global for every task: task 2 writing the scale while
    task 1's kernel may still read it is a race on a GPU too; the emulated device reports it and
    queues nothing."""
    reg = service.registry
    module = service.load_module(ModuleSource.of(GLOBALS_SOURCE))
    scale = module.global_("scale")
    b1, b2 = reg.bind(1), reg.bind(2)
    assert b1.stream != b2.stream
    y = reg.allocate(1, 64)
    copy_to_global(reg, 1, scale, _floats([2.0]))
    reg.launch(1, module.kernel("scale_by"), LaunchConfig(1, 32), [y, 16])
    with pytest.raises(StreamOrderRace, match=r"race on \[0x[0-9a-f]+, 0x[0-9a-f]+\) \(4 bytes\)"):
        copy_to_global(reg, 2, scale, _floats([3.0]))
    service.backend.races.clear()       # reported, as the fixture would; the race was the point
    reg.synchronize(1)                  # once the host has seen task 1's kernel done, task 2 may write
    copy_to_global(reg, 2, scale, _floats([3.0]))
    got = bytearray(4)
    copy_from_global(reg, 2, scale, got)    # (task 1 reading it now would race with that write in turn)
    assert np.frombuffer(got, dtype=np.float32)[0] == 3.0
    reg.release(1)
    reg.release(2)


def test_a_host_kernel_cannot_write_a_constant():
    """A __constant__ reaches a host kernel read-only: writing it is the kernel's fault (sticky, as a
    faulting kernel's error is), reported at the task's synchronize."""
    service = _service()
    try:
        reg = service.registry
        module = service.load_module(ModuleSource.of(WRITER_SOURCE))
        reg.bind(1)
        reg.launch(1, module.kernel("write_scale"), LaunchConfig(1, 1), [1.0])
        with pytest.raises(KernelFault, match="read-only") as info:
            reg.synchronize(1)
        assert info.value.candidates == ["write_scale"]
    finally:
        try:
            service.close()
        except CudaError:   # the device is unusable: draining its streams reports the error again
            pass


# On a GPU: a real __constant__ and a __device__ variable in a namespace (a C++ name, found through
# its name expression "&stats::launches").
GPU_SOURCE = r'''
__constant__ float scale;
__constant__ int offsets[4] = {1, 2, 3, 4};
namespace stats { __device__ unsigned long long launches; }
extern "C" __global__ void scale_by(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * scale + offsets[i % 4];
    if (i == 0) atomicAdd(&stats::launches, 1ull);
}
'''



def test_nvrtcs_ptx_declares_the_globals_the_module_finds(nvrtc):
    from cudabridge.kernels.cuda_module import compile_to_ptx

    ptx, lowered = compile_to_ptx(nvrtc, ModuleSource.of(GPU_SOURCE, name_expressions=["&stats::launches"]),
                                  "compute_90")
    assert lowered == {"&stats::launches": "_ZN5stats8launchesE"}
    assert ptx_globals(ptx) == {"scale", "offsets", "_ZN5stats8launchesE"}


class _DriverStandIn:
    """What CudaModule asks of the CUDA backend, without a GPU: NVRTC compiles for real, the driver's
    module calls are recorded (cuModuleGetGlobal answers with a made-up address)."""

    name = "cuda"

    def __init__(self, nvrtc) -> None:
        self.nvrtc = nvrtc
        self.asked: list[str] = []

    def compute_arch(self, gpu):
        return "compute_90"

    def module_load(self, image, gpu):
        return "module-handle"

    def module_global(self, module, symbol, name, gpu):
        self.asked.append(symbol)
        return 0x7000_0000 + len(self.asked) * 256, {"scale": 4, "offsets": 16}.get(symbol, 8)


def test_a_cuda_modules_global_is_asked_of_the_driver_by_its_lowered_name(nvrtc):
    from cudabridge.kernels.cuda_module import CudaModule

    backend = _DriverStandIn(nvrtc)
    module = CudaModule(backend, ModuleSource.of(GPU_SOURCE, name_expressions=["&stats::launches"]), 0)
    assert module.global_("scale") == ModuleGlobal("scale", 0x7000_0100, 4, 0)
    assert module.global_("stats::launches").size == 8 and module.global_("&stats::launches").size == 8
    assert module.global_("scale") is module.global_("scale")        # asked of the driver once
    assert backend.asked == ["scale", "_ZN5stats8launchesE", "_ZN5stats8launchesE"]
    with pytest.raises(InvalidArgument, match=r"defines no global 'launches' \(it defines: offsets, scale, "
                                              r"stats::launches; a C\+\+ name is found through its name expression"):
        module.global_("launches")
    assert len(backend.asked) == 3                                   # refused before the driver is asked


@pytest.mark.gpu
def test_on_a_gpu_a_kernel_reads_the_constant_the_host_wrote():
    with CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=4, high_priority_streams=0)) as service:
        module = service.load_module(ModuleSource.of(GPU_SOURCE, name_expressions=["&stats::launches"]))
        scale, offsets = module.global_("scale"), module.global_("offsets")
        launches = module.global_("stats::launches")
        assert (scale.size, offsets.size, launches.size) == (4, 16, 8)
        assert scale.gpu == 0 and scale.address and module.global_("scale") is scale
        with pytest.raises(InvalidArgument, match=r"defines no global 'scal' \(it defines: offsets, scale, "
                                                  r"stats::launches;"):
            module.global_("scal")
        reg, be = service.registry, service.backend
        b = reg.bind(1)
        n = 1 << 16
        y = reg.allocate(1, 4 * n)
        be.copy_to_device_async(y.ptr, _floats(np.arange(n)), b.stream)
        copy_to_global(reg, 1, scale, _floats([2.5]))
        copy_to_global(reg, 1, launches, bytearray(8))       # a __device__ variable: zero before the first launch
        k = module.kernel("scale_by")
        reg.launch(1, k, LaunchConfig(n // 256, 256), [y, n])
        reg.launch(1, k, LaunchConfig(n // 256, 256), [y, n])
        count = bytearray(8)
        copy_from_global(reg, 1, launches, count)            # after both launches on the stream
        assert np.frombuffer(count, dtype=np.uint64)[0] == 2
        out = bytearray(4 * n)
        be.copy_from_device_async(out, y.ptr, b.stream)
        be.stream_synchronize(b.stream)
        add = np.arange(1, 5, dtype=np.float32)[np.arange(n) % 4]
        want = (np.arange(n, dtype=np.float32) * np.float32(2.5) + add) * np.float32(2.5) + add
        assert np.array_equal(np.frombuffer(out, dtype=np.float32), want)
        initial = bytearray(16)
        copy_from_global(reg, 1, offsets, initial)           # the initializer in the source
        assert list(np.frombuffer(initial, dtype=np.int32)) == [1, 2, 3, 4]
        with pytest.raises(InvalidArgument, match=r"8 byte\(s\) at offset 0 do not fit global 'scale' of 4 bytes"):
            copy_to_global(reg, 1, scale, _floats([1, 2]))
        reg.release(1)


def test_a_kernel_reading_another_gpus_globals_is_refused_at_its_launch():
    """Issue 23, 6.8: a kernel of a module loaded on GPU 1 reads GPU 1's copies of its globals; a
    task on GPU 0 launching it is refused at the launch (InvalidArgument, naming both GPUs), as on
    a GPU, not failed at the device; on GPU 1 it runs."""
    with _service(emulated_devices=2) as service:
        reg = service.registry
        module = service.load_module(ModuleSource.of(GLOBALS_SOURCE), gpu=1)
        kernel = module.kernel("scale_by")
        reg.bind(1, gpu=0)
        y = reg.allocate(1, 64)
        with pytest.raises(InvalidArgument, match="kernel 'scale_by' is loaded on GPU 1; task 1 runs on GPU 0"):
            service.launch(1, kernel, LaunchConfig(1, 32), [y, 16])
        service.synchronize(1)                                      # nothing queued: nothing failed
        reg.bind(2, gpu=1)
        z = reg.allocate(2, 64)
        copy_to_global(reg, 2, module.global_("scale"), _floats([2.0]))
        service.launch(2, kernel, LaunchConfig(1, 32), [z, 16])
        count = bytearray(8)
        copy_from_global(reg, 2, module.global_("launches"), count)
        assert np.frombuffer(count, dtype=np.uint64)[0] == 1
        reg.release(1)
        reg.release(2)
        assert not service.backend.races
