#!/usr/bin/env bash
# One batched validation on the GPU machine (device tool, repository root), carry = [.whl,
# python/cudabridge/_native, bench/out/jvm-classes, spark-examples/build, build/junit/classes, bench/out/junit]: the C twins' tests,
# the JVM bridge scenarios and bench (gpu_jvm_run.sh), example (a)'s task code through TaskBinder
# and the stream bench (gpu_spark_harness_run.sh). Logs under $OUT.
set -uo pipefail
source bench/gpu_setup.sh
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_java_hot_path.py tests/test_native_fast_path.py \
  tests/test_seven_step_race.py tests/test_segment.py tests/test_external_streams.py tests/test_fault_injection.py \
  tests/test_bad_input_sweep.py tests/test_release_races.py tests/test_memory_pool.py tests/test_pool_twins_differential.py \
  >"$out/pytest.log" 2>&1
echo "pytest (C twins, cuda machine) exit $?: $(tail -1 "$out/pytest.log")"
bash bench/gpu_junit_run.sh; junit=$?
bash bench/gpu_jvm_run.sh; jvm=$?
bash bench/gpu_spark_harness_run.sh; harness=$?
echo "SUMMARY junit=$junit jvm=$jvm harness=$harness"
