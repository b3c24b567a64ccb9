"""The service's C paths are required parts of an install (setup.py builds them): here they
must all load, so that the differential and interruption tests that skip without them never skip
silently. Switched off at run time, the service runs their Python twins and says so: a WARN line
at start and ``c_paths_missing`` in its statistics (the opt-out build: test_wheel_install.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cudabridge.memory import native


def test_every_c_path_is_built_and_loads():
    if os.environ.get(native.ENV_SWITCH) is not None and not native.supported()[0]:
        pytest.skip(f"{native.ENV_SWITCH} is set: {native.supported()[1]}")
    assert native.unavailable() == {}, "a C path does not load: run ./dev/setup (it builds them), or see its error"


def test_every_c_path_setup_py_builds_has_its_source():
    for module, c_path in native.EXTENSIONS.items():
        assert (native.PACKAGE_DIR / c_path.source).is_file(), module


@pytest.mark.parametrize("value, missing", [("0", len(native.EXTENSIONS)), ("1", 0)])
def test_the_service_says_when_it_runs_without_its_c_paths(value, missing):
    code = ("import logging; logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s'); "
            "from cudabridge import CudaBridgeService, ServiceConfig; "
            "s = CudaBridgeService(ServiceConfig(backend='emulated')); "
            "print('missing', s.statistics().c_paths_missing, s.statistics().totals()['c_paths_missing']); s.close()")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, native.ENV_SWITCH: value})
    assert run.returncode == 0, run.stderr
    assert f"missing {missing} {missing}" in run.stdout
    warned = [line for line in run.stderr.splitlines() if line.startswith("WARNING") and "C paths" in line]
    if missing:
        assert len(warned) == 1 and f"WITHOUT {missing} of its C paths" in warned[0], run.stderr
        assert f"{native.ENV_SWITCH} switches it off" in warned[0]
    else:
        assert not warned, run.stderr


def test_no_tracked_file_is_one_git_ignores():
    """Build outputs (the C paths' .so files, jars) are ignored and never committed: a committed one
    would shadow a fresh build of a clean checkout with another machine's binary."""
    root = native.PACKAGE_DIR.parent.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    run = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [], f"tracked files git ignores: {run.stdout.split()}"
