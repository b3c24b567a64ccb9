import os

# The emulated device's stream-ordering race detector is on for the whole suite, here at import
# so that the emulated backends of the processes the tests start (the JVM bridge, Spark) inherit
# it. A test that needs it off says so (EmulatedBackend(race_check=False)).
os.environ["CUDABRIDGE_EMULATED_RACE_CHECK"] = "1"

import pytest  # noqa: E402

from cudabridge.device import EmulatedBackend, gpu_visible  # noqa: E402

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
    assert backend.race_check
    yield backend
    backend.close()
    # Fails the test even where the code under test caught the StreamOrderRace.
    assert not backend.races, "stream-ordering races: " + "; ".join(map(str, backend.races))


@pytest.fixture
def cuda_backend():
    from cudabridge.device.cuda_backend import CudaBackend

    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    backend = CudaBackend()
    backend.set_device(0)
    yield backend
    backend.close()


@pytest.fixture
def nvrtc():
    """NVRTC through cuda.bindings (it needs no GPU, only libnvrtc); skips where the library is not
    installed (CI has none; the GPU machines have it)."""
    try:
        from cuda.bindings import nvrtc as module
        module.nvrtcVersion()
    except Exception as exc:
        pytest.skip(f"needs NVRTC (libnvrtc): {type(exc).__name__}: {str(exc).splitlines()[0]}")
    return module
