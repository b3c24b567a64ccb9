"""The Java side of the settings table agrees with the Python side (``cudabridge.config``).

What a setting is (key, scope, type, values, bounds, default, doc, derived spellings) is written
once: the jar's build generates ``org.cudabridge.SettingsTable`` from ``settings.json``
(``cudabridge/jvm/settings_java.py``). What exists twice, because the driver checks a Spark
configuration in a JVM that may have no Python, is the check of a value, once per type in each
language (``Settings.Setting.parse``; ``config.check_value``), the typed value it returns, and the
whole check of a configuration and an environment (``Settings.checkAll``; ``config.check_all``)
with its messages and nearest-name suggestions: compared here over every key and a grid of values.

A small Java main (tests/java/org/cudabridge/harness/SettingsProbe.java) runs in a plain ``java``
(no Python, no JPype inside it) against the built jars and prints what Java makes of its input.
Needs a JDK (javac); CUDABRIDGE_SKIP_JVM_TESTS=1 skips it. The executor side's part (``TaskBind``,
``PluginConf``, in cudabridge.jar's ``org.cudabridge.executor``) is always there.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from cudabridge import config as pyconfig
from cudabridge.jvm import build as jvm_build

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = pyconfig.SETTINGS
PREFIX = pyconfig.SPARK_PREFIX
BY_NAME = {s.name: s for s in SETTINGS}   # as users write them: Spark key, property, variable
PROBE = "org.cudabridge.harness.SettingsProbe"
HARNESS_SOURCES = sorted((ROOT / "tests" / "java").rglob("*.java"))


def _java() -> str:
    return jvm_build._java_tool("java") or shutil.which("java") or "java"


@pytest.fixture(scope="module")
def jars(tmp_path_factory):
    """(core jar, plugin jar or None, compiled harness classes)."""
    if os.environ.get("CUDABRIDGE_SKIP_JVM_TESTS") == "1":
        pytest.skip("CUDABRIDGE_SKIP_JVM_TESTS=1")
    core = jvm_build.build_jar()
    javac = jvm_build._java_tool("javac")
    assert javac, "javac not found: these tests need a JDK (or CUDABRIDGE_SKIP_JVM_TESTS=1)"
    plugin = None
    try:
        from cudabridge.spark import build as spark_build

        plugin = spark_build.build_plugin()
    except Exception as exc:  # noqa: BLE001  (no pyspark: the plugin's part is skipped)
        print(f"cudabridge-spark.jar not built: {exc}")
    classes = tmp_path_factory.mktemp("settings-probe-classes")
    cp = os.pathsep.join([str(core), str(jvm_build.jpype_jar())])
    proc = subprocess.run([javac, "--release", "17", "-cp", cp, "-d", str(classes), *map(str, HARNESS_SOURCES)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return core, plugin, classes


def probe(jars, mode: str, stdin: str = "") -> subprocess.CompletedProcess:
    jar, plugin, classes = jars
    cp = [str(jar)] + ([str(plugin)] if plugin else []) + [str(classes)]
    return subprocess.run([_java(), "-cp", os.pathsep.join(cp), PROBE, mode], input=stdin, capture_output=True,
                          text=True, timeout=120)


def b64(s: str) -> str:
    """A token for SettingsProbe: 'x' + base64 (so that an empty string is one too)."""
    return "x" + base64.b64encode(s.encode()).decode()


@pytest.fixture(scope="module")
def dump(jars):
    proc = probe(jars, "dump")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


# --- the generated table ---------------------------------------------------------------------------

def test_the_generated_table_is_the_python_table(dump):
    """SettingsTable, as Java sees it, is config's table: every field and derived spelling (a
    check of the generator's output, escaping included)."""
    assert dump["prefix"] == PREFIX
    assert [s["key"] for s in dump["settings"]] == [s.key for s in SETTINGS]
    for j, s in zip(dump["settings"], SETTINGS):
        assert j == {"key": s.key, "scope": s.scope, "type": s.type, "values": list(s.values), "min": s.min,
                     "max": s.max, "defaultValue": s.default, "defaultDoc": s.default_doc, "doc": s.doc,
                     "test": s.test, "env": s.env, "sparkKey": s.spark_key, "envName": s.env_name, "name": s.name,
                     "envRead": s.env_read, "envChecked": s.env_checked}, s.key


def test_the_jar_carries_the_generated_class_and_no_table(jars):
    """Java reads no JSON at run time: the table is compiled in (SettingsTable), not copied."""
    with zipfile.ZipFile(jars[0]) as z:
        names = set(z.namelist())
    assert "org/cudabridge/SettingsTable.class" in names
    assert not any(n.endswith(".json") for n in names), sorted(n for n in names if n.endswith(".json"))


BROKEN = [
    (lambda t: t["settings"][0].update(defualt="auto"), "settings[0] (backend): unknown field 'defualt'"),
    (lambda t: by_key_in(t, "poolLimit").update(default="255"),
     "poolLimit: its default is refused by its own type: spark.cudabridge.poolLimit='255': 255 bytes is below"),
    (lambda t: by_key_in(t, "taskBind").update(values=[]), "(taskBind): an enum needs its 'values'"),
    (lambda t: by_key_in(t, "backend").update(scope="executor"), "scope executor is none of"),
    (lambda t: t["settings"].append(dict(t["settings"][0])), "key backend twice"),
    # a setting the Java code uses is gone: the generated constant is, and javac says so
    (lambda t: t["settings"].remove(by_key_in(t, "cudabridge.gate")), "GATE_PROPERTY"),
]


