package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.Map;
import java.util.Random;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Device buffers on the real bridge (emulated device): every copy kind round-trips its data
 * (heap arrays of each type at offsets, direct and pinned ByteBuffers, device to device), the
 * copies without "Async" are complete on return for pinned memory too, the asynchronous ones
 * take page-locked memory only and have the data after a synchronize, memset
 * sets only its range, every bad argument is refused in Java before anything changes, and a closed
 * or dead buffer (its task released) refuses every use. Each test works for a task of its own;
 * after it, the task is released and no allocation is left live.
 */
@Tag("own-jvm")
class DeviceBufferTest extends RunningBridge {
    static long nextTask = 100;
    TaskScope task;

    @BeforeEach
    void bind() {
        task = bridge.bindTask(nextTask++);
    }

    @AfterEach
    void nothingLeftLive() {
        task.release();
        assertEquals(0L, stat("live_allocations"), "no live allocation after the task's release");
        assertEquals(0, bridge.tasksBound());
    }

    @Test
    void aBufferIsOrderedOnItsTasksStream() {
        try (DeviceBuffer buf = bridge.allocate(64)) {
            assertEquals(task.stream(), buf.stream());
            assertEquals(task.stream(), bridge.stream());
            assertEquals(task.taskAttemptId(), buf.taskAttemptId());
            assertEquals(64, buf.size());
            assertTrue(buf.isAlive());
        }
    }

    @Test
    void aByteArrayRoundTrips() {
        byte[] data = new byte[100_000];
        new Random(1).nextBytes(data);
        byte[] back = new byte[data.length];
        try (DeviceBuffer buf = bridge.allocate(data.length)) {
            buf.copyFrom(data);
            buf.copyTo(back);
        }
        assertArrayEquals(data, back);
    }

    @Test
    void intAndLongArraysRoundTripAtAnOffset() {
        try (DeviceBuffer buf = bridge.allocate(4096)) {
            int[] ints = {1, -2, 3, Integer.MAX_VALUE};
            int[] intsBack = new int[4];
            buf.copyFrom(ints, 0, 64, 4);
            buf.copyTo(intsBack, 0, 64, 4);
            assertArrayEquals(ints, intsBack);
            long[] longs = {Long.MIN_VALUE, 7, 1L << 40};
            long[] longsBack = new long[3];
            buf.copyFrom(longs, 0, 8, 3);
            buf.copyTo(longsBack, 0, 8, 3);
            assertArrayEquals(longs, longsBack);
            int[] againAt64 = new int[4];
            buf.copyTo(againAt64, 0, 64, 4);
            assertArrayEquals(ints, againAt64, "the long[] copy at 8..32 left the ints at 64 alone");
        }
    }

    @Test
    void doubleAndFloatArraysRoundTripBitForBit() {
        try (DeviceBuffer buf = bridge.allocate(4096)) {
            double[] ds = {Math.PI, -0.0, Double.MAX_VALUE};
            double[] dsBack = new double[3];
            buf.copyFrom(ds);
            buf.copyTo(dsBack);
            assertTrue(Arrays.equals(ds, dsBack), () -> Arrays.toString(dsBack));   // -0.0 stays -0.0
            float[] fs = {1.5f, Float.NaN};
            float[] fsBack = new float[2];
            buf.copyFrom(fs);
            buf.copyTo(fsBack);
            assertTrue(Arrays.equals(fs, fsBack), () -> Arrays.toString(fsBack));
        }
    }

    @Test
    void memsetOfASubRangeSetsOnlyThoseBytes() {
        try (DeviceBuffer buf = bridge.allocate(4096)) {
            buf.memset(0);
            buf.memset(0x5a, 10, 20);
            byte[] seg = new byte[40];
            buf.copyTo(seg, 0, 0, 40);
            for (int i = 0; i < 40; i++) {
                assertEquals((i >= 10 && i < 30) ? (byte) 0x5a : 0, seg[i], "byte " + i);
            }
        }
    }

    @Test
    void directToDeviceToDeviceToPinned() {
        ByteBuffer direct = ByteBuffer.allocateDirect(4096);
        for (int i = 0; i < 4096; i++) {
            direct.put(i, (byte) (i * 7));
        }
        try (DeviceBuffer buf = bridge.allocate(8192);
             DeviceBuffer other = bridge.allocate(4096);
             PinnedBuffer pinned = bridge.allocatePinned(4096)) {
            buf.copyFrom(direct, 0);
            other.copyFrom(buf, 0, 0, 4096);
            other.copyToAsync(pinned.buffer(), 0);
            bridge.synchronize();
            ByteBuffer pb = pinned.buffer();
            for (int i = 0; i < 4096; i++) {
                assertEquals((byte) (i * 7), pb.get(i), "byte " + i);
            }
        }
    }

