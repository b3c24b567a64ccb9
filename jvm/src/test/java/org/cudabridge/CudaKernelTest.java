package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * User kernels from Java on the emulated device (issue 15): a module loaded once per executor,
 * its kernel launched on the task's stream through one JNI call, its host kernel
 * ({@code tests/host_kernels_for_tests.py}) computing in stream order; every bad argument refused.
 */
@Tag("own-jvm")
@EmulatedKernels("host_kernels_for_tests")
class CudaKernelTest extends RunningBridge {
    static final String SOURCE = """
            extern "C" __global__ void saxpy(const float* x, float* y, int n, float a) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) y[i] += a * x[i];
            }
            extern "C" __global__ void histogram(const unsigned* data, int n, unsigned* bins) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) atomicAdd(&bins[data[i] % 16], 1u);
            }
            """;


    @AfterEach
    void released() {
        assertEquals(0, bridge.tasksBound());
    }

    @Test
    void aTaskCompilesOnceAndLaunchesOnItsStream() {
        try (TaskScope t = bridge.bindTask(1)) {
            CudaModule m = bridge.loadModule(ModuleSource.cuda(SOURCE));
            CudaKernel saxpy = m.kernel("saxpy");
            assertEquals(List.of("ptr", "ptr", "i32", "f32"), saxpy.signature());
            int n = 1000;
            float[] x = new float[n];
            float[] y = new float[n];
            for (int i = 0; i < n; i++) {
                x[i] = i;
                y[i] = 1;
            }
            try (DeviceBuffer dx = bridge.allocate(4L * n); DeviceBuffer dy = bridge.allocate(4L * n)) {
                dx.copyFrom(x);
                dy.copyFrom(y);
                saxpy.launch(LaunchConfig.grid((n + 255) / 256).block(256), dx, dy, n, 2.0f);
                float[] out = new float[n];
                dy.copyTo(out);       // stream order: after the kernel
                float[] want = new float[n];
                for (int i = 0; i < n; i++) {
                    want[i] = 1 + 2f * i;
                }
                assertArrayEquals(want, out);
            }
            assertEquals(1, bridge.tasksBound(), t.toString());
        }
    }

    @Test
    void anInteriorPointerAndAnotherKernelOfTheSameModule() {
        try (TaskScope t = bridge.bindTask(2)) {
            CudaKernel hist = bridge.loadModule(ModuleSource.cuda(SOURCE)).kernel("histogram");
            int[] data = new int[4096];
            for (int i = 0; i < data.length; i++) {
                data[i] = i;
            }
            try (DeviceBuffer d = bridge.allocate(4L * (data.length + 16)); DeviceBuffer bins = bridge.allocate(64)) {
                d.copyFrom(data, 0, 64, data.length);   // the data starts 64 bytes in
                bins.memset(0);
                hist.launch(LaunchConfig.grid(16).block(256), d.at(64), data.length, bins);
                int[] out = new int[16];
                bins.copyTo(out);
                for (int v : out) {
                    assertEquals(256, v, t.toString());
                }
            }
        }
    }

    @Test
    void everyBadArgumentIsRefused() {
        try (TaskScope t = bridge.bindTask(3)) {
            CudaKernel saxpy = bridge.loadModule(ModuleSource.cuda(SOURCE)).kernel("saxpy");
            DeviceBuffer x = bridge.allocate(4096);
            DeviceBuffer y = bridge.allocate(4096);
            LaunchConfig c = LaunchConfig.grid(1).block(256);
            assertThrows(IllegalArgumentException.class, () -> saxpy.launch(c, x, y, 8));
            assertThrows(IllegalArgumentException.class, () -> saxpy.launch(c, x, y, 8L, 1f), "a long for an i32");
            assertThrows(IllegalArgumentException.class, () -> saxpy.launch(c, x, y, 8, 1.0), "a double for an f32");
            assertThrows(IllegalArgumentException.class, () -> saxpy.launch(c, x, 7, 8, 1f), "an int for a ptr");
            assertThrows(NullPointerException.class, () -> saxpy.launch(c, x, null, 8, 1f));
            assertThrows(IllegalArgumentException.class, () -> LaunchConfig.grid(0).block(1));
            assertThrows(IndexOutOfBoundsException.class, () -> x.at(4097));
            y.close();
            assertThrows(IllegalStateException.class, () -> saxpy.launch(c, x, y, 8, 1f), "a closed buffer");
            CudaBridgeException e = assertThrows(CudaBridgeException.class,
                    () -> bridge.loadModule(ModuleSource.cuda(SOURCE)).kernel("reduce"));
            assertTrue(e.getMessage().contains("defines no kernel 'reduce'"), e.getMessage() + " " + t);
            try (TaskScope other = bridge.bindTask(4)) {      // task 4 is this thread's current task now
                DeviceBuffer theirs = bridge.allocate(256);
                assertEquals(4, other.taskAttemptId());
                try (Attachment a = bridge.attach(3)) {         // and task 3 again, until closed
                    CudaBridgeException owner = assertThrows(CudaBridgeException.class,
                            () -> saxpy.launch(c, x, theirs, 8, 1f));
                    assertTrue(owner.getMessage().contains("belongs to task 4"), owner.getMessage() + " " + a.task());
                }
            }
        }
    }

    @Test
    void aLaunchWithNoBoundTaskIsRefusedAndTheExecutorGoesOn() throws Exception {
        CudaKernel saxpy;
        DeviceBuffer x;
        try (TaskScope t = bridge.bindTask(5)) {
            saxpy = bridge.loadModule(ModuleSource.cuda(SOURCE)).kernel("saxpy");
            x = bridge.allocate(4096);
            Throwable[] seen = {null};
            Thread unbound = new Thread(() -> {
                try {
                    saxpy.launch(LaunchConfig.grid(1).block(32), x, x, 8, 1f);
                } catch (Throwable e) {
                    seen[0] = e;
                }
            });
            unbound.start();
            unbound.join();
            assertTrue(seen[0] instanceof IllegalStateException && seen[0].getMessage().contains("no task is bound"),
                    String.valueOf(seen[0]));
            saxpy.launch(LaunchConfig.grid(1).block(32), x, x, 8, 1f);   // this thread's task still launches
            bridge.synchronize();
            assertEquals(5, t.taskAttemptId());
        }
        assertThrows(IllegalStateException.class, () -> saxpy.launch(LaunchConfig.grid(1).block(32), x, x, 8, 1f),
                "after the task's release");
    }
}