def by_key_in(t: dict, key: str) -> dict:
    return next(e for e in t["settings"] if e["key"] == key)


@pytest.mark.parametrize("change, message", BROKEN)
def test_a_broken_table_fails_the_jar_build_clearly(jars, tmp_path, monkeypatch, change, message):
    t = json.loads(pyconfig.TABLE.read_text())
    change(t)
    table = tmp_path / "settings.json"
    table.write_text(json.dumps(t))
    monkeypatch.setattr(jvm_build, "SETTINGS_TABLE", table)
    with pytest.raises(jvm_build.BuildError) as err:
        jvm_build.build_jar(force=True, native_dir=tmp_path / "native")
    assert message in str(err.value), str(err.value)[-3000:]
    assert not (tmp_path / "native" / jvm_build.JAR_NAME).exists()


def test_java_enums_have_the_tables_wire_names(dump):
    assert dump["enums"]["org.cudabridge.Priority"] == list(pyconfig.BY_KEY["taskPriority"].values)
    assert dump["plugin"] is not None, "org.cudabridge.executor.PluginConf is part of cudabridge.jar"
    assert dump["enums"]["org.cudabridge.executor.TaskBind"] == list(pyconfig.BY_KEY["taskBind"].values)


def test_plugin_keys_constants_and_defaults_come_from_the_table(dump):
    plugin = dump["plugin"]
    assert plugin is not None, "org.cudabridge.executor.PluginConf is part of cudabridge.jar"
    scope = [s for s in SETTINGS if s.scope == "plugin"]
    assert list(plugin["KEYS"]) == [s.spark_key for s in scope]
    for s in scope:
        dflt, doc = plugin["KEYS"][s.spark_key]
        assert doc == s.doc
        assert dflt == (s.default if s.default is not None else f"({s.default_doc})")
    constants = dict(plugin["constants"])
    assert constants.pop("PREFIX") == PREFIX
    assert constants.pop("GPU_ADDRESSES") == PREFIX + "gpuAddresses"
    assert constants.pop("STAGING_COPIES") == PREFIX + "stagingCopies"   # set from the task slots
    # one constant per plugin key, and none for anything else
    assert sorted(constants.values()) == sorted(s.spark_key for s in scope)
    by_key = pyconfig.BY_KEY
    assert plugin["defaults"] == {
        "gpuResource": by_key["gpuResource"].default, "taskPriority": by_key["taskPriority"].default,
        "asyncRelease": by_key["asyncRelease"].default == "true", "taskBind": by_key["taskBind"].default,
        "metricsRefreshMs": int(by_key["metrics.refreshMs"].default),
        "reportIntervalMs": int(by_key["reportIntervalMs"].default)}


# --- values: the same accepted and refused values, parsed to the same typed values ------------------------

