"""Before/after: one benchmark script run against two source trees in alternating rounds.

    git worktree add /tmp/before <commit>
    python bench/compare_trees.py --before /tmp/before --after . bench/bench_core.py --backend emulated --quick
    python bench/compare_trees.py --before /tmp/before --after . bench/bench_jvm.py --quick
    git worktree remove /tmp/before

The script (a path relative to --after, or absolute; arguments after it go to it) is the same
file for both trees, so both print the same rows: each run gets PYTHONPATH=<tree>/python, which
the benchmarks import cudabridge from (bench/rounds.py, library_path), and bench_jvm.py then uses
that tree's bridge, jar and Java harness (tests/java). So --before needs none of the new
benchmark code: any older commit works as long as the script runs against its library.

Builds: before the rounds, each tree's own build commands run in that tree, with PYTHONPATH on
its python/: ``python -m cudabridge.memory.build_fastpath`` (the pool's C fast path, built next
to its source, so that both trees run their C fast paths), and for a script named *jvm* or
*spark* ``python -m cudabridge build`` (the JNI library and the jar, written to
<tree>/python/cudabridge/_native with that tree's paths; *spark* also ``python -m
cudabridge.spark build``). A worktree has no venv of its own: --before-python / --after-python
(default: this interpreter, e.g. /work/main/.venv/bin/python) run it with that venv's packages;
PYTHONPATH comes before the venv's editable install of the main checkout. To give the old tree
a venv of its own instead: ``(cd /tmp/before && ./dev/setup)`` and ``--before-python
/tmp/before/.venv/bin/python``. ``--no-build`` skips the builds.

Rounds: one discarded warm-up round, then --rounds (at least 5) rounds, each running the script
once per tree in an order that alternates (before, after, after, before, ...); every run writes
its JSON into a folder of its own (--out) and this tool reads its "summary".

What the numbers mean: for every row of the summary (the benchmark's ratios and its absolute
times), each round gives after's median / before's median, from two runs made next to each
other; the table shows the median of these quotients over the rounds and their min-max. 1.00 is
no change. A row is flagged WORSE when the median quotient moved more than --threshold (10 %) in
the row's bad direction (its "better": a time that grew, a ratio such as "cudaMallocAsync pair /
our pair" that fell), "better" the other way; rows without a direction are not flagged. A "?"
after the flag says the rounds' min-max straddles 1 (some rounds moved the other way): weak
evidence, run more rounds or a longer configuration. Written as JSON with --json-out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rounds import fmt, interleave  # noqa: E402


def env_for(tree: Path) -> dict:
    """The tree's python/ first on the path; what PYTHONPATH held already after it (the GPU
    machine's carried wheels, bench/gpu_setup.sh)."""
    rest = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "python")] + ([rest] if rest else [])))


def build(tree: Path, python: str, script: str) -> None:
    cmds = [["-m", "cudabridge.memory.build_fastpath"]]
    if "jvm" in script or "spark" in script:
        cmds.append(["-m", "cudabridge", "build"])
    if "spark" in script:
        cmds.append(["-m", "cudabridge.spark", "build"])
    for cmd in cmds:
        print(f"build in {tree}: {' '.join(cmd)}", flush=True)
        subprocess.run([python, *cmd], cwd=tree, env=env_for(tree), check=True, stdout=subprocess.DEVNULL)


