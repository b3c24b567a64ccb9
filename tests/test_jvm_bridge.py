"""The JVM bridge, end to end: a real ``java`` process (not one JPype started) loads the bridge
library, starts CPython in itself, binds JPype to itself, and runs Java task code
(tests/java/org/cudabridge/harness/Harness.java) against the service on the emulated device.

Only whole-JVM scenarios run here: load (many threads, memory growth, timing) and a start that
needs the jar without the build's defaults beside it. The Java API's own behaviour (copies,
argument checks, error mapping, deferred binds, start-up failures in one JVM) is unit-tested by
JUnit under jvm/src/test/java (./dev/junit).

Each scenario prints ``RESULT key=value`` lines and ``FAIL ...`` for every check that does not
hold; a scenario passes only with exit code 0, no FAIL line, and the results asserted here.
Needs a JDK (javac); set CUDABRIDGE_SKIP_JVM_TESTS=1 to skip them where there is none.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from cudabridge.jvm import build as jvm_build

ROOT = Path(__file__).resolve().parent.parent
HARNESS_SOURCES = sorted((ROOT / "tests" / "java").rglob("*.java"))
HARNESS = "org.cudabridge.harness.Harness"
EMULATED = ["-Dspark.cudabridge.backend=emulated", "-Dspark.cudabridge.emulatedMemory=1g"]


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    cand = Path(home) / "bin" / "java" if home else None
    return str(cand) if cand and cand.is_file() else (shutil.which("java") or "java")


@pytest.fixture(scope="session")
def harness(tmp_path_factory):
    """Builds the library and the jar (if stale) and compiles the harness; returns the class path."""
    if os.environ.get("CUDABRIDGE_SKIP_JVM_TESTS") == "1":
        pytest.skip("CUDABRIDGE_SKIP_JVM_TESTS=1")
    built = jvm_build.build()
    classes = tmp_path_factory.mktemp("harness-classes")
    cp = os.pathsep.join([str(built["jar"]), str(jvm_build.jpype_jar())])
    javac = jvm_build._java_tool("javac")
    assert javac, "javac not found: the JVM bridge tests need a JDK (or CUDABRIDGE_SKIP_JVM_TESTS=1)"
    proc = subprocess.run([javac, "--release", "17", "-Xlint:all", "-cp", cp, "-d", str(classes),
                           *map(str, HARNESS_SOURCES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return os.pathsep.join([cp, str(classes)])


class Run:
    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.results: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                key, _, value = line[len("RESULT "):].partition("=")
                self.results[key] = value
        self.fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]

    def __getitem__(self, key: str) -> str:
        return self.results[key]

    def ok(self) -> None:
        assert self.rc == 0 and not self.fails, f"rc={self.rc}\n{self.out}\n--- stderr ---\n{self.err[-4000:]}"


def run_java(cp: str, *args: str, jvm: list[str] | None = None, timeout: float = 300,
             env: dict[str, str] | None = None) -> Run:
    cmd = [_java(), "-Xcheck:jni", *(jvm or []), "-cp", cp, *EMULATED, HARNESS, *args]
    return Run(subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env=None if env is None else {**os.environ, **env}))


def test_sixteen_threads_verified_cycles_every_byte_back(harness):
    threads, cycles = 16, 2000
    r = run_java(harness, "stress", str(threads), str(cycles))
    r.ok()
    assert int(r["verified"]) == threads * cycles
    assert int(r["live_allocations"]) == 0 and int(r["in_use_bytes"]) == 0
    assert int(r["free_bytes"]) == int(r["reserved_bytes"]) > 0
    assert int(r["bridge_live_handles"]) == 0
    # Quiet under load: nothing logged at WARNING by Python or the JVM on stderr, and no
    # -Xcheck:jni warning (HotSpot prints those on stdout).
    assert "WARNING" not in r.err and "FATAL" not in r.err, r.err
    assert "WARNING in native method" not in r.out and "WARNING: JNI" not in r.out, r.out


@pytest.mark.slow
def test_resident_memory_flat_between_100k_and_1m_calls(harness):
    # Fixed heap, touched up front: what RSS growth remains is native memory (JPype 1.7.1 leaks
    # ~1.5 KB per unpinned proxy call, invisible to -Xmx; the bridge must not). Without
    # AlwaysPreTouch, G1 touching fresh pages of its 64 MiB heap looked like a 10-40% "leak".
    r = run_java(harness, "rss", "100000", "1000000", "2",
                 jvm=["-Xms64m", "-Xmx64m", "-XX:+AlwaysPreTouch"], timeout=600)
    r.ok()
    assert int(r["calls"]) >= 1_000_000
    assert float(r["growth"]) < 0.05, r.out


def test_seven_step_race_from_java_threads_stays_clean(harness):
    r = run_java(harness, "race", "event-deferred", jvm=["-Dspark.cudabridge.poolLimit=2m"])
    r.ok()
    assert r["different_streams"] == "true"
    assert r["same_block"] == "true"          # B had to reuse A's block while A's work was in flight
    assert r["a_intact"] == "true" and r["b_intact"] == "true"
    pool = json.loads(r["pool"])
    assert pool["gpu_waits"] == 1 and pool["host_syncs"] == 0  # ordered on the device, no host block


def test_seven_step_race_from_java_threads_naive_pool_corrupts(harness):
    """The same Java scenario on a deliberately naive pool shows the race: the test above can fail."""
    # The emulated device's race detector (on for the suite, tests/conftest.py) would stop the
    # racing write this test exists to show land; it is off here so the corruption is seen.
    r = run_java(harness, "race", "naive",
                 jvm=["-Dspark.cudabridge.poolLimit=2m", "-Dspark.cudabridge.testStreamArena=naive_arena:NaiveArena",
                      "-Dcudabridge.pythonPath=" + str(ROOT / "tests")],
                 env={"CUDABRIDGE_EMULATED_RACE_CHECK": "0"})
    r.ok()
    assert r["same_block"] == "true"
    assert not (r["a_intact"] == "true" and r["b_intact"] == "true"), r.out


def test_thread_states_bounded_with_short_lived_java_threads(harness):
    total, concurrent = 400, 16
    r = run_java(harness, "threads", str(total), str(concurrent))
    r.ok()
    created, deleted = int(r["created"]), int(r["deleted"])
    assert created >= total + 1              # one kept state per Java thread (+ the starting thread's)
    assert created - deleted <= 2            # every finished thread's state was deleted
    assert int(r["states_after"]) <= int(r["states_before"]) + 2
    interp = json.loads(r["interpreter"])
    assert interp["threading_active"] <= int(r["states_before"]) + 2  # no _DummyThread left behind
    # start-up froze what lives as long as the JVM (JPype collects after every Java GC)
    assert interp["gc_frozen"] > 1000


@pytest.mark.parametrize("enabled", [True, False])
def test_gate_starves_nobody_and_never_holds_up_a_synchronize(harness, enabled):
    r = run_java(harness, "gate", "8", jvm=[f"-Dcudabridge.gate={'true' if enabled else 'false'}",
                                             "-Dcudabridge.gate.holdMicros=300"])
    r.ok()
    assert r["gate_enabled"] == ("1" if enabled else "0")
    assert r["gate_hold_ns"] == "300000"
    assert r["sparse_calls"] == "100" and int(r["looper_min_pairs"]) > 0
    if not enabled:
        assert r["handoffs"] == "0" and r["sleeps"] == "0"


# --- start-up failures -------------------------------------------------------------------------
# The others are JUnit tests in a JVM of their own (BridgeStartFailureTest, BasePythonStartTest).
# A Python without cudabridge stays here: dev/junit's class path holds the built jar, whose
# cudabridge-native.properties always puts the repository's python/ on the Python path.

@pytest.fixture
def bare_jar(harness, tmp_path):
    """The jar alone in a folder (no library beside it, so no defaults from an install), with a
    copy of the library (and its properties) outside any package given by -Dcudabridge.library."""
    jar = tmp_path / "cudabridge.jar"
    shutil.copyfile(jvm_build.jar_path(), jar)
    native = tmp_path / "native"
    native.mkdir()
    for name in (jvm_build.LIBRARY_NAME, jvm_build.PROPERTIES_NAME):
        shutil.copyfile(jvm_build.NATIVE_DIR / name, native / name)
    classes = harness.split(os.pathsep)[-1]
    cp = os.pathsep.join([str(jar), str(jvm_build.jpype_jar()), classes])
    return cp, [f"-Dcudabridge.library={native / jvm_build.LIBRARY_NAME}"]


def _message(r: Run) -> str:
    out = r.out
    assert "MESSAGE-BEGIN" in out, out + r.err
    return out.split("MESSAGE-BEGIN", 1)[1].split("MESSAGE-END", 1)[0]


def _base_python() -> str:
    exe = Path(sys.base_prefix) / "bin" / f"python{sysconfig.get_python_version()}"
    if not exe.is_file():
        pytest.skip(f"no base interpreter at {exe}")
    return str(exe)


def test_start_fails_with_traceback_when_cudabridge_missing_then_retry_works(bare_jar):
    """A Python without cudabridge: the Java exception carries the import error's traceback;
    the failure is recorded (get() fails fast with it); a retry with a Python path works."""
    cp, jvm = bare_jar
    base = _base_python()
    site = sysconfig.get_paths()["purelib"]  # the venv's site-packages (JPype, cuda-bindings)
    r = run_java(cp, "startfail", base, "-", base, f"{ROOT / 'python'}:{site}", jvm=jvm)
    r.ok()
    assert r["started"] == "false" and r["failure_type"] == "startup"
    msg = _message(r)
    assert "cannot import cudabridge.jvm.bootstrap" in msg and "sys.path ['" in msg
    # a top-level import has no frames to show: format_exception gives the error line itself
    assert "ModuleNotFoundError: No module named 'cudabridge'" in msg, msg
    assert r["retry_started"] == "true"


def test_cli_prints_jar_and_classpath(harness):
    def cli(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "cudabridge", *args], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert cli("jar") == str(jvm_build.jar_path())
    entries = cli("classpath").split(os.pathsep)
    plugin = jvm_build.jar_path().with_name("cudabridge-spark.jar")
    expected = [str(jvm_build.jar_path()), *([str(plugin)] if plugin.is_file() else []), str(jvm_build.jpype_jar())]
    assert entries == expected    # the Spark plugin's jar too, where dev/setup built it
    assert all(Path(e).is_file() for e in entries)


def test_every_header_the_bridge_library_includes_is_shipped_and_watched():
    """build_native rebuilds the library when one of its headers changes and ships them beside
    its source (bridge_headers: every header of the source's folder): each header there is one the
    source includes (directly or through another), and each it includes from there is watched."""
    import re

    src = jvm_build.c_source()
    seen: set[str] = set()
    todo = [src.name]
    while todo:
        for inc in re.findall(r'#include "([^"]+)"', (src.parent / todo.pop()).read_text()):
            if (src.parent / inc).is_file() and inc not in seen:
                seen.add(inc)
                todo.append(inc)
    assert seen == {h.name for h in jvm_build.bridge_headers(src)}


def test_the_bridge_starts_with_its_jar_in_a_child_class_loader(harness, tmp_path):
    """Spark's --jars: the jar in a child loader, neither it nor JPype's org.jpype.jar on the
    system class path. The bridge appends org.jpype.jar (from the Python environment) to the
    system class loader's search and looks its own classes up through the child loader; without
    that JPype fails (ClassNotFoundException: org.jpype.manager.TypeManager, or a
    ClassCastException between two copies of its class loader)."""
    jar = Path(shutil.copy(jvm_build.jar_path(), tmp_path))
    classes = harness.split(os.pathsep)[-1]
    cmd = [_java(), "-Xcheck:jni", f"-Dcudabridge.library={jvm_build.library_path()}", "-cp", classes,
           "org.cudabridge.harness.ChildLoaderStart", str(jar), sys.executable]
    r = Run(subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path))
    r.ok()
    assert r["stream"] != "0" and r["allocated"] == "true" and r["statistics"] == "true", r.out
    assert r["bridge_loader_is_child"] == "true" and r["jpype_on_system"] == "true", r.out


def test_the_jar_carries_the_one_table_of_kernel_parameter_kinds():
    """CudaKernel reads the parameter kinds from the jar, which the build writes from
    device/params.py's PARAM_KINDS: Java, the C twin (handed sizes and ranges at add_kernel) and
    Python share one table, a kind's code its index."""
    import zipfile

    from cudabridge.device.params import PARAM_KINDS
    from cudabridge.jvm.hot_path import KIND_CODES, java_raw_range

    jvm_build.build_jar()
    text = zipfile.ZipFile(jvm_build.jar_path()).read(jvm_build.PARAM_KINDS_RESOURCE).decode()
    assert text.split() == list(PARAM_KINDS) == list(KIND_CODES)
    assert KIND_CODES[0] == "ptr"   # the C twin tells a buffer argument by code 0
    assert java_raw_range("i8") == (-128, 127) and java_raw_range("f32") == (0, (1 << 32) - 1)
    assert java_raw_range("bool") == (0, 1) and java_raw_range("i64") == (-(1 << 63), (1 << 63) - 1)
