"""The project as a user installs it: a wheel built from a source distribution with
``python -m build`` (the build backend in an isolated environment, as pip does), installed into a
fresh virtual environment with no source tree on any path.

``wheel_env`` (session-scoped: built once per test run, about a minute) is shared by the wheel's
own test (test_wheel_install.py) and the standalone cluster's (its packed environment).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT_S = 900


@dataclass(frozen=True)
class WheelEnv:
    venv: Path
    python: Path
    wheel: Path
    sdist: Path
    build_seconds: float
    install_seconds: float

    def env(self, **extra: str) -> dict[str, str]:
        """A process environment for the venv: no PYTHONPATH, nothing of this test run's own."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.update(extra)
        return env

    def run(self, *args: str, cwd: Path, timeout: float = 300, **extra_env: str) -> subprocess.CompletedProcess:
        """``args`` run in the venv's environment from ``cwd`` (outside the source tree)."""
        return subprocess.run(list(args), cwd=cwd, env=self.env(**extra_env), capture_output=True, text=True,
                              timeout=timeout)


def _run(cmd: list, what: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, **kw)
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}): {' '.join(map(str, cmd))}\n" \
                                 f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return proc


def base_python() -> str:
    """The installation Python this test run's venv was made from: a fresh venv is made from it."""
    return getattr(sys, "_base_executable", None) or sys.executable


@pytest.fixture(scope="session")
def wheel_env(tmp_path_factory) -> WheelEnv:
    if not (ROOT / "setup.py").is_file():
        pytest.skip("not a source tree")
    out = tmp_path_factory.mktemp("dist")
    t0 = time.monotonic()
    # sdist, then the wheel from the unpacked sdist: what MANIFEST.in ships is what builds
    _run([sys.executable, "-m", "build", "--outdir", out, ROOT], "python -m build", cwd=out)
    build_s = time.monotonic() - t0
    wheels = sorted(out.glob("*.whl"))
    sdists = sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    venv = tmp_path_factory.mktemp("wheel-venv") / "env"
    t0 = time.monotonic()
    _run([base_python(), "-m", "venv", venv], "python -m venv")
    python = venv / "bin" / "python"
    # with the Spark extra: spark-submit from this environment (pip's cache has pyspark's wheel)
    _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheels[0]}[spark]"],
         "installing the wheel", cwd=out)
    return WheelEnv(venv=venv, python=python, wheel=wheels[0], sdist=sdists[0], build_seconds=build_s,
                    install_seconds=time.monotonic() - t0)
