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

/** The memory API on the real bridge (emulated device): allocate, batched frees, pinned memory,
 *  synchronize; every bad argument refused in Java, a size past the pool limit by the pool. */
@Tag("own-jvm")
class DeviceMemoryTest extends RunningBridge {
    static TaskScope task;

    @BeforeAll
    static void bindTask() {
        task = bridge.bindTask(1);
    }

    @AfterAll
    static void releaseTask() {
        task.release();
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
        IllegalArgumentException zero = assertThrows(IllegalArgumentException.class, () -> bridge.allocate(0));
        assertTrue(zero.getMessage().contains("positive"), zero.getMessage());
        IllegalArgumentException negative = assertThrows(IllegalArgumentException.class, () -> bridge.allocate(-5));
        assertTrue(negative.getMessage().contains("positive"), negative.getMessage());
        IllegalArgumentException pinned = assertThrows(IllegalArgumentException.class, () -> bridge.allocatePinned(0));
        assertTrue(pinned.getMessage().contains("size"), pinned.getMessage());
        assertThrows(IllegalArgumentException.class, () -> bridge.allocatePinned(1L << 31));
        assertEquals(before, inUse());
    }

    @Test
    void aSizePastThePoolLimitIsRefusedByThePool() {
        long before = inUse();
        long live = stat("live_allocations");
        CudaBridgeException e = assertThrows(CudaBridgeException.class, () -> bridge.allocate(Long.MAX_VALUE / 2));
        assertTrue(e.getMessage().contains("exceeds the pool limit"), e.getMessage());
        assertEquals(before, inUse());
        assertEquals(live, stat("live_allocations"));
    }

    @Test
    void aBatchedFreeIsOneCallCountingEachBuffer() {
        long live = stat("live_allocations");
        long batched = stat("bridge_batched_frees");
        assertEquals(3, bridge.free(bridge.allocate(10), bridge.allocate(20), bridge.allocate(30)));
        assertEquals(batched + 3, stat("bridge_batched_frees"), "three batched frees counted");
        assertEquals(live, stat("live_allocations"));
    }

    @Test
    void aBufferTwiceInOneBatchIsFreedOnce() {
        long live = stat("live_allocations");
        DeviceBuffer x = bridge.allocate(100);
        DeviceBuffer y = bridge.allocate(100);
        assertEquals(2, bridge.free(x, y, x));
        assertFalse(x.isAlive() || y.isAlive());
        assertEquals(live, stat("live_allocations"));
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
