package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/** The memory API on the real bridge (emulated device): every bad argument refused in Java. */
@Tag("own-jvm")
class DeviceMemoryTest {
    static CudaBridge bridge;
    static TaskScope task;

    @BeforeAll
    static void start() {
        bridge = CudaBridge.start();
        task = bridge.bindTask(1);
    }

    @AfterAll
    static void stop() {
        task.release();
        bridge.shutdown();
    }

    private static long inUse() {
        return bridge.statistics().get("in_use_bytes");
    }

    @Test
    void aBufferRoundTripsDataOnTheTasksStream() {
        try (DeviceBuffer b = bridge.allocate(4 * 1000)) {
            assertEquals(task.stream(), b.stream());
            int[] in = new int[1000];
            for (int i = 0; i < in.length; i++) {
                in[i] = i * 7;
            }
            b.copyFrom(in);
            int[] out = new int[1000];
            b.copyTo(out);
            assertArrayEquals(in, out);
        }
    }

    @Test
    void badSizesAreRefusedBeforeAnyCall() {
        long before = inUse();
        assertThrows(IllegalArgumentException.class, () -> bridge.allocate(0));
        assertThrows(IllegalArgumentException.class, () -> bridge.allocate(-5));
        assertThrows(IllegalArgumentException.class, () -> bridge.allocatePinned(0));
        assertThrows(IllegalArgumentException.class, () -> bridge.allocatePinned(1L << 31));
        assertEquals(before, inUse());
    }

    @Test
    void aBatchedFreeFreesTheOpenOnesOnly() {
        long before = inUse();
        DeviceBuffer a = bridge.allocate(100);
        DeviceBuffer b = bridge.allocate(200);
        DeviceBuffer c = bridge.allocate(300);
        b.close();
        assertEquals(2, bridge.free(a, b, c));
        assertFalse(a.isAlive() || c.isAlive());
        assertEquals(0, bridge.free(List.of(a, c)), "closed already");
        assertEquals(before, inUse());
        assertThrows(NullPointerException.class, () -> bridge.free(a, null));
    }

    @Test
    void pinnedMemoryIsADirectBufferInNativeOrder() {
        try (PinnedBuffer p = bridge.allocatePinned(4096)) {
            assertTrue(p.buffer().isDirect());
            assertEquals(4096, p.buffer().capacity());
            assertEquals(java.nio.ByteOrder.nativeOrder(), p.buffer().order());
        }
    }

    @Test
    void synchronizeWaitsForTheTasksStream() {
        try (DeviceBuffer b = bridge.allocate(1 << 20)) {
            b.memset(1);
            bridge.synchronize();
            byte[] out = new byte[16];
            b.copyTo(out);
            assertEquals(1, out[15]);
        }
    }
}
