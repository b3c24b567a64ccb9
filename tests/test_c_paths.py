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


def _local_includes(path):
    import re

    return re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.MULTILINE)


@pytest.mark.parametrize("module", sorted(native.EXTENSIONS))
def test_every_header_a_c_path_includes_is_an_input_of_its_build(module):
    """A change to any header an extension includes, its own or a shared one (lease_protocol.h),
    rebuilds it: setup.py's depends and build()'s freshness check both come from native.inputs,
    and the include path from native.include_dirs."""
    source = native.PACKAGE_DIR / native.EXTENSIONS[module].source
    inputs = {p.resolve() for p in native.inputs(source)}
    dirs = [d.resolve() for d in native.include_dirs(source)]
    seen, todo = set(), [source]
    while todo:
        for name in _local_includes(todo.pop()):
            found = [d / name for d in dirs if (d / name).is_file()]
            assert found, f"{module}: #include \"{name}\" is on none of its include dirs {dirs}"
            header = found[0].resolve()
            assert header in inputs, f"{module}: {header} is included but not an input of its build"
            if header not in seen:
                seen.add(header)
                todo.append(header)


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


def test_dev_setup_rebuilds_when_any_native_source_changes():
    """./dev/setup reinstalls only when a build input is newer than its stamp: every kind of source
    setup.py compiles must be among the names it looks at (a changed .cpp once went unbuilt)."""
    import re

    root = native.PACKAGE_DIR.parent.parent
    text = (root / "dev" / "setup").read_text()
    watched = {m for m in re.findall(r"-name '\*(\.[a-z]+)'", text)}
    sources = [native.PACKAGE_DIR / p.source for p in (*native.EXTENSIONS.values(), *native.ALLOCATOR_PARTS.values())]
    needed = {p.suffix for p in sources} | {p.suffix for s in sources for p in native.inputs(s)}
    assert needed <= watched, f"dev/setup does not look at {sorted(needed - watched)}"
