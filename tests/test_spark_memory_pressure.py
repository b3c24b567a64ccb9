"""Memory pressure in Spark (issue 28): example (e), GpuPressureJob, asks for more GPU memory at
once than the pool holds (16 tasks, each with a 32 MiB peak, in local[4] over a 64 MiB pool: the
summed peaks are 8x the pool, four tasks at once 2x). With waiting on it completes, with and
without concurrentGpuTasks; a cancelled job's tasks, holding memory and waiting, leave and give
everything back, and the executor keeps serving. Each run's timeout is the watchdog: none hangs."""

from __future__ import annotations

import pytest

import spark_harness as sh

pytestmark = pytest.mark.slow

JOB = "org.cudabridge.examples.GpuPressureJob"
POOL = {"spark.cudabridge.poolLimit": "64m", "spark.cudabridge.oomWait": "60"}


def _run(tmp_path, args, conf, master="local[4]"):
    sh.build()
    run = sh.spark_submit(tmp_path, master, [sh.examples_jar(), *args, "--summary-json", "summary.json"],
                          {**POOL, **conf}, main_class=JOB, timeout=240)
    assert run.returncode == 0, run.explain()
    return run.summary(), run


@pytest.mark.parametrize("admission", [None, "2"])
def test_an_oversubscribed_job_completes_with_waits_and_breaks_and_gives_all_memory_back(tmp_path, admission):
    conf = {} if admission is None else {"spark.cudabridge.concurrentGpuTasks": admission}
    s, run = _run(tmp_path, ["--partitions", "16", "--chunks", "4", "--chunk-mib", "8", "--hold-ms", "40"], conf)
    st = s["statistics"]
    assert s["tasks_run"] == 16 and s["verify_failures"] == 0, s
    assert st["live_allocations"] == 0 and st["in_use_bytes"] == 0, st
    assert st["allocations_waiting"] == 0 and st["tasks_waiting_admission"] == 0
    if admission is None:
        assert st["allocation_waits"] > 0, st   # four tasks at once ask for twice the pool: they waited
    else:
        assert st["admission_waits"] > 0 and st["tasks_admitted"] == 0, st
    # every out of memory the tasks met came from the breaker, and each was retried
    assert st["oom_wait_timeouts"] == 0 and s["retries"] == st["oom_breaks"], (s, st)


def test_a_cancelled_job_whose_tasks_hold_memory_and_wait_gives_everything_back(tmp_path):
    s, run = _run(tmp_path, ["--partitions", "8", "--chunks", "4", "--chunk-mib", "12", "--hold-ms", "40",
                             "--cancel-after-ms", "1500"], {})
    assert s["first_job"] == "cancelled", s
    st = s["statistics"]
    assert s["tasks_run"] == 8 and s["verify_failures"] == 0, s   # the executor kept serving
    assert st["live_allocations"] == 0 and st["in_use_bytes"] == 0, st
    # the killed tasks' buffers, left to their release: each reclaimed, none else (leaks reclaimed = leaks made)
    assert st["leaks_reclaimed"] == s["buffers_left_at_kill"] > 0, (s, st)
    assert st["allocations_waiting"] == 0 and st["plugin_tasks_started"] == st["plugin_tasks_released"], st
