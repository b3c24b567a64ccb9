#!/usr/bin/env bash
# Issue 16's validation on the GPU machine (device tool, repository root), carry = [.whl,
# python/cudabridge/_native, bench/out/jvm-classes, build/junit/classes, bench/out/junit]: the pinned
# pool's and host registration's GPU tests, the Java unit tests on cuda (gpu_junit_run.sh), then the
# copy bench with its plot (bench_copies.py). Logs, JSON and the PNG under $OUT; a summary last.
set -uo pipefail
final=${OUT:-bench/out}
export OUT=$(mktemp -d)   # the device tool returns only a few files: the logs go back as one archive
source bench/gpu_setup.sh
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_pinned_pool.py tests/test_host_registration.py \
  >"$out/pytest-copies.log" 2>&1
pytest=$?
bash bench/gpu_junit_run.sh >"$out/junit-summary.log" 2>&1; junit=$?
timeout 900 python3 bench/bench_copies.py --backend cuda --plot "$out/copies.png" --out "$out" ${COPY_BENCH_ARGS:-} \
  >"$out/bench_copies.log" 2>&1; bench=$?
# the same bench with the host copy on the calling thread alone, for the split's effect
timeout 600 python3 bench/bench_copies.py --backend cuda --out "$out" --set stagingCopyThreads=1 --tag _1thread \
  --rounds 3 >"$out/bench_copies_1thread.log" 2>&1
# SWEEP=1: heap copies at other ring shapes and thread counts (--quick, sizes up to 16 MiB)
if [ "${SWEEP:-0}" = 1 ]; then
  for cfg in "stagingSlotBytes=1m stagingSlots=8" "stagingSlotBytes=2m stagingSlots=8" "stagingSlotBytes=8m" \
             "stagingCopyThreads=4" "stagingCopyThreads=12"; do
    sets=""; for kv in $cfg; do sets="$sets --set $kv"; done
    timeout 300 python3 bench/bench_copies.py --backend cuda --quick --out "$out" $sets --tag _sweep \
      >"$out/sweep.log" 2>&1
    echo "--- sweep $cfg: $(grep -E '^heap_(in|out) (1024|16384) KiB' "$out/sweep.log" | awk '{printf "%s %s %s %s; ", $1, $2, $4, $5}')"
  done | tee "$out/sweep-summary.log"
fi
cat "$out/junit-summary.log"
echo "--- stagingCopyThreads=1:"
grep -E "^heap|memcpy_1 " "$out/bench_copies_1thread.log"
echo "--- default settings:"
grep -E "GB/s|x |us " "$out/bench_copies.log"
echo "pytest (pinned pool, registration): exit $pytest: $(tail -1 "$out/pytest-copies.log")"
cp "$out/copies.png" "$out/bench_copies_cuda.json" "$out/bench_copies.log" "$out/bench_copies_1thread.log" "$final/" 2>/dev/null
cp "$out/sweep-summary.log" "$final/" 2>/dev/null
tar czf "$final/logs.tgz" -C "$out" .
echo "SUMMARY pytest=$pytest junit=$junit bench=$bench"
