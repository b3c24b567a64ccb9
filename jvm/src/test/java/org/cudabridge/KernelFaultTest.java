package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;

import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * A kernel that faults (issue 15, item 5): on a GPU {@code faults} stores to address 0x10, on the
 * emulated device its host kernel reads past its buffer: the task's next synchronize reports it, naming the kernels
 * launched on its stream since the last completed synchronize, and from then on every GPU call
 * fails fast. The device is unusable afterwards, so this class has a JVM and a bridge of its own.
 */
@Tag("own-jvm")
class KernelFaultTest {
    static final String SOURCE = """
            extern "C" __global__ void histogram(const unsigned* data, int n, unsigned* bins) { }
            extern "C" __global__ void faults(const unsigned* p) { *(volatile unsigned*)0x10 = p[0]; }
            """;

    @Test
    void theNextSynchronizeNamesTheCandidatesAndEveryLaterCallFailsFast() {
        String tests = Path.of(System.getProperty("user.dir"), "tests").toString();
        CudaBridge bridge = CudaBridge.start(BridgeOptions.fromSystemProperties().addPythonPath(tests)
                .set("emulatedKernels", "host_kernels_for_tests"));
        try {
            try (TaskScope t = bridge.bindTask(1)) {
                CudaModule m = bridge.loadModule(ModuleSource.cuda(SOURCE));
                CudaKernel histogram = m.kernel("histogram");
                CudaKernel faults = m.kernel("faults");
                DeviceBuffer data = bridge.allocate(4096);
                LaunchConfig one = LaunchConfig.grid(1).block(64);
                histogram.launch(one, data, 64, data);
                bridge.synchronize();                      // completed: no candidate any more
                assertNull(bridge.deviceError());
                histogram.launch(one, data, 64, data);
                faults.launch(one, data);                  // last: a launch after the fault may fail already
                KernelFaultException fault = assertThrows(KernelFaultException.class, bridge::synchronize);
                assertTrue(fault.getMessage().contains("KernelFault")
                        && fault.getMessage().contains("(the candidates): histogram, faults"), fault.getMessage());
                assertNotNull(bridge.deviceError());
                DeviceUnusableException later = assertThrows(DeviceUnusableException.class,
                        () -> histogram.launch(one, data, 64, data));
                assertTrue(later.getMessage().contains("DeviceUnusable"), later.getMessage());
                assertThrows(CudaBridgeException.class, () -> bridge.allocate(64), "task " + t.taskAttemptId());
            }
        } finally {
            try {
                bridge.shutdown();
            } catch (CudaBridgeException expected) {
                // draining the unusable device's streams reports the error again
            }
        }
    }
}
