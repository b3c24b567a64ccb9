"""Example (d): a per-row numeric transform and a per-partition reduction in Python over Spark
columns, run by ``cudabridge.spark.map_batches`` inside each executor's own Python (the bridge's:
the task's stream and memory, no Python worker), beside the same computation with
``mapInPandas`` in PySpark's Python workers: with CuPy there where a GPU is visible, and with
numpy on the CPU. All results are checked equal.

    spark-submit --master 'local[4]' <plugin conf: docs/examples.md> spark-examples/map_batches_job.py \\
        [--rows 200000] [--partitions 8] [--batch-rows 65536] [--fail-first-attempt ID] [--rounds 1] \\
        [--summary-json out.json]

The transform: ``y = 0.5 * x * x + sqrt(|x|)`` with ``positive = x > 0``; the reduction, per
partition (one batch holds a whole partition when ``--batch-rows`` is at least its rows; otherwise
one row per batch, summed after by Spark): rows and the sum of ``y``. ``--fail-first-attempt ID``
makes the first attempt of the task holding row ``ID`` fail inside the function (Spark retries
it: run with ``local[4,2]``). Exits 1 when any result differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cudabridge.spark import map_batches

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
import example_batches  # noqa: E402  (the batch functions, beside the other examples' Python)

REL_TOL = 1e-12   # a GPU may fuse x * x * 0.5 + sqrt into one FMA: the last bit may differ


def pandas_transform(library: str):
    def run(batches):
        xp = __import__(library)
        import pandas as pd

        for pdf in batches:
            x = xp.asarray(pdf["x"].to_numpy())
            y = 0.5 * x * x + xp.sqrt(xp.abs(x))
            positive = x > 0
            if library == "cupy":
                y, positive = y.get(), positive.get()
            yield pd.DataFrame({"id": pdf["id"], "y": y, "positive": positive})

    return run


def pandas_reduce(library: str):
    def run(batches):
        xp = __import__(library)
        import pandas as pd

        rows, total = 0, 0.0
        for pdf in batches:
            x = xp.asarray(pdf["x"].to_numpy())
            rows += len(pdf)
            total += float((0.5 * x * x + xp.sqrt(xp.abs(x))).sum())
        yield pd.DataFrame({"rows": [rows], "sum_y": [total]})

    return run


def gpu_visible() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:   # noqa: BLE001 - no CuPy, no driver, no GPU
        return False


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--batch-rows", type=int, default=65536)
    p.add_argument("--fail-first-attempt", type=int, default=-1, metavar="ID")
    p.add_argument("--rounds", type=int, default=1, help="time each variant this many times, interleaved")
    p.add_argument("--by-reference", action="store_true",
                   help="name the functions ('example_batches:transform'; ship the module with --py-files) "
                        "instead of pickling them")
    p.add_argument("--module", default="example_batches",
                   help="with --by-reference: the module's name as shipped (a copy of example_batches.py)")
    p.add_argument("--check", choices=["rows", "sums"], default="rows",
                   help="compare the transforms row by row (collected on the driver) or by count and sums")
    p.add_argument("--summary-json")
    args = p.parse_args()
    spark = SparkSession.builder.appName("cudabridge-example-d").getOrCreate()
    df = (spark.range(0, args.rows, numPartitions=args.partitions)
          .select("id", ((F.col("id") % 1000) * 0.25 - 120.0).alias("x")))
    marker = os.path.join(tempfile.mkdtemp(prefix="cudabridge-example-d-"), "failed-once")
    workers = ["numpy"] + (["cupy"] if gpu_visible() else [])

    if args.by_reference:
        if args.fail_first_attempt >= 0:
            p.error("--fail-first-attempt pickles its function: it does not go with --by-reference")
        transform, reduce = f"{args.module}:transform", f"{args.module}:reduce"
    else:
        # pickled by value: the executors need not import example_batches
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(example_batches)
        transform = (example_batches.transform if args.fail_first_attempt < 0
                     else example_batches.transform_failing_once(args.fail_first_attempt, marker))
        reduce = example_batches.reduce

    def bridge_transform():
        return map_batches(df, transform, "id BIGINT, y DOUBLE, positive BOOLEAN", batch_rows=args.batch_rows)

    def bridge_reduce():
        return map_batches(df, reduce, "rows BIGINT, sum_y DOUBLE", batch_rows=args.batch_rows)

    def worker_transform(library):
        return df.mapInPandas(pandas_transform(library), "id BIGINT, y DOUBLE, positive BOOLEAN")

    def worker_reduce(library):
        return df.mapInPandas(pandas_reduce(library), "rows BIGINT, sum_y DOUBLE")

    # results, checked equal: the bridge's against each worker library's, row by row (or, with
    # --check sums, for a benchmark's many rows, by the transform's count, sum and positives)
    mismatches, checked = 0, 0
    if args.check == "rows":
        reference = {r["id"]: (r["y"], r["positive"]) for r in bridge_transform().collect()}
        checked = len(reference)
        for library in workers:
            for r in worker_transform(library).collect():
                y, positive = reference.get(r["id"], (None, None))
                if y is None or positive != r["positive"] or abs(y - r["y"]) > REL_TOL * max(1.0, abs(y)):
                    mismatches += 1
    else:
        def sums(frame):
            return frame.agg(F.count("id").alias("n"), F.sum("y").alias("y"),
                             F.sum(F.col("positive").cast("int")).alias("p")).collect()[0]
        want = sums(bridge_transform())
        checked = want["n"]
        for library in workers:
            got = sums(worker_transform(library))
            if got["n"] != want["n"] or got["p"] != want["p"] or abs(got["y"] - want["y"]) > 1e-9 * abs(want["y"]):
                mismatches += 1
    totals = {"bridge": bridge_reduce().agg(F.sum("rows").alias("rows"), F.sum("sum_y").alias("sum_y")).collect()[0]}
    for library in workers:
        totals[library] = worker_reduce(library).agg(F.sum("rows").alias("rows"), F.sum("sum_y").alias("sum_y")).collect()[0]
    want_rows, want_sum = totals["bridge"]["rows"], totals["bridge"]["sum_y"]
    sums_equal = all(t["rows"] == want_rows == args.rows and abs(t["sum_y"] - want_sum) <= 1e-9 * abs(want_sum)
                     for t in totals.values())

    # rows/s of the transform (its sum forces every row), interleaved rounds
    seconds: dict[str, list[float]] = {"bridge": [], **{f"mapInPandas_{lib}": [] for lib in workers}}
    for _ in range(args.rounds):
        for name, make in [("bridge", bridge_transform)] + [(f"mapInPandas_{lib}", lambda lib=lib: worker_transform(lib))
                                                             for lib in workers]:
            t0 = time.perf_counter()
            make().agg(F.sum("y")).collect()
            seconds[name].append(time.perf_counter() - t0)
    summary = {
        "rows": args.rows, "partitions": args.partitions, "batch_rows": args.batch_rows, "workers": workers,
        "check": args.check, "rows_checked": checked, "mismatches": mismatches, "sums_equal": sums_equal,
        "failed_once": os.path.exists(marker),
        "rows_per_s": {k: round(args.rows / sorted(v)[len(v) // 2]) for k, v in seconds.items()},
        "seconds": {k: [round(s, 4) for s in v] for k, v in seconds.items()},
    }
    for key, value in summary.items():
        print(f"{key:20} {value}")
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary, f)
    spark.stop()
    ok = mismatches == 0 and sums_equal and checked == args.rows
    ok = ok and (args.fail_first_attempt < 0 or summary["failed_once"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
