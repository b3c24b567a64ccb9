#!/usr/bin/env bash
# The Java unit tests that start the bridge, on the GPU machine's real device (no javac there):
# run from the repository root through the device tool with carry = [.whl, python/cudabridge/_native,
# build/junit/classes, bench/out/junit] (the test classes are compiled here by ./dev/junit;
# bench/out/junit/ holds a copy of /usr/share/java/junit-platform-console-standalone.jar).
# Each class gets a JVM of its own, as dev/junit gives the own-jvm classes; prints one line per class.
set -uo pipefail
source bench/gpu_setup.sh
cp="$(python3 -m cudabridge classpath):build/junit/classes:bench/out/junit/junit-platform-console-standalone.jar"
status=0
for cls in CudaBridgeTest DeviceBufferTest DeviceMemoryTest TaskTableTest TaskScopeTest NativeBridgeTest \
           CudaBridgeExceptionTest GpuOutOfMemoryExceptionTest BridgeStatisticsTest CudaKernelTest DeviceGlobalTest StagedCopyTest StagedCopyThreadsTest StagedCopyStarvedTest HostRegistrationTest PinnedBufferTest CloseReleaseRaceTest \
           KernelFaultTest LaunchReleaseRaceTest; do
  log="$out/junit-$cls.log"
  timeout 240 "$JAVA_HOME/bin/java" -Dcudabridge.python="$(command -v python3)" -Dcudabridge.pythonPath="$PYTHONPATH" \
    -Dspark.cudabridge.backend=cuda -cp "$cp" org.junit.platform.console.ConsoleLauncher --disable-banner \
    --disable-ansi-colors --details=summary --fail-if-no-tests --select-class="org.cudabridge.$cls" >"$log" 2>&1
  rc=$?
  echo "junit $cls (cuda): exit $rc: $(grep -E 'tests (successful|failed)' "$log" | tr -s ' ' | tr '\n' ' ')"
  [ $rc -eq 0 ] || { status=1; grep -E "MethodSource|=>" "$log" | head -6; }
done
exit $status
