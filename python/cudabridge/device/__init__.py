"""Device backends: ``cuda`` (the real GPU through cuda-python) and ``emulated`` (a CPU model).

:func:`open_backend` with ``"auto"`` picks ``cuda`` when a GPU is visible and ``emulated``
otherwise, and logs which it picked and why.
"""

from __future__ import annotations

import logging
import os

from ..errors import CudaError
from ..modes import Mode
from .backend import (
    DEFAULT_STREAM,
    LEGACY_STREAM,
    PER_THREAD_STREAM,
    DeviceAllocationFailed,
    DeviceBackend,
)
from .emulated_backend import EmulatedBackend

log = logging.getLogger(__name__)



class Backend(Mode):
    """Which device backend: ``auto`` picks ``cuda`` when a GPU is visible, else ``emulated``."""
    AUTO = "auto"
    CUDA = "cuda"
    EMULATED = "emulated"


__all__ = [
    "Backend",
    "DEFAULT_STREAM",
    "LEGACY_STREAM",
    "PER_THREAD_STREAM",
    "DeviceAllocationFailed",
    "DeviceBackend",
    "EmulatedBackend",
    "gpu_visible",
    "open_backend",
]


def gpu_visible() -> tuple[bool, str]:
    """Whether cuda-python sees a usable GPU, and the reason when it does not.

    No driver (``cudaErrorInsufficientDriver``), no libcuda (``DynamicLibNotFoundError``), no
    bindings installed, or zero devices all mean "no GPU"."""
    try:
        from cuda.bindings import runtime
    except Exception as exc:  # ImportError, or the bindings failing to find their libraries
        return False, f"cuda-python is not importable ({type(exc).__name__}: {exc})"
    try:
        err, count = runtime.cudaGetDeviceCount()
    except Exception as exc:
        return False, f"cudaGetDeviceCount raised {type(exc).__name__}: {exc}"
    if err != runtime.cudaError_t.cudaSuccess:
        return False, f"cudaGetDeviceCount returned {getattr(err, 'name', err)}"
    if count < 1:
        return False, "cudaGetDeviceCount found no device"
    return True, f"{count} CUDA device(s) visible"


def open_backend(name: str = "auto", *, emulated_devices: int | None = None,
                 emulated_memory_bytes: int | None = None, race_check: bool | None = None) -> DeviceBackend:
    """Open a backend by name. The emulated backend's shape comes from the arguments or from
    ``CUDABRIDGE_EMULATED_DEVICES`` / ``CUDABRIDGE_EMULATED_MEMORY`` (bytes); ``race_check``
    turns its stream-ordering race detector on or off (``None``: ``CUDABRIDGE_EMULATED_RACE_CHECK``,
    off when unset). The CUDA backend has no race detector and ignores it."""
    name = Backend.parse(name, "device backend")
    if name == "auto":
        visible, why = gpu_visible()
        name = "cuda" if visible else "emulated"
        log.info("device backend 'auto' picked %r: %s", name, why)
    if name == "cuda":
        visible, why = gpu_visible()
        if not visible:
            raise CudaError("cudaGetDeviceCount", 100, "cudaErrorNoDevice", f"backend 'cuda' needs a GPU: {why}")
        from .cuda_backend import CudaBackend

        return CudaBackend()
    devices = emulated_devices if emulated_devices is not None else int(os.environ.get("CUDABRIDGE_EMULATED_DEVICES", "1"))
    memory = (emulated_memory_bytes if emulated_memory_bytes is not None
              else int(os.environ.get("CUDABRIDGE_EMULATED_MEMORY", str(16 << 30))))
    return EmulatedBackend(devices=devices, memory_bytes=memory, race_check=race_check)
