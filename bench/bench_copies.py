"""Host <-> device copies from Java against the host's memcpy and CuPy, in one process (issue 16).

One ``java`` process runs tests/java/org/cudabridge/harness/CopyBench.java: for each size, the
median time of one copy plus the synchronize after it (end to end), both directions, from a Java
heap array (pinned staging on a GPU), a pinned buffer of the pinned pool, registered off-heap
memory and unregistered off-heap memory; and in each round, in the same process, the anchors timed
from Python (``cudabridge.jvm.tools.copy_bench``): the host's memcpy with one thread and with 8,
and on a GPU CuPy's pinned and pageable ``cudaMemcpyAsync``. Ratios are computed inside each round;
the report gives their median and min-max over the rounds.

Targets on the H200 (issue 16): heap copies >= 0.8x the same run's one-thread memcpy at every size
from 1 MiB; >= 20 GB/s each way at 16 MiB and above; a 64 KiB heap copy at most 3 us over CuPy's
pinned copy + synchronize; pinned and registered copies >= 0.95x CuPy pinned; allocatePinned + close
from the pool >= 20x faster than cudaHostAlloc + cudaFreeHost. On the emulated
device the same bench runs as a regression check (no CuPy rows).

    python bench/bench_copies.py [--backend cuda] [--quick] [--plot bench/out/copies.png]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_jvm import compile_bench, java  # noqa: E402
from rounds import Report  # noqa: E402

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
ALLOCS = ("pinned_alloc", "host_alloc")     # allocate + free, timed in us rather than GB/s


def gbs(nbytes: int, ns: float) -> float:
    return nbytes / ns   # bytes per ns = GB/s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="emulated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="3 rounds, sizes up to 16 MiB, 10 repetitions")
    ap.add_argument("--plot", type=Path, help="a PNG of GB/s by size (needs matplotlib)")
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a bridge setting for the Java process, e.g. stagingCopyThreads=1 (repeatable)")
    ap.add_argument("--tag", default="", help="a suffix for the JSON file's name")
    args = ap.parse_args()
    sizes = SIZES[:-1] if args.quick else SIZES
    if args.quick:
        args.rounds, args.reps = 3, 10
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cp = compile_bench(Path(tmp))
        # a pool large enough for the largest buffer, so that every pinned candidate comes from it
        cmd = [java(), f"-Dspark.cudabridge.backend={args.backend}", "-Dspark.cudabridge.pinnedPool=1g",
               *(f"-Dspark.cudabridge.{kv}" for kv in args.set), "-cp", cp, "org.cudabridge.harness.CopyBench",
               ",".join(map(str, sizes)), str(args.reps), str(args.rounds)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("BENCH ")), None)
    if proc.returncode != 0 or line is None:
        print(f"bench failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr[-4000:]}")
        return 1
    rounds = json.loads(line[len("BENCH "):])["rounds"]
    report = Report()
    everything = [k for k in rounds[0] if k != "anchors"] + list(rounds[0]["anchors"])
    candidates = [k for k in everything if k not in ALLOCS]      # copies, in GB/s

    def ns(r: dict, cand: str, n: int) -> float:
        src = r if cand in r and cand != "anchors" else r["anchors"]
        return src[cand][str(n)]
    for n in sizes:
        for cand in candidates:
            report.values(f"{cand} {n >> 10} KiB", [gbs(n, ns(r, cand, n)) for r in rounds], "GB/s", better="higher")
    for n in sizes:
        for cand in ALLOCS:
            if cand in everything:
                report.values(f"{cand} {n >> 10} KiB", [ns(r, cand, n) / 1e3 for r in rounds], "us", better="lower")
        if "host_alloc" in everything:
            report.ratio(f"cudaHostAlloc / allocatePinned (pool), {n >> 10} KiB",
                         [ns(r, "host_alloc", n) / ns(r, "pinned_alloc", n) for r in rounds], better="higher",
                         note="target >= 20")
    for n in sizes:
        for d in ("in", "out"):
            if f"cupy_pinned_{d}" in rounds[0]["anchors"] and n == 64 << 10:
                report.values(f"heap {d} - CuPy pinned, 64 KiB",
                              [(ns(r, f"heap_{d}", n) - ns(r, f"cupy_pinned_{d}", n)) / 1e3 for r in rounds], "us",
                              better="lower")
            report.ratio(f"heap {d} / memcpy 1 thread, {n >> 10} KiB",
                         [ns(r, "memcpy_1", n) / ns(r, f"heap_{d}", n) for r in rounds], better="higher",
                         note="target >= 0.8 from 1 MiB")
            many = next((k for k in rounds[0]["anchors"] if k.startswith("memcpy_") and k != "memcpy_1"), None)
            if many and n >= 1 << 20:   # the bound for the threads the staging splits a copy over
                report.ratio(f"heap {d} / {many.replace('_', ' ')} threads, {n >> 10} KiB",
                             [ns(r, many, n) / ns(r, f"heap_{d}", n) for r in rounds], better="higher",
                             note="target >= 0.8")
            if f"cupy_pinned_{d}" in rounds[0]["anchors"]:
                for mine in ("pinned", "registered"):
                    report.ratio(f"{mine} {d} / CuPy pinned, {n >> 10} KiB",
                                 [ns(r, f"cupy_pinned_{d}", n) / ns(r, f"{mine}_{d}", n) for r in rounds],
                                 better="higher", note="target >= 0.95")
    print(report.text())
    (args.out / f"bench_copies_{args.backend}{args.tag}.json").write_text(json.dumps({"summary": report.summary(),
                                                                            "raw": rounds}, indent=1))
    if args.plot:
        import statistics

        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 5))
        colors = plt.get_cmap("tab20").colors
        for i, cand in enumerate(candidates):   # the anchors dashed
            ax.plot(sizes, [statistics.median(gbs(n, ns(r, cand, n)) for r in rounds) for n in sizes], marker="o",
                    label=cand, color=colors[i % len(colors)],
                    linestyle="--" if cand in rounds[0]["anchors"] else "-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per copy")
        ax.set_ylabel("GB/s (median over rounds; copy + synchronize)")
        ax.set_title(f"host <-> device copies ({args.backend})")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
