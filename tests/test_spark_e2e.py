"""End to end through real Spark (spark-submit, local[4,2], emulated device): the plugin binds and
releases every task attempt, a first attempt that fails after allocating has its memory
reclaimed (counted as a leak) and its retry succeeds, and the metrics a CsvSink wrote agree with
the service's own statistics. Also example (b), SQL with Java UDFs on the task's stream."""

from __future__ import annotations


import pytest

import spark_harness as sh

pytestmark = pytest.mark.slow

PARTITIONS = 24
ELEMENTS = 2048
FAIL = (2, 5)


@pytest.fixture(scope="module")
def job_a(tmp_path_factory):
    sh.build()
    cwd = tmp_path_factory.mktemp("spark-e2e")
    metrics = cwd / "metrics"
    metrics.mkdir()
    run = sh.spark_submit(
        cwd, "local[4,2]",
        [sh.examples_jar(), "--partitions", str(PARTITIONS), "--elements", str(ELEMENTS),
         "--fail-first-attempt", ",".join(map(str, FAIL)), "--summary-json", "summary.json", "--linger-ms", "2500"],
        {**sh.csv_sink_conf(metrics), "spark.cudabridge.metrics.refreshMs": "0"})
    assert run.returncode == 0, run.explain()
    return run, run.summary(), metrics


def test_every_task_bound_and_released(job_a):
    run, s, _ = job_a
    st = s["statistics"]
    attempts = PARTITIONS + len(FAIL)
    assert s["tasks_run"] == PARTITIONS and s["verify_failures"] == 0, run.explain()
    assert s["task_attempts_expected"] == attempts
    # every attempt (retries included) was bound once by onTaskStart and released once at its end
    assert st["plugin_tasks_started"] == attempts
    assert st["tasks_bound_total"] == attempts
    assert st["plugin_tasks_released"] == attempts
    assert st["plugin_tasks_succeeded"] == PARTITIONS
    assert st["plugin_tasks_failed"] == len(FAIL)
    assert st["plugin_bind_failures"] == 0 and st["plugin_release_failures"] == 0
    assert st["tasks_bound"] == 0 and st["streams_in_use"] == 0
    assert st["bridge_java_tasks_bound"] == 0
    # round-robin over 32 pool streams, 26 binds: every successful task had a stream of its own
    assert s["distinct_streams_used"] == PARTITIONS
    assert s["bytes_moved"] == PARTITIONS * 16 * ELEMENTS


def test_failed_first_attempt_memory_reclaimed_and_retry_succeeds(job_a):
    run, s, _ = job_a
    st = s["statistics"]
    # one 4 KiB buffer leaked on purpose by each successful task, and one ELEMENTS*4 buffer by each
    # failed first attempt: all reclaimed at release, nothing left in use
    assert s["leaked_on_purpose"] == PARTITIONS
    assert st["leaks_reclaimed"] == PARTITIONS + len(FAIL)
    assert st["plugin_leaks_reclaimed"] == PARTITIONS + len(FAIL)
    assert st["leaked_bytes_reclaimed"] == PARTITIONS * 4096 + len(FAIL) * 4 * ELEMENTS
    assert st["plugin_leaked_bytes_reclaimed"] == st["leaked_bytes_reclaimed"]
    assert st["live_allocations"] == 0 and st["in_use_bytes"] == 0
    assert "planned failure of the first attempt of partition 2" in run.stderr
    assert "planned failure of the first attempt of partition 5" in run.stderr


def test_csv_sink_metrics_agree_with_service_statistics(job_a):
    from cudabridge.spark import build as b  # noqa: F401  (built by the fixture)

    run, s, metrics = job_a
    st = s["statistics"]
    seen = sh.read_csv_metrics(metrics)
    assert "driver" in seen, f"no plugin metrics in {sorted(p.name for p in metrics.iterdir())[:20]}"
    m = seen["driver"]  # local mode: the executor plugin runs in the driver JVM
    expected = {
        "executor.tasks_bound_total": st["tasks_bound_total"],
        "executor.tasks_bound": 0,
        "executor.streams_in_use": 0,
        "executor.streams": st["streams"],
        "executor.in_use_bytes": 0,
        "executor.reserved_bytes": st["reserved_bytes"],
        "executor.peak_in_use_bytes": st["peak_in_use_bytes"],
        "executor.allocations": st["allocations"],
        "executor.live_allocations": 0,
        "executor.leaks_reclaimed": st["leaks_reclaimed"],
        "executor.leaked_bytes_reclaimed": st["leaked_bytes_reclaimed"],
        "executor.oom": st["oom"],
        "executor.host_syncs": st["host_syncs"],
        "executor.gpu_waits": st["gpu_waits"],
        "executor.plugin_start_failed": 0,
        "executor.plugin_tasks_started": PARTITIONS + len(FAIL),
        "executor.plugin_tasks_released": PARTITIONS + len(FAIL),
        "executor.plugin_tasks_failed": len(FAIL),
    }
    got = {k: m.get(k) for k in expected}
    assert got == expected, run.explain()
    # every statistic is a gauge, named as the statistics name it (docs/glossary.md), registered in
    # init (Spark keeps the source only if init registered them)
    from cudabridge.jvm.control import BridgeControl

    missing = sorted(n for n in BridgeControl.statistics_names() if f"executor.{n}" not in m)
    assert not missing, missing
    assert "executor.plugin_leaks_reclaimed" in m and "executor.bridge_thread_states" in m
    # every allocation and free crossed the bridge once: the call counter must say at least that
    assert m["executor.bridge_calls_total"] >= 2 * st["allocations"] - st["leaks_reclaimed"] > 0, (m, st)
    # driver-side metrics have their own names, so both survive in local mode's shared registry
    assert m.get("driver.executors_reporting") == 1
    assert m.get("driver.executors_leaks_reclaimed") == st["leaks_reclaimed"]


