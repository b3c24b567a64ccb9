"""The emulated device as the C paths' driver (device/emulated_driver.py): its table is
jvm/cuda_driver.h's cb_driver field for field; called as C calls it, each entry point acts on the
emulated device as the driver would on a GPU (page-locked copies asynchronous, pageable ones
staged or waited for, a pending event NOT_READY, the driver's error codes), under the race
detector; and the Java hot path's C twin takes launches and copies itself on the emulated device
instead of leaving them to the Python reference, so that CI runs that C code."""

from __future__ import annotations

import ctypes
import re
import time
from pathlib import Path

import numpy as np
import pytest

from cudabridge.config import ServiceConfig
from cudabridge.device import EmulatedBackend
from cudabridge.device.emulated_driver import (
    CUDA_ERROR_DEINITIALIZED,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_NOT_READY,
    CUDA_SUCCESS,
    DriverTable,
)
from cudabridge.errors import StreamOrderRace
from cudabridge.jvm.hot_path import KIND_CODES, JavaHotPath
from cudabridge.kernels.modules import ModuleSource
from cudabridge.memory import native
from cudabridge.service import CudaBridgeService

ROOT = Path(__file__).resolve().parents[1]
F32 = KIND_CODES.index("f32")


def test_the_table_is_cuda_driver_hs_cb_driver_field_for_field():
    header = (ROOT / "python" / "cudabridge" / "jvm" / "cuda_driver.h").read_text()
    body = re.search(r"typedef struct \{(.*?)\} cb_driver;", header, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = re.findall(r"\(\*(\w+)\)", body)
    assert ["ready", "failure"] + fields == [name for name, _ in DriverTable._fields_]
    assert re.search(r"int ready;\s*char failure\[256\];", body)


@pytest.fixture
def be():
    backend = EmulatedBackend(devices=2, memory_bytes=64 << 20, race_check=True)
    yield backend
    backend.close()


def test_a_page_locked_copy_is_asynchronous_and_the_race_detector_sees_it(be):
    t = be.native_driver._table
    a, b = be.stream_create(), be.stream_create()
    dev = be.malloc(1 << 20)
    pinned = be.alloc_pinned(1 << 20)
    ctypes.memset(pinned, 7, 1 << 20)
    assert t.cuMemcpyHtoDAsync(dev, ctypes.addressof(pinned), 1 << 20, a) == CUDA_SUCCESS
    # unordered with the copy on stream a: the detector finds it, whatever ran first
    with pytest.raises(StreamOrderRace, match="cudaMemsetAsync"):
        be.memset_async(dev, 0, 4096, b)
    be.races.clear()
    assert t.cuStreamSynchronize(a) == CUDA_SUCCESS
    out = bytearray(1 << 20)
    be.copy_from_device_async(out, dev, a)
    assert out == b"\x07" * (1 << 20)


def test_a_pageable_copy_from_the_device_has_the_data_on_return(be):
    t = be.native_driver._table
    s = be.stream_create()
    dev = be.malloc(4096)
    be.memset_async(dev, 9, 4096, s)
    host = (ctypes.c_char * 4096)()   # not the backend's page-locked memory
    assert t.cuMemcpyDtoHAsync(ctypes.addressof(host), dev, 4096, s) == CUDA_SUCCESS
    assert host.raw == b"\x09" * 4096


def test_events_contexts_and_error_codes_are_the_drivers(be):
    d = be.native_driver
    t = d._table
    ctx = ctypes.c_void_p()
    assert t.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 1) == CUDA_SUCCESS and ctx.value == 2
    assert t.cuCtxSetCurrent(ctx) == CUDA_SUCCESS and be.get_device() == 1
    current = ctypes.c_void_p()
    assert t.cuCtxGetCurrent(ctypes.byref(current)) == CUDA_SUCCESS and current.value == 2
    s = be.stream_create()
    event = ctypes.c_void_p()
    assert t.cuEventCreate(ctypes.byref(event), 2) == CUDA_SUCCESS
    gate = []
    be.launch_host_func(s, lambda: gate.append(time.sleep(0.2)))
    assert t.cuEventRecord(event, s) == CUDA_SUCCESS
    assert t.cuEventQuery(event) == CUDA_ERROR_NOT_READY
    assert t.cuEventSynchronize(event) == CUDA_SUCCESS and gate
    assert t.cuEventQuery(event) == CUDA_SUCCESS
    assert t.cuEventDestroy(event) == CUDA_SUCCESS
    assert t.cuStreamSynchronize(0xDEAD0) == CUDA_ERROR_INVALID_HANDLE
    name = ctypes.c_char_p()
    assert t.cuGetErrorName(CUDA_ERROR_NOT_READY, ctypes.byref(name)) == CUDA_SUCCESS
    assert name.value == b"CUDA_ERROR_NOT_READY"
    be.close()
    assert t.cuStreamSynchronize(s) == CUDA_ERROR_DEINITIALIZED


needs_core = pytest.mark.skipif(native.load() is None or not native.supported()[0],
                                reason="the C paths are not built or switched off")
SAXPY = 'extern "C" __global__ void saxpy(const float* x, float* y, int n, float a) {}'


@needs_core
def test_the_hot_paths_c_twin_launches_through_the_emulated_driver():
    """The C launch takes the kernel itself (launches_referred stays), with the buffers' extents
    for the race detector, and gives what the Python reference gives."""
    config = ServiceConfig(backend="emulated", emulated_kernels="host_kernels_for_tests", emulated_memory="64m",
                           streams_per_gpu=4, high_priority_streams=0)
    with CudaBridgeService(config) as service:
        c, py = JavaHotPath(service, fast_path="native"), JavaHotPath(service, fast_path="python")
        saxpy = service.load_module(ModuleSource.of(SAXPY)).kernel("saxpy")
        n = 1024
        results = {}
        for task, hot in ((1, c), (2, py)):
            b = service.bind_task(task)
            kid = hot.register_kernel(saxpy)
            before = hot.counters
            x, xp = hot.allocate(task, 4 * n)
            y, yp = hot.allocate(task, 4 * n)
            service.backend.copy_to_device_async(xp, np.arange(n, dtype=np.float32).tobytes(), b.stream)
            service.backend.copy_to_device_async(yp, np.ones(n, dtype=np.float32).tobytes(), b.stream)
            a = int(np.array([2.0], np.float32).view(np.uint32)[0])
            hot.launch(task, kid, (n // 256, 1, 1, 256, 1, 1), 0, (x, y, n, a), bytes([0, 0, 3, F32]), (0, 0, 0, 0))
            hot.synchronize(task)
            out = bytearray(4 * n)
            service.backend.copy_from_device_async(out, yp, b.stream)
            results[task] = np.frombuffer(bytes(out), np.float32)
            after = hot.counters
            assert after["launches"] - before["launches"] == 1
            if hot is c:
                assert after["launches_referred"] == before["launches_referred"]   # the C path took it
            service.release_task(task)
        assert np.array_equal(results[1], 1 + 2 * np.arange(n, dtype=np.float32))
        assert np.array_equal(results[1], results[2])
        assert not service.backend.races
