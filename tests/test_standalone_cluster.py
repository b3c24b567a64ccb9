"""Example (a) on a real Spark standalone cluster, deployed as Spark users deploy (issue 24, 3).

Spark's own daemon script starts a master and two workers as separate JVMs on 127.0.0.1
(tests/standalone_cluster.py); each worker offers one GPU through its discovery script
(tests/emulated_gpu_discovery.sh). The job goes in with ``spark-submit --master spark://...
--deploy-mode client`` and the plugin, and everything the executors need travels with it:

* the executors' Python environment: the project's wheel installed into a fresh virtual
  environment (the ``wheel_env`` fixture), packed with ``venv-pack`` and shipped as
  ``--archives env.tar.gz#env``; ``spark.cudabridge.python=./env/bin/python`` (relative to the
  executor's directory, where Spark unpacks it). Its ``bin/python`` is a link to the base
  interpreter's absolute path, which holds on one machine (a cluster needs that Python at the same
  place on every node, or an environment made relocatable another way);
* the bridge's jars, from inside that environment, with ``--jars``: a child class loader. They
  cannot go on ``spark.executor.extraClassPath=./env/...``: Spark unpacks ``--archives`` only
  after the executor JVM started, and the JVM drops class-path entries that do not exist at its
  first class lookup. Nothing tells the bridge where its library is: it must find it itself;
* the examples' host kernels (``spark-examples/python/example_kernels.py``, the kernel of example (a)
  on the emulated device) with ``--files`` and ``spark.cudabridge.pythonPath=.`` (the executor's
  directory, where Spark puts them): they are the job's own code, which travels with the job as a
  PySpark user's ``--py-files`` do, not part of the environment built from the wheel.

Checks: the job succeeds with every partition verified; every leak made is reclaimed; both
executors ran tasks, each in its own service started from the shipped environment, and each
reported its own plugin metrics (a CsvSink per executor); the executors exit when the application
ends; no process of the cluster is left afterwards, whatever happened.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

import spark_harness as sh
from standalone_cluster import MASTER_CLASS, WORKER_CLASS, StandaloneCluster, alive, executors_conf, submit
from wheel_env import wheel_env  # noqa: F401  (the fixture: the wheel installed in a fresh venv)

pytestmark = pytest.mark.slow

PARTITIONS = 64          # the job's default: each task leaks one 4 KiB buffer on purpose
# Two rounds of the 64 tasks: the executors become ready seconds apart (each unpacks the environment
# and starts Python; on two cores, the first may run a whole round before the second is up), and
# the second round starts only when the first is done, by when both are: each runs some of its tasks.
ROUNDS = 2
ATTEMPTS = PARTITIONS * ROUNDS
SUBMIT_TIMEOUT = 180
EXAMPLES_PYTHON = sh.ROOT / "spark-examples" / "python"
SERVICE_UP = re.compile(r"cudabridge: executor (\S+) GPU service up in \d+ ms: (\{.*\})\s*$", re.M)


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    assert len(found) == 1, f"no single site-packages under {venv}: {found}"
    return found[0]


# Not shipped: pyspark (the Spark extra, installed so that spark-submit runs from this environment;
# 490 MB) and py4j. The executors are the cluster's own JVMs: Python in them needs only what the
# bridge imports, as Spark's documentation packs a venv for PySpark without pyspark in it.
NOT_SHIPPED = [("exclude", f"lib/python*/site-packages/{name}")
               for name in ("pyspark/*", "pyspark-*.dist-info/*", "py4j/*", "py4j-*.dist-info/*")]


@pytest.fixture(scope="module")
def packed_env(wheel_env, tmp_path_factory):  # noqa: F811
    """(env.tar.gz of the wheel's environment, the bridge's jars inside that environment)."""
    try:
        import venv_pack
    except ImportError as exc:
        pytest.fail(f"venv-pack is a test dependency (pip install venv-pack==0.2.0): {exc}")
    # the jars for --jars, as docs/deploy.md has them: inside the environment
    proc = wheel_env.run(str(wheel_env.python), "-m", "cudabridge.spark", "jars", cwd=tmp_path_factory.mktemp("jars"))
    assert proc.returncode == 0, f"python -m cudabridge.spark jars: rc {proc.returncode}\n{proc.stdout}{proc.stderr}"
    jars = [Path(j) for j in proc.stdout.strip().split(",")]
    assert [j.name for j in jars] == ["cudabridge.jar", "cudabridge-spark.jar"], proc.stdout
    assert all(j.is_file() and j.is_relative_to(wheel_env.venv) for j in jars), proc.stdout
    out = tmp_path_factory.mktemp("packed") / "env.tar.gz"
    venv_pack.pack(prefix=str(wheel_env.venv), output=str(out), compress_level=1, filters=NOT_SHIPPED)
    return out, jars


def _run_job(wheel_env, cluster: StandaloneCluster, cwd: Path, archive: Path, jars: list[Path],  # noqa: F811
             metrics: Path):
    """spark-submit (the wheel environment's: its Spark extra) of example (a) to the cluster in
    client mode; returns (Run, submit command)."""
    conf = {
        "spark.plugins": sh.PLUGIN,
        "spark.cudabridge.backend": "emulated",
        "spark.cudabridge.python": "./env/bin/python",
        "spark.cudabridge.pythonPath": ".",
        "spark.cudabridge.emulatedKernels": "example_kernels",
        "spark.cudabridge.reportIntervalMs": "250",
        "spark.cudabridge.metrics.refreshMs": "0",   # the gauges read fresh statistics
        # one GPU per executor, shared by its two task slots; no task before both executors
        # registered: each must run some (the check below)
        **executors_conf(2),
        "spark.ui.enabled": "false",
        "spark.log.level": "WARN",
        **sh.csv_sink_conf(metrics),
    }
    spark_submit = _site_packages(wheel_env.venv) / "pyspark" / "bin" / "spark-submit"
    assert spark_submit.is_file(), f"no {spark_submit}: the wheel was installed without its Spark extra"
    cmd = [str(spark_submit), "--master", cluster.master_url, "--deploy-mode", "client",
           "--class", sh.JOB_A,
           "--archives", f"{archive}#env",
           "--jars", ",".join(map(str, jars)),
           "--files", str(EXAMPLES_PYTHON / "example_kernels.py")]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    # --linger-ms: the sinks (period 1 s) write the final numbers while the application still runs
    cmd += [sh.examples_jar(), "--partitions", str(PARTITIONS), "--rounds", str(ROUNDS), "--summary-json", "summary.json",
            "--linger-ms", "2000"]
    return submit(cmd, cwd, timeout=SUBMIT_TIMEOUT, env=wheel_env.env()), cmd


def test_example_a_on_a_standalone_cluster_with_the_environment_shipped(wheel_env, packed_env, tmp_path):  # noqa: F811
    sh.build()   # the examples' jar (the job); the bridge's own jars come from the wheel's environment
    archive, jars = packed_env
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    cluster = StandaloneCluster(tmp_path / "cluster", workers=2, cores=2, memory="1g", gpus=1)
    t0 = time.monotonic()
    with cluster:
        workers = cluster.alive_workers()
        assert all(w["resources"]["gpu"]["addresses"] == ["0"] for w in workers), cluster.explain(json.dumps(workers))
        run, cmd = _run_job(wheel_env, cluster, tmp_path / "job", archive, jars, metrics)
        why = lambda *more: cluster.explain(" ".join(cmd), run.explain(), *more)  # noqa: E731
        assert run.returncode == 0, why()
        s = run.summary()
        st = s["statistics"]

        # every partition's task ran and verified its data (the last round's results); in that round
        # both executors ran tasks
        assert s["tasks_run"] == PARTITIONS and s["verify_failures"] == 0, why(json.dumps(s))
        assert s["task_attempts_expected"] == ATTEMPTS and s["executors"] == 2, why(json.dumps(s))
        # leaks: one made by every task of every round, every one reclaimed at its release, nothing left
        assert s["leaked_on_purpose"] == PARTITIONS, why(json.dumps(s))   # per round
        assert s["leaks_reclaimed"] == st["plugin_leaks_reclaimed"] == ATTEMPTS, why(json.dumps(s))
        assert s["tasks_released"] == st["plugin_tasks_started"] == ATTEMPTS, why(json.dumps(s))
        assert s["live_allocations_after"] == 0 and s["in_use_bytes_after"] == 0, why(json.dumps(s))
        # both executors' plugins reported to the driver, each from a service of its own
        assert s["executors_reporting"] == 2 and st["plugin_start_failed"] == 0, why(json.dumps(s))
        assert st["streams"] == 2 * 36 and st["plugin_bind_failures"] == 0, why(json.dumps(s))

        # each executor's service ran in the environment shipped with the job, unpacked in its own
        # directory, with the library from there
        ups = {}
        for log in cluster.executor_logs():
            if log.name == "stderr":
                for executor, info in SERVICE_UP.findall(log.read_text(errors="replace")):
                    ups[executor] = (log.parent, json.loads(info))
        assert sorted(ups) == ["0", "1"], why(f"service-up lines: {ups}")
        for executor, (directory, info) in ups.items():
            env = (directory / "env").resolve()
            assert Path(info["prefix"]).resolve() == env, why(f"executor {executor}: {info}")
            assert Path(info["library"]).resolve().is_relative_to(env), why(f"executor {executor}: {info}")

        # each executor's own plugin metrics (its CsvSink): both bound and released tasks, and
        # together they account for every task and every leak
        seen = sh.read_csv_metrics(metrics)
        per = {e: seen.get(e, {}) for e in ("0", "1")}
        got = {e: {k: m.get(f"executor.{k}") for k in ("plugin_tasks_started", "plugin_tasks_released",
                                                       "leaks_reclaimed", "plugin_start_failed", "live_allocations")}
               for e, m in per.items()}
        explain_metrics = f"per-executor metrics: {got}; files: {sorted(p.name for p in metrics.iterdir())[:40]}"
        for e, m in got.items():
            assert m["plugin_start_failed"] == 0 and (m["plugin_tasks_started"] or 0) > 0, why(explain_metrics)
            assert m["plugin_tasks_released"] == m["plugin_tasks_started"] == m["leaks_reclaimed"], why(explain_metrics)
            assert m["live_allocations"] == 0, why(explain_metrics)
        assert sum(m["plugin_tasks_started"] for m in got.values()) == ATTEMPTS, why(explain_metrics)

        # the application is over: its executor JVMs (each hosting Python) exit, the daemons stay
        deadline = time.monotonic() + 30
        daemons = {d.pid for d in cluster.daemons}
        while set(cluster.processes()) - daemons and time.monotonic() < deadline:
            time.sleep(0.25)
        left = {pid: cmd for pid, cmd in cluster.processes().items() if pid not in daemons}
        assert not left, why(f"executor processes still alive 30 s after the application ended: {left}")
    # whatever happened above, the cluster is stopped: no master, worker or executor is left
    left = cluster.processes()
    assert not any(MASTER_CLASS in c or WORKER_CLASS in c for c in left.values()), cluster.explain(f"left: {left}")
    assert not left, cluster.explain(f"left after stop: {left}")
    assert not cluster.killed, cluster.explain(f"spark-daemon.sh stop left these, killed: {cluster.killed}")
    print(f"standalone cluster: started, job run, stopped in {time.monotonic() - t0:.1f} s; "
          f"job {run.seconds:.1f} s; per-executor metrics {got}")


@pytest.mark.parametrize("how", ["KeyboardInterrupt", "SIGTERM"])
def test_the_cluster_is_stopped_whatever_ends_the_block(tmp_path, how):
    """Ctrl-C inside the block, or SIGTERM to the test process (a cancelled CI job): the cluster is
    stopped all the same, and the exception carries the daemons' logs."""
    sh.require_spark()
    cluster = StandaloneCluster(tmp_path / "cluster", workers=1)
    expected = KeyboardInterrupt if how == "KeyboardInterrupt" else SystemExit
    with pytest.raises(expected) as info:
        with cluster:
            pids = set(cluster.processes())
            assert len(pids) == 2 and len(cluster.alive_workers()) == 1, cluster.explain()
            if how == "SIGTERM":
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(100):   # the handler raises in this thread at its next step
                    time.sleep(0.1)
            raise KeyboardInterrupt
    assert signal.getsignal(signal.SIGTERM) is not None   # restored (pytest's, or the default)
    left = cluster.processes()
    assert not left and not any(alive(p) for p in pids), cluster.explain(f"left: {left}")
    assert not cluster.killed, cluster.explain(f"spark-daemon.sh stop left these, killed: {cluster.killed}")
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"{MASTER_CLASS}-1" in notes and f"{WORKER_CLASS}-1" in notes, notes
