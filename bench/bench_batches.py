"""Example (d)'s per-row transform over column batches: through the bridge against a Python worker
fed Arrow batches over a socket, as PySpark's mapInPandas feeds its workers.

Spark cannot run on the GPU machine, so the two per-batch paths are measured without it, on the
same batches (id BIGINT, x DOUBLE; --rows-per-batch rows, --batches per round):

* **bridge**: a Java process (tests/java/org/cudabridge/harness/BatchBench.java) with the bridge in
  it runs GpuPython.mapBatches' per-batch steps (ColumnBatches) over heap arrays: the two input
  columns into task buffers (staged copies through the pinned slots), one PythonFunction call of
  spark-examples/python/example_batches.py's transform over batches (on a GPU: CuPy arrays over
  the buffers, on the task's stream; emulated: numpy), the three output columns back into heap
  arrays. Measured in Java, from the first copy of the first batch to the last copy back.
* **worker**: a separate Python process (the worker) reads Arrow IPC record batches from a local
  socket, makes each column an array of the library (CuPy: cupy.asarray, a host-to-device copy;
  numpy), runs the same transform, brings the results to the host and writes them back as Arrow
  record batches. The feeder (this process) writes the batches from one thread and reads the
  results on another, as PySpark's JVM writer thread and reader do. Measured in the feeder, from
  the first batch written to the last result read. The feeder sends one prebuilt RecordBatch again
  and again (Spark would build each from rows: not counted here, generous to the worker), and the
  worker skips pandas (mapInPandas converts to pandas and back: also not counted).

Both run one after the other in interleaved rounds (bench/rounds.py's way: after a warm-up round,
--rounds rounds of bridge then worker, the order alternating), each with its own process kept
for all rounds; the report is the median rows/s with min-max and the worker/bridge ratio per
round. On a GPU, each process's device memory (nvidia-smi) is reported beside the figures: the
worker holds a CUDA context and a CuPy pool of its own, the bridge none beyond the executor's.

    python bench/bench_batches.py                      # emulated device, numpy worker
    python bench/bench_batches.py --backend cuda       # the GPU machine: CuPy in both
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from rounds import Report, fmt  # noqa: E402

EXAMPLES = HERE.parent / "spark-examples" / "python"


# --- the worker process ----------------------------------------------------------------------------
def worker(port: int, library: str) -> None:
    """Serves Arrow record batches on one connection: transform each, write the results back."""
    import pyarrow as pa

    sys.path.insert(0, str(EXAMPLES))
    import example_batches

    xp = __import__(library)
    conn = socket.create_connection(("127.0.0.1", port))
    rfile, wfile = conn.makefile("rb"), conn.makefile("wb")
    reader = pa.ipc.open_stream(rfile)
    schema = pa.schema([("id", pa.int64()), ("y", pa.float64()), ("positive", pa.bool_())])
    writer = pa.ipc.new_stream(wfile, schema)
    for batch in reader:
        columns = {name: xp.asarray(batch.column(i).to_numpy(zero_copy_only=True))
                   for i, name in enumerate(batch.schema.names)}
        out = example_batches.transform(columns)
        host = {k: (v.get() if library == "cupy" else v) for k, v in out.items()}
        writer.write_batch(pa.record_batch([pa.array(host["id"]), pa.array(host["y"]), pa.array(host["positive"])],
                                           schema=schema))
        wfile.flush()
    writer.close()
    wfile.close()
    conn.close()


class WorkerSide:
    """The feeder: one worker process per round (connected anew: its CUDA context and pool stay
    warm across the batches of a round only if kept, so the process is kept for all rounds and a
    connection made per round)."""

    def __init__(self, library: str, rows: int) -> None:
        import numpy as np
        import pyarrow as pa

        ids = np.arange(rows, dtype=np.int64)
        self.batch = pa.record_batch([pa.array(ids), pa.array((ids % 1000) * 0.25 - 120.0)], names=["id", "x"])
        self.library = library
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(1)
        self.port = self.server.getsockname()[1]
        self.pid: int | None = None

    def round(self, batches: int) -> dict:
        import pyarrow as pa

        proc = subprocess.Popen([sys.executable, __file__, "--worker", str(self.port), "--library", self.library])
        conn, _ = self.server.accept()
        self.pid = proc.pid
        rfile, wfile = conn.makefile("rb"), conn.makefile("wb")
        done = {"rows": 0, "checksum": 0.0}

        def read() -> None:
            reader = pa.ipc.open_stream(rfile)
            for out in reader:
                y = out.column(1).to_numpy()
                done["rows"] += out.num_rows
                done["checksum"] += float(y[-1]) + int(out.column(0)[out.num_rows // 2].as_py()) + \
                    int(out.column(2)[0].as_py())

        # warm-up batches (the worker's imports, its context and pool) before the clock starts
        writer = pa.ipc.new_stream(wfile, self.batch.schema)
        reader_thread = threading.Thread(target=read)
        reader_thread.start()
        for _ in range(2):
            writer.write_batch(self.batch)
        wfile.flush()
        while done["rows"] < 2 * self.batch.num_rows:
            time.sleep(0.001)
        memory = process_gpu_memory_mib(proc.pid)
        t0 = time.perf_counter()
        for _ in range(batches):
            writer.write_batch(self.batch)
        wfile.flush()
        writer.close()
        wfile.close()
        reader_thread.join()
        seconds = time.perf_counter() - t0
        conn.close()
        proc.wait(timeout=60)
        return {"seconds": seconds, "rows": done["rows"] - 2 * self.batch.num_rows, "device_memory_mib": memory}


# --- the bridge side -------------------------------------------------------------------------------
class BridgeSide:
    """The Java harness, one JVM for all rounds: a round per `round` line on its stdin."""

    def __init__(self, backend: str, rows: int, batches: int) -> None:
        from bench_jvm import compile_bench, java

        classes = Path(os.environ.get("TMPDIR", "/tmp")) / f"cudabridge-batchbench-{os.getpid()}"
        cp = compile_bench(classes)
        self.proc = subprocess.Popen(
            [java(), f"-Dspark.cudabridge.backend={backend}", "-cp", cp, "org.cudabridge.harness.BatchBench",
             str(rows), str(batches), str(EXAMPLES)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            raise SystemExit(f"BatchBench did not start: {line!r}")

    def round(self) -> dict:
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"BatchBench ended (rc {self.proc.wait()})")
            if line.startswith("ROUND "):
                out = json.loads(line[len("ROUND "):])
                out["device_memory_mib"] = process_gpu_memory_mib(self.proc.pid)
                return out

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=120)


def process_gpu_memory_mib(pid: int) -> int | None:
    """The device memory a process holds (nvidia-smi's per-process figure: context and
    allocations), or None where nvidia-smi is absent."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return int(fields[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="emulated", choices=["emulated", "cuda"])
    ap.add_argument("--rows-per-batch", type=int, default=65536)
    ap.add_argument("--batches", type=int, default=40, help="batches per round and side")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="folder for bench_batches_<backend>.json")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--library", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.library)
        return 0
    library = "cupy" if args.backend == "cuda" else "numpy"
    bridge = BridgeSide(args.backend, args.rows_per_batch, args.batches)
    workers = WorkerSide(library, args.rows_per_batch)
    rounds = []
    try:
        for r in range(args.rounds + 1):   # round 0: warm-up, dropped
            order = ("bridge", "worker") if r % 2 == 0 else ("worker", "bridge")
            res = {}
            for side in order:
                res[side] = bridge.round() if side == "bridge" else workers.round(args.batches)
            if r:
                rounds.append(res)
    finally:
        bridge.close()
    print(f"Example (d)'s transform over {args.rows_per_batch}-row batches, {args.batches} a round: the bridge "
          f"(mapBatches' per-batch path, {args.backend}) against a Python worker fed Arrow over a socket ({library})")
    report = Report()
    rate = {side: [x[side]["rows"] / x[side]["seconds"] for x in rounds] for side in ("bridge", "worker")}
    report.values("bridge rows/s", rate["bridge"], "/s", "higher")
    report.values("worker rows/s", rate["worker"], "/s", "higher")
    report.ratio("bridge / worker, rows/s", [b / w for b, w in zip(rate["bridge"], rate["worker"])], "higher",
                 "(the issue's 3x is example (d)'s in Spark; no row-to-Arrow or pandas step here)")
    mem = {side: [x[side]["device_memory_mib"] for x in rounds] for side in ("bridge", "worker")}
    if mem["worker"][0] is not None:
        note = f"bridge process {fmt(median(mem['bridge']))} MiB, worker process {fmt(median(mem['worker']))} MiB"
        report.values("device memory, worker process (MiB)", mem["worker"], "MiB", "lower", note)
    print(report.text())
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"bench_batches_{args.backend}.json").write_text(
            json.dumps({"args": vars(args), "rounds": rounds, "summary": report.summary()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
