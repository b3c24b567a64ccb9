"""The Java harness (example (a)'s task code bound through TaskBinder, as the plugin binds it) runs
in a plain `java` process with no Spark jar on its class path: that is how it runs on the GPU
machine, where Spark is not available."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

import spark_harness as sh


def run_harness(tmp_path, *args: str, conf: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, dict, str]:
    sh.build()
    from cudabridge.jvm import build as core
    from cudabridge.spark import build as b

    java = shutil.which("java")
    if java is None:
        pytest.skip("no java")
    cp = os.pathsep.join([str(core.jar_path()), str(b.plugin_jar_path()), str(b.examples_jar_path()),
                          str(core.jpype_jar())])
    out = tmp_path / "summary.json"
    twins = [f"-D{k}={v}" for k, v in sh.EXAMPLE_TWINS.items()]   # example (a)'s kernel, emulated
    proc = subprocess.run([java, "-cp", cp, "-Dspark.cudabridge.backend=emulated", *twins, *conf,
                           "org.cudabridge.examples.TaskHarness", *args, "--summary-json", str(out)],
                          capture_output=True, text=True, timeout=120)
    return proc, (json.loads(out.read_text()) if out.is_file() else {}), cp


@pytest.mark.parametrize("task_bind", ["lazy", "ahead", "eager"])
def test_harness_runs_without_spark(tmp_path, task_bind):
    proc, s, cp = run_harness(tmp_path, "--tasks", "48", "--threads", "4", "--elements", "2048",
                              "--fail-first-attempt", "1,9,30", "--gpu-address", "0",
                              conf=(f"-Dspark.cudabridge.taskBind={task_bind}",))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "org.apache.spark" not in cp
    assert s["checks"] == "ok", s
    assert s["tasks_run"] == 48 and s["task_attempts"] == 51 and s["planned_failures"] == 3
    assert s["leaks_reclaimed"] == 48 + 3 and s["live_allocations_after"] == 0
    # 51 round-robin binds cover all 32 pool streams; counted over successful tasks only, a stream
    # that only failed attempts drew is missing (which attempts fail first depends on timing)
    assert 32 - s["planned_failures"] <= s["distinct_streams_used"] <= 32, s
    st = s["statistics"]
    assert st["plugin_tasks_released"] == 51 and st["tasks_bound_total"] == 51
    assert st["plugin_bind_failures"] == 0 and st["plugin_binds_never_applied"] == 0  # every task used the GPU
    if task_bind != "ahead":
        assert st["plugin_binds_ahead"] == 0


@pytest.mark.parametrize("task_bind", ["lazy", "ahead", "eager"])
def test_unknown_gpu_address_fails_each_task_with_the_reason(tmp_path, task_bind):
    """A task whose GPU address the executor does not own: its GPU calls fail with the reason
    (a deferred bind fails at the first one), the failure is counted, nothing is left bound."""
    proc, s, _ = run_harness(tmp_path, "--tasks", "6", "--threads", "2", "--elements", "256", "--gpu-address", "7",
                             conf=(f"-Dspark.cudabridge.taskBind={task_bind}",))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not owned by this executor" in proc.stderr and "could not be bound" in proc.stderr
    assert s["unexpected_failures"] == 12 and s["tasks_run"] == 0   # each partition tried twice
    st = s["statistics"]
    assert st["plugin_bind_failures"] == 12 and st.get("tasks_bound_total", 0) == 0
    assert st["tasks_bound"] == 0 and st["live_allocations"] == 0


def test_statistics_snapshots_taken_while_tasks_end_are_consistent(tmp_path):
    """The executor's reports to the driver are TaskBinder.refresh() snapshots taken while tasks
    end. One that counts a task attempt as ended must count that attempt's leak too (the CI run
    that summed 8 attempts ended but 7 leaks came from a snapshot that read the service before
    the plugin's counters). A thread takes snapshots all through 400 short tasks and checks each."""
    proc, s, _ = run_harness(tmp_path, "--tasks", "400", "--threads", "4", "--elements", "64",
                             "--fail-first-attempt", "5,50", "--check-snapshots")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert s["checks"] == "ok", s
    assert s["snapshots_checked"] > 50 and s["snapshots_inconsistent"] == 0, s


def test_harness_runs_example_c_s_kernel(tmp_path):
    """Example (c)'s task code (HistogramWork) through the harness, as the H200 runs it: each task
    compiles the histogram kernel once per executor (its twin here), launches it on its stream and
    checks the bins against the CPU's; a failed first attempt is retried."""
    proc, s, _ = run_harness(tmp_path, "--work", "histogram", "--tasks", "24", "--threads", "4", "--elements", "5000",
                             "--fail-first-attempt", "2", "--no-leak")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert s["checks"] == "ok" and s["tasks_run"] == 24 and s["verify_failures"] == 0, s
    assert s["statistics"]["bridge_launches"] == 24, s["statistics"]
