"""Closing the service after a kernel fault, and with a stream that does not finish.

Before the fix, ``CudaBridgeService.close()`` after an illegal-address fault raised the device's
error from the memory pool's close and stopped there: the streams and the backend stayed open,
``reserved_bytes`` read 2 MiB, and a second close returned ``[]`` without finishing anything. With a
host kernel that did not return, close waited without end (``hostWaitTimeout`` did not bound it).
Now every step runs, the first error is logged and returned (``CloseReport.errors``,
``device_error``), nothing is raised, and a second close is a no-op.
"""

from __future__ import annotations

import time

import pytest
from device_kernels import spin_async

from cudabridge.config import ServiceConfig
from cudabridge.errors import CudaError, HostWaitTimeout, KernelFault
from cudabridge.kernels import LaunchConfig
from cudabridge.kernels.modules import ModuleSource
from cudabridge.service import CloseReport, CudaBridgeService

FAULTS = 'extern "C" __global__ void faults(int* p) {}'


def _service(**kw) -> CudaBridgeService:
    conf = dict(backend="emulated", emulated_kernels="host_kernels_for_tests", emulated_memory="64m",
                streams_per_gpu=4, high_priority_streams=0, log_level="CRITICAL")
    conf.update(kw)
    return CudaBridgeService(ServiceConfig(**conf))


def test_close_after_a_kernel_fault_releases_everything_and_reports_the_fault_once():
    svc = _service()
    kernel = svc.load_module(ModuleSource.of(FAULTS)).kernel("faults")
    svc.bind_task(1)
    svc.bind_task(2)
    buf = svc.allocate(1, 4096)
    svc.allocate(2, 1 << 20)
    svc.launch(1, kernel, LaunchConfig(1, 1), [buf])
    with pytest.raises(KernelFault):
        svc.synchronize(1)
    report = svc.close()                                  # raises nothing
    assert isinstance(report, CloseReport)
    assert sorted(r.task_id for r in report) == [1, 2]    # both tasks released, their memory reclaimed
    assert isinstance(report.device_error, CudaError) and report.device_error.sticky
    assert report.errors and all(isinstance(e, CudaError) for e in report.errors)
    pool, streams = svc.memory_pool(0), svc.stream_pool(0)
    stats = pool.statistics()
    assert pool.closed and streams.closed and streams.handles == []
    assert (stats.reserved_bytes, stats.in_use_bytes, stats.live_allocations) == (0, 0, 0)
    assert svc.backend._closed
    again = svc.close()                                   # a no-op
    assert list(again) == [] and again.errors == [] and again.device_error is None


def test_a_clean_close_reports_no_error():
    svc = _service()
    svc.bind_task(3)
    svc.allocate(3, 4096)
    report = svc.close()
    assert [r.task_id for r in report] == [3] and report.errors == [] and report.device_error is None


def test_close_is_bounded_by_the_host_wait_timeout_when_a_stream_does_not_finish():
    svc = _service(host_wait_timeout="0.5")
    svc.bind_task(1)
    spin_async(svc.backend, svc.registry.binding(1).stream, 20.0)  # a kernel that runs on and on
    start = time.monotonic()
    report = svc.close()
    took = time.monotonic() - start
    assert took < 8, f"close took {took:.1f} s with a 0.5 s host wait timeout"
    assert any(isinstance(e, HostWaitTimeout) for e in report.errors)
    assert svc.memory_pool(0).statistics().reserved_bytes == 0 and svc.stream_pool(0).closed
