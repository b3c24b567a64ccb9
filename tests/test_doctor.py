"""``python -m cudabridge doctor``: the real command on this machine (every line ok or warn with the
emulated backend), and each failure made real in a copy of the package's ``_native/`` build
(``run_checks(native_dir=...)``), a switched-off or missing C fast path, a bad configuration, and
the cuda backend where there is no GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cudabridge import doctor
from cudabridge.device import gpu_visible
from cudabridge.jvm import build
from cudabridge.memory import native
from cudabridge.spark import build as spark_build

GPU, WHY = gpu_visible()
ORDER = ["config", "python", "libpython", "jpype", "org.jpype.jar", "jni-library", "jni-python", "_fastpath",
         "_registry_core", "_hotcore", "_library_core", "_call_core", "cudabridge.jar", "cudabridge-spark.jar", "java", "device", "kernels",
         "pinned-memory"]
SWITCH = native.ENV_SWITCH


def _built() -> None:
    """The all-ok checks need what ./dev/setup builds: the library and both jars (gcc, a JDK)."""
    if os.environ.get("CUDABRIDGE_SKIP_JVM_TESTS") == "1":
        pytest.skip("CUDABRIDGE_SKIP_JVM_TESTS=1: no JDK, the bridge's jars are not built here")


def _doctor(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in (SWITCH, "CUDABRIDGE_BACKEND")}
    environ.update(env)
    return subprocess.run([sys.executable, "-m", "cudabridge", "doctor", *args], capture_output=True, text=True,
                          env=environ, timeout=120)


def _lines(out: str) -> list[tuple[str, str, str]]:
    """(status, name, rest) of each line."""
    rows = []
    for line in out.splitlines():
        status, name, rest = (line.split(None, 2) + ["", ""])[:3]
        rows.append((status, name, rest))
    return rows


def _by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.name: c for c in checks}


@pytest.fixture
def native_copy(tmp_path: Path) -> Path:
    """A copy of the package's _native/ build (library, properties, jars) to damage."""
    _built()
    lib, jar = build.library_path(), build.jar_path()
    if not lib.is_file() or not jar.is_file():
        pytest.fail(f"{lib} or {jar} is not built: run ./dev/setup")
    out = tmp_path / "_native"
    shutil.copytree(build.NATIVE_DIR, out)
    return out


@pytest.fixture
def fast_path_on(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)


# --- the real command ----------------------------------------------------------------------------

def test_emulated_backend_is_all_ok_here():
    _built()
    proc = _doctor("--backend", "emulated")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _lines(proc.stdout)
    assert [name for _, name, _ in rows] == ORDER, proc.stdout
    assert all(status in ("ok", "warn") for status, _, _ in rows), proc.stdout
    # ./dev/setup makes these ok, not warn (java may be missing; jni-python warns when the library's
    # default interpreter is not the one running these tests)
    assert all(status == "ok" for status, name, _ in rows if name not in ("java", "jni-python")), proc.stdout
    device = dict((name, rest) for _, name, rest in rows)["device"]
    assert "the emulated device, a CPU model" in device
    assert "host kernels" in dict((name, rest) for _, name, rest in rows)["kernels"]


def test_json_lists_the_same_checks():
    _built()
    proc = _doctor("--backend", "emulated", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = json.loads(proc.stdout)
    assert [c["name"] for c in checks] == ORDER
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in checks)
    assert all(c["status"] in ("ok", "warn") and c["detail"] for c in checks)
    lib = next(c for c in checks if c["name"] == "jni-library")
    assert str(build.library_path()) in lib["detail"] and lib["fix"] is None


