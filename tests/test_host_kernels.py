"""User kernels on the emulated device: their host kernels run in stream order on the stream's
worker, with their arguments checked at the launch and their memory accesses seen by the race
detector (issue 15, the emulated device's part)."""

from __future__ import annotations

import struct
import threading
import time

import numpy as np
import pytest

import host_kernels_for_tests as host_kernels
from device_kernels import spin_async

from cudabridge.config import ServiceConfig
from cudabridge.device import EmulatedBackend
from cudabridge.errors import CudaError, InvalidArgument, StreamOrderRace
from cudabridge.kernels import HostKernels, LaunchConfig, pack_params
from cudabridge.service import CudaBridgeService

MiB = 1 << 20


@pytest.fixture
def be():
    b = EmulatedBackend(devices=1, memory_bytes=64 * MiB, race_check=True)
    yield b
    b.close()


@pytest.fixture
def kernels():
    return HostKernels(["host_kernels_for_tests"])


def to_device(be, s, data: bytes) -> int:
    p = be.malloc(len(data))
    be.copy_to_device_async(p, bytearray(data), s)
    return p


def from_device(be, s, p: int, n: int) -> bytes:
    out = bytearray(n)
    be.copy_from_device_async(out, p, s)
    be.stream_synchronize(s)
    return bytes(out)


def test_a_host_kernel_computes_in_stream_order(be, kernels):
    s = be.stream_create()
    n = 1000
    x = to_device(be, s, np.arange(n, dtype=np.float32).tobytes())
    y = to_device(be, s, np.ones(n, dtype=np.float32).tobytes())
    host_kernels.calls.clear()
    spin_async(be, s, 0.2)                                 # the launch queues behind this
    be.launch_host_kernel(s, kernels.get("saxpy"), LaunchConfig((4, 1, 1), (256, 1, 1)), [x, y, n, 2.0])
    assert host_kernels.calls == [], "the launch returned before the host kernel ran: it runs on the stream's worker"
    got = np.frombuffer(from_device(be, s, y, 4 * n), dtype=np.float32)
    assert host_kernels.calls == ["saxpy"]
    assert np.array_equal(got, 1 + 2 * np.arange(n, dtype=np.float32))


def test_launches_on_one_stream_run_in_order_and_see_each_others_writes(be, kernels):
    s = be.stream_create()
    data = np.arange(4096, dtype=np.uint32)
    d = to_device(be, s, data.tobytes())
    bins = to_device(be, s, bytes(64))
    for _ in range(3):
        be.launch_host_kernel(s, kernels.get("histogram"), LaunchConfig((16, 1, 1), (256, 1, 1)), [d, 4096, bins])
    got = np.frombuffer(from_device(be, s, bins, 64), dtype=np.uint32)
    assert np.array_equal(got, 3 * np.bincount(data % 16, minlength=16))


@pytest.mark.parametrize("args, message", [
    ([1, 2, 3], "takes 4 argument(s), got 3"),
    ([None, None, 10, 1.0], "parameter 0 (ptr): got None"),
    ("x", "takes 4 argument(s)"),
    (["a pointer", "Y", 10, 1.0], "parameter 0 (ptr): expects an int, got str"),
    (["X", "Y", 1 << 31, 1.0], "parameter 2 (i32): 2147483648 does not fit 32 bits"),
    (["X", "Y", True, 1.0], "parameter 2 (i32): expects an int, got bool"),
    (["X", "Y", 10, "two"], "parameter 3 (f32): expects a number"),
    (["X", "Y", 10, 1e39], "does not fit a float"),
])
def test_bad_arguments_are_refused_before_anything_is_queued(be, kernels, args, message):
    s = be.stream_create()
    x, y = be.malloc(4096), be.malloc(4096)
    args = [x if a == "X" else y if a == "Y" else a for a in args] if isinstance(args, list) else list(args)
    host_kernels.calls.clear()
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        be.launch_host_kernel(s, kernels.get("saxpy"), LaunchConfig((1, 1, 1), (32, 1, 1)), args)
    be.stream_synchronize(s)
    assert host_kernels.calls == []


