"""Where the CUDA headers are, for NVRTC: the include directories a user kernel's
``#include <cuda_fp16.h>`` or ``#include <cuda/std/limits>`` (CCCL) is found in.

NVRTC searches no directory of its own for them: without ``--include-path`` such an include
fails ("could not open source file"). The service finds the CUDA toolkit's include directory
(the one holding ``cuda_runtime.h``) once per process and passes it, with CCCL's where that is
separate (``include/cccl`` in CUDA 13 toolkits and wheels; a wheel of its own in CUDA 12),
unless the compile options name include paths of their own. Candidates, in order:

1. ``cuda.pathfinder`` where it is importable (the locator cuda.bindings loads NVRTC with: pip
   wheels, conda, ``CUDA_PATH`` / ``CUDA_HOME``, system directories);
2. NVIDIA's pip wheels on the Python path: ``nvidia/cu13/include`` (CUDA 13),
   ``nvidia/cuda_runtime/include`` and ``nvidia/cuda_cccl/include`` (CUDA 12);
3. ``$CUDA_PATH/include``, ``$CUDA_HOME/include``;
4. ``/usr/local/cuda/include``, then ``/usr/local/cuda-X.Y/include``, newest first.

Where NVRTC's major version is known, the first candidate whose ``CUDART_VERSION`` has that
major wins (a CUDA 12 toolkit's headers with NVRTC 13 may not compile), else the first found.
The directories chosen are part of a module's cache key, so a different toolkit recompiles.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import re
import site
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

log = logging.getLogger(__name__)

TOOLKIT_HEADER = "cuda_runtime.h"               # what makes a directory the toolkit's include
CCCL_HEADER = os.path.join("cuda", "std", "version")   # what makes one CCCL's
TOOLKIT_WHEEL_DIRS = ("nvidia/cu13/include", "nvidia/cuda_runtime/include")
CCCL_WHEEL_DIRS = ("nvidia/cu13/include/cccl", "nvidia/cuda_cccl/include")
SYSTEM_DIRS = ("/usr/local/cuda/include", "/usr/local/cuda-*/include")
_CUDART_VERSION = re.compile(rb"#define\s+CUDART_VERSION\s+(\d+)")


@dataclass(frozen=True)
class CudaHeaders:
    """The include directories to pass NVRTC (the toolkit's, then CCCL's if separate; empty when
    none was found) and where the search looked, in order, in words (for the error hint)."""

    include_dirs: tuple[str, ...]
    looked_in: tuple[str, ...]

    def options(self) -> list[str]:
        return [f"--include-path={d}" for d in self.include_dirs]

    def key(self) -> str:
        """The part of a module's cache key that says which headers it compiled with."""
        return os.pathsep.join(self.include_dirs) or "none"

    def hint(self, missing: str) -> str:
        """What a compile that could not open ``missing`` adds to its error."""
        if self.include_dirs:
            return f"<{missing}> is not under the CUDA include directories passed ({', '.join(self.include_dirs)})"
        return (f"no CUDA include directory was found for <{missing}> (looked in: {', '.join(self.looked_in)}): "
                f"install the CUDA headers (a CUDA toolkit, or the nvidia-cuda-runtime and nvidia-cuda-cccl "
                f"wheels), set CUDA_HOME, or pass --include-path=<dir> as a compile option")


def cuda_version_major(include_dir: str) -> int | None:
    """The CUDA major version of a toolkit include directory (``CUDART_VERSION`` 13000 -> 13)."""
    try:
        with open(os.path.join(include_dir, "cuda_runtime_api.h"), "rb") as f:
            m = _CUDART_VERSION.search(f.read())
    except OSError:
        return None
    return int(m.group(1)) // 1000 if m else None


def python_site_dirs() -> list[str]:
    """The directories a pip wheel may be installed in: the Python path, then site-packages."""
    dirs = [p for p in sys.path if p and os.path.isdir(p)]
    try:
        dirs += site.getsitepackages()
    except AttributeError:   # some embedded interpreters
        pass
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return list(dict.fromkeys(os.path.abspath(d) for d in dirs))


