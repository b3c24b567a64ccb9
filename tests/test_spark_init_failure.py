"""The executor plugin's failure path: a service that cannot start never fails ``init`` (which
would make a cluster relaunch executors forever); the executor stays up and runs non-GPU tasks,
logs one clear error line, and every GPU call of every task fails fast with the reason."""

from __future__ import annotations

import pytest

import spark_harness as sh

pytestmark = pytest.mark.slow

BAD_PYTHON = "/nonexistent/cudabridge-venv/bin/python"


def test_executor_stays_up_and_non_gpu_tasks_run(tmp_path):
    sh.build()
    run = sh.spark_submit(tmp_path, "local[2]",
                          [sh.examples_jar(), "--work", "host", "--partitions", "8", "--elements", "512",
                           "--summary-json", "summary.json"],
                          {"spark.cudabridge.python": BAD_PYTHON, "spark.cudabridge.reportIntervalMs": "200"})
    assert run.returncode == 0, run.explain()
    s = run.summary()
    assert s["tasks_run"] == 8 and s["verify_failures"] == 0
    st = s["statistics"]                       # the executor's report to the driver plugin
    assert st["plugin_start_failed"] == 1
    assert st["plugin_tasks_started"] == 8 and st["plugin_tasks_released"] == 0 and st.get("tasks_bound_total", 0) == 0
    lines = [l for l in run.stderr.splitlines() if "has NO GPU service" in l]
    assert len(lines) == 1, lines             # one clear line, naming the cause
    assert BAD_PYTHON in lines[0]


def test_gpu_calls_fail_fast_with_the_reason(tmp_path):
    sh.build()
    run = sh.spark_submit(tmp_path, "local[2]",
                          [sh.examples_jar(), "--partitions", "4", "--elements", "512"],
                          {"spark.cudabridge.python": BAD_PYTHON})
    assert run.returncode != 0, run.explain()
    assert "cudabridge is not available on executor driver: its start failed" in run.stderr, run.explain()
    assert BAD_PYTHON in run.stderr


def test_service_error_in_python_is_the_reason(tmp_path):
    """The Python service itself refuses the configuration (a value whose form the settings table
    accepts, so that the driver lets it through): its message reaches the task."""
    sh.build()
    run = sh.spark_submit(tmp_path, "local[2]",
                          [sh.examples_jar(), "--partitions", "2", "--elements", "256"],
                          {"spark.cudabridge.gpuAddressMap": "0:zz"})
    assert run.returncode != 0, run.explain()
    failure = [l for l in run.stderr.splitlines() if "has NO GPU service" in l]
    assert len(failure) == 1 and "GPU address map entry '0:zz' is not 'address:ordinal'" in failure[0], failure
    assert "cudabridge is not available on executor driver" in run.stderr
