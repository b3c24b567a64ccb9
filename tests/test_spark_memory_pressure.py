"""Memory pressure in Spark (issue 28): example (f), GpuPressureJob, asks for more GPU memory at
once than the pool holds (16 tasks, each with a 32 MiB peak, in local[4] over a 64 MiB pool: the
summed peaks are 8x the pool, four tasks at once 2x). With waiting on it completes, with and
without concurrentGpuTasks; a cancelled job's tasks, holding memory, waiting and running helper
threads that allocate, copy and launch, leave and give everything back, and the executor keeps
serving. Each run's timeout is the watchdog: none hangs."""

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


@pytest.mark.parametrize("admission", [None, "2"])
def test_a_cancelled_job_whose_tasks_hold_memory_wait_and_run_helpers_gives_everything_back(tmp_path, admission):
    # with concurrentGpuTasks 2, tasks wait for admission when the cancel comes; without, for memory
    conf = {} if admission is None else {"spark.cudabridge.concurrentGpuTasks": admission}
    s, run = _run(tmp_path, ["--partitions", "8", "--chunks", "4", "--chunk-mib", "12", "--hold-ms", "40",
                             "--cancel-after-ms", "1500"], conf)
    assert s["first_job"] == "cancelled", s
    st = s["statistics"]
    assert s["tasks_run"] == 8 and s["verify_failures"] == 0, s   # the executor kept serving
    assert st["live_allocations"] == 0 and st["in_use_bytes"] == 0, st
    # the killed tasks' buffers, left to their release: each reclaimed, none else (leaks reclaimed =
    # leaks made); a helper's close that raced its task's release may have freed its buffer or found
    # it reclaimed (DeviceBuffer.close returns quietly either way)
    left, raced = s["buffers_left_at_kill"], s["helper_closes_raced_release"]
    assert 0 < left <= st["leaks_reclaimed"] <= left + raced, (s, st)
    assert st["allocations_waiting"] == 0 and st["plugin_tasks_started"] == st["plugin_tasks_released"], st
    # each task ran a helper thread that allocated, copied and launched for it: every helper of a
    # killed task was refused once its task was released (none runs on), and what it held counts
    # among the leaks reclaimed above
    assert s["helpers_started"] > 0 and s["helpers_ended"] == s["helpers_started"], s
    endings = dict(e.split("=") for e in s["helper_endings"].strip("{}").split(", "))
    # refused: by Java's own check of a released task, or by the service (its release began, or
    # its waits were cancelled at the kill); "stopped": a task that finished before the cancel
    assert set(endings) <= {"IllegalStateException", "UnknownTaskException", "stopped"}, s
    assert sum(int(n) for e, n in endings.items() if e != "stopped") > 0, s