def _pathfinder(libname: str) -> str | None:
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except Exception:   # not installed, or too old to locate headers
        return None
    try:
        return find_nvidia_header_directory(libname)
    except Exception as exc:   # an unsupported name, or a failed probe: the other candidates remain
        log.debug("cuda.pathfinder could not locate %s headers: %s", libname, exc)
        return None


def _system_dirs(patterns: Iterable[str]) -> list[str]:
    out: list[str] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            def version(path: str) -> tuple[int, ...]:
                return tuple(int(n) for n in re.findall(r"\d+", os.path.basename(os.path.dirname(path))))
            out += sorted(glob.glob(pattern), key=version, reverse=True)
        else:
            out.append(pattern)
    return out


def find_cuda_headers(site_dirs: Sequence[str] | None = None, environ: Mapping[str, str] | None = None,
                      system_dirs: Iterable[str] = SYSTEM_DIRS, use_pathfinder: bool = True,
                      prefer_major: int | None = None) -> CudaHeaders:
    """Find the CUDA toolkit's include directory, and CCCL's if separate (a pure filesystem search:
    every argument overrides where it looks, for tests)."""
    site_dirs = python_site_dirs() if site_dirs is None else list(site_dirs)
    environ = os.environ if environ is None else environ
    candidates: list[str] = []
    looked: list[str] = []            # what the hint says, one entry per place
    if use_pathfinder:
        found = _pathfinder("cudart")
        candidates += [found] if found else []
        looked.append(f"cuda.pathfinder ({found or 'found none'})")
    candidates += [os.path.join(d, w) for d in site_dirs for w in TOOLKIT_WHEEL_DIRS]
    looked.append(f"{' and '.join(TOOLKIT_WHEEL_DIRS)} under the {len(site_dirs)} directories of the Python path")
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if environ.get(var):
            candidates.append(os.path.join(environ[var], "include"))
        looked.append(f"${var}/include" + (f" ({os.path.join(environ[var], 'include')})" if environ.get(var)
                                            else " (unset)"))
    system = _system_dirs(system_dirs)
    candidates += system
    looked += system
    candidates = list(dict.fromkeys(os.path.normpath(c) for c in candidates))
    toolkits = [c for c in candidates if os.path.isfile(os.path.join(c, TOOLKIT_HEADER))]
    if not toolkits:
        return CudaHeaders((), tuple(looked))
    toolkit = next((t for t in toolkits if prefer_major is not None and cuda_version_major(t) == prefer_major),
                   toolkits[0])
    dirs = [toolkit]
    if not os.path.isfile(os.path.join(toolkit, CCCL_HEADER)):       # CCCL not in the include itself
        cccl = [os.path.join(toolkit, "cccl")]
        if use_pathfinder:
            cccl += [found] if (found := _pathfinder("cccl")) else []
        cccl += [os.path.join(d, w) for d in site_dirs for w in CCCL_WHEEL_DIRS]
        hit = next((c for c in dict.fromkeys(os.path.normpath(c) for c in cccl)
                    if os.path.isfile(os.path.join(c, CCCL_HEADER))), None)
        if hit is not None:
            dirs.append(hit)
    return CudaHeaders(tuple(dirs), tuple(looked))


@functools.lru_cache(maxsize=None)
def cuda_headers(prefer_major: int | None = None) -> CudaHeaders:
    """:func:`find_cuda_headers` once per process (and NVRTC major version)."""
    headers = find_cuda_headers(prefer_major=prefer_major)
    if headers.include_dirs:
        log.info("CUDA headers for NVRTC compiles: %s", ", ".join(headers.include_dirs))
    else:
        log.info("no CUDA headers found for NVRTC compiles (looked in: %s)", ", ".join(headers.looked_in))
    return headers


def nvrtc_major(nvrtc: Any) -> int | None:
    """NVRTC's major version (``cuda.bindings.nvrtc``), to prefer headers of the same CUDA."""
    result = nvrtc.nvrtcVersion()
    return int(result[1]) if result[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS else None


def names_include_path(options: Iterable[str]) -> bool:
    """Whether compile options give include paths of their own (then none is added)."""
    return any(o.startswith(("-I", "--include-path")) for o in options)
