"""The project installed as a user installs it (tests/wheel_env.py): a wheel built by the standard
build backend from the source distribution, in a fresh virtual environment, no source tree on any
path. It holds every native part, `doctor` passes, example (a) runs through spark-submit from that
environment, and the bridge library rebuilds from the sources shipped inside it. Also the build's
two edges: a compile error fails it with the compiler's message, and the explicit opt-out builds a
package without the C paths that says so when it runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from wheel_env import ROOT, WheelEnv, wheel_env  # noqa: F401  (the fixture)

from cudabridge.memory.native import ALLOCATOR_PARTS, EXTENSIONS

pytestmark = pytest.mark.slow

# the C extensions' files in a wheel: the C paths (memory/native.py's EXTENSIONS) and the allocator plug-ins' part
C_PATHS = tuple(m.replace(".", "/") for m in (*EXTENSIONS, *ALLOCATOR_PARTS))
NATIVE = "cudabridge/_native/"


def site_packages(env: WheelEnv) -> Path:
    found = sorted(env.venv.glob("lib/python3*/site-packages"))
    assert len(found) == 1, found
    return found[0]


def test_the_wheel_holds_every_native_part(wheel_env):
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"-{tag}-{tag}-linux_" in wheel_env.wheel.name, wheel_env.wheel.name
    names = set(zipfile.ZipFile(wheel_env.wheel).namelist())
    for stem in C_PATHS:
        assert any(n.startswith(stem + ".cpython-") and n.endswith(".so") for n in names), (stem, sorted(names))
    for name in ("libcudabridge_jni.so", "cudabridge.jar", "cudabridge-spark.jar", "cudabridge-native.properties",
                 "cudabridge_jni.c"):
        assert NATIVE + name in names, name
    # every header the bridge's source includes is shipped (beside it, or in the package's jvm/)
    source = zipfile.ZipFile(wheel_env.wheel).read(NATIVE + "cudabridge_jni.c").decode()
    for header in re.findall(r'#include "([^"]+)"', source):
        assert NATIVE + header in names or "cudabridge/jvm/" + header in names, header
    # the properties name no place on the build machine but its Python installation
    props = zipfile.ZipFile(wheel_env.wheel).read(NATIVE + "cudabridge-native.properties").decode()
    keys = {line.split("=", 1)[0] for line in props.splitlines() if "=" in line and not line.startswith("#")}
    assert "python" not in keys and "pythonpath" not in keys and "library" not in keys, props
    assert {"python.version", "libpython", "library.file", "library.size", "library.sha256"} <= keys, props
    # nothing from the source tree's own build outputs or tests
    assert not any(n.startswith(("tests/", "bench/", "spark-examples/")) for n in names)


def test_the_installed_package_is_the_wheels_not_the_source_tree(wheel_env, tmp_path):
    code = "import cudabridge, cudabridge.memory._fastpath as f, sys; print(cudabridge.__file__); print(f.__file__)"
    proc = wheel_env.run(str(wheel_env.python), "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.split():
        assert Path(line).is_relative_to(site_packages(wheel_env)), proc.stdout
    proc = wheel_env.run(str(wheel_env.python), "-m", "cudabridge.spark", "classpath", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for jar in proc.stdout.strip().split(":"):
        assert Path(jar).is_file() and Path(jar).is_relative_to(site_packages(wheel_env)), proc.stdout


def test_doctor_passes_in_the_installed_environment(wheel_env, tmp_path):
    proc = wheel_env.run(str(wheel_env.python), "-m", "cudabridge", "doctor", "--backend", "emulated", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines and all(line.split()[0] in ("ok", "warn") for line in lines), proc.stdout
    for part in ("jni-library", "_fastpath", "_registry_core", "_hotcore", "cudabridge.jar", "cudabridge-spark.jar"):
        assert any(line.split()[0] == "ok" and line.split()[1] == part for line in lines), (part, proc.stdout)


def test_example_a_runs_through_spark_submit_from_the_installed_environment(wheel_env, tmp_path):
    # the job's own files, copied out of the source tree: its jar and its kernel's host kernel
    from spark_harness import examples_jar

    job = tmp_path / "job"
    job.mkdir()
    app = Path(shutil.copy(examples_jar(), job))
    shutil.copy(ROOT / "spark-examples" / "python" / "example_kernels.py", job)
    classpath = wheel_env.run(str(wheel_env.python), "-m", "cudabridge.spark", "classpath", cwd=job).stdout.strip()
    submit = wheel_env.venv / "bin" / "spark-submit"
    cmd = [str(submit), "--master", "local[4,2]", "--class", "org.cudabridge.examples.GpuPartitionJob",
           "--conf", f"spark.driver.extraClassPath={classpath}", "--conf", f"spark.executor.extraClassPath={classpath}",
           "--conf", "spark.plugins=org.cudabridge.spark.CudaBridgePlugin",
           "--conf", "spark.cudabridge.backend=emulated", "--conf", "spark.cudabridge.emulatedKernels=example_kernels",
           "--conf", f"spark.cudabridge.pythonPath={job}", "--conf", "spark.ui.enabled=false",
           str(app), "--partitions", "16", "--summary-json", "summary.json"]
    proc = wheel_env.run(*cmd, cwd=job, timeout=300, SPARK_LOCAL_IP="127.0.0.1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    s = json.loads((job / "summary.json").read_text())
    st = s["statistics"]
    assert s["tasks_run"] == 16 and s["verify_failures"] == 0, s
    assert s["leaked_on_purpose"] == 16 and s["leaks_reclaimed"] == 16 and s["live_allocations_after"] == 0, s
    assert st["c_paths_missing"] == 0, st
    # the executor's Python was the installed environment's (the default: beside the jars)
    assert "WITHOUT" not in proc.stderr


def test_the_bridge_library_rebuilds_from_the_sources_in_the_package(wheel_env, tmp_path):
    native = site_packages(wheel_env) / NATIVE
    before = (native / "cudabridge-native.properties").read_text()
    proc = wheel_env.run(str(wheel_env.python), "-m", "cudabridge", "build", "--native-only", "--force", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = (native / "cudabridge-native.properties").read_text()
    sha = re.search(r"library.sha256=(\w+)", after).group(1)
    import hashlib

    assert hashlib.sha256((native / "libcudabridge_jni.so").read_bytes()).hexdigest() == sha
    keys = [line.split("=", 1)[0] for line in after.splitlines() if "=" in line and not line.startswith("#")]
    assert "python" not in keys, "an installed package records no interpreter"
    assert keys == [line.split("=", 1)[0] for line in before.splitlines() if "=" in line and not line.startswith("#")]
    doctor = wheel_env.run(str(wheel_env.python), "-m", "cudabridge", "doctor", "--backend", "emulated", cwd=tmp_path)
    assert doctor.returncode == 0, doctor.stdout


def _unpacked_sdist(env: WheelEnv, into: Path) -> Path:
    with tarfile.open(env.sdist) as tar:
        tar.extractall(into, filter="data")
    (tree,) = [p for p in into.iterdir() if p.is_dir()]
    return tree


def _wheel_from(tree: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    """``pip wheel`` of ``tree`` with this test run's environment as the build's (no isolation:
    it has the build requirements; the isolated build is the fixture's)."""
    import os

    return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(out),
                           str(tree)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env}, cwd=out)


