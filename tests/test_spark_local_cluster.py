"""local-cluster[2,1,1024]: two real executor JVMs, each starting its own bridge and service
(always under a timeout: an executor whose plugin init throws is relaunched forever there).
Executors write logs under pyspark/work/<app>; the test removes what its runs added."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import spark_harness as sh

pytestmark = pytest.mark.slow

# The job starts once both executors have registered (Spark waits 30 s by default, then schedules on
# whatever registered: on a loaded 2-core machine an executor's start can take longer, and all 8
# tasks then ran on one executor).
CLUSTER = {"spark.executor.memory": "512m", "spark.cudabridge.reportIntervalMs": "250",
           "spark.scheduler.minRegisteredResourcesRatio": "1.0",
           "spark.scheduler.maxRegisteredResourcesWaitingTime": "150s"}


@pytest.fixture
def work_dir_cleanup():
    import pyspark

    work = Path(pyspark.__file__).resolve().parent / "work"
    before = set(work.iterdir()) if work.is_dir() else set()
    yield work
    if work.is_dir():
        for p in set(work.iterdir()) - before:
            shutil.rmtree(p, ignore_errors=True)
        if not before and not any(work.iterdir()):
            work.rmdir()


def test_two_executors_each_with_its_own_service(tmp_path, work_dir_cleanup):
    sh.build()
    run = sh.spark_submit(tmp_path, "local-cluster[2,1,1024]",
                          [sh.examples_jar(), "--partitions", "8", "--elements", "1024", "--summary-json", "summary.json"],
                          CLUSTER, timeout=180)
    assert run.returncode == 0, run.explain()
    s = run.summary()
    assert s["tasks_run"] == 8 and s["verify_failures"] == 0
    assert s["executors"] == 2, s              # tasks ran in both executor JVMs
    assert s["executors_reporting"] == 2, s   # and each executor's own service reported to the driver
    st = s["statistics"]                       # summed over the two executors
    assert st["plugin_tasks_started"] == 8 and st["plugin_tasks_released"] == 8
    assert st["leaks_reclaimed"] == 8 and st["live_allocations"] == 0 and st["in_use_bytes"] == 0
    assert st["plugin_start_failed"] == 0
    assert st["streams"] == 2 * 36            # one stream pool per executor
    apps = list(work_dir_cleanup.glob("app-*")) if work_dir_cleanup.is_dir() else []
    assert apps, f"no app-* directory under {work_dir_cleanup}, where local-cluster executors write their logs"


def test_gpu_addresses_from_spark_resource_scheduling(tmp_path, work_dir_cleanup):
    """Each executor gets two GPUs from Spark's resource scheduling (a discovery script) and
    each task one of them: the plugin gives the executor's addresses to its service and binds
    each task to its own address's GPU. With two GPUs a bind without an address is refused
    ("say which"), so every task bound proves the task's address reached the bind."""
    sh.build()
    script = tmp_path / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    gpu = {"spark.worker.resource.gpu.amount": "2", "spark.worker.resource.gpu.discoveryScript": str(script),
           "spark.executor.resource.gpu.amount": "2", "spark.executor.resource.gpu.discoveryScript": str(script),
           "spark.task.resource.gpu.amount": "1", "spark.cudabridge.emulatedDevices": "2"}
    run = sh.spark_submit(tmp_path, "local-cluster[2,1,1024]",
                          [sh.examples_jar(), "--partitions", "8", "--elements", "1024", "--summary-json", "summary.json"],
                          {**CLUSTER, **gpu}, timeout=180)
    assert run.returncode == 0, run.explain()
    s = run.summary()
    assert s["tasks_run"] == 8 and s["verify_failures"] == 0, s
    st = s["statistics"]
    assert st["plugin_bind_failures"] == 0 and st["plugin_tasks_released"] == 8
    assert st["streams"] == 2 * 2 * 36         # two GPUs per executor, a stream pool each
    assert s["gpus_used"] >= 2, s


def test_failed_service_does_not_relaunch_executors_forever(tmp_path, work_dir_cleanup):
    sh.build()
    run = sh.spark_submit(tmp_path, "local-cluster[2,1,1024]",
                          [sh.examples_jar(), "--work", "host", "--partitions", "4", "--elements", "256",
                           "--summary-json", "summary.json"],
                          {**CLUSTER, "spark.cudabridge.python": "/nonexistent/bin/python"}, timeout=180)
    assert run.returncode == 0, run.explain()
    s = run.summary()
    assert s["tasks_run"] == 4 and s["verify_failures"] == 0
    st = s["statistics"]
    assert st["plugin_start_failed"] == s["executors_reporting"] >= 1
    # each executor JVM started once: one work directory per executor, no relaunches
    app = sorted(work_dir_cleanup.glob("app-*"), key=lambda p: p.stat().st_mtime)[-1]
    executors = [p for p in app.iterdir() if p.is_dir()]
    assert len(executors) == 2, [p.name for p in executors]


