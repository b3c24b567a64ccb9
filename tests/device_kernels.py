"""The tests' two kernels, on either device: a slow writer and a spinner.

* :func:`fill_u32_async` spins ``delay_s`` seconds, then writes ``count`` 32-bit words of
  ``value`` at ``ptr``: slow writers turn stream-ordering bugs into visible corruption.
* :func:`spin_async` only spins ``seconds``, touching no memory: chains of these show whether
  streams run concurrently, and keep a stream busy while a test looks at what waits for it.

They are no part of the device interface (``DeviceBackend``); each backend runs them through
what it offers any kernel:

* on a GPU (``CudaBackend``), two CUDA kernels compiled once per backend and GPU by NVRTC through
  the project's module loading (``kernels/cuda_module.py``: a ``ModuleSource`` with declared
  signatures, a ``CudaModule``, ``CudaKernel.launch``, which is the backend's ``launch_kernel``);
* on the emulated device, the spin is a host kernel (``launch_host_kernel`` with a ``HostKernel``
  that sleeps and has no pointer: the race detector sees it touch nothing, as before). The fill is
  queued on the stream's worker through the race detector as a write of exactly ``4 * count``
  bytes, under the call name ``cudaLaunchKernel(fill_u32)`` that the tests' race messages assert:
  a host kernel would not do, since the detector counts each of a host kernel's pointers as read
  *and* written, and a fill racing another write would then report ``read-after-write`` where
  the tests expect ``write-after-write``. So this one reaches into the emulated backend's stream
  and race detector (``_stream``, ``_race``) as its own copies and memsets do.

A test wrapper of a backend that must see this work queued (``latched_backend.py``, which latches
the stream first) defines ``fill_u32_async`` / ``spin_async`` itself; these functions call it.
Other wrappers (``faulty_backend.py``) reach the wrapped backend through attribute forwarding.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from cudabridge.device import DeviceBackend
from cudabridge.kernels import HostKernel, LaunchConfig

__all__ = ["fill_u32_async", "spin_async"]

# On a GPU: the Java tools' two kernels (cudabridge.jvm.tools.TOOL_KERNELS, signatures declared),
# the same CUDA source, not a copy of it.
_THREADS = 256


def fill_u32_async(backend: Any, ptr: int, count: int, value: int, stream: int, delay_s: float = 0.0) -> None:
    """On ``stream``: spin ``delay_s`` seconds, then write ``count`` 32-bit words of ``value`` at ``ptr``."""
    own = _wrapper_own(backend, "fill_u32_async")
    if own is not None:
        own(ptr, count, value, stream, delay_s)
    elif _emulated(backend):
        _emulated_fill(backend, ptr, count, value, stream, delay_s)
    else:
        v = value & 0xFFFFFFFF
        blocks = max(1, min(1024, -(-count // _THREADS)))
        _cuda_kernel(backend, "cb_fill_u32").launch(
            backend, stream, LaunchConfig(blocks, _THREADS),
            [ptr, count, v - (1 << 32) if v >= 1 << 31 else v, int(delay_s * 1e9)])


def spin_async(backend: Any, stream: int, seconds: float) -> None:
    """On ``stream``: a kernel that spins ``seconds`` and touches no memory."""
    own = _wrapper_own(backend, "spin_async")
    if own is not None:
        own(stream, seconds)
    elif _emulated(backend):
        backend.launch_host_kernel(stream, _SPIN, LaunchConfig(1, 1), [float(seconds)])
    else:
        _cuda_kernel(backend, "cb_spin").launch(backend, stream, LaunchConfig(1, 1), [int(seconds * 1e9)])


# which path ---------------------------------------------------------------------------------------
def _wrapper_own(backend: Any, name: str) -> Any:
    """A test wrapper's own version of the operation (bound), or None; a device backend has none."""
    if isinstance(backend, DeviceBackend) or getattr(type(backend), name, None) is None:
        return None
    return getattr(backend, name)


def _emulated(backend: Any) -> bool:
    return bool(getattr(backend, "runs_host_kernels", False))


# the emulated device --------------------------------------------------------------------------------
def _spin_host(grid: Any, block: Any, seconds: float) -> None:
    time.sleep(seconds)   # a negative time raises: a faulting kernel, the device's error is sticky


_SPIN = HostKernel("spin", ("f64",), _spin_host, f"{__name__}.spin_async")


def _emulated_fill(backend: Any, ptr: int, count: int, value: int, stream: int, delay_s: float) -> None:
    call = "cudaLaunchKernel(fill_u32)"
    s = backend._stream(call, stream)
    d = s.device.view(call, ptr, 4 * count)     # bounds-checked now, as a launch's arguments are
    word = (value & 0xFFFFFFFF).to_bytes(4, "little")

    def kernel() -> None:
        if delay_s > 0:
            time.sleep(delay_s)
        d[:] = word * count
    race = backend._race
    if race is None:
        s.enqueue(kernel)
    else:
        race.enqueue(s, kernel, call, writes=((ptr, 4 * count),) if count > 0 else ())


# a GPU ------------------------------------------------------------------------------------------------
_modules: "weakref.WeakKeyDictionary[Any, dict[int, Any]]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _cuda_kernel(backend: Any, name: str) -> Any:
    """Kernel ``name`` of the tools' module on the calling thread's current GPU, compiled and loaded
    once per backend and GPU."""
    from cudabridge.jvm.tools import TOOL_KERNELS
    from cudabridge.kernels.cuda_module import CudaModule

    base = backend
    while getattr(base, "inner", None) is not None:   # a test wrapper: the module is the device's
        base = base.inner
    gpu = backend.get_device()
    with _lock:
        per_gpu = _modules.setdefault(base, {})
        module = per_gpu.get(gpu)
        if module is None:
            module = per_gpu[gpu] = CudaModule(base, TOOL_KERNELS, gpu)
    return module.kernel(name)
