"""Spark benchmarks: the plugin's overhead on a job's task phase, and pool streams against one
cudaStreamCreate/Destroy per task.

    python bench/bench_spark.py [--part all|plugin|bind|streams] [--apps 5] [--rounds 6] [--tasks 200]
                                [--backend emulated|cuda|auto] [--out DIR]

* ``plugin`` (needs Spark; emulated device): example (a)'s job of ``--tasks`` short tasks in
  ``local[4]``, with ``--work host`` (the same data and checks, no GPU call) without the plugin
  and with it (no task is then bound in Python: ``taskBind=lazy`` binds at a task's first GPU
  call), with ``--work stream`` (the same, plus one ``stream()`` call per task: every task bound
  and released in Python; with ``taskBind`` lazy, ahead and eager), and with ``--work gpu``
  (plugin on; copies and a kernel per task, for scale; ``--skip-gpu-work`` leaves it out). The
  process's CPU time in the task phase is reported beside the wall time (in local mode driver,
  executor and Python share the process), and the lifecycle thread's own CPU time per task. Each spark-submit runs the job
  ``--rounds`` times; the first half of the rounds warms the JIT up (task phases fall for several
  rounds) and is dropped, the app's task phase is the median of the second half. ``--apps`` spark-submits per configuration, interleaved (A, B, C, A, ...)
  so that the machine's drift hits all alike; reported: median over apps and the spread
  (min-max), and start-up (JVM start to a ready SparkSession, which includes the plugin's init
  in local mode) on its own, with the bridge's own start time.
* ``bind`` (no Spark): TaskHarness ``--bind-only`` in a plain JVM: the bind + release cost per
  task outside Spark, the anchor for the in-Spark ``executor.plugin_*_us_total`` row.
* ``streams`` (no Spark; runs on the GPU machine with ``--backend cuda``): per short task, the
  pool (bind_task + a 4 KiB memset on the task's stream + stream synchronize + release_task)
  against creating a stream (cudaStreamCreate + the same memset + synchronize +
  cudaStreamDestroy); medians over batches, and the acquire/release step alone.

Nothing is asserted; the table is printed and written as JSON under --out (bench/out/ by default).
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
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

PLUGIN = "org.cudabridge.spark.CudaBridgePlugin"


def spread(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}"


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


def bench_bind_plain_jvm(args, rows: list, out: dict) -> None:
    """The plugin's per-task cost outside Spark: TaskHarness --bind-only (TaskBinder's bind and
    release, 4 task threads, no work), in a plain java process: the anchor for the in-Spark
    executor.plugin_bind_us_total / plugin_release_us_total."""
    import shutil

    from cudabridge.jvm import build as core
    from cudabridge.spark import build as b

    b.build()
    cp = os.pathsep.join([str(core.jar_path()), str(b.plugin_jar_path()), str(b.examples_jar_path()),
                          str(core.jpype_jar())])
    per_task = []
    for _ in range(args.apps):
        with tempfile.TemporaryDirectory(prefix="bench-bind-") as d:
            summary = Path(d) / "s.json"
            subprocess.run([shutil.which("java") or "java", "-cp", cp, "-Dspark.cudabridge.backend=emulated",
                            "org.cudabridge.examples.TaskHarness", "--bind-only", "--tasks", "4000", "--threads", "4",
                            "--summary-json", str(summary)], check=True, capture_output=True, timeout=300)
            s = json.loads(summary.read_text())
        st = s["statistics"]
        per_task.append((st["plugin_bind_us_total"] + st["plugin_release_us_total"]) / st["plugin_tasks_started"])
    rows.append(("plain JVM: bind + release per task (TaskBinder, 4 threads)", f"{statistics.median(per_task):.1f} us",
                 f"spread {spread(per_task)} over {len(per_task)} runs (time inside the calls, summed over threads)"))
    out["bind_plain_jvm_us"] = per_task


def bench_plugin(args, rows: list, out: dict) -> None:
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
    results: dict[str, list[dict]] = {name: [] for name, *_ in configs}
    for i in range(args.apps):
        for name, work, plugin, extra in configs:
            r = run_app(work, plugin, args.tasks, args.rounds, args.elements, args.master, extra)
            results[name].append(r)
            print(f"app {i + 1}/{args.apps} {name:18} task phase {r['phase_ms']:8.1f} ms (rounds {r['rounds_ms']}), "
                  f"start-up {r['startup_ms']:.0f} ms", flush=True)
    base = [r["phase_ms"] for r in results["host, no plugin"]]
    base_cpu = [r["phase_cpu_ms"] for r in results["host, no plugin"] if r["phase_cpu_ms"] is not None]
    for name, *_ in configs:
        phases = [r["phase_ms"] for r in results[name]]
        cpus = [r["phase_cpu_ms"] for r in results[name] if r["phase_cpu_ms"] is not None]
        starts = [r["startup_ms"] for r in results[name]]
        med = statistics.median(phases)
        rows.append((f"task phase, {args.tasks} tasks: {name}", f"{med:.1f} ms",
                     f"spread {spread(phases)} over {len(phases)} apps; x{med / statistics.median(base):.3f} of no plugin"))
        if cpus and base_cpu:
            mc = statistics.median(cpus)
            rows.append((f"  process CPU in the task phase: {name}", f"{mc:.0f} ms",
                         f"spread {spread(cpus)}; x{mc / statistics.median(base_cpu):.3f} of no plugin"))
        rows.append((f"  start-up: {name}", f"{statistics.median(starts):.0f} ms", f"spread {spread(starts)}"))
        out[name] = results[name]
    out["overhead"] = {}
    for name, *_ in configs:
        if name == "host, no plugin" or name.startswith("gpu"):
            continue
        with_plugin = [r["phase_ms"] for r in results[name]]
        overhead = statistics.median(with_plugin) / statistics.median(base) - 1
        # paired by app index (the same moment of the machine's drift)
        paired = [w / n - 1 for w, n in zip(with_plugin, base)]
        rows.append((f"plugin overhead on the task phase: {name}", f"{100 * overhead:+.1f} %",
                     f"paired per app: median {100 * statistics.median(paired):+.1f} %, spread "
                     f"{100 * min(paired):+.1f} to {100 * max(paired):+.1f} % (target <= 3 %)"))
        out["overhead"][name] = {"median": overhead, "paired": paired}
        binds, lifecycle, ahead, never = [], [], [], []
        for r in results[name]:
            st = r.get("stats") or {}
            n = st.get("plugin_tasks_started")
            if n:
                binds.append(st["plugin_bind_us_total"] / n)
                lifecycle.append(st.get("plugin_lifecycle_cpu_us", 0) / n)
                ahead.append(st.get("plugin_binds_ahead", 0) / n)
                never.append(st.get("plugin_binds_never_applied", 0) / n)
        cpu_per_task = statistics.median(base_cpu) * 1000 / args.tasks if base_cpu else None
        if binds:
            rows.append((f"  {name}: onTaskStart on the task thread, per task", f"{statistics.median(binds):.1f} us",
                         f"spread {spread(binds)} (executor.plugin_bind_us_total)"))
            share = (f"; {100 * statistics.median(lifecycle) / cpu_per_task:.1f} % of the CPU per task without the "
                     f"plugin ({cpu_per_task:.0f} us)") if cpu_per_task else ""
            rows.append((f"  {name}: lifecycle thread CPU per task", f"{statistics.median(lifecycle):.1f} us",
                         f"spread {spread(lifecycle)}{share}; bound ahead {100 * statistics.median(ahead):.0f} %, "
                         f"never bound {100 * statistics.median(never):.0f} %"))
    starts = [r["bridge_start_ms"] for r in results["host, plugin"] if r["bridge_start_ms"] is not None]
    if starts:
        rows.append(("bridge + service start in ExecutorPlugin.init", f"{statistics.median(starts):.0f} ms",
                     f"spread {spread(starts)}"))


# --- pool streams vs create/destroy per task ------------------------------------------------------

def bench_streams(args, rows: list, out: dict) -> None:
    from cudabridge import CudaBridgeService, ServiceConfig

    service = CudaBridgeService(ServiceConfig(backend=args.backend))
    backend = service.backend
    try:
        ptr = backend.malloc(4096)
        n, batches = args.stream_tasks, args.stream_batches

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

        def per_task_us(fn, work: bool) -> tuple[float, list[float]]:
            fn(min(n, 200), work)
            samples = []
            for _ in range(batches):
                t0 = time.perf_counter()
                fn(n, work)
                samples.append((time.perf_counter() - t0) / n * 1e6)
            return statistics.median(samples), samples

        for work, label in ((True, "short task (memset 4 KiB + sync)"), (False, "acquire + release only")):
            p, ps = per_task_us(pooled, work)
            c, cs = per_task_us(created, work)
            rows.append((f"{backend.name}: pool stream, {label}", f"{p:.2f} us/task", f"spread {spread(ps)}"))
            rows.append((f"{backend.name}: cudaStreamCreate/Destroy, {label}", f"{c:.2f} us/task",
                         f"spread {spread(cs)}; x{c / p:.2f} of the pool"))
            out[f"streams_{'work' if work else 'bare'}"] = {"pool_us": p, "create_us": c, "pool": ps, "create": cs}
        backend.free(ptr)
    finally:
        service.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("all", "plugin", "bind", "streams"), default="all")
    p.add_argument("--apps", type=int, default=5, help="spark-submits per configuration (>= 5 for the medians)")
    p.add_argument("--rounds", type=int, default=10, help="job rounds per app; the first half is dropped")
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--elements", type=int, default=1024, help="ints per task (short tasks)")
    p.add_argument("--master", default="local[4]")
    p.add_argument("--skip-gpu-work", action="store_true", help="plugin part: leave out the GPU-work configuration")
    p.add_argument("--configs", default="", help="plugin part: only these configurations, ';'-separated "
                   "(e.g. 'host, plugin;stream, plugin'; the baseline always runs)")
    p.add_argument("--backend", default="emulated", help="backend of the streams part")
    p.add_argument("--stream-tasks", type=int, default=2000)
    p.add_argument("--stream-batches", type=int, default=7)
    p.add_argument("--out", default=str(HERE / "out"))
    args = p.parse_args()
    rows: list[tuple[str, str, str]] = []
    out: dict = {"args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M"), "machine": os.uname().nodename,
                 "cpus": os.cpu_count()}
    if args.part in ("all", "streams"):
        bench_streams(args, rows, out)
    if args.part in ("all", "plugin", "bind"):
        bench_bind_plain_jvm(args, rows, out)
    if args.part in ("all", "plugin"):
        bench_plugin(args, rows, out)
    width = max(len(r[0]) for r in rows)
    print()
    for name, value, note in rows:
        print(f"{name:{width}}  {value:>14}  {note}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"bench_spark-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"rows": rows, **out}, indent=1, default=str))
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