P = PREFIX
# (name, value, accepted): names as users write them (Spark key, system property, variable).
CASES = [
    # blanks and characters outside ASCII: both sides trim ASCII blanks only and refuse the rest
    (P + "streamsPerGpu", "8\u00a0", False), (P + "poolInitial", "8m\u00a0", False),
    (P + "asyncRelease", "true\u00a0", False), (P + "streamsPerGpu", "\x1c8", False),
    (P + "poolInitial", "8\u212a", False), (P + "streamsPerGpu", " 8\t", True), (P + "poolInitial", "8K ", True),
    # enum: case matters, except where every value is upper case (logLevel); no trimming
    (P + "backend", "auto", True), (P + "backend", "emulated", True), (P + "backend", "cuda", True),
    (P + "backend", "Emulated", False), (P + "backend", "gpu", False), (P + "backend", "", False),
    (P + "backend", " auto", False),
    (P + "streamPolicy", "idle-first", True), (P + "streamPolicy", "idle_first", False),
    (P + "poolGrowth", "segment", True), (P + "poolGrowth", "chunk", False),
    (P + "poolCacheFrees", "256", True), (P + "poolCacheFrees", "0", True), (P + "poolCacheFrees", "1048576", True),
    (P + "poolCacheFrees", "-1", False), (P + "poolCacheFrees", "1048577", False), (P + "poolCacheFrees", "1.5", False),
    (P + "poolCacheFrees", "", False),
    (P + "torchKeptFrees", "128", True), (P + "torchKeptFrees", "0", True), (P + "torchKeptFrees", "65536", True),
    (P + "torchKeptFrees", "-1", False), (P + "torchKeptFrees", "65537", False), (P + "torchKeptFrees", "x", False),
    (P + "logLevel", "INFO", True), (P + "logLevel", "info", True), (P + "logLevel", "Warning", True),
    (P + "logLevel", "critical", True), (P + "logLevel", "TRACE", False), (P + "logLevel", " INFO", False),
    (P + "testStreamArena", "naive_arena:NaiveArena", True),
    (P + "emulatedKernels", "host_kernels_for_tests,more_twins", True), (P + "emulatedKernels", "", True),
    (P + "moduleCacheDir", "/var/cache/cudabridge", True), (P + "moduleCacheDir", "", True),
    (P + "stagingSlots", "4", True), (P + "stagingSlots", "0", False), (P + "stagingSlots", "17", False),
    (P + "stagingSlotBytes", "4m", True), (P + "stagingSlotBytes", "1k", False), (P + "stagingSlotBytes", "1g", True),
    (P + "stagingSlotBytes", "1025m", False), (P + "stagingSlotBytes", "16g", False),
    (P + "stagingCopies", "16", True), (P + "stagingCopies", "0", False), (P + "stagingCopies", "1025", False),
    (P + "stagingWait", "0.5", True), (P + "stagingWait", "0", False), (P + "stagingWait", "soon", False),
    (P + "stagingCopyThreads", "8", True), (P + "stagingCopyThreads", "1", True), (P + "stagingCopyThreads", "0", False),
    (P + "stagingCopyThreads", "65", False),
    (P + "pinnedPool", "64m", True), (P + "pinnedPool", "0", True), (P + "pinnedPool", "-1", False),
    (P + "taskPriority", "normal", True), (P + "taskPriority", "high", True), (P + "taskPriority", "HIGH", False),
    (P + "taskPriority", "urgent", False),
    (P + "taskBind", "lazy", True), (P + "taskBind", "ahead", True), (P + "taskBind", "eager", True),
    (P + "taskBind", "Lazy", False), (P + "taskBind", "never", False),
    # int: a decimal integer within [min, max] (surrounding blanks and a sign are fine)
    (P + "streamsPerGpu", "32", True), (P + "streamsPerGpu", "1", True), (P + "streamsPerGpu", "1024", True),
    (P + "streamsPerGpu", " 8 ", True), (P + "streamsPerGpu", "+8", True),
    (P + "streamsPerGpu", "0", False), (P + "streamsPerGpu", "1025", False), (P + "streamsPerGpu", "-1", False),
    (P + "streamsPerGpu", "abc", False), (P + "streamsPerGpu", "3.0", False), (P + "streamsPerGpu", "", False),
    (P + "streamsPerGpu", "0x10", False), (P + "streamsPerGpu", "99999999999999999999", False),
    (P + "streamsPerGpu", "1_0", False), (P + "streamsPerGpu", "\uff18", False),
    (P + "highPriorityStreams", "0", True), (P + "highPriorityStreams", "-1", False),
    (P + "emulatedDevices", "64", True), (P + "emulatedDevices", "65", False),
    (P + "metrics.refreshMs", "0", True), (P + "metrics.refreshMs", "86400000", True),
    (P + "metrics.refreshMs", "86400001", False), (P + "reportIntervalMs", "1000", True),
    (P + "reportIntervalMs", "1s", False), (P + "pythonBatchRows", "65536", True), (P + "pythonBatchRows", "0", False),
    (P + "pythonBatchRows", "16777217", False),
    ("cudabridge.gate.holdMicros", "1000", True), ("cudabridge.gate.holdMicros", "1", True),
    ("cudabridge.gate.holdMicros", "0", False), ("cudabridge.gate.holdMicros", "1000001", False),
    ("cudabridge.gate.holdMicros", "abc", False),
    # bool: true or false, any case
    (P + "asyncRelease", "true", True), (P + "asyncRelease", "FALSE", True), (P + "asyncRelease", " True ", True),
    (P + "asyncRelease", "yes", False), (P + "asyncRelease", "1", True), (P + "asyncRelease", "0", True), (P + "asyncRelease", "", False),
    (P + "emulatedRaceCheck", "false", True), (P + "emulatedRaceCheck", "on", False),
    ("cudabridge.gate", "true", True), ("cudabridge.gate", "False", True), ("cudabridge.gate", "off", False),
    ("CUDABRIDGE_NATIVE_FAST_PATH", "true", True), ("CUDABRIDGE_NATIVE_FAST_PATH", "0", True),
    # bytes: a non-negative integer, an optional binary suffix (any case), at least min, below 2**63
    (P + "poolInitial", "0", True), (P + "poolInitial", "64m", True), (P + "poolInitial", "64MB", True),
    (P + "poolInitial", "1k", True), (P + "poolInitial", "1kb", True), (P + "poolInitial", "2t", True),
    (P + "poolInitial", "512b", True), (P + "poolInitial", " 8g ", True),
    (P + "poolInitial", "-1", False), (P + "poolInitial", "1.5g", False), (P + "poolInitial", "8x", False),
    (P + "poolInitial", "m", False), (P + "poolInitial", "", False), (P + "poolInitial", "8 g", False),
    (P + "poolInitial", "+8m", True), (P + "poolInitial", "1_0m", False), (P + "poolInitial", "\uff18m", False),
    (P + "poolInitial", "9223372036854775807", True), (P + "poolInitial", "9223372036854775808", False),
    (P + "poolInitial", "8388607t", True), (P + "poolInitial", "8388608t", False),
    (P + "emulatedMemory", "16g", True), (P + "emulatedMemory", "2m", True), (P + "emulatedMemory", "2097151", False),
    (P + "emulatedMemory", "1m", False), (P + "emulatedMemory", "1t", True), (P + "emulatedMemory", "1025g", False),
    (P + "emulatedMemory", "2t", False),
    # limit: with a decimal point a fraction in (0, 1]; else bytes of at least 2 MiB
    (P + "poolLimit", "0.9", True), (P + "poolLimit", "1.0", True), (P + "poolLimit", "1.", True),
    (P + "poolLimit", ".5", True), (P + "poolLimit", "0.5e0", True), (P + "poolLimit", "0.0", False),
    (P + "poolLimit", "1.5", False), (P + "poolLimit", "-0.5", False), (P + "poolLimit", ".", False),
    (P + "poolLimit", "0.9x", False), (P + "poolLimit", "1", False), (P + "poolLimit", "255", False),
    (P + "poolLimit", "2097151", False), (P + "poolLimit", "2097152", True), (P + "poolLimit", "2m", True),
    (P + "poolLimit", "2M", True), (P + "poolLimit", "1m", False), (P + "poolLimit", "8g", True),
    (P + "poolLimit", "8GB", True), (P + "poolLimit", "abc", False), (P + "poolLimit", "", False),
    (P + "poolLimit", "0.5_0", False), (P + "poolLimit", "0.000001", True), (P + "poolLimit", "0.1e-5", True),
    (P + "poolLimit", "0.0000009", False), (P + "poolLimit", "0.0000001", False), (P + "poolLimit", "1.0e-7", False),
    # seconds: a positive finite number
    (P + "hostWaitTimeout", "300", True), (P + "hostWaitTimeout", "0.5", True), (P + "hostWaitTimeout", "1e3", True),
    (P + "hostWaitTimeout", ".25", True), (P + "hostWaitTimeout", "0", False), (P + "hostWaitTimeout", "-1", False),
    (P + "hostWaitTimeout", "inf", False), (P + "hostWaitTimeout", "nan", False), (P + "hostWaitTimeout", "1e400", False),
    (P + "hostWaitTimeout", "abc", False), (P + "hostWaitTimeout", "", False), (P + "hostWaitTimeout", "5s", False),
    (P + "hostWaitTimeout", "1_0", False), (P + "hostWaitTimeout", "infinity", False),
    # list and string: anything
    (P + "gpuAddresses", "0,1", True), (P + "gpuAddresses", "", True), (P + "gpuAddressMap", "0:1,1:0", True),
    (P + "allocators", "cupy,torch", True), (P + "allocators", " numba , rmm ", True), (P + "allocators", "", True),
    (P + "allocators", "cupy,tensorflow", False), (P + "allocators", "torch,torch", False),
    (P + "allocators", "CuPy", False),
    (P + "concurrentGpuTasks", "0", True), (P + "concurrentGpuTasks", "4", True), (P + "concurrentGpuTasks", "-1", False),
    (P + "concurrentGpuTasks", "65537", False), (P + "oomWait", "60", True), (P + "oomWait", "0.5", True),
    (P + "oomWait", "0", False), (P + "oomWait", "1m", False),
    (P + "backendWrapper", "faulty_backend:from_env", True), (P + "python", "/nonexistent/bin/python", True),
    (P + "pythonPath", "a:b", True), (P + "library", "", True), (P + "gpuResource", "gpu", True),
    ("cudabridge.python", "/x", True), ("cudabridge.pythonPath", "a:b", True), ("cudabridge.library", "/x.so", True),
    # dev: the scripts' and tests' own variables (checked by type here; the service checks only their names)
    ("CUDABRIDGE_MASTER", "local[2]", True), ("CUDABRIDGE_SKIP_JVM_TESTS", "0", True), ("CUDABRIDGE_SKIP_JVM_TESTS", "yes", False),
    ("CUDABRIDGE_MODEL_EXAMPLES", "600", True), ("CUDABRIDGE_MODEL_EXAMPLES", "0", False),
    ("CUDABRIDGE_INTERRUPT_SECONDS", "2.5", True), ("CUDABRIDGE_SOAK_SECONDS", "0", False),
    ("CUDABRIDGE_FAULT_STICKY_AFTER_COPIES", "3", True), ("CUDABRIDGE_FAULT_ONCE_FILE", "/tmp/once", True),
]