    /** Fills a pinned buffer's bytes with {@code seed + i}. */
    static void fill(ByteBuffer b, int seed) {
        for (int i = 0; i < b.capacity(); i++) {
            b.put(i, (byte) (seed + i));
        }
    }

    static byte[] pattern(int n, int seed) {
        byte[] out = new byte[n];
        for (int i = 0; i < n; i++) {
            out[i] = (byte) (seed + i);
        }
        return out;
    }

    static byte[] bytes(ByteBuffer b) {
        byte[] out = new byte[b.capacity()];
        b.get(0, out);
        return out;
    }

    @Test
    void copyFromAndCopyToOfPinnedMemoryAreCompleteOnReturn() {
        // Issue 25 item 7: the copies without "Async" complete on return for page-locked memory too.
        // A long kernel is queued ahead of each copy: a copy that only queued its DMA would return
        // long before it ran (the source then read after it changed, the destination not yet written).
        int n = 1 << 16;
        try (DeviceBuffer buf = bridge.allocate(n); PinnedBuffer pinned = bridge.allocatePinned(n)) {
            assertTrue(pinned.isPinned());
            ByteBuffer p = pinned.buffer();
            fill(p, 3);
            long syncs = stat("bridge_synchronizes");
            bridge.callTool("spin", "{\"task\": " + task.taskAttemptId() + ", \"seconds\": 0.3}");
            buf.copyFrom(p, 0);
            fill(p, 100);                                       // at once: the copy has read it
            byte[] back = new byte[n];
            buf.copyTo(back);
            assertArrayEquals(pattern(n, 3), back, "copyFrom read the pinned memory before it returned");
            bridge.callTool("spin", "{\"task\": " + task.taskAttemptId() + ", \"seconds\": 0.3}");
            buf.copyTo(p, 0);                                   // no synchronize after it
            assertArrayEquals(pattern(n, 3), bytes(p), "copyTo wrote the pinned memory before it returned");
            assertEquals(syncs + 2, stat("bridge_synchronizes"), "one wait for the stream per page-locked copy");
        }
    }

    @Test
    void asyncCopiesOfPinnedMemoryHaveTheDataAfterASynchronize() {
        int n = 1 << 16;
        try (DeviceBuffer buf = bridge.allocate(n);
             PinnedBuffer src = bridge.allocatePinned(n);
             PinnedBuffer dst = bridge.allocatePinned(n)) {
            fill(src.buffer(), 5);
            long syncs = stat("bridge_synchronizes");
            long direct = stat("bridge_copies_direct");
            buf.copyFromAsync(src.buffer(), 0);
            buf.copyToAsync(dst.buffer(), 0);
            assertEquals(syncs, stat("bridge_synchronizes"), "the asynchronous copies wait for nothing");
            bridge.synchronize();
            assertArrayEquals(pattern(n, 5), bytes(dst.buffer()));
            ByteBuffer part = dst.buffer().slice(100, 50);      // a slice of a pinned buffer is page-locked too
            buf.copyToAsync(part, 1000);
            bridge.synchronize();
            byte[] got = new byte[50];
            part.get(0, got);
            assertArrayEquals(Arrays.copyOfRange(pattern(n, 5), 1000, 1050), got);
            assertEquals(direct + 3, stat("bridge_copies_direct"));
        }
    }

    @Test
    void asyncCopiesRefuseMemoryThatIsNotPageLockedAndChangeNothing() {
        int n = 4096;
        byte[] data = pattern(n, 9);
        try (DeviceBuffer buf = bridge.allocate(n)) {
            buf.copyFrom(data);
            PinnedBuffer closed = bridge.allocatePinned(n);
            ByteBuffer stale = closed.buffer().duplicate();
            closed.close();
            Map<String, Long> before = bridge.statistics();
            ByteBuffer heap = ByteBuffer.wrap(new byte[n]);
            ByteBuffer direct = ByteBuffer.allocateDirect(n);
            assertRefused(IllegalArgumentException.class, () -> buf.copyFromAsync(heap, 0), "not direct",
                    "never page-locked", "copyFrom(ByteBuffer, long)");
            assertRefused(IllegalArgumentException.class, () -> buf.copyToAsync(heap, 0), "not direct",
                    "copyTo(ByteBuffer, long)");
            assertRefused(IllegalArgumentException.class, () -> buf.copyFromAsync(direct, 0),
                    "copyFromAsync(ByteBuffer): the ByteBuffer's memory", "is not page-locked", "copyFrom(ByteBuffer, long)");
            assertRefused(IllegalArgumentException.class, () -> buf.copyToAsync(direct, 0), "is not page-locked",
                    "use copyTo(ByteBuffer, long)");
            assertRefused(IllegalArgumentException.class, () -> buf.copyFromAsync(stale, 0), "is not page-locked");
            assertRefused(IllegalArgumentException.class, () -> buf.copyToAsync(stale, 0), "is not page-locked");
            assertRefused(NullPointerException.class, () -> buf.copyFromAsync(null, 0));
            assertRefused(IndexOutOfBoundsException.class, () -> buf.copyFromAsync(ByteBuffer.allocateDirect(n + 1), 0),
                    "outside");
            Map<String, Long> after = bridge.statistics();
            for (String key : new String[] {"bridge_calls_total", "bridge_copies_direct", "bridge_synchronizes"}) {
                assertEquals(before.get(key), after.get(key), key + ": nothing reached Python");
            }
            byte[] back = new byte[n];
            buf.copyTo(back);
            assertArrayEquals(data, back, "the buffer holds its bytes after the refused copies");
        }
    }