def test_sql_udf_example_uses_task_streams(tmp_path):
    sh.build()
    run = sh.spark_submit(tmp_path, "local[4]", [str(sh.ROOT / "spark-examples" / "sql_udf.py"), "--rows", "1200",
                                                 "--partitions", "6", "--summary-json", "summary.json"],
                          main_class=None, jars=[sh.examples_jar()])
    assert run.returncode == 0, run.explain()
    s = run.summary()
    assert s == {"rows": 1200, "matched": 1200, "partitions": 6, "distinct_streams": 6, "max_streams_per_task": 1}, s


def test_example_c_tasks_run_their_own_kernel(tmp_path):
    """Example (c) in local[4,2]: each task compiles a histogram kernel (once per executor), runs
    it on its own stream over its partition and checks the bins against the CPU; partition 3's
    first attempt fails with its kernel queued, and its retry succeeds. On the emulated device
    the kernel's host kernel runs (spark-examples/python/example_kernels.py)."""
    sh.build()
    run = sh.spark_submit(tmp_path, "local[4,2]",
                          [sh.examples_jar(), "--partitions", "12", "--elements", "20000", "--fail-first-attempt", "3",
                           "--summary-json", "summary.json"],
                          {},   # the examples' host kernels: spark_harness.EXAMPLE_TWINS
                          main_class="org.cudabridge.examples.GpuHistogramJob", timeout=240)
    assert run.returncode == 0, run.explain()
    s = run.summary()
    assert s["tasks_run"] == 12 and s["verify_failures"] == 0, s
    assert s["values_counted"] == s["values_expected"] == 12 * 20000
    assert "planned failure of the first attempt of partition 3" in run.stderr


def test_example_e_arrow_batches_are_summed_on_the_gpu(tmp_path):
    """Example (e) in local[4,2]: each task fills an off-heap Arrow vector from its rows in batches,
    registers the vector's buffer once, copies each batch to the GPU by address and adds it up with
    its own kernel (its host kernel here); the GPU's sum must equal Spark's. Partition 3's first
    attempt fails with its memory registered; the retry succeeds."""
    sh.build()
    run = sh.spark_submit(tmp_path, "local[4,2]",
                          [sh.examples_jar(), "--rows", "300000", "--partitions", "6", "--batch", "8192",
                           "--fail-first-attempt", "3", "--summary-json", "summary.json"],
                          {}, main_class="org.cudabridge.examples.GpuArrowSumJob", timeout=240)
    assert run.returncode == 0, run.explain()
    s = run.summary()
    assert s["tasks_run"] == 6 and s["verify_failures"] == 0, s
    assert s["gpu_sum"] == s["spark_sum"] and s["rows_counted"] == s["rows_expected"] == 300000, s


def test_example_d_map_batches_runs_in_the_executors_python_and_matches_map_in_pandas(tmp_path):
    """Example (d) in local[4,2]: a per-row transform and a per-partition reduction through
    cudabridge.spark.map_batches (a function pickled on the driver, run in the executor's own
    Python on the task's stream) equal mapInPandas's with numpy in PySpark's workers, row by row;
    the first attempt of one task fails inside the function (a FunctionFailedException with the
    Python traceback in the executor's log) and its retry succeeds."""
    sh.build()
    run = sh.spark_submit(tmp_path, "local[4,2]",
                          [str(sh.ROOT / "spark-examples" / "map_batches_job.py"), "--rows", "60000", "--partitions", "4",
                           "--batch-rows", "4096", "--fail-first-attempt", "40000", "--summary-json", "summary.json"],
                          main_class=None, timeout=300)
    assert run.returncode == 0, run.explain()
    s = run.summary()
    assert s["rows_checked"] == 60000 and s["mismatches"] == 0 and s["sums_equal"] and s["failed_once"], s
    assert "planned failure of the first attempt of the task holding row 40000" in run.stderr
    assert "FunctionFailedException" in run.stderr
