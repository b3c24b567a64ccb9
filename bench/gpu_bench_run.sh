#!/usr/bin/env bash
# The copy and stream benchmarks on the GPU machine (device tool, repository root), carry = [.whl,
# python/cudabridge/_native]; the checks run apart (gpu_checks_run.sh: one device call is at most
# 10 minutes): the copy bench (--quick: heap in/out by size, against the anchors) and
# bench_spark.py --part streams (a pool stream against cudaStreamCreate/Destroy; 1 and 16 threads
# with the interpreter's anchor). Logs and JSON under $OUT; a summary last.
set -uo pipefail
source bench/gpu_setup.sh
status=0
timeout 400 python3 bench/bench_copies.py --backend cuda --quick --out "$out" >"$out/bench_copies.log" 2>&1 || status=1
timeout 150 python3 bench/bench_spark.py --part streams --backend cuda --stream-rounds 9 --out "$out" \
  >"$out/bench_streams.log" 2>&1 || status=1
grep -E "^heap_(in|out)" "$out/bench_copies.log" | head -12
tail -14 "$out/bench_streams.log"
exit $status