def test_a_pointer_outside_every_allocation_is_refused(be, kernels):
    s = be.stream_create()
    y = be.malloc(4096)
    with pytest.raises(CudaError, match="not inside an allocation"):
        be.launch_host_kernel(s, kernels.get("saxpy"), LaunchConfig((1, 1, 1), (32, 1, 1)), [0x1234, y, 10, 1.0])


def test_the_race_detector_sees_a_kernels_accesses(be, kernels):
    s1, s2 = be.stream_create(), be.stream_create()
    x = to_device(be, s1, bytes(4096))           # written on s1 ...
    y = be.malloc(4096)
    with pytest.raises(StreamOrderRace):         # ... and read by a kernel on s2 with no ordering
        be.launch_host_kernel(s2, kernels.get("saxpy"), LaunchConfig((1, 1, 1), (256, 1, 1)), [x, y, 256, 1.0])
    ev = be.event_create()
    be.event_record(ev, s1)
    be.stream_wait_event(s2, ev)                 # ordered now
    be.launch_host_kernel(s2, kernels.get("saxpy"), LaunchConfig((1, 1, 1), (256, 1, 1)), [x, y, 256, 1.0])
    be.stream_synchronize(s2)


def test_a_faulting_host_kernel_is_a_sticky_error_at_the_next_call(be, kernels):
    s = be.stream_create()
    p = be.malloc(4096)
    be.launch_host_kernel(s, kernels.get("faults"), LaunchConfig((1, 1, 1), (1, 1, 1)), [p])
    with pytest.raises(CudaError, match="IllegalAddress"):
        be.stream_synchronize(s)
    with pytest.raises(CudaError, match="IllegalAddress"):
        be.malloc(256)


@pytest.mark.parametrize("config, message", [
    (LaunchConfig(1, 2048), "block (2048, 1, 1) exceeds the device's (1024, 1024, 64) on axis x"),
    (LaunchConfig(1, (32, 32, 2)), "2048 threads per block"),
    (LaunchConfig(1, (1, 1, 65)), "exceeds the device's (1024, 1024, 64) on axis z"),
    (LaunchConfig((1, 65536), 32), "exceeds the device's (2147483647, 65535, 65535) on axis y"),
    (LaunchConfig(1, 32, 228 << 10), "exceed the device's 232448 per block"),
])
def test_a_launch_beyond_the_devices_limits_is_refused(be, kernels, config, message):
    s = be.stream_create()
    x, y = be.malloc(4096), be.malloc(4096)
    host_kernels.calls.clear()
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        be.launch_host_kernel(s, kernels.get("saxpy"), config, [x, y, 8, 1.0])
    be.launch_host_kernel(s, kernels.get("saxpy"), LaunchConfig(1, 1024, 100 << 10), [x, y, 8, 1.0])  # opts in
    be.stream_synchronize(s)
    assert host_kernels.calls == ["saxpy"]


def test_a_kernel_without_host_kernel_says_which_and_where_to_register_it(kernels):
    with pytest.raises(InvalidArgument, match=r"kernel 'reduce' has no host kernel .*spark.cudabridge.emulatedKernels"):
        kernels.get("reduce")
    assert kernels.names() == ["faults", "histogram", "saxpy"]
    with pytest.raises(InvalidArgument, match="the setting is empty"):
        HostKernels([]).get("saxpy")


def test_the_service_loads_the_host_kernels_its_setting_names():
    config = ServiceConfig(backend="emulated", emulated_kernels="host_kernels_for_tests", emulated_memory="64m")
    with CudaBridgeService(config) as service:
        assert "saxpy" in service.host_kernels
    with pytest.raises(InvalidArgument, match="emulatedKernels: cannot import 'no_such_module'"):
        CudaBridgeService(ServiceConfig(backend="emulated", emulated_kernels="no_such_module", emulated_memory="64m"))


