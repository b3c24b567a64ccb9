"""How the service loads a module, and what its cache key's target is (the ``ModuleCache``'s loader
and target, ``service.modules``).

On the emulated device a module is an :class:`~.modules.EmulatedModule` (host kernels, and its
globals in the device's memory); the target is ``emulated``, and nothing is compiled. On a GPU a
module is a :class:`~.cuda_module.CudaModule`, and the target names everything outside the source
that changes what a compile produces: the GPU's architecture, NVRTC's version and the CUDA include
directories (``cuda_headers.py``), so that another toolkit recompiles. With
``spark.cudabridge.moduleCacheDir`` set, CUDA source compiled here is kept on disk under the same
key (``module_store.py``) and a later process loads the PTX instead of compiling.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .cuda_headers import cuda_headers, nvrtc_major
from .module_store import ModuleStore
from .modules import EmulatedModule, ModuleLoadError, ModuleSource

log = logging.getLogger(__name__)


class ModuleLoader:
    def __init__(self, backend: Any, host_kernels: Any, config: Any) -> None:
        self.backend = backend
        self.host_kernels = host_kernels
        directory = config.module_cache_dir          # unset or blank: no disk cache
        self.store = ModuleStore(directory) if directory and directory.strip() else None
        self._lock = threading.Lock()
        self.compiles = 0      # NVRTC compiles run by this loader (a disk hit runs none)

    @property
    def emulated(self) -> bool:
        return self.backend.runs_host_kernels

    def target(self, gpu: int) -> str:
        """The part of the cache key that is not the source (``ModuleSource.digest(target)``)."""
        if self.emulated:
            return "emulated"
        nvrtc = self.backend.nvrtc
        return (f"{self.backend.compute_arch(gpu)}/nvrtc{nvrtc.nvrtcVersion()[1:]}"
                f"/include={cuda_headers(nvrtc_major(nvrtc)).key()}")

    def compile(self, source: ModuleSource, gpu: int) -> tuple[str, dict[str, str]]:
        """(PTX, lowered names) of CUDA source, by NVRTC for GPU ``gpu``."""
        from .cuda_module import compile_to_ptx
        with self._lock:
            self.compiles += 1
        nvrtc = self.backend.nvrtc
        return compile_to_ptx(nvrtc, source, self.backend.compute_arch(gpu), cuda_headers(nvrtc_major(nvrtc)))

    def load(self, source: ModuleSource, gpu: int) -> Any:
        if self.emulated:
            return EmulatedModule(source, self.host_kernels, self.backend, gpu)
        from .cuda_module import CudaModule
        if source.kind != "cuda":
            return CudaModule(self.backend, source, gpu)
        store = self.store
        if store is None:
            return CudaModule(self.backend, source, gpu, compiled=self.compile(source, gpu))
        target = self.target(gpu)
        digest = source.digest(target)      # the key the in-memory cache loads this under
        stored = store.get(digest)
        if stored is not None:
            try:
                return CudaModule(self.backend, source, gpu, compiled=stored)
            except ModuleLoadError as exc:  # the driver refused what was stored: compile afresh
                log.warning("module cache: the driver refused the stored PTX of %s (%s); compiling again",
                            store.path(digest), exc.summary)
                store.discard(digest)
        compiled = self.compile(source, gpu)      # a compile error raises here: nothing is stored
        module = CudaModule(self.backend, source, gpu, compiled=compiled)
        store.put(digest, compiled, target)       # stored once the driver has loaded it
        return module
