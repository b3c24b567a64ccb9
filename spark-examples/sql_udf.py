"""Example (b): SQL calling Java UDFs that use the task's CUDA stream.

Run with spark-submit (docs/examples.md has the full command); the UDFs are Java classes registered
with ``spark.udf.registerJavaFunction``, so they run on the executor JVM's task threads, where the
plugin bound each task to its stream (a Python UDF would run in a separate worker process, which
cannot share the executor's streams).

    gpu_crc32(payload)  copies payload to the GPU, device-to-device, and back; CRC-32 of the result
    gpu_stream(x)       the calling task's stream handle

Prints rows, rows whose GPU round trip matched SQL's own crc32, partitions, distinct streams, and
exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument("--partitions", type=int, default=16)
    p.add_argument("--summary-json")
    args = p.parse_args()
    spark = SparkSession.builder.appName("cudabridge-example-b").getOrCreate()
    spark.udf.registerJavaFunction("gpu_crc32", "org.cudabridge.examples.GpuRoundTripCrc32", LongType())
    spark.udf.registerJavaFunction("gpu_stream", "org.cudabridge.examples.GpuStream", LongType())
    (spark.range(0, args.rows, numPartitions=args.partitions)
     .selectExpr("id", "unhex(sha2(cast(id AS string), 256)) AS payload")
     .createOrReplaceTempView("t"))
    per_row = spark.sql("""
        SELECT spark_partition_id() AS p, gpu_stream(id) AS stream,
               gpu_crc32(payload) = crc32(payload) AS matched
        FROM t
    """).cache()                      # evaluated once, by the tasks of one stage
    per_row.createOrReplaceTempView("per_row")
    row = spark.sql("""
        SELECT count(*) AS rows, sum(CAST(matched AS INT)) AS matched,
               count(DISTINCT p) AS partitions, count(DISTINCT stream) AS distinct_streams
        FROM per_row
    """).collect()[0].asDict()
    per_task = spark.sql("SELECT p, count(DISTINCT stream) AS streams FROM per_row GROUP BY p").collect()
    row["max_streams_per_task"] = max(r["streams"] for r in per_task)
    for key, value in row.items():
        print(f"{key:32} {value}")
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(row, f)
    spark.stop()
    return 0 if row["matched"] == row["rows"] == args.rows and row["max_streams_per_task"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
