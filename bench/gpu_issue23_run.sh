#!/usr/bin/env bash
# Issue 23's validation on the GPU machine (device tool, repository root), carry = [.whl,
# python/cudabridge/_native, spark-examples/build, build/junit/classes, bench/out/junit]: the JUnit
# classes on cuda (gpu_junit_run.sh; StagedCopyThreadsTest / StagedCopyStarvedTest check the shared
# staging slots), TaskHarness with 16 task threads and 2,400 tasks of heap copies (checks: no pinned
# fallback, no staging slot or pinned byte held after), the GPU-marked pytest files of the issue,
# the copy bench (--quick: heap in/out by size, against the anchors), and bench_spark.py --part
# streams (pool stream against cudaStreamCreate/Destroy; 1 and 16 threads with the interpreter's
# anchor). Logs and JSON under $OUT; a summary last.
set -uo pipefail
source bench/gpu_setup.sh
status=0
bash bench/gpu_junit_run.sh >"$out/junit-summary.log" 2>&1 || status=1
cp="$(python3 -m cudabridge classpath):spark-examples/build/cudabridge-examples.jar"
timeout 300 "$JAVA_HOME/bin/java" -Dcudabridge.python="$(command -v python3)" -Dcudabridge.pythonPath="$PYTHONPATH" \
  -Dspark.cudabridge.backend=cuda -cp "$cp" org.cudabridge.examples.TaskHarness \
  --tasks 2400 --threads 16 --elements 262144 --summary-json "$out/harness16.json" >"$out/harness16.log" 2>&1 || status=1
timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_host_registration.py tests/test_pinned_pool.py \
  tests/test_service_close.py tests/test_registry_twins_differential.py tests/test_lease_interruptions.py \
  tests/test_module_store.py tests/test_kernel_faults.py >"$out/pytest-gpu.log" 2>&1 || status=1
timeout 600 python3 bench/bench_copies.py --backend cuda --quick --out "$out" >"$out/bench_copies.log" 2>&1 || status=1
timeout 300 python3 bench/bench_spark.py --part streams --backend cuda --stream-rounds 9 --out "$out" \
  >"$out/bench_streams.log" 2>&1 || status=1
cat "$out/junit-summary.log"
echo "TaskHarness 16 threads: $(grep -E '^(checks|staging_|pinned_)' "$out/harness16.log" | tr -s ' ' | tr '\n' ';')"
echo "pytest: $(tail -1 "$out/pytest-gpu.log")"
grep -E "^heap_(in|out)" "$out/bench_copies.log" | head -12
tail -14 "$out/bench_streams.log"
exit $status
