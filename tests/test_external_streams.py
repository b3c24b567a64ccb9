"""Pool streams are plain handles that other CUDA libraries wrap as external streams.

Runs where the library and a GPU are present (the H200 machine has CuPy and PyTorch);
docs/python-api.md documents the same calls.
"""

from __future__ import annotations

import pytest

from cudabridge.config import ServiceConfig
from cudabridge.service import CudaBridgeService

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture
def service():
    svc = CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=4, high_priority_streams=0,
                                          pool_limit="256m"))
    yield svc
    svc.close()


def test_cupy_works_on_a_task_stream_in_pool_memory(service):
    cp = pytest.importorskip("cupy")
    task = service.bind_task(1)
    buf = service.allocate(1, MiB)
    stream = cp.cuda.ExternalStream(task.stream)
    mem = cp.cuda.UnownedMemory(buf.ptr, MiB, owner=buf)
    with stream:
        arr = cp.ndarray((MiB // 4,), dtype=cp.uint32, memptr=cp.cuda.MemoryPointer(mem, 0))
        arr.fill(0xC0FFEE)
        total = int(arr[:1024].sum())
        assert cp.cuda.get_current_stream().ptr == task.stream
    out = bytearray(4096)
    service.backend.copy_from_device_async(out, buf.ptr, task.stream)   # ordered after CuPy's fill
    assert out == (0xC0FFEE).to_bytes(4, "little") * 1024
    assert total == 0xC0FFEE * 1024
    service.release_task(1)


def test_torch_works_on_a_task_stream(service):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    task = service.bind_task(2)
    ext = torch.cuda.ExternalStream(task.stream)
    with torch.cuda.stream(ext):
        assert torch.cuda.current_stream().cuda_stream == task.stream
        x = torch.arange(1 << 16, device="cuda", dtype=torch.float32)
        s = float(x.sum())
    ext.synchronize()
    assert s == float(sum(range(1 << 16)))
    service.release_task(2)
