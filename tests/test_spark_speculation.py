"""Speculation (issue 28): a real speculative copy wins and Spark kills the losing attempt while it
holds GPU memory. Spark places a copy of a task only on a host that runs no attempt of it, so the
cluster's two workers bind addresses of their own (127.0.0.2 and 127.0.0.3, loopback): a
standalone cluster of separate JVMs (tests/standalone_cluster.py), the bridge from this checkout's
build on each executor's class path. Example (f), GpuPressureJob, holds partition 0's first attempt
for 8 s in each of two jobs: a copy runs on the other executor and wins, the killed attempt's
memory comes back, every task started is released, nothing is live afterwards, and the second job
shows the executors kept serving."""

from __future__ import annotations

import json

import pytest

import spark_harness as sh
from standalone_cluster import StandaloneCluster, executors_conf

pytestmark = pytest.mark.slow

JOB = "org.cudabridge.examples.GpuPressureJob"
CONF = {
    "spark.cudabridge.poolLimit": "64m",
    "spark.cudabridge.reportIntervalMs": "250",
    # speculate a task running twice the median once half the tasks are done
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "2",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "500ms",
    **executors_conf(2),   # one GPU per executor, shared by its two task slots
}


def test_a_speculative_copy_wins_and_the_killed_attempt_gives_everything_back(tmp_path):
    sh.build()
    cluster = StandaloneCluster(tmp_path / "cluster", workers=2, cores=2, memory="1g", gpus=1, hosts_per_worker=True)
    with cluster:
        hosts = sorted(w["host"] for w in cluster.alive_workers())
        assert hosts == ["127.0.0.2", "127.0.0.3"], cluster.explain(f"workers' hosts: {hosts}")
        run = sh.spark_submit(tmp_path / "job", cluster.master_url,
                              [sh.examples_jar(), "--partitions", "8", "--chunks", "4", "--chunk-mib", "8",
                               "--hold-ms", "200", "--slow-partition", "0", "--slow-ms", "8000", "--rounds", "2",
                               "--summary-json", "summary.json"], CONF, main_class=JOB, timeout=240)
        why = lambda *more: cluster.explain(run.explain(), *more)  # noqa: E731
        assert run.returncode == 0, why()
        s = run.summary()
        st = s["statistics"]
        assert s["tasks_run"] == 8 and s["verify_failures"] == 0, why(json.dumps(s))
        # a copy won in each job: neither waited out its slow attempt
        assert s["speculative_attempts"] >= 2, why(json.dumps(s))
        assert all(float(ms) < 8000 for ms in s["job_ms_rounds"].split(",")), why(json.dumps(s))
        # the losing attempts were killed holding memory: their releases took it back; every attempt
        # started (speculative copies included) was released, and nothing is live
        assert st["plugin_tasks_started"] == st["plugin_tasks_released"] >= 18, why(json.dumps(st))
        assert st["live_allocations"] == 0 and st["in_use_bytes"] == 0, why(json.dumps(st))
        assert st["allocations_waiting"] == 0 and st["plugin_start_failed"] == 0, why(json.dumps(st))