def check_in_java(jars, cases: list[tuple[str, str]]) -> list[dict]:
    proc = probe(jars, "check", "".join(f"{b64(k)} {b64(v)}\n" for k, v in cases))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(out) == len(cases)
    return out


def test_every_setting_has_cases():
    assert {s.name for s in SETTINGS} == {k for k, _, _ in CASES}


def test_check_accepts_and_refuses_as_written(jars):
    got = check_in_java(jars, [(k, v) for k, v, _ in CASES])
    wrong = [(k, v, ok, g["message"]) for (k, v, ok), g in zip(CASES, got) if g["ok"] != ok]
    assert wrong == []
    for (k, v, ok), g in zip(CASES, got):
        if not ok:   # a refusal names the key and the value
            assert g["message"].startswith(f"{k}={v}: "), g["message"]


def test_every_default_is_accepted(jars):
    cases = [(s.name, s.default) for s in SETTINGS if s.default is not None]
    assert all(g["ok"] for g in check_in_java(jars, cases))


def test_refusal_messages(jars):
    got = check_in_java(jars, [(P + "poolLimit", "255"), (P + "poolLimit", "1.5"), (P + "streamsPerGpu", "0"),
                               (P + "backend", "gpu"), (P + "asyncRelease", "yes"), (P + "poolInitial", "8388608t")])
    assert [g["message"] for g in got] == [
        "spark.cudabridge.poolLimit=255: 255 bytes is below the least accepted, 2097152 (2 MiB)",
        "spark.cudabridge.poolLimit=1.5: a fraction of free memory must be in [0.000001, 1] (a smaller one gives a "
        "pool under 2 MiB on any GPU)",
        "spark.cudabridge.streamsPerGpu=0: expected an integer in [1, 1024]",
        "spark.cudabridge.backend=gpu: expected one of auto, cuda, emulated",
        "spark.cudabridge.asyncRelease=yes: expected true or false (or 1 or 0)",
        "spark.cudabridge.poolInitial=8388608t: 9223372036854775808 bytes is 2**63 or more",
    ]


