package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;


import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Module globals from Java on the emulated device: a {@code __constant__} written from Java before
 * a launch is what the kernel reads (its host kernel in {@code tests/host_kernels_for_globals.py}), a
 * {@code __device__} variable the kernel writes is read back after it, both on the task's stream;
 * every bad argument refused before anything is copied.
 */
@Tag("own-jvm")
@EmulatedKernels("host_kernels_for_globals")
class DeviceGlobalTest extends RunningBridge {
    static final String SOURCE = """
            __constant__ float scale;
            __constant__ int offsets[4] = {1, 2, 3, 4};
            __device__ unsigned long long launches;
            extern "C" __global__ void scale_by(float* y, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) y[i] = y[i] * scale + offsets[i % 4];
                if (i == 0) launches += 1;
            }
            """;

    /** A module of its own per test: its globals are shared by every task that uses it, so tests on
     *  other tasks' streams writing one module's globals unordered would race (as on a GPU). */
    static ModuleSource source(String test) {
        return ModuleSource.cuda(SOURCE + "// " + test + "\n");
    }


    @AfterEach
    void released() {
        assertEquals(0, bridge.tasksBound());
    }

    @Test
    void aKernelReadsTheConstantJavaWroteAndJavaReadsWhatTheKernelWrote() {
        try (TaskScope t = bridge.bindTask(1)) {
            CudaModule m = bridge.loadModule(source("reads"));
            DeviceGlobal scale = m.global("scale");
            assertEquals(4, scale.size());
            assertEquals("scale", scale.name());
            assertEquals(t.gpu(), scale.gpu());
            assertTrue(scale.address() != 0, scale.toString());
            DeviceGlobal launches = m.global("launches");
            assertEquals(8, launches.size());
            int n = 8;
            float[] y = new float[n];
            for (int i = 0; i < n; i++) {
                y[i] = i;
            }
            try (DeviceBuffer dy = bridge.allocate(4L * n)) {
                dy.copyFrom(y);
                scale.copyFrom(new float[] {2.5f});      // before the launch, on the task's stream
                CudaKernel k = m.kernel("scale_by");
                k.launch(LaunchConfig.grid(1).block(32), dy, n);
                long[] count = new long[1];
                launches.copyTo(count);                 // after the launch: what it wrote
                assertEquals(1, count[0]);
                float[] out = new float[n];
                dy.copyTo(out);
                float[] want = new float[n];
                for (int i = 0; i < n; i++) {
                    want[i] = i * 2.5f + (i % 4 + 1);
                }
                assertArrayEquals(want, out);
            }
            float[] back = new float[1];
            scale.copyTo(back);
            assertEquals(2.5f, back[0]);
            int[] offsets = new int[2];
            m.global("offsets").copyTo(offsets, 0, 8, 2);   // bytes 8..16: the initializer's {3, 4}
            assertArrayEquals(new int[] {3, 4}, offsets);
        }
    }

    @Test
    void everyTypeRoundTripsAtAnOffset() {
        try (TaskScope t = bridge.bindTask(2)) {
            DeviceGlobal offsets = bridge.loadModule(source("types")).global("offsets");   // 16 bytes
            byte[] b = {1, 2, 3, 4, 5};
            offsets.copyFrom(b, 1, 3, 4);
            byte[] bb = new byte[4];
            offsets.copyTo(bb, 0, 3, 4);
            assertArrayEquals(new byte[] {2, 3, 4, 5}, bb);
            short[] s = {-7, 9};
            offsets.copyFrom(s, 0, 2, 2);
            short[] ss = new short[2];
            offsets.copyTo(ss, 0, 2, 2);
            assertArrayEquals(s, ss);
            long[] l = {Long.MIN_VALUE, 42};
            offsets.copyFrom(l);
            long[] ll = new long[2];
            offsets.copyTo(ll);
            assertArrayEquals(l, ll);
            double[] d = {Math.PI};
            offsets.copyFrom(d, 0, 8, 1);
            double[] dd = new double[1];
            offsets.copyTo(dd, 0, 8, 1);
            assertArrayEquals(d, dd);
            assertEquals(1, bridge.tasksBound(), t.toString());
        }
    }

    @Test
    void everyBadArgumentIsRefusedAndChangesNothing() {
        try (TaskScope t = bridge.bindTask(3)) {
            CudaModule m = bridge.loadModule(source("refused"));
            DeviceGlobal scale = m.global("scale");
            scale.copyFrom(new float[] {7f});
            assertThrows(NullPointerException.class, () -> m.global(null));
            assertThrows(IllegalArgumentException.class, () -> m.global(""));
            CudaBridgeException unknown = assertThrows(CudaBridgeException.class, () -> m.global("scal"));
            assertTrue(unknown.getMessage().contains("defines no global 'scal'"), unknown.getMessage());
            if (System.getProperty("spark.cudabridge.backend", "emulated").equals("emulated")) {
                // a global the source defines but no host kernel module declares (the emulated device only)
                CudaBridgeException undeclared = assertThrows(CudaBridgeException.class,
                        () -> bridge.loadModule(ModuleSource.cuda(SOURCE + "__constant__ float bias;\n")).global("bias"));
                assertTrue(undeclared.getMessage().contains("host_global('bias', <bytes>)"), undeclared.getMessage());
            }
            assertThrows(IndexOutOfBoundsException.class, () -> scale.copyFrom(new float[] {1f, 2f}), "8 bytes into 4");
            assertThrows(IndexOutOfBoundsException.class, () -> scale.copyFrom(new float[] {1f}, 0, 1, 1), "at offset 1");
            assertThrows(IndexOutOfBoundsException.class, () -> scale.copyFrom(new float[] {1f}, 0, -4, 1));
            assertThrows(IndexOutOfBoundsException.class, () -> scale.copyFrom(new float[] {1f}, 1, 0, 1), "past the array");
            assertThrows(IndexOutOfBoundsException.class, () -> scale.copyTo(new double[1]), "8 bytes out of 4");
            assertThrows(IndexOutOfBoundsException.class, () -> scale.copyTo(new float[1], 0, 4, 1));
            assertThrows(NullPointerException.class, () -> scale.copyFrom((float[]) null));
            assertThrows(NullPointerException.class, () -> scale.copyTo((int[]) null));
            float[] back = new float[1];
            scale.copyTo(back);
            assertEquals(7f, back[0], "nothing was written by the refused copies, " + t);
            assertSame(scale.getClass(), m.global("scale").getClass());
        }
        assertThrows(IllegalStateException.class,
                () -> bridge.loadModule(source("refused"), 0).global("scale").copyFrom(new float[] {1f}),
                "no current task");
    }
}
