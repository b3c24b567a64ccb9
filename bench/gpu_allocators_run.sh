#!/usr/bin/env bash
# Issue 26 on the GPU machine (device tool, repository root), carry = [.whl, python/cudabridge/_native]:
# the real libraries through cudabridge.allocators (tests/test_allocators_gpu.py: CuPy, PyTorch,
# Numba; RMM where installed), then bench/bench_allocators.py (CuPy and PyTorch against their own
# pools, interleaved rounds), bench/cupy_pair_parts.py (CuPy's pair, part by part) and the pool's
# footprint on the Spark-like trace (bench_core.py's fragmentation rows) and its stream cache on
# repeating steps (bench_stream_cache.py). gpu_setup.sh
# builds the C paths and the torch allocator's compiled part there (build_fastpath). Logs and JSON
# under $OUT; a summary last.
set -uo pipefail
source bench/gpu_setup.sh
status=0
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_allocators_gpu.py tests/test_allocators.py \
  >"$out/pytest_allocators.log" 2>&1 || status=1
timeout 300 python3 bench/bench_allocators.py --rounds 5 --out "$out" >"$out/bench_allocators.log" 2>&1 || status=1
(cd bench && timeout 120 python3 cupy_pair_parts.py --rounds 5 --out "$out") >"$out/cupy_pair_parts.log" 2>&1 || status=1
# the pool's footprint on the Spark-like trace (bench_core's rows; the stream cache may hold more)
(cd bench && timeout 180 python3 -c "
import bench_core as b
from cudabridge.device import open_backend
be = open_backend('cuda'); be.set_device(0)
b.bench_fragmentation(be); b.bench_fragmentation(be, growth='chunks')
print(b.report.text())") >"$out/trace_footprint.log" 2>&1 || status=1
timeout 120 python3 bench/bench_stream_cache.py --backend cuda --out "$out" >"$out/bench_stream_cache.log" 2>&1 || status=1
tail -3 "$out/pytest_allocators.log"
tail -12 "$out/cupy_pair_parts.log"
tail -4 "$out/trace_footprint.log"
tail -22 "$out/bench_stream_cache.log"
sed -n "/^measurement /,\$p" "$out/bench_allocators.log"
exit $status