def test_a_compile_error_fails_the_build_with_the_compilers_message(wheel_env, tmp_path):
    tree = _unpacked_sdist(wheel_env, tmp_path)
    source = tree / "python" / "cudabridge" / "_registry_core.c"
    source.write_text(source.read_text() + "\n#error injected by test_wheel_install\n")
    proc = _wheel_from(tree, tmp_path)
    assert proc.returncode != 0
    assert "#error injected by test_wheel_install" in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not list(tmp_path.glob("*.whl"))


def test_the_explicit_opt_out_builds_no_c_paths_and_the_service_says_so(wheel_env, tmp_path):
    tree = _unpacked_sdist(wheel_env, tmp_path)
    proc = _wheel_from(tree, tmp_path, CUDABRIDGE_NATIVE_FAST_PATH="0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith(C_PATHS) and n.endswith(".so")], names
    assert NATIVE + "libcudabridge_jni.so" in names and NATIVE + "cudabridge-spark.jar" in names
    # installed without its C paths, a service warns at start and counts them
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    code = ("import logging; logging.basicConfig(level=logging.WARNING); from cudabridge import CudaBridgeService, "
            "ServiceConfig; s = CudaBridgeService(ServiceConfig(backend='emulated')); "
            "print('missing', s.statistics().c_paths_missing); s.close()")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target)})
    assert run.returncode == 0, run.stderr
    assert f"missing {len(EXTENSIONS)}" in run.stdout
    assert re.search(rf"WARNING\S* ?.*WITHOUT {len(EXTENSIONS)} of its C paths", run.stderr), run.stderr


def test_jars_copied_away_find_the_library_in_the_configured_pythons_environment(wheel_env, tmp_path):
    """What an executor sees with --jars and --archives: a copy of cudabridge.jar in its directory,
    in a child class loader, and spark.cudabridge.python naming the unpacked environment (here by
    a relative path): the library, its record and the package come from that environment."""
    from cudabridge.jvm.build import _java_tool

    javac, java = _java_tool("javac"), _java_tool("java")
    source = ROOT / "tests" / "java" / "org" / "cudabridge" / "harness" / "ChildLoaderStart.java"
    subprocess.run([javac, "--release", "17", "-d", str(tmp_path / "classes"), str(source)], check=True, timeout=120)
    executor = tmp_path / "executor"
    executor.mkdir()
    jar = Path(shutil.copy(site_packages(wheel_env) / NATIVE / "cudabridge.jar", executor))
    (executor / "env").symlink_to(wheel_env.venv)   # the unpacked archive
    proc = subprocess.run([java, "-cp", str(tmp_path / "classes"), "org.cudabridge.harness.ChildLoaderStart",
                           str(jar), "./env/bin/python"], cwd=executor, capture_output=True, text=True, timeout=300,
                          env=wheel_env.env())
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    assert "RESULT allocated=true" in proc.stdout and "RESULT bridge_loader_is_child=true" in proc.stdout, proc.stdout


def test_a_missing_c_compiler_is_named_before_anything_compiles(wheel_env, tmp_path):
    tree = _unpacked_sdist(wheel_env, tmp_path)
    proc = _wheel_from(tree, tmp_path, CC="/nonexistent/cc")
    assert proc.returncode != 0
    assert "no C compiler: '/nonexistent/cc' is not found" in proc.stdout + proc.stderr, proc.stderr[-3000:]