def test_launch_configs_and_parameter_buffers():
    c = LaunchConfig(grid=(4, 2), block=256, shared_bytes=1024)
    assert (c.grid, c.block, c.shared_bytes, c.threads_per_block) == ((4, 2, 1), (256, 1, 1), 1024, 256)
    for bad in [dict(grid=0, block=1), dict(grid=(1, 1, 1, 1), block=1), dict(grid=1, block=-1),
                dict(grid=1, block=1, shared_bytes=-1), dict(grid=1.5, block=1), dict(grid=1 << 31, block=1)]:
        with pytest.raises(InvalidArgument):
            LaunchConfig(**bad)
    # (float*, int, float): offsets 0, 8, 12 as the H200's driver reports them; 16 bytes in all
    buf = pack_params(("ptr", "i32", "f32"), [0x7F00_0000_1000, -5, 2.5], "k")
    assert len(buf) == 16 and struct.unpack("<Qif", buf) == (0x7F00_0000_1000, -5, 2.5)
    assert len(pack_params(("i8", "f64"), [1, 1.0], "k")) == 16        # the double aligned to 8


def test_host_kernels_of_many_threads_interleave_only_in_each_streams_order(be, kernels):
    streams = [be.stream_create() for _ in range(4)]
    data = np.arange(1024, dtype=np.uint32)
    bufs = [(to_device(be, s, data.tobytes()), to_device(be, s, bytes(64))) for s in streams]
    errors: list[BaseException] = []

    def work(i):
        try:
            for _ in range(20):
                be.launch_host_kernel(streams[i], kernels.get("histogram"), LaunchConfig((4, 1, 1), (256, 1, 1)),
                                      [bufs[i][0], 1024, bufs[i][1]])
        except BaseException as exc:   # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    expect = 20 * np.bincount(data % 16, minlength=16)
    for s, (_, bins) in zip(streams, bufs):
        assert np.array_equal(np.frombuffer(from_device(be, s, bins, 64), dtype=np.uint32), expect)


def _service(**kw):
    return CudaBridgeService(ServiceConfig(backend="emulated", emulated_kernels="host_kernels_for_tests",
                                           emulated_memory="64m", streams_per_gpu=4, high_priority_streams=0, **kw))


def test_a_task_launches_on_its_stream_with_its_buffers():
    with _service() as service:
        reg = service.registry
        b = reg.bind(1)
        n = 256
        x, y = reg.allocate(1, 4 * n), reg.allocate(1, 4 * n)
        be = service.backend
        be.copy_to_device_async(x.ptr, bytearray(np.full(n, 3, np.float32).tobytes()), b.stream)
        be.copy_to_device_async(y.ptr, bytearray(np.ones(n, np.float32).tobytes()), b.stream)
        reg.launch(1, service.host_kernels.get("saxpy"), LaunchConfig(1, 256), [x, y, n, 2.0])
        got = np.frombuffer(from_device(be, b.stream, y.ptr, 4 * n), dtype=np.float32)
        assert np.array_equal(got, np.full(n, 7, np.float32))
        assert reg.release(1).leaks_reclaimed == 2


def test_a_launch_refuses_buffers_it_cannot_order():
    with _service() as service:
        reg = service.registry
        reg.bind(1)
        reg.bind(2)
        saxpy = service.host_kernels.get("saxpy")
        mine, theirs = reg.allocate(1, 1024), reg.allocate(2, 1024)
        freed = reg.allocate(1, 1024)
        freed.free()
        for arg, message in [(theirs, "belongs to task 2, not to task 1"), (freed, "is not live")]:
            with pytest.raises(InvalidArgument, match=message):
                reg.launch(1, saxpy, LaunchConfig(1, 32), [arg, mine, 8, 1.0])
        with pytest.raises(Exception, match="task 9 is not bound"):
            reg.launch(9, saxpy, LaunchConfig(1, 32), [mine, mine, 8, 1.0])
        reg.release(1)
        with pytest.raises(Exception, match="task 1 is not bound"):
            reg.launch(1, saxpy, LaunchConfig(1, 32), [mine, mine, 8, 1.0])
        reg.release(2)


