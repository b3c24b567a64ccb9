#!/usr/bin/env bash
# The checks on the GPU machine (device tool, repository root), carry = [.whl,
# python/cudabridge/_native, spark-examples/build, build/junit/classes, bench/out]: the JUnit
# classes on cuda (gpu_junit_run.sh), TaskHarness with 16 task threads and 2,400 tasks of heap
# copies (checks: no pinned fallback, no staging slot or pinned byte held after), and every
# GPU-marked pytest file with the GPU-parametrised files of issues 23 and 25. Logs under $OUT; a
# summary last. The benchmarks run apart (gpu_bench_run.sh): one device call is at most 10 minutes.
set -uo pipefail
source bench/gpu_setup.sh
status=0
bash bench/gpu_junit_run.sh >"$out/junit-summary.log" 2>&1 || status=1
cp="$(python3 -m cudabridge classpath):spark-examples/build/cudabridge-examples.jar"
timeout 150 "$JAVA_HOME/bin/java" -Dcudabridge.python="$(command -v python3)" -Dcudabridge.pythonPath="$PYTHONPATH" \
  -Dspark.cudabridge.backend=cuda -cp "$cp" org.cudabridge.examples.TaskHarness \
  --tasks 2400 --threads 16 --elements 262144 --summary-json "$out/harness16.json" >"$out/harness16.log" 2>&1 || status=1
gpu_files=$(grep -lE "mark\.gpu|pytestmark.*gpu" tests/test_*.py | grep -v test_doctor.py)
timeout 300 python3 -m pytest -q -p no:cacheprovider $gpu_files tests/test_service_close.py \
  tests/test_registry_twins_differential.py tests/test_lease_interruptions.py tests/test_kernel_faults.py \
  >"$out/pytest-gpu.log" 2>&1 || status=1
cat "$out/junit-summary.log"
echo "TaskHarness 16 threads: $(grep -E '^(checks|staging_|pinned_)' "$out/harness16.log" | tr -s ' ' | tr '\n' ';')"
grep -E "^(FAILED|ERROR)" "$out/pytest-gpu.log" | head -20
echo "pytest: $(tail -1 "$out/pytest-gpu.log")"
exit $status
