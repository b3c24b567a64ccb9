"""A kernel that faults is reported at the next synchronize of its task's stream, naming the kernels
launched there since the stream's last completed synchronize; after that sticky error every GPU
call fails fast (issue 15, item 5). On the emulated device a host kernel that reads past its buffer
is the fault (an illegal address, sticky as CUDA's)."""

from __future__ import annotations

import pytest

from cudabridge.config import ServiceConfig
from cudabridge.errors import CudaError, DeviceUnusable, KernelFault
from cudabridge.kernels import LaunchConfig
from cudabridge.kernels.launch_log import LaunchLog
from cudabridge.service import CudaBridgeService


def _service():
    return CudaBridgeService(ServiceConfig(backend="emulated", emulated_kernels="host_kernels_for_tests",
                                           emulated_memory="64m", streams_per_gpu=2, high_priority_streams=0))


def test_a_fault_names_the_kernels_since_the_last_completed_synchronize():
    service = _service()
    try:
        reg, k = service.registry, service.host_kernels
        reg.bind(1)
        x, y = reg.allocate(1, 4096), reg.allocate(1, 4096)
        one = LaunchConfig(1, 256)
        service.launch(1, k.get("saxpy"), one, [x, y, 256, 1.0])
        service.synchronize(1)                      # completed: saxpy is no candidate any more
        service.launch(1, k.get("histogram"), one, [x, 256, y])
        service.launch(1, k.get("histogram"), one, [x, 256, y])
        service.launch(1, k.get("faults"), one, [x])   # last: a launch after the fault may fail already
        with pytest.raises(KernelFault) as info:
            service.synchronize(1)
        fault = info.value
        assert fault.candidates == ["histogram", "histogram", "faults"]
        assert fault.code == 700 and fault.sticky
        assert "candidates): histogram x2, faults" in str(fault), str(fault)
        assert service.device_error() is not None
        # from now on every GPU call of the executor fails fast, naming the error
        for call in (lambda: service.launch(1, k.get("saxpy"), one, [x, y, 256, 1.0]),
                     lambda: service.bind_task(2), lambda: service.allocate(1, 64)):
            with pytest.raises(DeviceUnusable, match="cudaErrorIllegalAddress"):
                call()
        assert reg.release(1).leaks_reclaimed == 2   # the bookkeeping stays whole
    finally:
        try:
            service.close()
        except CudaError:   # the device is unusable: draining its streams reports the error again
            pass


def test_a_synchronize_without_fault_clears_only_its_own_streams_log():
    with _service() as service:
        reg, k = service.registry, service.host_kernels
        a, b = reg.bind(1), reg.bind(2)
        assert a.stream != b.stream
        x1, x2 = reg.allocate(1, 1024), reg.allocate(2, 1024)
        service.launch(1, k.get("histogram"), LaunchConfig(1, 32), [x1, 16, x1])
        service.launch(2, k.get("histogram"), LaunchConfig(1, 32), [x2, 16, x2])
        service.synchronize(1)
        log = reg.launch_log
        assert log.candidates(a.stream) == ([], 0)
        assert log.candidates(b.stream) == (["histogram"], 0)
        reg.release(1)
        reg.release(2)


def test_the_log_keeps_the_latest_launches_and_counts_the_rest():
    log = LaunchLog()
    for i in range(5 * LaunchLog.KEEP + 3):
        log.record(7, f"k{i}")
    names, dropped = log.candidates(7)
    assert len(names) + dropped == 5 * LaunchLog.KEEP + 3
    assert len(names) <= 2 * LaunchLog.KEEP and names[-1] == f"k{5 * LaunchLog.KEEP + 2}"
    assert "earlier launch(es) not kept" in LaunchLog.describe(names, dropped)
    log.clear(7)
    assert log.candidates(7) == ([], 0)
    assert LaunchLog.describe([], 0).startswith("no kernel was launched")


@pytest.mark.parametrize("fast_path", ["python", "native"])
def test_the_java_hot_path_fails_fast_too_after_a_fault(fast_path):
    """The Java hot path allocates and launches without the service's own calls: it is told when
    the GPU becomes unusable and refuses from then on, on both twins."""
    from cudabridge.jvm.hot_path import JavaHotPath

    service = _service()
    try:
        hot = JavaHotPath(service, fast_path=fast_path)
        assert hot.fast_path == fast_path
        service.bind_task(1)
        handle, _ = hot.allocate(1, 4096)
        faults = hot.register_kernel(service.host_kernels.get("faults"))
        hot.launch(1, faults, (1, 1, 1, 1, 1, 1), 0, (handle,), bytes([0]), (0,))
        with pytest.raises(KernelFault, match=r"\(the candidates\): faults$"):
            hot.synchronize(1)
        with pytest.raises(DeviceUnusable, match="allocate: the GPU is unusable"):
            hot.allocate(1, 64)
        with pytest.raises(DeviceUnusable, match="launch: the GPU is unusable"):
            hot.launch(1, faults, (1, 1, 1, 1, 1, 1), 0, (handle,), bytes([0]), (0,))
        hot.free(handle)   # frees go on: they only return memory
        service.release_task(1)
    finally:
        try:
            service.close()
        except CudaError:
            pass

