"""The executor's page-locked host memory and its kernels by id are the service's
(memory/page_locked_regions.py, kernels/kernel_table.py): Python task code pins, registers and
names kernels through the service, and the Java bridge's hot path (an adapter over the same
objects) sees the same regions and ids; a task's pinned buffers are reclaimed at its release
whichever front allocated them."""

from __future__ import annotations

import ctypes
import threading

import pytest

from cudabridge.config import ServiceConfig
from cudabridge.errors import InvalidArgument
from cudabridge.jvm.hot_path import JavaHotPath
from cudabridge.kernels.modules import ModuleSource
from cudabridge.service import CudaBridgeService


@pytest.fixture
def service():
    svc = CudaBridgeService(ServiceConfig(backend="emulated", emulated_memory="64m", streams_per_gpu=2,
                                          high_priority_streams=0, pinned_pool="1m",
                                          emulated_kernels="host_kernels_for_tests"))
    yield svc
    svc.close()


def test_python_task_codes_pinned_buffer_is_reclaimed_with_its_task(service):
    regions = service.page_locked
    service.bind_task(7)
    block = regions.alloc_pinned(4096, owner=7)
    kept = regions.alloc_pinned(4096)                        # owned by no task: stays
    assert block.pinned and regions.pinned_buffers == 2
    assert regions.lookup("copy", block.address + 8, 64, 7) == (block.address, block.view)
    service.release_task(7)
    assert regions.pinned_buffers == 1 and regions.reclaimed == 1
    assert regions.lookup("copy", block.address + 8, 64, 0) is None   # back in the pool: not looked up
    with pytest.raises(InvalidArgument, match="not a pinned buffer"):
        regions.free_pinned(block.address)
    regions.free_pinned(kept.address)
    assert regions.pinned_buffers == 0 and service.page_locked.pinned_pool.in_use_bytes == 0


@pytest.mark.parametrize("fast_path", ["python", "native"])
def test_the_java_hot_path_sees_what_python_registered_and_the_reverse(service, fast_path):
    hp = JavaHotPath(service, fast_path=fast_path)
    service.bind_task(1)
    h, _ = hp.allocate(1, 4096)
    mem = (ctypes.c_char * 8192)()
    base = ctypes.addressof(mem)
    service.page_locked.register(base, 4096)                 # by Python task code

    def pagelocked(address, n):
        a, lease, locked = hp.enter_host_copy(h, 0, address, n, True, False)
        lease.inside.remove(threading.get_ident())
        return locked
    assert pagelocked(base, 64) is True and pagelocked(base + 4096, 64) is False
    hp.unregister_host(base, 1)                               # by Java, for task 1
    with pytest.raises(InvalidArgument, match="unregistered .*by task 1"):
        service.page_locked.lookup("copy_in", base, 64, 1)
    pinned, locked = hp.alloc_pinned(4096, 1)                 # by Java, owned by task 1
    assert locked and service.page_locked.block(pinned).owner == 1
    hp.free(h)
    service.release_task(1)
    assert service.page_locked.block(pinned) is None and hp.counters["pinned_reclaimed"] == 1


def test_kernel_ids_are_the_services(service):
    saxpy = service.load_module(ModuleSource.of('extern "C" __global__ void saxpy(float* x, float* y, int n, '
                                                'float a) {}')).kernel("saxpy")
    a, b = JavaHotPath(service, fast_path="python"), JavaHotPath(service, fast_path="native")
    kid = service.kernels.add(saxpy)
    assert a.register_kernel(saxpy) == b.register_kernel(saxpy) == kid and service.kernels.get(kid) is saxpy
    assert service.kernels.add(saxpy) == kid and len(service.kernels) == 1