def test_fast_paths_switched_off_warn_and_exit_0():
    _built()
    proc = _doctor("--backend", "emulated", **{SWITCH: "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {name: (status, rest) for status, name, rest in _lines(proc.stdout)}
    for name in ("_fastpath", "_registry_core", "_hotcore", "_library_core", "_call_core"):
        status, rest = rows[name]
        assert status == "warn" and f"switched off by {SWITCH}=0" in rest, proc.stdout
        assert f"fix: unset {SWITCH}" in rest


@pytest.mark.skipif(GPU, reason="a GPU is visible here")
def test_cuda_backend_without_a_gpu_fails():
    proc = _doctor("--backend", "cuda")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {name: (status, rest) for status, name, rest in _lines(proc.stdout)}
    status, rest = rows["device"]
    assert status == "FAIL" and "needs a GPU and none is visible" in rest and "fix:" in rest
    assert rows["pinned-memory"][0] == "FAIL"
    assert rows["kernels"][0] == "FAIL"


@pytest.mark.gpu
def test_cuda_backend_on_a_gpu():
    proc = _doctor("--backend", "cuda")
    rows = {name: (status, rest) for status, name, rest in _lines(proc.stdout)}
    assert rows["device"][0] == "ok" and "CUDA driver" in rows["device"][1], proc.stdout
    assert rows["gpu0"][0] == "ok" and "GiB free" in rows["gpu0"][1]
    assert rows["kernels"][0] == "ok" and "NVRTC" in rows["kernels"][1], proc.stdout
    assert rows["pinned-memory"][0] == "ok" and "cudaMallocHost" in rows["pinned-memory"][1]


def test_auto_names_what_it_picks():
    _built()
    proc = _doctor()
    rows = {name: (status, rest) for status, name, rest in _lines(proc.stdout)}
    assert rows["config"][1].startswith("backend auto (from the default of spark.cudabridge.backend)")
    picked = "cuda" if GPU else "emulated"
    assert f"auto picks {picked}" in rows["device"][1], proc.stdout
    if not GPU:                     # running emulated when no GPU is visible is worth a warn, not a failure
        assert rows["device"][0] == "warn" and proc.returncode == 0, proc.stdout


# --- failures made real in a copy of the build ---------------------------------------------------

def test_the_copy_checks_ok(native_copy, fast_path_on):
    checks = doctor.run_checks("emulated", native_dir=native_copy)
    by = _by_name(checks)
    assert by["jni-library"].status == "ok" and str(native_copy) in by["jni-library"].detail
    assert by["cudabridge.jar"].status == "ok" and str(native_copy) in by["cudabridge.jar"].detail
    assert doctor.exit_status(checks) == 0, [c.line() for c in checks if c.status == doctor.FAIL]


def test_truncated_library(native_copy):
    lib = native_copy / build.LIBRARY_NAME
    size = lib.stat().st_size
    with open(lib, "r+b") as f:
        f.truncate(size // 2)
    checks = doctor.run_checks("emulated", native_dir=native_copy)
    c = _by_name(checks)["jni-library"]
    assert c.status == "FAIL" and f"is {size // 2} bytes, the build recorded {size}" in c.detail
    assert c.fix == doctor.REBUILD_LIBRARY == "python -m cudabridge build --native-only"
    assert doctor.exit_status(checks) == 1


def test_library_changed_in_place(native_copy):
    lib = native_copy / build.LIBRARY_NAME
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF                      # same size, one byte different
    lib.write_bytes(bytes(data))
    checks = doctor.run_checks("emulated", native_dir=native_copy)
    c = _by_name(checks)["jni-library"]
    assert c.status == "FAIL" and "SHA-256" in c.detail and "(same size)" in c.detail
    assert doctor.exit_status(checks) == 1


def test_missing_library_and_missing_record(native_copy):
    (native_copy / build.PROPERTIES_NAME).unlink()
    c = _by_name(doctor.run_checks("emulated", native_dir=native_copy))["jni-library"]
    assert c.status == "FAIL" and "no build record" in c.detail
    (native_copy / build.LIBRARY_NAME).unlink()
    checks = doctor.run_checks("emulated", native_dir=native_copy)
    assert _by_name(checks)["jni-library"].status == "FAIL" and "is missing" in _by_name(checks)["jni-library"].detail
    assert _by_name(checks)["jni-python"].status == "FAIL"
    assert doctor.exit_status(checks) == 1


def _edit_properties(native_dir: Path, **changes: str) -> None:
    path = native_dir / build.PROPERTIES_NAME
    props = build.read_properties(path)
    props.update({k.replace("_", "."): v for k, v in changes.items()})
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))


def test_library_built_for_another_python(native_copy):
    _edit_properties(native_copy, python_version="3.99")
    checks = doctor.run_checks("emulated", native_dir=native_copy)
    c = _by_name(checks)["jni-python"]
    assert c.status == "FAIL" and "built for Python 3.99" in c.detail and c.fix == doctor.REBUILD_LIBRARY
    assert _by_name(checks)["jni-library"].status == "ok"      # the file itself is as recorded
    assert doctor.exit_status(checks) == 1


def test_recorded_libpython_missing(native_copy, tmp_path):
    _edit_properties(native_copy, libpython=str(tmp_path / "gone" / "libpython3.so.1.0"))
    c = _by_name(doctor.run_checks("emulated", native_dir=native_copy))["jni-python"]
    assert c.status == "FAIL" and "is missing" in c.detail and "gone" in c.detail


def test_linked_libpython_is_the_running_ones():
    _built()
    names, runpath = doctor.elf_dynamic(build.library_path())
    linked = next(n for n in names if n.startswith("libpython"))
    ours, _ = build.libpython()
    assert any(os.path.samefile(Path(d) / linked, ours) for d in runpath if (Path(d) / linked).exists())


def test_elf_reader_refuses_what_is_not_elf(tmp_path):
    bad = tmp_path / "not.so"
    bad.write_bytes(b"#!/bin/sh\n" * 10)
    with pytest.raises(ValueError, match="not an ELF file"):
        doctor.elf_dynamic(bad)


def test_missing_and_damaged_jars(native_copy):
    (native_copy / build.JAR_NAME).unlink()
    plugin = native_copy / spark_build.PLUGIN_JAR
    with zipfile.ZipFile(plugin, "w") as z:             # a readable jar without the plugin class
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    checks = doctor.run_checks("emulated", native_dir=native_copy)
    by = _by_name(checks)
    assert by["cudabridge.jar"].status == "FAIL" and "is missing" in by["cudabridge.jar"].detail
    assert "python -m cudabridge build" in by["cudabridge.jar"].fix
    assert by["cudabridge-spark.jar"].status == "FAIL"
    assert "has no org/cudabridge/spark/CudaBridgePlugin.class" in by["cudabridge-spark.jar"].detail
    assert doctor.exit_status(checks) == 1
    plugin.write_bytes(b"not a zip")
    c = _by_name(doctor.run_checks("emulated", native_dir=native_copy))["cudabridge-spark.jar"]
    assert c.status == "FAIL" and "not a readable zip" in c.detail


# --- the rest ------------------------------------------------------------------------------------

def test_missing_fast_path_fails(fast_path_on):
    checks = doctor.run_checks("emulated", fast_paths=[("cudabridge._no_such_extension", "a test's")])
    c = _by_name(checks)["_no_such_extension"]
    assert c.status == "FAIL" and "not built" in c.detail and c.fix.startswith(doctor.BUILD_FAST_PATHS)
    assert doctor.exit_status(checks) == 1


def test_bad_configuration_fails_and_the_rest_still_runs():
    checks = doctor.run_checks(environ={"CUDABRIDGE_BACKEND": "bogus"})
    assert checks[0].name == "config" and checks[0].status == "FAIL" and "'bogus'" in checks[0].detail
    assert [c.name for c in checks][-1] == "pinned-memory"
    assert doctor.exit_status(checks) == 1


def test_host_kernel_modules_that_do_not_import_fail():
    checks = doctor.run_checks("emulated", environ={"CUDABRIDGE_EMULATED_KERNELS": "json,no_such_twins_module"})
    c = _by_name(checks)["kernels"]
    assert c.status == "FAIL" and "no_such_twins_module" in c.detail and "json" not in c.detail.split("names ")[-1]


def test_a_check_that_raises_is_a_fail_line(monkeypatch):
    def broken(ctx):
        yield doctor.Check("first", doctor.OK, "yielded before the error")
        raise RuntimeError("boom")

    monkeypatch.setattr(doctor, "CHECKS", (("broken", broken), *doctor.CHECKS[-2:]))
    checks = doctor.run_checks("emulated")
    assert [(c.name, c.status) for c in checks[:3]] == [("config", "ok"), ("first", "ok"), ("broken", "FAIL")]
    assert "RuntimeError: boom" in checks[2].detail
    assert checks[-1].name == "pinned-memory" and checks[-1].status == "ok"   # later checks still ran


def test_library_defaulting_to_another_interpreter_warns(native_copy, tmp_path):
    other = tmp_path / "other-venv" / "bin" / "python"
    _edit_properties(native_copy, python=str(other))
    checks = doctor.run_checks("emulated", native_dir=native_copy)
    c = _by_name(checks)["jni-python"]
    assert c.status == "warn" and f"CudaBridge.start runs {other}, which does not exist" in c.detail
    assert doctor.exit_status(checks) == 0
