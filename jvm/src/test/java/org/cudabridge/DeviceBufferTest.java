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
 * (heap arrays of each type at offsets, direct and pinned ByteBuffers, device to device), memset
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
            other.copyTo(pinned.buffer(), 0);
            bridge.synchronize();
            ByteBuffer pb = pinned.buffer();
            for (int i = 0; i < 4096; i++) {
                assertEquals((byte) (i * 7), pb.get(i), "byte " + i);
            }
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