    @Test
    void badArgumentsAreRefusedAndChangeNothing() {
        Map<String, Long> before = bridge.statistics();
        byte[] data = new byte[1000];
        Arrays.fill(data, (byte) 9);
        try (DeviceBuffer buf = bridge.allocate(1000)) {
            buf.copyFrom(data);
            assertRefused(NullPointerException.class, () -> buf.copyFrom((byte[]) null));
            assertRefused(NullPointerException.class, () -> buf.copyTo((int[]) null));
            assertRefused(IndexOutOfBoundsException.class, () -> buf.copyFrom(new byte[1001]), "outside");
            assertRefused(IndexOutOfBoundsException.class, () -> buf.copyFrom(new byte[10], 0, 995, 10), "outside");
            assertRefused(IndexOutOfBoundsException.class, () -> buf.copyTo(new byte[10], 0, -1, 10));
            assertRefused(IndexOutOfBoundsException.class, () -> buf.copyFrom(new byte[10], 5, 0, 10));
            assertRefused(IndexOutOfBoundsException.class, () -> buf.copyFrom(new long[126]), "outside");
            assertRefused(IndexOutOfBoundsException.class, () -> buf.memset(1, 900, 101), "outside");
            assertRefused(IllegalArgumentException.class, () -> buf.memset(300), "0-255");
            assertRefused(IllegalArgumentException.class, () -> buf.copyFrom(ByteBuffer.allocate(10), 0), "not direct");
            assertRefused(IndexOutOfBoundsException.class, () -> buf.copyFrom(ByteBuffer.allocateDirect(2000), 0), "outside");
            assertRefused(NullPointerException.class, () -> buf.copyTo((ByteBuffer) null, 0));
            byte[] back = new byte[1000];
            buf.copyTo(back);
            assertArrayEquals(data, back, "the buffer holds its bytes after the refused calls");
            assertEquals(before.get("live_allocations") + 1, stat("live_allocations"));
        }
        Map<String, Long> after = bridge.statistics();
        assertEquals(before.get("live_allocations"), after.get("live_allocations"));
        assertEquals(before.get("in_use_bytes"), after.get("in_use_bytes"));
    }

    @Test
    void aClosedBufferRefusesEveryUseAndClosesOnce() {
        Map<String, Long> before = bridge.statistics();
        DeviceBuffer buf = bridge.allocate(1000);
        buf.close();
        buf.close(); // no effect
        assertFalse(buf.isAlive());
        assertRefused(IllegalStateException.class, () -> buf.copyTo(new byte[1000]), "was closed");
        assertRefused(IllegalStateException.class, () -> buf.memset(0), "was closed");
        assertEquals(0, bridge.free(buf), "freeing a closed buffer frees nothing");
        Map<String, Long> after = bridge.statistics();
        assertEquals(before.get("live_allocations"), after.get("live_allocations"));
        assertEquals(before.get("in_use_bytes"), after.get("in_use_bytes"));
    }

    @Test
    void aReleasedTasksBuffersAreDead() {
        byte[] data = new byte[10];
        DeviceBuffer leaked = bridge.allocate(4096);
        DeviceBuffer leaked2 = bridge.allocate(4096);
        task.release();
        assertFalse(leaked.isAlive());
        assertFalse(leaked2.isAlive());
        assertRefused(IllegalStateException.class, () -> leaked.copyFrom(data, 0, 0, 10), "is dead");
        assertRefused(IllegalStateException.class, () -> leaked.memset(0), "is dead");
        leaked.close(); // no effect: the release freed it
        assertEquals(0, bridge.free(leaked2), "freeing a dead buffer frees nothing");
        assertEquals(0L, stat("live_allocations"));
    }
}
