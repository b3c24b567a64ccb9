"""Interleaved rounds: how the benchmarks compare candidates on a machine whose speed drifts.

The host's speed drifts by about 2x between runs and within one (the first run after the machine
starts is the slowest), so a ratio of two measurements taken minutes apart says little. Here every
comparison is measured in rounds: a discarded warm-up round, then ``rounds`` rounds that each run
every candidate once, in an order that rotates from round to round (two candidates: A B, B A, A B,
...). A ratio is computed inside each round, from measurements taken next to each other; the
report gives its median over the rounds and its spread as min-max over the rounds (every round's
value is kept in the JSON). Absolute numbers are reported the same way: median and min-max.

    from rounds import Report, interleave
    res = interleave({"ours": lambda: t_ours(), "anchor": lambda: t_anchor()}, rounds=7)
    report.values("our pair", [r["ours"] for r in res], "us", better="lower")
    report.ratio("anchor / ours", [r["anchor"] / r["ours"] for r in res], better="higher")

``Report.summary()`` is the part of each benchmark's JSON that bench/compare_trees.py reads.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent


def library_path() -> Path:
    """The ``python/`` folder to import cudabridge from: the first PYTHONPATH entry that holds a
    cudabridge package (compare_trees.py runs a script against another tree that way), else this
    checkout's."""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (Path(entry) / "cudabridge" / "__init__.py").is_file():
            return Path(entry).resolve()
    return HERE.parent / "python"


def interleave(candidates: dict[str, Callable[[], Any]], rounds: int, warmup: int = 1) -> list[dict[str, Any]]:
    """Run each candidate once per round, after ``warmup`` discarded rounds; round r starts at
    candidate r mod len(candidates). Returns one {name: result} per kept round."""
    names = list(candidates)
    for _ in range(warmup):
        for name in names:
            candidates[name]()
    out = []
    for r in range(rounds):
        k = r % len(names)
        out.append({name: candidates[name]() for name in names[k:] + names[:k]})
    return out


def fmt(v: float) -> str:
    a = abs(v)
    if v == int(v) and a < 1e15:
        return f"{int(v):,}"
    return f"{v:,.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 10 else f"{v:.3f}"


class Report:
    """Rows of medians with their min-max spread, printed as a table and summarized for JSON."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []
        self.stats: dict[str, dict[str, dict]] = {"ratios": {}, "values": {}}

    def _add(self, kind: str, name: str, values: list[float], unit: str, better: str, note: str) -> float:
        values = [float(v) for v in values]
        med = statistics.median(values)
        spread = f"{fmt(min(values))}-{fmt(max(values))}" if len(values) > 1 else ""
        self.rows.append((name, f"{fmt(med)} {unit}".rstrip(), spread, note))
        self.stats[kind][name] = {"median": med, "min": min(values), "max": max(values), "rounds": values,
                                  "unit": unit, "better": better}
        return med

    def values(self, name: str, values: list[float], unit: str, better: str = "", note: str = "") -> float:
        """An absolute number (per-call us, pairs/s, ...); better: "lower", "higher" or ""."""
        return self._add("values", name, values, unit, better, note)

    def ratio(self, name: str, values: list[float], better: str = "", note: str = "") -> float:
        """A ratio computed within each round."""
        return self._add("ratios", name, values, "x", better, note)

    def values_of(self, results: list[dict], name: str, unit: str, better: str = "", note: str = "") -> float:
        """values() of one candidate's result over interleave()'s rounds."""
        return self.values(name, [r[name] for r in results], unit, better, note)

    def ratio_of(self, name: str, results: list[dict], num: str, den: str, better: str = "", note: str = "") -> None:
        """The ratio num / den of two candidates' results within each of interleave()'s rounds
        (no row when either did not run)."""
        if results and num in results[0] and den in results[0]:
            self.ratio(name, [r[num] / r[den] for r in results], better, note)

    def missing(self, name: str, why: str) -> None:
        """A row for a candidate that could not run here."""
        self.rows.append((name, "n/a", "", why))

    def text(self) -> str:
        head = ("measurement", "median", "min-max", "")
        rows = [head] + self.rows
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        return "\n".join(f"{a:<{w[0]}}  {b:>{w[1]}}  {c:>{w[2]}}  {d}".rstrip() for a, b, c, d in rows)

    def summary(self) -> dict:
        return self.stats
