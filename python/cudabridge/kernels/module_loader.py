"""How the service loads a module, and what its cache key's target is (the ``ModuleCache``'s loader
and target, ``service.modules``).

On the emulated device a module is an :class:`~.modules.EmulatedModule` (host twins, and its
globals in the device's memory); the target is ``emulated``. On a GPU a module is a
:class:`~.cuda_module.CudaModule`, and the target names everything outside the source that
changes what a compile produces: the GPU's architecture, NVRTC's version and the CUDA include
directories (``cuda_headers.py``), so that another toolkit recompiles.
"""

from __future__ import annotations

from typing import Any

from .cuda_headers import cuda_headers, nvrtc_major
from .modules import EmulatedModule, ModuleSource


class ModuleLoader:
    def __init__(self, backend: Any, host_kernels: Any, config: Any) -> None:
        self.backend = backend
        self.host_kernels = host_kernels
        self.config = config

    @property
    def emulated(self) -> bool:
        return self.backend.name == "emulated"

    def target(self, gpu: int) -> str:
        """The part of the cache key that is not the source (``ModuleSource.digest(target)``): on a
        GPU its architecture, NVRTC's version and the CUDA include directories compiles use."""
        if self.emulated:
            return "emulated"
        nvrtc = self.backend.nvrtc
        return (f"{self.backend.compute_arch(gpu)}/nvrtc{nvrtc.nvrtcVersion()[1:]}"
                f"/include={cuda_headers(nvrtc_major(nvrtc)).key()}")

    def load(self, source: ModuleSource, gpu: int) -> Any:
        if self.emulated:
            return EmulatedModule(source, self.host_kernels, self.backend, gpu)
        from .cuda_module import CudaModule
        return CudaModule(self.backend, source, gpu)
