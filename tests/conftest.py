import os

import pytest

from cudabridge.device import EmulatedBackend, gpu_visible

_VISIBLE, _WHY = gpu_visible()


def pytest_collection_modifyitems(config, items):
    if _VISIBLE:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {_WHY}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def emulated():
    backend = EmulatedBackend(devices=1, memory_bytes=1 << 30)
    yield backend
    backend.close()


@pytest.fixture
def cuda_backend():
    from cudabridge.device.cuda_backend import CudaBackend

    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    backend = CudaBackend()
    backend.set_device(0)
    yield backend
    backend.close()
