"""The service's C paths: five Python extensions, built by the package's build (setup.py) as
required parts, and loaded here.

* ``cudabridge.memory._fastpath``: the pool's allocate/free (its Python twin: python_fast_path.py);
* ``cudabridge._registry_core``: the task registry's bind/release (task_registry.py);
* ``cudabridge.jvm._hotcore``: the Java hot path's allocate/free/copies (jvm/hot_path.py);
* ``cudabridge.allocators._library_core``: the library allocators' allocate and drain
  (allocators/library_allocator.py);
* ``cudabridge.functions._call_core``: a Python function's call from Java
  (jvm/function_calls.py over functions/function_calls.py).

Each has a Python twin, the reference its C code follows line by line, which runs where the
extension is missing: a build with ``CUDABRIDGE_NATIVE_FAST_PATH=0`` (the explicit opt-out, which
builds none), a free-threaded CPython, or the ``nativeFastPath`` setting false at run time. The
service says so at start (a WARN line) and counts them in ``c_paths_missing``.
:func:`build` compiles one with the interpreter's own headers and gcc, no setuptools: for machines
that have a compiler and a Python but no package index (the GPU machine,
``python -m cudabridge.memory.build_fastpath``); the flags are setup.py's.
"""

from __future__ import annotations

import importlib
import logging
import os
import shlex
import subprocess
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from ..config import BY_KEY, check_value

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = HERE.parent
SOURCE = HERE / "_fastpath.c"
ENV_SWITCH = BY_KEY["nativeFastPath"].env_name   # CUDABRIDGE_NATIVE_FAST_PATH


class CPath(NamedTuple):
    source: str   # relative to the package directory
    twin_of: str  # whose Python code it stands in for


# module -> its C source (setup.py builds these) and what it speeds up
EXTENSIONS = {
    "cudabridge.memory._fastpath": CPath("memory/_fastpath.c", "the memory pool's"),
    "cudabridge._registry_core": CPath("_registry_core.c", "the task registry's"),
    "cudabridge.jvm._hotcore": CPath("jvm/_hotcore.c", "the Java hot path's"),
    "cudabridge.allocators._library_core": CPath("allocators/_library_core.c", "the library allocators'"),
    "cudabridge.functions._call_core": CPath("functions/_call_core.c", "the Python function calls'"),
}
# The allocator plug-ins' compiled parts: Python extensions with no Python twin, loaded by a
# library by path (PyTorch's CUDAPluggableAllocator loads its functions by name), built with the
# C paths as required parts of an install. C++: a failed allocation throws into the library.
ALLOCATOR_PARTS = {
    "cudabridge.allocators._torch_allocator": CPath("allocators/_torch_allocator.cpp", "PyTorch's pluggable allocator"),
}
# The compiler flags of every extension (setup.py and build() use these, so that both make the
# same code). -UNDEBUG: setuptools adds Python's own CFLAGS, -DNDEBUG among them, which measured
# 3-6% slower on the pool's alloc+free pair here (bench_core, 11 interleaved rounds: code layout,
# not the headers' assertions); the C paths are built as they were measured (bench/RESULTS.md).
COMPILE_ARGS = ("-O2", "-UNDEBUG", "-Wall", "-Werror=implicit-function-declaration")
LIBRARIES = ("dl",)
# Headers every C twin may include (lease_protocol.h): the package directory is on each one's
# include path, and its headers are inputs of each build.
SHARED_INCLUDE = PACKAGE_DIR


def include_dirs(source: Path) -> list[Path]:
    """Where ``source``'s headers are found: beside it, then the shared ones."""
    return [source.parent] if source.resolve().parent == SHARED_INCLUDE else [source.parent, SHARED_INCLUDE]


def inputs(source: Path) -> list[Path]:
    """What a build of ``source`` depends on: the source and every header on its include path
    (jvm/cuda_driver.h, ..., lease_protocol.h)."""
    return [source, *(h for d in include_dirs(source) for h in sorted(d.glob("*.h")))]


def target(source: Path = SOURCE) -> Path:
    return source.with_name(source.stem + sysconfig.get_config_var("EXT_SUFFIX"))


def supported() -> tuple[bool, str]:
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return False, "free-threaded CPython: the C fast path relies on the GIL"
    value = os.environ.get(ENV_SWITCH, "true")
    try:
        on = check_value("nativeFastPath", value, ENV_SWITCH)
    except ValueError as exc:   # the service refuses to start on it; an import must not fail on it
        return False, str(exc)
    if not on:
        return False, f"{ENV_SWITCH} switches it off"
    return True, ""


def build(force: bool = False, cc: str | None = None, source: Path = SOURCE) -> Path:
    """Compile the extension next to its source (if older than the source, or ``force``). The
    Java hot path's ``cudabridge/jvm/_hotcore.c`` is built the same way (``source=``)."""
    out = target(source)
    if not force and out.exists() and all(out.stat().st_mtime >= p.stat().st_mtime for p in inputs(source)):
        return out
    cc = cc or (os.environ.get("CXX") or "g++" if source.suffix == ".cpp" else os.environ.get("CC") or "gcc")
    include = sysconfig.get_paths()["include"]
    cmd = [*shlex.split(cc), *COMPILE_ARGS, "-fPIC", "-shared", f"-I{include}", *(f"-I{d}" for d in include_dirs(source)), str(source),
           "-o", str(out) + ".tmp", *(f"-l{lib}" for lib in LIBRARIES)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise RuntimeError(f"cannot build {source.name}: compiler {cc!r} not found") from exc
    if proc.returncode != 0:
        raise RuntimeError(f"building {source.name} failed ({' '.join(cmd)}):\n{proc.stderr}")
    os.replace(str(out) + ".tmp", out)
    return out


def load(module: str = "cudabridge.memory._fastpath") -> ModuleType | None:
    """The extension module (the pool's, or ``cudabridge.jvm._hotcore``), or None (and why,
    logged at debug level)."""
    ok, why = supported()
    if not ok:
        log.debug("%s not used, the Python path runs: %s", module, why)
        return None
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        log.debug("%s not used, the Python path runs: the C extension is not built (%s)", module, exc)
        return None


def unavailable() -> dict[str, str]:
    """The C paths that do not run here: module -> why (empty in a normal install)."""
    ok, why = supported()
    out = {}
    for module in EXTENSIONS:
        if not ok:
            out[module] = why
            continue
        try:
            importlib.import_module(module)
        except ImportError as exc:
            out[module] = f"not built ({exc})"
    return out
