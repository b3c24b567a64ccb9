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


def test_harness_runs_without_spark(tmp_path):
    sh.build()
    from cudabridge.jvm import build as core
    from cudabridge.spark import build as b

    java = shutil.which("java")
    if java is None:
        pytest.skip("no java")
    cp = os.pathsep.join([str(core.jar_path()), str(b.plugin_jar_path()), str(b.examples_jar_path()),
                          str(core.jpype_jar())])
    out = tmp_path / "summary.json"
    proc = subprocess.run([java, "-cp", cp, "-Dspark.cudabridge.backend=emulated", "org.cudabridge.examples.TaskHarness",
                           "--tasks", "48", "--threads", "4", "--elements", "2048", "--fail-first-attempt", "1,9,30",
                           "--summary-json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "org.apache.spark" not in cp
    s = json.loads(out.read_text())
    assert s["checks"] == "ok", s
    assert s["tasks_run"] == 48 and s["task_attempts"] == 51 and s["planned_failures"] == 3
    assert s["leaks_reclaimed"] == 48 + 3 and s["live_allocations_after"] == 0
    # 51 round-robin binds cover all 32 pool streams; counted over successful tasks only, a stream
    # that only failed attempts drew is missing (which attempts fail first depends on timing)
    assert 32 - s["planned_failures"] <= s["distinct_streams_used"] <= 32, s
    st = s["statistics"]
    assert st["plugin_tasks_released"] == 51 and st["tasks_bound_total"] == 51