def _python_value(name: str, value: str) -> tuple[bool, object]:
    """(accepted, the typed value as JSON has it) by config.check_value."""
    try:
        typed = pyconfig.check_value(BY_NAME[name].key, value)
    except pyconfig.InvalidArgument:
        return False, None
    return True, list(typed) if isinstance(typed, tuple) else typed


@pytest.fixture(scope="module")
def java_outcomes(jars):
    return dict(zip([(k, v) for k, v, _ in CASES], check_in_java(jars, [(k, v) for k, v, _ in CASES])))


@pytest.mark.parametrize("name, value", [(k, v) for k, v, _ in CASES])
def test_java_and_python_accept_refuse_and_parse_the_same(java_outcomes, name, value):
    """The same verdict, and an accepted value parsed to the same typed value (a limit as
    [bytes, fraction], a list as its items, an enum as the table's spelling)."""
    java = java_outcomes[(name, value)]
    assert (java["ok"], java.get("value")) == _python_value(name, value), java


# --- keys -------------------------------------------------------------------------------------------------

def conf_line(conf: dict[str, str]) -> str:
    return " ".join(f"{b64(k)} {b64(v)}" for k, v in conf.items()) + "\n"


MISSPELLED = [
    ("spark.cudabridge.poolLimt", "spark.cudabridge.poolLimit"),
    ("spark.cudabridge.pool_limit", "spark.cudabridge.poolLimit"),
    ("spark.cudabridge.test_stream_arena", "spark.cudabridge.testStreamArena"),
    ("spark.cudabridge.emulated_devices", "spark.cudabridge.emulatedDevices"),
    ("spark.cudabridge.gpu_addresses", "spark.cudabridge.gpuAddresses"),
    ("spark.cudabridge.streams_per_gpu", "spark.cudabridge.streamsPerGpu"),
    ("spark.cudabridge.metrics_refresh_ms", "spark.cudabridge.metrics.refreshMs"),
    ("spark.cudabridge.TASKBIND", "spark.cudabridge.taskBind"),
    ("spark.cudabridge.pyton", "spark.cudabridge.python"),
    ("spark.cudabridge.zzzzzzzz", None),
    ("spark.cudabridge.cudabridge.gate", None),
]


def test_a_misspelled_key_is_refused_with_the_nearest(jars):
    proc = probe(jars, "checkall", "".join(conf_line({k: "1"}) for k, _ in MISSPELLED))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    for (key, near), g in zip(MISSPELLED, got):
        assert not g["ok"] and g["type"] == "java.lang.IllegalArgumentException"
        if near:
            assert g["message"] == f"unknown key {key}; did you mean {near}?"
        else:
            assert g["message"].startswith(f"unknown key {key}; no key is close")
        assert g["message"] == pyconfig.unknown_key_message(key)


def test_nearest_key_agrees_with_python(jars):
    keys = [k for k, _ in MISSPELLED] + ["spark.cudabridge.backen", "spark.cudabridge.x", "spark.cudabridge.hostWait",
                                         "spark.cudabridge.Library", "spark.cudabridge.refreshMs"]
    proc = probe(jars, "nearest", "".join(b64(k) + "\n" for k in keys))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [pyconfig.nearest_key(k) for k in keys]


