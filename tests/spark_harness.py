"""Running the Spark examples with spark-submit from the tests (real Spark, emulated device).

Each run gets its own working directory (spark-warehouse, metrics CSVs, summaries) and a hard
timeout; the environment sets SPARK_LOCAL_IP=127.0.0.1 and forces the emulated backend unless a
test says otherwise.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

PLUGIN = "org.cudabridge.spark.CudaBridgePlugin"
JOB_A = "org.cudabridge.examples.GpuPartitionJob"
ROOT = Path(__file__).resolve().parent.parent
# The examples' host kernels (their kernels on the emulated device): every run can find them.
EXAMPLE_TWINS = {"spark.cudabridge.emulatedKernels": "example_kernels",
                 "spark.cudabridge.pythonPath": str(ROOT / "spark-examples" / "python")}
METRIC_PREFIX = f"plugin.{PLUGIN}."


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    cwd: Path

    def summary(self, name: str = "summary.json") -> dict:
        path = self.cwd / name
        assert path.is_file(), f"no {name}; rc={self.returncode}\nstdout:\n{self.stdout}\nstderr tail:\n{self.stderr[-6000:]}"
        return json.loads(path.read_text())

    def explain(self) -> str:
        return f"rc={self.returncode} after {self.seconds:.1f}s\nstdout:\n{self.stdout}\nstderr tail:\n{self.stderr[-8000:]}"


def require_spark() -> None:
    pytest.importorskip("pyspark", reason="pyspark 4.3.0 is not installed (./dev/setup installs it)")
    if shutil.which("javac") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no JDK (javac) to build the plugin jar")


def build() -> dict[str, Path]:
    require_spark()
    from cudabridge.spark import build as b

    return b.build()


def spark_submit(cwd: Path, master: str, app: list[str], conf: dict[str, str] | None = None, *,
                 main_class: str | None = JOB_A, timeout: float = 240, plugin: bool = True,
                 jars: list[str] | None = None, env: dict[str, str] | None = None) -> Run:
    from cudabridge.spark import build as b

    cwd.mkdir(parents=True, exist_ok=True)
    settings = {"spark.ui.enabled": "false", "spark.cudabridge.backend": "emulated",
                "spark.log.level": "WARN", "spark.sql.shuffle.partitions": "4"}
    if plugin:
        cp = b.classpath()
        settings.update({"spark.driver.extraClassPath": cp, "spark.executor.extraClassPath": cp,
                         "spark.plugins": PLUGIN})
    conf = dict(conf or {})
    if plugin:
        settings.update(EXAMPLE_TWINS)
        path = conf.pop("spark.cudabridge.pythonPath", None)   # a test's own modules, and the twins
        if path is not None:
            settings["spark.cudabridge.pythonPath"] = os.pathsep.join([path, settings["spark.cudabridge.pythonPath"]])
    settings.update(conf)
    cmd = [str(b.spark_submit()), "--master", master]
    if main_class:
        cmd += ["--class", main_class]
    if jars:
        cmd += ["--jars", ",".join(jars)]
    for k, v in settings.items():
        cmd += ["--conf", f"{k}={v}"]
    cmd += app
    full_env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                    PYSPARK_DRIVER_PYTHON=sys.executable)
    full_env.pop("CUDABRIDGE_BACKEND", None)
    full_env.update(env or {})
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"spark-submit ran past its {timeout}s timeout: {' '.join(cmd[:6])}...\nstdout:\n{out}\n"
                    f"stderr tail:\n{err[-6000:]}")
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0, cwd)


def examples_jar() -> str:
    from cudabridge.spark import build as b

    return str(b.examples_jar_path())


def csv_sink_conf(directory: Path, namespace: str = "cbtest") -> dict[str, str]:
    return {
        "spark.metrics.namespace": namespace,
        "spark.metrics.conf.*.sink.csv.class": "org.apache.spark.metrics.sink.CsvSink",
        "spark.metrics.conf.*.sink.csv.period": "1",
        "spark.metrics.conf.*.sink.csv.unit": "seconds",
        "spark.metrics.conf.*.sink.csv.directory": str(directory),
    }


def read_csv_metrics(directory: Path) -> dict[str, dict[str, int]]:
    """{instance (driver / executor id): {metric name after the plugin prefix: last value}}."""
    out: dict[str, dict[str, int]] = {}
    for path in directory.glob("*.csv"):
        name = path.name[:-len(".csv")]
        i = name.find(METRIC_PREFIX)
        if i < 0:
            continue
        instance = name[:i].rstrip(".").split(".")[-1]
        with path.open() as f:
            rows = list(csv.reader(f))
        if len(rows) < 2:
            continue
        out.setdefault(instance, {})[name[i + len(METRIC_PREFIX):]] = int(float(rows[-1][1]))
    return out
