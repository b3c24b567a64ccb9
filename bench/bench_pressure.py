"""Memory pressure's cost (issue 28): example (f), GpuPressureJob, in local[4] where four tasks at
once ask for twice the pool (16 tasks of a 32 MiB peak over a 64 MiB pool: the summed peaks are 8x),
against the same job with a pool large enough for all of them at once, and against failing fast
with Spark's retries (oomWait 1 ms, no GpuRetry: an allocation that does not fit fails its attempt
and Spark runs it again, spark.task.maxFailures 100).

One spark-submit per candidate and round, candidates interleaved (the order rotates each round),
after a warm-up round; inside each app the job runs --jobs times and the last run's time counts
(JIT and Spark warm). The report: each candidate's median job time with min-max, and the ratios
within each round (target: waiting / large pool <= 1.5x).

With ``--io-ms X`` each task first spends X ms off the GPU (reading its input, no GPU memory held)
before it builds its peak, as Spark's tasks overlap I/O with others' GPU work (the reason an
executor runs more tasks than fit at once). Without it the tasks hold their peak all their time:
the pool that holds half the concurrent peaks bounds the job at about half the large pool's speed.

    python bench/bench_pressure.py [--rounds 5] [--io-ms 0] [--out bench/out]    # emulated device
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from rounds import Report  # noqa: E402

sys.path.insert(0, str(HERE.parent / "python"))

PLUGIN = "org.cudabridge.spark.CudaBridgePlugin"
JOB = ["--partitions", "16", "--chunks", "4", "--chunk-mib", "8", "--hold-ms", "40"]
CANDIDATES = {
    "waiting (64 MiB pool)": ({"spark.cudabridge.poolLimit": "64m"}, []),
    "waiting, concurrentGpuTasks 2": ({"spark.cudabridge.poolLimit": "64m", "spark.cudabridge.concurrentGpuTasks": "2"}, []),
    "pool large enough (640 MiB)": ({"spark.cudabridge.poolLimit": "640m"}, []),
    "fail fast, Spark retries": ({"spark.cudabridge.poolLimit": "64m", "spark.cudabridge.oomWait": "0.001",
                                  "spark.task.maxFailures": "100"}, ["--no-retry"]),
}


def run(conf: dict, extra: list, jobs: int, master: str, io_ms: int) -> dict:
    from cudabridge.spark import build as b

    cp = b.classpath()
    cmd = [str(b.spark_submit()), "--master", master, "--class", "org.cudabridge.examples.GpuPressureJob",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=ERROR",
           "--conf", "spark.cudabridge.backend=emulated", "--conf", f"spark.driver.extraClassPath={cp}",
           "--conf", f"spark.executor.extraClassPath={cp}", "--conf", f"spark.plugins={PLUGIN}"]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    with tempfile.TemporaryDirectory(prefix="bench-pressure-") as d:
        summary = Path(d) / "s.json"
        cmd += [str(b.examples_jar_path()), *JOB, "--io-ms", str(io_ms), *extra, "--rounds", str(jobs), "--summary-json", str(summary)]
        proc = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=900,
                              env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
        if proc.returncode != 0 or not summary.is_file():
            raise RuntimeError(f"spark-submit failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}")
        s = json.loads(summary.read_text())
    st = s.get("statistics", {})
    return {"job_ms": float(s["job_ms"]), "job_ms_rounds": s["job_ms_rounds"], "retries": s["retries"],
            "oom_breaks": st.get("oom_breaks"), "allocation_waits": st.get("allocation_waits"),
            "tasks_failed": st.get("plugin_tasks_failed"), "verify_failures": s["verify_failures"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=3, help="runs of the job inside each app (the last one counts)")
    ap.add_argument("--master", default="local[4,100]")
    ap.add_argument("--io-ms", type=int, default=0, help="each task's time off the GPU before its GPU work")
    ap.add_argument("--out")
    args = ap.parse_args()
    names = list(CANDIDATES)
    rounds = []
    for r in range(args.rounds + 1):   # round 0: warm-up, dropped
        order = names[r % len(names):] + names[:r % len(names)]
        res = {name: run(*CANDIDATES[name], args.jobs, args.master, args.io_ms) for name in order}
        print(f"round {r}: " + ", ".join(f"{n} {res[n]['job_ms']:.0f} ms" for n in names), flush=True)
        if r:
            rounds.append(res)
    report = Report()
    for name in names:
        report.values(f"{name}: job", [x[name]["job_ms"] for x in rounds], "ms", "lower",
                      f"breaks {rounds[-1][name]['oom_breaks']}, failed attempts {rounds[-1][name]['tasks_failed']}")
    base = "pool large enough (640 MiB)"
    for name in names:
        if name != base:
            report.ratio(f"{name} / {base}", [x[name]["job_ms"] / x[base]["job_ms"] for x in rounds], "lower",
                         "target <= 1.5x" if name == "waiting (64 MiB pool)" else "")
    report.ratio("waiting (64 MiB pool) / fail fast, Spark retries",
                 [x["waiting (64 MiB pool)"]["job_ms"] / x["fail fast, Spark retries"]["job_ms"] for x in rounds], "lower")
    print(report.text())
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        name = "bench_pressure.json" if not args.io_ms else f"bench_pressure_io{args.io_ms}.json"
        (Path(args.out) / name).write_text(json.dumps({"args": vars(args), "rounds": rounds,
                                                                        "summary": report.summary()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
