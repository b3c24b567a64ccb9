#!/usr/bin/env bash
# Issue 23 item 1 on the GPU machine (device tool, repository root; no carry needed): builds the C
# twins against that machine's Python, runs the registry's twin and interruption tests there, then
# bench_spark.py --part streams --backend cuda (pool stream against cudaStreamCreate/Destroy per
# task, and 16 threads binding at once). Logs and JSON under $OUT; the bench's table last.
set -uo pipefail
out=${OUT:-bench/out}
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
python3 -m cudabridge.memory.build_fastpath >"$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_registry_twins_differential.py \
  tests/test_lease_interruptions.py tests/test_task_registry_and_service.py tests/test_release_races.py \
  >"$out/pytest-registry.log" 2>&1
echo "pytest (registry, emulated, this machine's Python): $(tail -1 "$out/pytest-registry.log")"
timeout 600 python3 bench/bench_spark.py --part streams --backend cuda --stream-rounds ${ROUNDS:-9} --out "$out" \
  >"$out/bench_streams.log" 2>&1
echo "bench rc $?"
tail -12 "$out/bench_streams.log"
