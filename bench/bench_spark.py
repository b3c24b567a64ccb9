"""Spark benchmarks: the plugin's overhead on a job's task phase, and pool streams against one
cudaStreamCreate/Destroy per task.

    python bench/bench_spark.py [--part all|plugin|bind|streams] [--apps 5] [--warmup-apps 1] [--rounds 10]
                                [--tasks 200] [--backend emulated|cuda|auto] [--stream-rounds 7] [--out DIR]

* ``plugin`` (needs Spark; emulated device): example (a)'s job of ``--tasks`` short tasks in
  ``local[4]``, with ``--work host`` (the same data and checks, no GPU call) without the plugin
  and with it (no task is then bound in Python: ``taskBind=lazy`` binds at a task's first GPU
  call), with ``--work stream`` (the same, plus one ``stream()`` call per task: every task bound
  and released in Python; with ``taskBind`` lazy, ahead and eager), and with ``--work gpu``
  (plugin on; copies and a kernel per task, for scale; ``--skip-gpu-work`` leaves it out). The
  process's CPU time in the task phase is reported beside the wall time (in local mode driver,
  executor and Python share the process), and the lifecycle thread's own CPU time per task. Each
  spark-submit runs the job ``--rounds`` times; the first half of the job rounds warms the JIT up
  (task phases fall for several rounds) and is dropped, the app's task phase is the median of the
  second half. The configurations are interleaved (bench/rounds.py): ``--warmup-apps`` discarded
  rounds, then ``--apps`` rounds, each running one spark-submit per configuration in an order
  that rotates between rounds; "with plugin / no plugin" is computed inside each round.
  Start-up (JVM start to a ready SparkSession, which includes the plugin's init in local mode) is
  reported on its own, with the bridge's own start time.
* ``bind`` (no Spark): TaskHarness ``--bind-only`` in a plain JVM, ``--apps`` runs after the
  warm-up: the bind + release cost per task outside Spark, the anchor for the in-Spark
  ``executor.plugin_*_us_total`` row.
* ``streams`` (no Spark; runs on the GPU machine with ``--backend cuda``): per short task, the
  pool (bind_task + a 4 KiB memset on the task's stream + stream synchronize + release_task)
  against creating a stream (cudaStreamCreate + the same memset + synchronize +
  cudaStreamDestroy), and the acquire/release step alone: one batch of ``--stream-tasks`` tasks
  per candidate and round, ``--stream-rounds`` interleaved rounds after a warm-up round;
  create / pool computed inside each round.

What the numbers mean: every row is the median over the rounds (apps) with the min-max over the
rounds. Times move with the machine; the ratios (with plugin / no plugin, created / pooled) come
from measurements made next to each other and are what to compare between runs and against the
target (plugin overhead on the task phase <= 3 %, i.e. a ratio <= 1.03). Nothing is asserted; the
table is printed and written as JSON under --out (bench/out/ by default; "summary" holds every
row's median, min, max and per-round values).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from rounds import Report, interleave, library_path  # noqa: E402

sys.path.insert(0, str(library_path()))

PLUGIN = "org.cudabridge.spark.CudaBridgePlugin"


# --- plugin overhead ------------------------------------------------------------------------------

def run_app(work: str, plugin: bool, tasks: int, rounds: int, elements: int, master: str,
            extra_conf: tuple[str, ...] = ()) -> dict:
    from cudabridge.spark import build as b

    cmd = [str(b.spark_submit()), "--master", master, "--class", "org.cudabridge.examples.GpuPartitionJob",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN",
           "--conf", "spark.cudabridge.backend=emulated"]
    if plugin:
        cp = b.classpath()
        cmd += ["--conf", f"spark.driver.extraClassPath={cp}", "--conf", f"spark.executor.extraClassPath={cp}",
                "--conf", f"spark.plugins={PLUGIN}"]
        twins = Path(__file__).resolve().parent.parent / "spark-examples" / "python"   # example (a)'s kernel, emulated
        cmd += ["--conf", "spark.cudabridge.emulatedKernels=example_kernels",
                "--conf", f"spark.cudabridge.pythonPath={twins}"]
        for kv in extra_conf:
            cmd += ["--conf", kv]
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as d:
        summary = Path(d) / "s.json"
        cmd += [str(b.examples_jar_path()), "--work", work, "--partitions", str(tasks), "--elements", str(elements),
                "--rounds", str(rounds), "--no-leak", "--summary-json", str(summary)]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
        wall = time.monotonic() - t0
        if proc.returncode != 0 or not summary.is_file():
            raise RuntimeError(f"spark-submit failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}")
        s = json.loads(summary.read_text())
    per_round = [float(x) for x in re.findall(r"[\d.]+", s["task_phase_ms_rounds"])]
    warm = per_round[len(per_round) // 2:]   # the first half warms the JIT and Spark's caches up
    cpu_rounds = [float(x) for x in re.findall(r"[\d.]+", s.get("task_phase_cpu_ms_rounds", ""))]
    cpu_warm = cpu_rounds[len(cpu_rounds) // 2:]
    return {"phase_ms": statistics.median(warm), "cpu_rounds_ms": cpu_rounds,
            "phase_cpu_ms": statistics.median(cpu_warm) if cpu_warm else None,
            "rounds_ms": per_round, "startup_ms": float(s["startup_ms"]), "wall_s": wall,
            "bridge_start_ms": s.get("statistics", {}).get("plugin_start_ms"), "stats": s.get("statistics", {}),
            "tasks_released": s.get("tasks_released"), "verify_failures": s["verify_failures"]}


def bench_bind_plain_jvm(args, report: Report, out: dict) -> None:
    """The plugin's per-task cost outside Spark: TaskHarness --bind-only (TaskBinder's bind and
    release, 4 task threads, no work), in a plain java process: the anchor for the in-Spark
    executor.plugin_bind_us_total / plugin_release_us_total."""
    import shutil

    from cudabridge.jvm import build as core
    from cudabridge.spark import build as b

    b.build()
    cp = os.pathsep.join([str(core.jar_path()), str(b.plugin_jar_path()), str(b.examples_jar_path()),
                          str(core.jpype_jar())])

    def per_task() -> float:
        with tempfile.TemporaryDirectory(prefix="bench-bind-") as d:
            summary = Path(d) / "s.json"
            subprocess.run([shutil.which("java") or "java", "-cp", cp, "-Dspark.cudabridge.backend=emulated",
                            "org.cudabridge.examples.TaskHarness", "--bind-only", "--tasks", "4000", "--threads", "4",
                            "--summary-json", str(summary)], check=True, capture_output=True, timeout=300)
            st = json.loads(summary.read_text())["statistics"]
        return (st["plugin_bind_us_total"] + st["plugin_release_us_total"]) / st["plugin_tasks_started"]
    res = interleave({"bind": per_task}, args.apps, args.warmup_apps)
    report.values("plain JVM: bind + release per task (TaskBinder, 4 threads)", [r["bind"] for r in res], "us", "lower",
                  "time inside the calls, summed over threads")
    out["bind_plain_jvm_us"] = [r["bind"] for r in res]


def bench_plugin(args, report: Report, out: dict) -> None:
    from cudabridge.spark import build as b

    b.build()
    configs = [("host, no plugin", "host", False, ()),
               ("host, plugin", "host", True, ()),
               ("stream, plugin", "stream", True, ()),
               ("stream, plugin, taskBind=ahead", "stream", True, ("spark.cudabridge.taskBind=ahead",)),
               ("stream, plugin, taskBind=eager", "stream", True, ("spark.cudabridge.taskBind=eager",)),
               ("gpu work, plugin", "gpu", True, ())]
    if args.skip_gpu_work:
        configs = configs[:-1]
    if args.configs:
        wanted = {c.strip() for c in args.configs.split(";")} | {"host, no plugin"}
        configs = [c for c in configs if c[0] in wanted]

    def app(name, work, plugin, extra) -> dict:
        r = run_app(work, plugin, args.tasks, args.rounds, args.elements, args.master, extra)
        print(f"{name:30} task phase {r['phase_ms']:8.1f} ms (rounds {r['rounds_ms']}), start-up {r['startup_ms']:.0f} ms",
              flush=True)
        return r
    res = interleave({c[0]: (lambda c=c: app(*c)) for c in configs}, args.apps, args.warmup_apps)
    base = "host, no plugin"
    for name, *_ in configs:
        runs = [r[name] for r in res]
        report.values(f"task phase, {args.tasks} tasks: {name}", [r["phase_ms"] for r in runs], "ms", "lower")
        if all(r["phase_cpu_ms"] is not None for r in runs):
            report.values(f"  process CPU in the task phase: {name}", [r["phase_cpu_ms"] for r in runs], "ms", "lower")
        report.values(f"  start-up: {name}", [r["startup_ms"] for r in runs], "ms", "lower")
        out[name] = runs
        if name == base or name.startswith("gpu"):
            continue
        report.ratio(f"with plugin / no plugin, task phase: {name}", [r[name]["phase_ms"] / r[base]["phase_ms"] for r in res],
                     "lower", "target <= 1.03")
        if all(r[n]["phase_cpu_ms"] is not None for r in res for n in (name, base)):
            report.ratio(f"  with plugin / no plugin, process CPU: {name}",
                         [r[name]["phase_cpu_ms"] / r[base]["phase_cpu_ms"] for r in res], "lower")
        stats = [r.get("stats") or {} for r in runs]
        if all(st.get("plugin_tasks_started") for st in stats):
            def per_task(key: str) -> list[float]:
                return [st.get(key, 0) / st["plugin_tasks_started"] for st in stats]
            report.values(f"  {name}: onTaskStart on the task thread, per task", per_task("plugin_bind_us_total"), "us",
                          "lower", "executor.plugin_bind_us_total")
            ahead, never = per_task("plugin_binds_ahead"), per_task("plugin_binds_never_applied")
            report.values(f"  {name}: lifecycle thread CPU per task", per_task("plugin_lifecycle_cpu_us"), "us", "lower",
                          f"bound ahead {100 * statistics.median(ahead):.0f} %, never bound {100 * statistics.median(never):.0f} %")
    starts = [r["host, plugin"]["bridge_start_ms"] for r in res if "host, plugin" in r]
    if starts and None not in starts:
        report.values("bridge + service start in ExecutorPlugin.init", starts, "ms", "lower")


# --- pool streams vs create/destroy per task ------------------------------------------------------

TARGETS = {True: "<= 0.8", False: "<= 0.25"}   # issue 23: pool stream / created, per task

def bench_streams(args, report: Report, out: dict) -> None:
    from cudabridge import CudaBridgeService, ServiceConfig

    service = CudaBridgeService(ServiceConfig(backend=args.backend))
    backend = service.backend
    try:
        ptr = backend.malloc(4096)
        n = args.stream_tasks

        def pooled(k: int, work: bool) -> None:
            bind, release = service.bind_task, service.release_task
            memset, sync = backend.memset_async, backend.stream_synchronize
            for t in range(k):
                s = bind(t).stream
                if work:
                    memset(ptr, 0, 4096, s)
                    sync(s)
                release(t)

        def created(k: int, work: bool) -> None:
            create, destroy = backend.stream_create, backend.stream_destroy
            memset, sync = backend.memset_async, backend.stream_synchronize
            for _ in range(k):
                s = create()
                if work:
                    memset(ptr, 0, 4096, s)
                    sync(s)
                destroy(s)

        def batch(fn, work: bool):
            def run() -> float:
                t0 = time.perf_counter()
                fn(n, work)
                return (time.perf_counter() - t0) / n * 1e6
            return run

        per_thread = args.thread_tasks

        def on_threads(threads: int, body):
            """``threads`` threads each running ``body(first_id, per_thread)`` at once, started
            together: wall time per task over all of them (the inverse of the tasks/s in total).
            Each thread runs long enough (``--thread-tasks``) that the start and the end, where
            threads queue for the GIL to pass the barrier or finish at different times, weigh
            little against the GIL's switch interval (5 ms)."""
            def run() -> float:
                go = threading.Barrier(threads + 1)

                def worker(base: int) -> None:
                    go.wait()
                    body(base, per_thread)
                pool = [threading.Thread(target=worker, args=(i * per_thread,)) for i in range(threads)]
                for th in pool:
                    th.start()
                t0 = time.perf_counter()
                go.wait()
                for th in pool:
                    th.join()
                return (time.perf_counter() - t0) / (per_thread * threads) * 1e6
            return run

        def binds(base: int, k: int) -> None:
            bind, release = service.bind_task, service.release_task
            for t in range(base, base + k):
                bind(t)
                release(t)

        def anchor(base: int, k: int, table: dict = {}) -> None:   # noqa: B006 - shared on purpose
            """The interpreter alone: a shared dict's insert and pop, per task."""
            put, pop = table.__setitem__, table.pop
            for t in range(base, base + k):
                put(t, t)
                pop(t)

        labels = {True: "short task (memset 4 KiB + sync)", False: "acquire + release only"}
        cands = {f"{backend.name}: {kind}, {labels[work]}": batch(fn, work) for work in (True, False)
                 for kind, fn in (("pool stream", pooled), ("cudaStreamCreate/Destroy", created))}
        threads_of = {}
        for who, body in (("pool stream, acquire + release", binds), ("anchor: a dict insert + pop", anchor)):
            for k in (1, 16):
                threads_of[who, k] = name = f"{backend.name}: {who}, {k} thread{'s' if k > 1 else ''} at once"
                cands[name] = on_threads(k, body)
        res = interleave(cands, args.stream_rounds)
        for name in cands:
            report.values_of(res, name, "us/task", "lower")
        for work in (True, False):
            report.ratio_of(f"{backend.name}: pool stream / created, {labels[work]} (target {TARGETS[work]})", res,
                            f"{backend.name}: pool stream, {labels[work]}",
                            f"{backend.name}: cudaStreamCreate/Destroy, {labels[work]}", "lower")
        for who, target in (("pool stream, acquire + release", " (target >= 0.8)"),
                            ("anchor: a dict insert + pop", ": what the interpreter's GIL allows")):
            report.ratio_of(f"{backend.name}: {who}, tasks/s 16 threads / 1 thread{target}", res,
                            threads_of[who, 1], threads_of[who, 16], "higher")
        out["streams"] = res
        backend.free(ptr)
    finally:
        service.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("all", "plugin", "bind", "streams"), default="all")
    p.add_argument("--apps", type=int, default=5, help="rounds: spark-submits per configuration (>= 5 for the medians)")
    p.add_argument("--warmup-apps", type=int, default=1, help="discarded warm-up rounds of spark-submits")
    p.add_argument("--rounds", type=int, default=10, help="job rounds per app; the first half is dropped")
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--elements", type=int, default=1024, help="ints per task (short tasks)")
    p.add_argument("--master", default="local[4]")
    p.add_argument("--skip-gpu-work", action="store_true", help="plugin part: leave out the GPU-work configuration")
    p.add_argument("--configs", default="", help="plugin part: only these configurations, ';'-separated "
                   "(e.g. 'host, plugin;stream, plugin'; the baseline always runs)")
    p.add_argument("--backend", default="emulated", help="backend of the streams part")
    p.add_argument("--stream-tasks", type=int, default=2000)
    p.add_argument("--thread-tasks", type=int, default=20000,
                   help="tasks each thread binds and releases in the 1- and 16-thread candidates")
    p.add_argument("--stream-rounds", "--stream-batches", dest="stream_rounds", type=int, default=7)
    p.add_argument("--out", default=str(HERE / "out"))
    args = p.parse_args()
    report = Report()
    out: dict = {"args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M"), "machine": os.uname().nodename,
                 "cpus": os.cpu_count()}
    if args.part in ("all", "streams"):
        bench_streams(args, report, out)
    if args.part in ("all", "plugin", "bind"):
        bench_bind_plain_jvm(args, report, out)
    if args.part in ("all", "plugin"):
        bench_plugin(args, report, out)
    print(f"\nmedian and min-max over the rounds (plugin, bind: {args.apps} apps; streams: {args.stream_rounds} rounds)")
    print(report.text())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"bench_spark-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"summary": report.summary(), **out}, indent=1, default=str))
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