def run_once(tree: Path, python: str, script: Path, extra: list[str]) -> dict:
    """One run of the script against tree; returns its JSON's summary."""
    with tempfile.TemporaryDirectory(prefix="compare-trees-") as out:
        proc = subprocess.run([python, str(script), *extra, "--out", out], cwd=tree, env=env_for(tree),
                              capture_output=True, text=True)
        files = sorted(Path(out).glob("*.json"), key=lambda p: p.stat().st_mtime)
        if proc.returncode != 0 or not files:
            raise SystemExit(f"{script} failed against {tree} ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        summary = json.loads(files[-1].read_text()).get("summary")
    if summary is None:
        raise SystemExit(f"{files[-1].name} has no 'summary' (bench/rounds.py): use a script that writes one")
    print(f"  ran against {tree}", flush=True)
    return summary


def quotient(after: float, before: float) -> float:
    return after / before if before else 1.0 if after == before else float("inf")


def compare(res: list[dict], threshold: float) -> list[dict]:
    """Per row of both summaries: after/before of the medians in each round, their median and min-max."""
    rows = []
    first = res[0]
    for kind in ("ratios", "values"):
        for name, stat in first["after"][kind].items():
            if name not in first["before"][kind]:
                continue
            q = [quotient(r["after"][kind][name]["median"], r["before"][kind][name]["median"]) for r in res]
            m = median(q)
            better = stat.get("better", "")
            worse = (m > 1 + threshold) if better == "lower" else (m < 1 - threshold) if better == "higher" else False
            improved = (m < 1 - threshold) if better == "lower" else (m > 1 + threshold) if better == "higher" else False
            rows.append({"kind": kind, "name": name, "unit": stat.get("unit", ""), "better": better,
                         "before": median(r["before"][kind][name]["median"] for r in res),
                         "after": median(r["after"][kind][name]["median"] for r in res),
                         "after/before": m, "min": min(q), "max": max(q), "rounds": q,
                         "flag": ("WORSE" if worse else "better" if improved else "")
                         + ("?" if (worse or improved) and min(q) < 1 < max(q) else "")})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, type=Path, help="the old source tree (a checkout or worktree)")
    ap.add_argument("--after", default=Path(__file__).resolve().parent.parent, type=Path, help="the new tree (default: this one)")
    ap.add_argument("--before-python", default=sys.executable)
    ap.add_argument("--after-python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=5, help="rounds after the warm-up (at least 5)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threshold", type=float, default=0.10, help="flag rows that moved more than this (0.10 = 10 %%)")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("script", help="benchmark script, relative to --after (e.g. bench/bench_core.py)")
    ap.add_argument("script_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if args.rounds < 5:
        ap.error("--rounds must be at least 5")
    trees = {"before": (args.before.resolve(), args.before_python), "after": (args.after.resolve(), args.after_python)}
    script = Path(args.script) if Path(args.script).is_absolute() else trees["after"][0] / args.script
    if not args.no_build:
        for tree, python in trees.values():
            build(tree, python, script.name)
    res = interleave({side: (lambda t=t, p=p: run_once(t, p, script, args.script_args))
                      for side, (t, p) in trees.items()}, args.rounds, args.warmup)
    rows = compare(res, args.threshold)
    print(f"\n{script.name} {' '.join(args.script_args)}: after = {trees['after'][0]}, before = {trees['before'][0]}")
    print(f"after/before per round (median and min-max over {args.rounds} rounds after {args.warmup} warm-up; "
          f"flag: moved > {args.threshold:.0%} in the row's bad/good direction)\n")
    table = [("row", "before", "after", "after/before", "min-max", "better", "flag")]
    table += [(r["name"], f"{fmt(r['before'])} {r['unit']}".rstrip(), f"{fmt(r['after'])} {r['unit']}".rstrip(),
               f"{r['after/before']:.3f}", f"{r['min']:.3f}-{r['max']:.3f}", r["better"], r["flag"]) for r in rows]
    w = [max(len(t[i]) for t in table) for i in range(7)]
    for t in table:
        print(f"{t[0]:<{w[0]}}  {t[1]:>{w[1]}}  {t[2]:>{w[2]}}  {t[3]:>{w[3]}}  {t[4]:>{w[4]}}  {t[5]:<{w[5]}}  {t[6]}".rstrip())
    worse = [r["name"] + ("" if r["flag"] == "WORSE" else " (?)") for r in rows
             if r["flag"].startswith("WORSE") and r["kind"] == "ratios"]
    print(f"\nratios worse by more than {args.threshold:.0%}: {', '.join(worse) if worse else 'none'}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"script": str(script), "args": args.script_args, "rows": rows,
                                             "raw": res}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