def test_check_all_checks_known_keys_values_and_ignores_other_prefixes(jars):
    confs = [
        {"spark.cudabridge.backend": "emulated", "spark.executor.memory": "1g", "spark.cudabridge_x": "y"},
        {s.spark_key: s.default for s in SETTINGS if s.spark_key and s.default is not None},
        {"spark.cudabridge.poolLimit": "255", "spark.other": "x"},
        {"spark.cudabridge.poolLimit": "255", "spark.cudabridge.taskBind": "never"},
        {"spark.cudabridge.pool_limit": "255", "spark.cudabridge.taskBind": "never"},
        {},
    ]
    proc = probe(jars, "checkall", "".join(conf_line(c) for c in confs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [g["ok"] for g in got] == [True, True, False, False, False, True]
    assert got[2]["message"] == "spark.cudabridge.poolLimit=255: 255 bytes is below the least accepted, 2097152 (2 MiB)"
    assert got[3]["message"] == ("spark.cudabridge.poolLimit=255: 255 bytes is below the least accepted, 2097152 "
                                 "(2 MiB); spark.cudabridge.taskBind=never: expected one of lazy, ahead, eager")
    # unknown keys first: values are checked once every key is known
    assert got[4]["message"] == "unknown key spark.cudabridge.pool_limit; did you mean spark.cudabridge.poolLimit?"


def test_plugin_conf_validate_is_check_all(jars, dump):
    if dump["plugin"] is None:
        pytest.skip("cudabridge-spark.jar is not built (pyspark missing)")
    confs = [{"spark.cudabridge.poolLimt": "64m"}, {"spark.cudabridge.streamsPerGpu": "0"},
             {"spark.cudabridge.taskBind": "ahead", "spark.cudabridge.poolLimit": "64m"}]
    proc = probe(jars, "validate", "".join(conf_line(c) for c in confs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert got[0]["message"] == "unknown key spark.cudabridge.poolLimt; did you mean spark.cudabridge.poolLimit?"
    assert got[1]["message"] == "spark.cudabridge.streamsPerGpu=0: expected an integer in [1, 1024]"
    assert got[2]["ok"]


def test_java_start_refuses_a_misspelled_key_before_loading_anything(jars):
    """CudaBridge.start checks the service keys before the library or Python (none is given here)."""
    proc = probe(jars, "start", conf_line({"pool_limit": "64m", "backend": "emulated"}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    g = json.loads(proc.stdout)
    assert not g["ok"] and g["type"] == "org.cudabridge.CudaBridgeException"
    assert g["message"] == "cudabridge: unknown key spark.cudabridge.pool_limit; did you mean spark.cudabridge.poolLimit?"


# --- the driver's check against the executor's: every key, a grid of values, the cross-key rules ---------
#
# The driver (Settings.checkAll, Java, no Python) and the executor (cudabridge.config: ServiceConfig,
# check_all) must accept exactly the same configurations: one the driver accepts and an executor
# refuses fails every executor at start (issue 23, 6.6: 13 of 1,386 pairs disagreed, all through
# the pinned-pool rule and stagingSlotBytes' missing bound). The grid is built from the table, so
# a new key or bound is covered without editing this list.

def grid_values(s: pyconfig.Setting) -> list[str]:
    """Values around every bound and of every form the type's parser sees."""
    t = s.type
    out: list[str] = []
    if t == "int":
        lo, hi = s.min or 0, 1 << 31 if s.max is None else s.max
        out = [str(n) for n in (lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, 0, 1, -1, (1 << 63) - 1, 1 << 63)]
        out += ["abc", "", " 7 ", "+3", "1.0", "0x10", "1e3"]
    elif t == "bytes":
        lo, hi = s.min or 0, (1 << 63) - 1 if s.max is None else s.max
        out = [str(n) for n in (lo - 1, lo, lo + 1, hi - 1, hi, hi + 1)]
        out += ["0", "1", "4095", "4k", "1m", "2m", "4m", "8m", "15m", "16m", "17m", "64m", "1g", "1025m", "2g", "16g",
                "1t", "1025g", "2t", "8388607t", "8388608t", "-1", "1.5g", "x", "", " 4m ", "4M", "4mb"]
    elif t == "limit":
        out = ["0.0000001", "0.0000009", "0.000001", "0.0000010", "0.1e-5", "9.99e-7", "1e-6", "0.00001", "0.5", "1.0",
               "1.0000001", "0.0", "-0.5", ".", "1", "255", "2097151", "2m", "8g", "1t", "abc", ""]
    elif t == "enum":
        for v in s.values:
            out += [v, v.upper(), v.lower(), v.title(), " " + v]
        out += ["", "x"]
    elif t == "bool":
        out = ["true", "false", "TRUE", "False", "1", "0", " true ", "yes", "on", "", "2"]
    elif t == "seconds":
        out = ["300", "0.5", "1e3", ".25", "0", "-1", "inf", "nan", "1e400", "abc", "", "5s"]
    else:   # string, list
        out = ["", "a", "a,b", "/x/y", "\u00e9"]
    return list(dict.fromkeys(out))


def checkall_env_in_java(jars, cases: list[tuple[dict, dict]]) -> list[dict]:
    proc = probe(jars, "checkallenv", "".join(conf_line(c).rstrip("\n") + " | " + conf_line(env) for c, env in cases))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(out) == len(cases)
    return out


def python_outcome(conf: dict, env: dict) -> tuple[bool, str | None]:
    try:
        pyconfig.check_all(conf, env)
    except pyconfig.InvalidArgument as exc:
        return False, str(exc)
    return True, None


def executor_accepts(conf: dict, env: dict, monkeypatch) -> bool:
    """What an executor's service does with ``conf`` in environment ``env``: ServiceConfig.from_mapping
    (the JVM bridge's bootstrap) with exactly those CUDABRIDGE_* variables in os.environ."""
    with monkeypatch.context() as m:
        for k in [k for k in os.environ if k.startswith("CUDABRIDGE_")]:
            m.delenv(k)
        for k, v in env.items():
            m.setenv(k, v)
        try:
            pyconfig.ServiceConfig.from_mapping(conf)
        except pyconfig.InvalidArgument:
            return False
    return True


def _grid_cases() -> list[tuple[dict, dict, str]]:
    """(conf, env, what) for every key and grid value: Spark keys as a one-key configuration,
    service keys' variables as a one-variable environment."""
    cases = []
    for s in SETTINGS:
        for v in grid_values(s):
            if s.spark_key:
                cases.append(({s.spark_key: v}, {}, "key"))
            if s.env_read:
                cases.append(({}, {s.env_name: v}, "variable"))
    return cases


def test_driver_and_executor_checks_agree_on_every_key_over_a_grid(jars, monkeypatch):
    cases = _grid_cases()
    java = checkall_env_in_java(jars, [(c, env) for c, env, _ in cases])
    disagree = []
    for (conf, env, what), j in zip(cases, java):
        ok, message = python_outcome(conf, env)
        # the executor's real path, where it reads the value: the Python service (the plugin keys
        # are the plugin's, checked by Settings on the executor too)
        service_key = bool(conf) and pyconfig.SPARK_KEYS[next(iter(conf))].scope == "service"
        service_var = bool(env) and pyconfig.VARIABLES.get(next(iter(env))) is not None \
            and pyconfig.VARIABLES[next(iter(env))].scope == "service"
        executor = executor_accepts(conf, env, monkeypatch) if service_key or service_var else ok
        if not (j["ok"] == ok == executor):
            disagree.append((conf, env, "java", j["ok"], "python", ok, "executor", executor, j["message"], message))
        elif not ok:   # a refusal names the setting as it was spelled (a value's: with the value given)
            name, value = next(iter((conf or env).items()))
            assert name in j["message"] and name in message, (j["message"], message)
            assert j["message"].startswith(f"{name}={value}: "), j["message"]
            assert message.startswith(f"{name}={value!r}: "), message
    assert disagree == [], f"{len(disagree)} of {len(cases)} disagree: {disagree[:10]}"
    assert len(cases) > 500   # the grid is not empty by accident


def test_driver_and_executor_checks_agree_on_jvm_environment_and_dev_names(jars):
    cases = [(s.name, v) for s in SETTINGS if s.scope in ("jvm", "environment", "dev") for v in grid_values(s)]
    got = check_in_java(jars, cases)
    wrong = [(k, v, g) for (k, v), g in zip(cases, got) if (g["ok"], g.get("value")) != _python_value(k, v)]
    assert wrong == []


# the pinned pool and the staging keys together: every combination of the three, each given as a
# Spark key, as a variable or left to its default (staging has its own reservation: no rule ties
# them, and a bad value is refused alike on both sides)
POOLS = ["0", "1m", "2m", "4m", "8m", "15m", "16m", "64m", "1g", "16g", "17g"]
SLOTS = ["1", "4", "5", "16", "17"]
SLOT_BYTES = ["4k", "1m", "4m", "64m", "1g", "2g"]


def _staging_cases() -> list[tuple[dict, dict]]:
    cases = []
    for i, (pool, slots, slot_bytes) in enumerate(itertools.product(POOLS + [None], SLOTS + [None], SLOT_BYTES + [None])):
        conf, env = {}, {}
        for j, (key, value) in enumerate((("pinnedPool", pool), ("stagingSlots", slots), ("stagingSlotBytes", slot_bytes))):
            if value is None:
                continue
            # where each value comes from: key, variable, or both (the key wins over the variable)
            where = (i + j) % 3
            if where in (0, 2):
                conf[PREFIX + key] = value
            if where in (1, 2):
                env[pyconfig.BY_KEY[key].env_name] = value if where == 1 else {"pinnedPool": "1m", "stagingSlots": "16",
                                                               "stagingSlotBytes": "1g"}[key]
        cases.append((conf, env))
    return cases


def test_driver_and_executor_agree_on_the_pinned_pool_and_staging_keys_together(jars, monkeypatch):
    cases = _staging_cases()
    java = checkall_env_in_java(jars, cases)
    refused = 0
    for (conf, env), j in zip(cases, java):
        ok, message = python_outcome(conf, env)
        assert j["ok"] == ok == executor_accepts(conf, env, monkeypatch), (conf, env, j, message)
        # word for word, but for the quotes Python puts around a value it repeats
        assert j["message"] == (message if message is None else message.replace("'", "")), (conf, env)
        refused += not ok
    assert 0 < refused < len(cases)   # the values out of bounds (17 slots, 2g slot bytes) only
    # a pinned pool smaller than the staging a copy uses is fine: staging is not taken from it
    got = checkall_env_in_java(jars, [({P + "pinnedPool": "1m"}, {}), ({P + "pinnedPool": "8m"}, {}),
                                      ({P + "stagingSlotBytes": "16g"}, {})])
    assert [g["ok"] for g in got] == [True, True, False]
    assert got[2]["message"] == ("spark.cudabridge.stagingSlotBytes=16g: 17179869184 bytes is above the most accepted, "
                                 "1073741824 (1 GiB)")


def test_the_driver_checks_the_executors_variables_the_conf_sets(jars):
    """Settings.checkAll(conf) takes spark.executorEnv.CUDABRIDGE_* as the executors' environment."""
    confs = [{"spark.executorEnv.CUDABRIDGE_STREAMS_PER_GPUS": "3"},
             {"spark.executorEnv.CUDABRIDGE_PINNED_POOL": "8x"},
             {"spark.executorEnv.CUDABRIDGE_PINNED_POOL": "8m", P + "stagingSlots": "2"},
             {"spark.executorEnv.CUDABRIDGE_FAULT_ONCE_FILE": "/tmp/x", "spark.executorEnv.OTHER": "1"}]
    proc = probe(jars, "checkall", "".join(conf_line(c) for c in confs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [g["ok"] for g in got] == [False, False, True, True]
    assert got[0]["message"] == ("unknown environment variable CUDABRIDGE_STREAMS_PER_GPUS; did you mean "
                                 "CUDABRIDGE_STREAMS_PER_GPU?")
    unquoted = [(ok, m if m is None else m.replace("'", "")) for ok, m in
                (python_outcome(c, pyconfig.executor_environment(c)) for c in confs)]
    assert unquoted == [(g["ok"], g["message"]) for g in got]


VARIABLE_NAMES = ["CUDABRIDGE_STREAMS_PER_GPUS", "CUDABRIDGE_STREAMSPERGPU", "CUDABRIDGE_POOL_LIMT",
                  "CUDABRIDGE_TASK_BIND", "CUDABRIDGE_METRICS_REFRESH_MS", "CUDABRIDGE_PYTHON_PATH",
                  "CUDABRIDGE_ZZZZZZZZ", "CUDABRIDGE_", "CUDABRIDGE_GATE", "CUDABRIDGE_SKIP_JVM_TEST",
                  "CUDABRIDGE_NATIVE_FASTPATH"]


def test_an_unknown_variable_is_refused_alike_with_the_nearest(jars):
    got = checkall_env_in_java(jars, [({}, {n: "1"}) for n in VARIABLE_NAMES])
    for name, g in zip(VARIABLE_NAMES, got):
        assert not g["ok"], name
        assert g["message"] == pyconfig.unknown_variable_message(name)
    by = dict(zip(VARIABLE_NAMES, (g["message"] for g in got)))
    assert by["CUDABRIDGE_STREAMS_PER_GPUS"] == ("unknown environment variable CUDABRIDGE_STREAMS_PER_GPUS; did you "
                                                 "mean CUDABRIDGE_STREAMS_PER_GPU?")
    assert by["CUDABRIDGE_TASK_BIND"] == ("CUDABRIDGE_TASK_BIND is not read from the environment: "
                                          "spark.cudabridge.taskBind is a plugin key, set in the Spark configuration "
                                          "(--conf spark.cudabridge.taskBind=...)")
    assert by["CUDABRIDGE_ZZZZZZZZ"].startswith("unknown environment variable CUDABRIDGE_ZZZZZZZZ; no variable is close")
    # every variable that is read passes (with its default, or a value of its type)
    known = {s.env_name: s.values[0] if s.type == "list" and s.values else "1" for s in SETTINGS if s.env_read}
    known.update({s.env_name: s.default for s in SETTINGS if s.default is not None and s.env_name in known})
    assert checkall_env_in_java(jars, [({}, known)])[0] == {"ok": True, "message": None}


def test_java_start_refuses_a_misspelled_variable_before_loading_anything(jars):
    """CudaBridge.start checks this process's CUDABRIDGE_* variables before the library or Python."""
    jar, plugin, classes = jars
    cp = [str(jar)] + ([str(plugin)] if plugin else []) + [str(classes)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDABRIDGE_")}
    env["CUDABRIDGE_STREAMS_PER_GPUS"] = "3"
    proc = subprocess.run([_java(), "-cp", os.pathsep.join(cp), PROBE, "start"], input=conf_line({"backend": "emulated"}),
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    g = json.loads(proc.stdout)
    assert not g["ok"] and g["type"] == "org.cudabridge.CudaBridgeException"
    assert g["message"] == ("cudabridge: unknown environment variable CUDABRIDGE_STREAMS_PER_GPUS; did you mean "
                            "CUDABRIDGE_STREAMS_PER_GPU?")


@pytest.fixture(scope="module")
def bridge_classpath(jars):
    """cudabridge.jar with the bridge library and the Python recorded beside it, JPype's jar and
    the probe: what CudaBridge.start() needs from system properties alone."""
    built = jvm_build.build()
    return os.pathsep.join([str(built["jar"]), str(jvm_build.jpype_jar()), str(jars[2])])


def start_streams(cp: str, env: dict[str, str], *props: str) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CUDABRIDGE_")}
    full.update(env)
    proc = subprocess.run([_java(), "-Dspark.cudabridge.backend=emulated", "-Dspark.cudabridge.emulatedMemory=256m",
                           *props, "-cp", cp, PROBE, "streams"], capture_output=True, text=True, timeout=300,
                          env=full, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_java_bridge_reads_the_environment_under_its_keys(bridge_classpath):
    """CUDABRIDGE_STREAMS_PER_GPU=3 gives the bridge 3 streams per GPU (it had 32 + 4: the
    variable was read only by `python -m cudabridge demo`); a key given explicitly wins over it."""
    env = {"CUDABRIDGE_STREAMS_PER_GPU": "3", "CUDABRIDGE_HIGH_PRIORITY_STREAMS": "1"}
    assert start_streams(bridge_classpath, env) == {"ok": True, "streams": 4}
    assert start_streams(bridge_classpath, env, "-Dspark.cudabridge.streamsPerGpu=5") == {"ok": True, "streams": 6}


# --- one vocabulary ---------------------------------------------------------------------------------

def test_java_derives_the_same_names(jars):
    """GpuOutOfMemoryException.FIELDS are OutOfDeviceMemory.FIELDS in camelCase; the Java statistics'
    names start with Python's list; the executor metrics are those names and the plugin's counters."""
    from cudabridge.errors import OutOfDeviceMemory
    from cudabridge.jvm.control import BridgeControl

    proc = probe(jars, "names")
    assert proc.returncode == 0, proc.stderr
    lists = {line.split("\t")[0]: line.split("\t")[1:] for line in proc.stdout.splitlines() if line}
    camel = [f.split("_")[0] + "".join(w.title() for w in f.split("_")[1:]) for f in OutOfDeviceMemory.FIELDS]
    assert lists["oom"] == camel
    python = list(BridgeControl.statistics_names())
    assert lists["statistics"][:len(python)] == python
    assert all(n.startswith("bridge_") for n in lists["statistics"][len(python):])
    if lists.get("metrics"):
        assert lists["metrics"][:len(lists["statistics"])] == lists["statistics"]
        assert all(n.startswith("plugin_") for n in lists["metrics"][len(lists["statistics"]):])
