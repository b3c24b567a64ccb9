#!/usr/bin/env bash
# Before/after on the GPU machine (device tool, repository root): bench/compare_trees.py over two
# trees carried under bench/out (carry = [.whl, bench/out, python/cudabridge/_native]: gpu_setup.sh
# builds this checkout too): bench/out/before and bench/out/after,
# each a `git archive` of its commit with its jar and Java harness built where a JDK is
# (bench/prepare_compare_trees.sh BEFORE [AFTER] makes both). Here each
# tree's C parts are built against this machine's Python, then the script given runs in
# interleaved rounds. Usage: bash bench/gpu_compare_run.sh ROUNDS SCRIPT [ARGS...]
# (e.g. 5 bench/bench_jvm.py --backend cuda --quick). The table is printed last; JSON under $OUT.
set -uo pipefail
rounds=$1; shift
source bench/gpu_setup.sh
for tree in bench/out/before bench/out/after; do
  (cd "$tree" && PYTHONPATH=python:$PYTHONPATH python3 -m cudabridge.memory.build_fastpath >/dev/null &&
   PYTHONPATH=python:$PYTHONPATH python3 -m cudabridge build --native-only >/dev/null) || { echo "build failed in $tree"; exit 1; }
done
name=$(basename "$1" .py)
# the log is written as it goes (a call cut off by the device tool's limit still brings back the
# runs made); the table is printed last. Size it: the builds take about a minute, and a call ten
# at most (bench_jvm: prefer --quick --threads 1 --seconds 0.1 --copies 10 --n 50000 --rounds 3).
python3 -u bench/compare_trees.py --no-build --before bench/out/before --after bench/out/after --rounds "$rounds" \
  --json-out "$out/compare_$name.json" "$@" >"$out/compare_$name.log" 2>&1
status=$?
tail -40 "$out/compare_$name.log"
exit $status
