package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.util.Map;
import java.util.Random;

import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Sixteen threads, each its own task, mixing sizes around the split threshold (chunks of 512 KiB
 * and more have their host copy split over stagingCopyThreads threads: bridge/host_copy.h) with
 * 1 MiB slots, through every staged source: Java heap arrays, pageable off-heap memory copied by
 * address (Unsafe's, as Arrow's is), and plain direct ByteBuffers (allocateDirect). Copies go in
 * by one kind and out by another, and every byte is checked. These are the C ring and its helper
 * threads over the GPU's shared staging slots (fewer than the threads: copies wait for slots, and
 * with a wait too short for them, copy through pageable memory); no copy allocates pinned memory,
 * and every slot is back when the copies end. On the emulated device too: its driver table runs
 * the same C copies (device/emulated_driver.py).
 */
@Tag("own-jvm")
class StagedCopyThreadsTest {
    @Test
    void sixteenThreadsMixingSizesHeapAndOffHeapEveryByteChecked() throws Exception {
        sixteenThreads(false);
    }

    /** {@code starved}: one staging slot and a wait of 1 us, so that most copies find none in time
     *  (StagedCopyStarvedTest: a bridge's settings are fixed for its JVM). */
    static void sixteenThreads(boolean starved) throws Exception {
        Class<?> uc = Class.forName("sun.misc.Unsafe");   // by reflection: no compile-time use of it
        Field f = uc.getDeclaredField("theUnsafe");
        f.setAccessible(true);
        Object unsafe = f.get(null);
        Method allocate = uc.getMethod("allocateMemory", long.class);
        Method free = uc.getMethod("freeMemory", long.class);
        Method copy = uc.getMethod("copyMemory", Object.class, long.class, Object.class, long.class, long.class);
        long base = (long) (int) uc.getMethod("arrayBaseOffset", Class.class).invoke(unsafe, byte[].class);
        CudaBridge bridge = CudaBridge.start(BridgeOptions.fromSystemProperties()
                .set("stagingSlots", "3").set("stagingSlotBytes", "1m").set("stagingCopyThreads", "4")
                .set("stagingCopies", starved ? "1" : "4").set("stagingWait", starved ? "0.000001" : "5"));
        try {
            Concurrently.run(16, id -> {
                try (TaskScope scope = bridge.bindTask(200 + id)) {
                    Random rnd = new Random(id);
                    int[] sizes = {0, 1, 524_287, 524_288, 600_001, 1 << 20, (1 << 20) + 1, (3 << 20) + 13};
                    for (int k = 0; k < sizes.length; k++) {
                        int size = sizes[(k + id) % sizes.length];   // threads meet different sizes at once
                        byte[] src = new byte[size + 32];
                        rnd.nextBytes(src);
                        long off = (long) allocate.invoke(unsafe, (long) size + 1);
                        try (DeviceBuffer buf = bridge.allocate(Math.max(1, size + 16))) {
                            int kind = (k + id) % 3;   // 0: heap in, address out; 1: the reverse; 2: direct both ways
                            byte[] got = new byte[size];
                            if (kind == 0) {
                                buf.copyFrom(src, 5, 9, size);
                                buf.copyToAddress(off, size, 9);
                                copy.invoke(unsafe, null, off, got, base, (long) size);
                            } else if (kind == 1) {
                                copy.invoke(unsafe, src, base + 5, null, off, (long) size);
                                buf.copyFromAddress(off, size, 9);
                                buf.copyTo(got, 0, 9, size);
                            } else {
                                ByteBuffer in = ByteBuffer.allocateDirect(size).put(src, 5, size).flip();
                                ByteBuffer out = ByteBuffer.allocateDirect(size);
                                buf.copyFrom(in, 9);
                                buf.copyTo(out, 9);
                                out.get(got);
                            }
                            byte[] want = new byte[size];
                            System.arraycopy(src, 5, want, 0, size);
                            assertArrayEquals(want, got, "thread " + id + ", " + size + " bytes, kind " + kind);
                        } finally {
                            free.invoke(unsafe, off);
                        }
                    }
                    assertEquals(200 + id, scope.taskAttemptId());
                }
            });
            // staging is the GPU's slots, reserved at the start and given back by every copy as it
            // ended; no copy took pinned memory of its own, and none is held now
            Map<String, Long> st = bridge.statistics();
            String all = st.toString();
            assertEquals((starved ? 1L : 4L) << 20, st.get("staging_reserved_bytes"), all);
            assertEquals(0, st.get("staging_slots_held"), all);
            assertEquals(0, st.get("staging_slots_lost"), all);
            assertTrue(st.get("staging_slots_held_peak") <= (starved ? 1 : 4), all);
            assertEquals(0, st.get("pinned_in_use_bytes"), all);
            assertEquals(0, st.get("pinned_fallbacks_host_alloc"), all);
            assertTrue(st.get("staging_copies") > 0, all);
            if (starved) {
                assertTrue(st.get("staging_fallbacks_pageable") > 0, all);
            } else {
                assertEquals(0, st.get("staging_fallbacks_pageable"), all);
            }
        } finally {
            bridge.shutdown();
        }
    }
}