def test_no_kernel_of_a_task_is_queued_once_its_release_began():
    """Launches racing their task's release: each either ran before the release's frees (stream
    order) or was refused. Proof: while the launchers still run, the memory the release freed goes
    to another task on another stream and is written there; a kernel of the released task queued
    after the release would write it with nothing ordering the two, which the race detector (on
    here) reports at once."""
    with _service(emulated_race_check=True) as service:
        reg = service.registry
        saxpy = service.host_kernels.get("saxpy")
        refused = ran = 0
        unexpected: list[BaseException] = []
        for round_ in range(30):
            task = 100 + round_
            reg.bind(task)
            x, y = reg.allocate(task, 4096), reg.allocate(task, 4096)
            counts = {"ok": 0, "refused": 0}
            lock = threading.Lock()
            start = threading.Barrier(5)

            def launcher():
                start.wait()
                for _ in range(20):
                    try:
                        reg.launch(task, saxpy, LaunchConfig(4, 256), [x, y, 1024, 1.0])
                        key = "ok"
                    except InvalidArgument as exc:   # UnknownTask: not bound / being released
                        if "being released" not in str(exc) and "not bound" not in str(exc):
                            unexpected.append(exc)
                        key = "refused"
                    except BaseException as exc:
                        unexpected.append(exc)
                        key = "refused"
                    with lock:
                        counts[key] += 1
            threads = [threading.Thread(target=launcher) for _ in range(4)]
            for t in threads:
                t.start()
            start.wait()
            time.sleep(0.0005 * (round_ % 5))
            reg.release(task)
            other = 1000 + round_
            b2 = reg.bind(other)
            for _ in range(4):   # the freed blocks, another task's now, written on its stream
                a = reg.allocate(other, 4096)
                service.backend.memset_async(a.ptr, 0xAB, 4096, b2.stream)
            for t in threads:
                t.join()
            reg.release(other)
            refused += counts["refused"]
            ran += counts["ok"]
        assert not unexpected, unexpected[:3]
        assert not service.backend.races
        assert ran > 0 and refused > 0 and ran + refused == 30 * 80


def test_a_kernel_of_another_gpus_module_is_refused_before_anything_runs():
    """A kernel belongs to the GPU its module was loaded on (a CUDA kernel's ``gpu``); a task on
    another GPU launching it is refused, naming both, and nothing is queued."""
    from dataclasses import dataclass

    @dataclass
    class OnGpu1:   # a Launchable (kernels/host_kernels.py) loaded on GPU 1
        name: str = "on_gpu1"
        gpu: int = 1
        launched: int = 0

        def launch(self, backend, stream, config, args):
            self.launched += 1

    with CudaBridgeService(ServiceConfig(backend="emulated", emulated_devices=2, emulated_memory="64m",
                                         streams_per_gpu=2, high_priority_streams=0)) as service:
        service.registry.bind(1, gpu=0)
        k = OnGpu1()
        with pytest.raises(InvalidArgument, match="loaded on GPU 1; task 1 runs on GPU 0"):
            service.launch(1, k, LaunchConfig(1, 1), [])
        assert k.launched == 0 and service.registry.launch_log.recent == {}
        service.registry.bind(2, gpu=1)
        service.launch(2, k, LaunchConfig(1, 1), [])
        assert k.launched == 1
        service.release_task(1)
        service.release_task(2)


def test_the_parameter_layout_is_the_compilers():
    from cudabridge.kernels.params import param_layout
    assert param_layout(("ptr", "i32", "f32")) == [(0, 8), (8, 4), (12, 4)]
    assert param_layout(("i8", "i64", "bool", "i16", "f64")) == [(0, 1), (8, 8), (16, 1), (18, 2), (24, 8)]
    assert param_layout(()) == []


# --- issue 23 -------------------------------------------------------------------------------------

