package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Kernel launches from many Java threads racing their task's release (issue 15): each launch
 * either is queued before the release's frees (so stream order puts it first) or is refused; none
 * is queued after. Proof, on the emulated device with its race detector on: as soon as the
 * release returns, the freed memory goes to another task and is written on that task's stream
 * while the launchers still run; a kernel of the released task queued after the release would
 * touch that memory with nothing ordering the two, which the detector records.
 *
 * <p>End to end, most launches after the release are refused by Java's own check (the scope is
 * marked released before the release crosses into Python); the narrow window between that check
 * and the Python side's task guard is proven closed by the registry-level test that drives the
 * guard directly, tests/test_host_kernels.py ({@code test_no_kernel_of_a_task_is_queued_once_its_
 * release_began}, which fails when the guard is removed; this class does not reach that window).
 */
@Tag("own-jvm")
class LaunchReleaseRaceTest {
    static final String SOURCE = """
            extern "C" __global__ void saxpy(const float* x, float* y, int n, float a) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) y[i] += a * x[i];
            }
            """;

    @Test
    void noLaunchIsQueuedAfterItsTasksReleaseBegan() throws Exception {
        String tests = Path.of(System.getProperty("user.dir"), "tests").toString();
        CudaBridge bridge = CudaBridge.start(BridgeOptions.fromSystemProperties().addPythonPath(tests)
                .set("emulatedKernels", "host_kernels_for_tests").set("emulatedRaceCheck", "true"));
        AtomicInteger ran = new AtomicInteger();
        AtomicInteger refused = new AtomicInteger();
        List<Throwable> unexpected = new ArrayList<>();
        CudaKernel[] last = {null};
        DeviceBuffer[] lastBuffer = {null};
        try {
            for (int round = 0; round < 20; round++) {
                long task = 100 + round;
                TaskScope scope = bridge.bindTask(task);
                CudaKernel saxpy = bridge.loadModule(ModuleSource.cuda(SOURCE)).kernel("saxpy");
                DeviceBuffer x = bridge.allocate(4096);
                DeviceBuffer y = bridge.allocate(4096);
                CyclicBarrier start = new CyclicBarrier(5);
                List<Thread> launchers = new ArrayList<>();
                for (int t = 0; t < 4; t++) {
                    Thread th = new Thread(() -> {
                        try (Attachment a = bridge.attach(task)) {
                            assertEquals(task, a.task().taskAttemptId());
                            start.await(30, TimeUnit.SECONDS);
                            for (boolean open = true; open; ) {     // until refused
                                try {
                                    saxpy.launch(LaunchConfig.grid(4).block(256), x, y, 1024, 1.0f);
                                    ran.incrementAndGet();
                                } catch (IllegalStateException | CudaBridgeException e) {
                                    // refused: the buffer's task released (Java's check) or being
                                    // released / no longer bound (the Python side's)
                                    String m = String.valueOf(e.getMessage());
                                    if (!(m.contains("released") || m.contains("not bound"))) {
                                        synchronized (unexpected) {
                                            unexpected.add(e);
                                        }
                                    }
                                    refused.incrementAndGet();
                                    open = false;
                                }
                            }
                        } catch (Throwable e) {
                            synchronized (unexpected) {
                                unexpected.add(e);
                            }
                        }
                    });
                    launchers.add(th);
                    th.start();
                }
                start.await(30, TimeUnit.SECONDS);
                Thread.sleep(1 + round % 3);
                scope.close();                                   // the release, racing the launchers
                try (TaskScope other = bridge.bindTask(1000 + round)) {
                    for (int i = 0; i < 4; i++) {                // the freed blocks, another task's now
                        bridge.allocate(4096).memset(0xAB);
                    }
                    for (Thread th : launchers) {
                        th.join();
                    }
                    assertEquals(1000 + round, other.taskAttemptId());
                }
            }
            assertTrue(unexpected.isEmpty(), "unexpected: " + unexpected);
            String races = bridge.callTool("emulated_races", "{}");   // -1: no detector (a GPU): the refusals alone
            if (!"-1".equals(races)) {
                assertEquals("0", races, "a launch was queued after its task's release");
            }
            assertTrue(ran.get() > 0, "ran " + ran);
            assertEquals(20 * 4, refused.get(), "every launcher ends refused");
            // a task still bound when the bridge shuts down: its launches are refused after
            bridge.bindTask(9999);
            last[0] = bridge.loadModule(ModuleSource.cuda(SOURCE)).kernel("saxpy");
            lastBuffer[0] = bridge.allocate(4096);
        } finally {
            bridge.shutdown();
        }
        IllegalStateException down = assertThrows(IllegalStateException.class,
                () -> last[0].launch(LaunchConfig.grid(1).block(32), lastBuffer[0], lastBuffer[0], 8, 1f));
        assertTrue(down.getMessage().contains("shut down") || down.getMessage().contains("released"), down.getMessage());
        assertThrows(IllegalStateException.class, () -> bridge.bindTask(1));
    }
}