def test_an_executor_whose_gpu_became_unusable_is_replaced(tmp_path, work_dir_cleanup):
    """A sticky CUDA error in one executor (injected through the backend_wrapper test setting:
    tests/faulty_backend.py, after its 3rd copy to the device): the task fails, the plugin sees the
    GPU is unusable and exits the executor with code 20, Spark starts a new executor and the
    job completes with every partition checked."""
    sh.build()
    tests_dir = str(Path(__file__).resolve().parent)
    once = tmp_path / "sticky-once"
    conf = {**CLUSTER, "spark.cudabridge.pythonPath": tests_dir,
            "spark.cudabridge.backendWrapper": "faulty_backend:from_env",
            "spark.executorEnv.CUDABRIDGE_FAULT_STICKY_AFTER_COPIES": "3",
            "spark.executorEnv.CUDABRIDGE_FAULT_ONCE_FILE": str(once),
            "spark.task.maxFailures": "4"}
    run = sh.spark_submit(tmp_path, "local-cluster[2,1,1024]",
                          [sh.examples_jar(), "--partitions", "12", "--elements", "1024", "--no-leak",
                           "--summary-json", "summary.json"], conf, timeout=240)
    assert run.returncode == 0, run.explain()
    assert once.exists(), "the fault was never injected"
    s = run.summary()
    assert s["tasks_run"] >= 12 and s["verify_failures"] == 0, s
    assert "exited with code 20" in run.stderr, run.explain()
    app = sorted(work_dir_cleanup.glob("app-*"), key=lambda p: p.stat().st_mtime)[-1]
    logs = "".join(p.read_text(errors="replace") for p in app.glob("*/stderr"))
    assert "the GPU is unusable" in logs and "exiting with code 20" in logs
    assert len([p for p in app.iterdir() if p.is_dir()]) >= 3   # the replacement executor


def test_example_c_in_two_executor_jvms(tmp_path, work_dir_cleanup):
    """Example (c) in local-cluster: each executor JVM compiles the kernel in its own service (the
    module cache is per executor) and its tasks run it on their streams."""
    sh.build()
    run = sh.spark_submit(tmp_path, "local-cluster[2,1,1024]",
                          [sh.examples_jar(), "--partitions", "8", "--elements", "20000", "--summary-json", "summary.json"],
                          CLUSTER,   # the examples' host kernels: spark_harness.EXAMPLE_TWINS
                          main_class="org.cudabridge.examples.GpuHistogramJob", timeout=180)
    assert run.returncode == 0, run.explain()
    s = run.summary()
    assert s["tasks_run"] == 8 and s["verify_failures"] == 0, s
    assert s["values_counted"] == s["values_expected"] == 8 * 20000


def test_example_d_by_reference_from_py_files_in_two_executors(tmp_path, work_dir_cleanup):
    """Example (d) in local-cluster: the batch functions named by reference
    ("shipped_batches:transform"), shipped with --py-files and imported in each executor's own
    Python from Spark's files folder (trusted: the executor user's, writable by it alone);
    results equal mapInPandas's, row by row."""
    sh.build()
    examples = sh.ROOT / "spark-examples"
    shipped = tmp_path / "shipped_batches.py"   # a name found nowhere else on the executors' path
    shipped.write_text((examples / "python" / "example_batches.py").read_text())
    run = sh.spark_submit(tmp_path, "local-cluster[2,1,1024]",
                          ["--py-files", str(shipped), str(examples / "map_batches_job.py"), "--by-reference",
                           "--module", "shipped_batches", "--rows", "40000",
                           "--partitions", "4", "--batch-rows", "8192", "--summary-json", "summary.json"],
                          CLUSTER, main_class=None, timeout=240)
    assert run.returncode == 0, run.explain()
    s = run.summary()
    assert s["rows_checked"] == 40000 and s["mismatches"] == 0 and s["sums_equal"], s


def test_an_attempt_killed_as_a_losing_copy_gives_everything_back_and_the_job_completes(tmp_path,
                                                                                      work_dir_cleanup):
    """Example (f) in two executors, partition 0's first attempt holding its memory for 8 s: the
    driver kills that attempt after 1.5 s the way Spark kills a speculative race's losing copy
    (killTaskAttempt, interrupting its thread; Spark places no speculative copy on a host already
    running an attempt, so in local-cluster, one host, speculation itself never launches one: the
    real race runs in tests/test_spark_speculation.py, on two loopback addresses). The plugin's kill
    watch ends any wait of it, its release reclaims what it held, Spark runs it again, the job
    completes, every task started is released in both executors, and nothing is live afterwards."""
    sh.build()
    conf = {**CLUSTER, "spark.cudabridge.poolLimit": "64m"}
    run = sh.spark_submit(tmp_path, "local-cluster[2,1,1024]",
                          [sh.examples_jar(), "--partitions", "8", "--chunks", "4", "--chunk-mib", "4", "--hold-ms", "200",
                           "--slow-partition", "0", "--slow-ms", "8000", "--kill-slow-after-ms", "1500",
                           "--summary-json", "summary.json"],
                          conf, main_class="org.cudabridge.examples.GpuPressureJob", timeout=240)
    assert run.returncode == 0, run.explain()
    s = run.summary()
    st = s["statistics"]
    assert s["tasks_run"] == 8 and s["verify_failures"] == 0, s
    assert s["attempts_killed"] == 1 and float(s["job_ms"]) < 8000, s   # it did not wait out the slow attempt
    assert st["plugin_tasks_started"] == st["plugin_tasks_released"] == 9, st
    assert st["live_allocations"] == 0 and st["in_use_bytes"] == 0 and st["allocations_waiting"] == 0, st
