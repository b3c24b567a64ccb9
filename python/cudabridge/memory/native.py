"""The pool's C fast paths (``_fastpath.c``): build and load.

The extension is optional: without it (no compiler, a free-threaded build, or
``CUDABRIDGE_NATIVE_FAST_PATH=0``) the pool runs its pure-Python fast paths, which are the
reference the C code follows line by line. It is built with the interpreter's own headers
(paths from ``sysconfig``), so it needs neither setuptools nor network, and it can be built on a
machine that only has gcc and a Python (the GPU machine):
``python -m cudabridge.memory.build_fastpath``.
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

from ..config import BY_KEY, check_value

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_fastpath.c"
ENV_SWITCH = BY_KEY["nativeFastPath"].env_name   # CUDABRIDGE_NATIVE_FAST_PATH


def target(source: Path = SOURCE) -> Path:
    return source.with_name(source.stem + sysconfig.get_config_var("EXT_SUFFIX"))


def supported() -> tuple[bool, str]:
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return False, "free-threaded CPython: the C fast path relies on the GIL"
    if not check_value("nativeFastPath", os.environ.get(ENV_SWITCH, "true")):
        return False, f"{ENV_SWITCH} switches it off"
    return True, ""


def build(force: bool = False, cc: str | None = None, source: Path = SOURCE) -> Path:
    """Compile the extension next to its source (if older than the source, or ``force``). The
    Java hot path's ``cudabridge/jvm/_hotcore.c`` is built the same way (``source=``)."""
    out = target(source)
    inputs = [source, *source.parent.glob("*.h")]   # the headers beside it (jvm/cuda_driver.h, ...)
    if not force and out.exists() and all(out.stat().st_mtime >= p.stat().st_mtime for p in inputs):
        return out
    cc = cc or os.environ.get("CC") or "gcc"
    include = sysconfig.get_paths()["include"]
    cmd = [*shlex.split(cc), "-O2", "-fPIC", "-shared", "-Wall", "-Werror=implicit-function-declaration",
           f"-I{include}", f"-I{source.parent}", str(source), "-o", str(out) + ".tmp", "-ldl"]
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

