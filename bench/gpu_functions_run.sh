#!/usr/bin/env bash
# Issue 27 on the GPU machine (device tool, repository root), carry = [.whl, python/cudabridge/_native]
# (the jars and the bridge's sources come in _native; gpu_setup.sh builds the library and the C paths
# there): the GPU tests of Python functions (CuPy, PyTorch), then bench/bench_jvm.py's per-call part
# (a trivial Python function from Java against the same call in-process) and
# bench/bench_batches.py (the per-batch path through the bridge against a Python worker fed Arrow
# batches over a socket). Logs and JSON under $OUT; a summary last.
set -uo pipefail
source bench/gpu_setup.sh
status=0
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_python_functions_gpu.py tests/test_python_functions.py \
  >"$out/pytest_functions.log" 2>&1 || status=1
timeout 150 python3 bench/bench_jvm.py --backend cuda --quick --rounds 3 --threads 1 --seconds 0.1 --copies 10 \
  >"$out/bench_jvm.log" 2>&1 || status=1
timeout 200 python3 bench/bench_batches.py --backend cuda --rounds 3 --batches 20 --out "$out" >"$out/bench_batches.log" 2>&1 || status=1
tail -3 "$out/pytest_functions.log"
grep -i "function" "$out/bench_jvm.log" | head -12
tail -20 "$out/bench_batches.log"
exit $status