def test_an_emulated_kernel_belongs_to_the_gpu_its_module_was_loaded_on():
    """6.8: a module's kernel on the emulated device carries its module's GPU, as a CUDA kernel
    does, so a task on another GPU is refused (InvalidArgument, naming both) and nothing runs; a
    bare host kernel (``HostKernels.get``) belongs to no GPU."""
    from cudabridge.kernels.modules import ModuleSource
    source = ModuleSource.of('extern "C" __global__ void saxpy(const float* x, float* y, int n, float a) {}')
    with _service(emulated_devices=2) as service:
        reg = service.registry
        saxpy = service.load_module(source, gpu=1).kernel("saxpy")
        assert saxpy.gpu == 1 and service.load_module(source, gpu=0).kernel("saxpy").gpu == 0
        assert service.host_kernels.get("saxpy").gpu is None
        reg.bind(1, gpu=0)
        x, y = reg.allocate(1, 64), reg.allocate(1, 64)
        before = list(host_kernels.calls)
        with pytest.raises(InvalidArgument, match="kernel 'saxpy' is loaded on GPU 1; task 1 runs on GPU 0"):
            service.launch(1, saxpy, LaunchConfig(1, 32), [x, y, 16, 1.0])
        reg.synchronize(1)
        assert host_kernels.calls == before and reg.launch_log.recent == {}
        reg.bind(2, gpu=1)
        p, q = reg.allocate(2, 64), reg.allocate(2, 64)
        service.launch(2, saxpy, LaunchConfig(1, 32), [p, q, 16, 1.0])
        reg.synchronize(2)
        assert host_kernels.calls == before + ["saxpy"]
        reg.release(1)
        reg.release(2)


def test_a_host_kernel_module_that_exits_on_import_fails_the_start_naming_the_setting(tmp_path, monkeypatch):
    """6.16: SystemExit raised by a host kernels module's import is that module's failure, as any other
    exception is: InvalidArgument naming the setting, not an exit of the executor's Python."""
    (tmp_path / "host_kernels_that_exit.py").write_text("import sys\nsys.exit('no GPU here')\n")
    (tmp_path / "host_kernels_that_exit_0.py").write_text("raise SystemExit\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module, said in [("host_kernels_that_exit", "SystemExit: no GPU here"), ("host_kernels_that_exit_0", "SystemExit")]:
        with pytest.raises(InvalidArgument, match=rf"emulatedKernels: cannot import '{module}': {said}"):
            CudaBridgeService(ServiceConfig(backend="emulated", emulated_kernels=module, emulated_memory="64m"))
        with pytest.raises(InvalidArgument, match=f"cannot import '{module}'"):
            HostKernels([module])


def test_a_launch_request_of_the_wrong_types_is_refused_by_its_check():
    """6.11: ``check_launch_request`` (kernels/launch_config.py, called first in
    TaskRegistry.launch) refuses a launch whose kernel, config or args are not what a launch takes,
    naming which, before anything is entered or queued."""
    from cudabridge.kernels.launch_config import check_launch_request
    saxpy = HostKernels(["host_kernels_for_tests"]).get("saxpy")
    config = LaunchConfig(1, 32)
    check_launch_request(saxpy, config, [1, 2, 3, 4.0])
    check_launch_request(saxpy, config, (1, 2, 3, 4.0))
    for kernel, cfg, args, message in [
        (None, config, [], r"launch: kernel must be a module's kernel \(module.kernel\(name\)\), got NoneType"),
        ("saxpy", config, [], "launch: kernel must be a module's kernel .*, got str"),
        (saxpy, None, [], r"launch of kernel 'saxpy': config must be a LaunchConfig \(LaunchConfig\(grid, block\)\), "
                          r"got NoneType"),
        (saxpy, (1, 32), [], "launch of kernel 'saxpy': config must be a LaunchConfig .*, got tuple"),
        (saxpy, config, None, "launch of kernel 'saxpy': args must be a list or tuple of its arguments, got NoneType"),
        (saxpy, config, "xyz", "launch of kernel 'saxpy': args must be a list or tuple .*, got str"),
        (saxpy, config, iter([1]), "launch of kernel 'saxpy': args must be a list or tuple .*, got list_iterator"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            check_launch_request(kernel, cfg, args)


@pytest.mark.parametrize("which", ["kernel", "config", "args"])
def test_the_services_launch_refuses_a_request_of_the_wrong_types(which):
    with _service() as service:
        reg = service.registry
        reg.bind(1)
        x, y = reg.allocate(1, 64), reg.allocate(1, 64)
        request = {"kernel": service.host_kernels.get("saxpy"), "config": LaunchConfig(1, 32), "args": [x, y, 16, 1.0]}
        request[which] = None
        with pytest.raises(InvalidArgument, match=f"{which} must be"):
            service.launch(1, request["kernel"], request["config"], request["args"])
        assert reg.launch_log.recent == {}
        assert reg.release(1).leaks_reclaimed == 2
