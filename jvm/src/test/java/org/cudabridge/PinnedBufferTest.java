package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;

import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Pinned buffers from the executor's pinned pool (issue 16 item 2): served from one reservation,
 * counted while held, back in the pool after close (reused only once their copies passed), and a
 * request larger than the pool served by its own allocation (counted as a fallback).
 */
@Tag("own-jvm")
class PinnedBufferTest extends RunningBridge {
    @Test
    void pinnedBuffersComeFromThePoolAndAreCounted() {
        try (TaskScope t = bridge.bindTask(8801); DeviceBuffer dev = bridge.allocate(1 << 20)) {
            long fallbacks = stat("pinned_fallbacks_host_alloc");
            PinnedBuffer a = bridge.allocatePinned(1 << 20);
            assertTrue(a.isPinned());
            assertEquals(64L << 20, stat("pinned_reserved_bytes"), "the default pool, reserved at first use");
            assertEquals(1L << 20, stat("pinned_in_use_bytes"));
            ByteBuffer b = a.buffer();
            for (int i = 0; i < b.capacity(); i++) b.put(i, (byte) (i * 13));
            dev.copyFromAsync(b, 0);                            // asynchronous from the pool's memory
            a.close();                                          // back to the pool; reused after the copy
            PinnedBuffer c = bridge.allocatePinned(1 << 20);
            ByteBuffer back = c.buffer();
            dev.copyToAsync(back, 0);
            bridge.synchronize();
            byte[] want = new byte[1 << 20];
            for (int i = 0; i < want.length; i++) want[i] = (byte) (i * 13);
            byte[] got = new byte[1 << 20];
            back.get(0, got);
            assertArrayEquals(want, got, "the copy read the first buffer before anything reused it");
            PinnedBuffer huge = bridge.allocatePinned(65L << 20);  // larger than the pool
            assertTrue(huge.isPinned());
            assertEquals(fallbacks + 1, stat("pinned_fallbacks_host_alloc"));
            huge.close();
            c.close();
            assertEquals(0, stat("pinned_in_use_bytes"));
            assertThrows(IllegalArgumentException.class, () -> bridge.allocatePinned(0));
            assertEquals(8801, t.taskAttemptId());
        }
    }

    @Test
    void aTasksPinnedBuffersAreReclaimedAtItsRelease() {
        long reclaimed = stat("bridge_pinned_reclaimed");
        PinnedBuffer kept;
        PinnedBuffer free;
        try (TaskScope t = bridge.bindTask(8802)) {
            kept = bridge.allocatePinned(4096);                  // never closed by the task
            assertEquals(8802, t.taskAttemptId());
        }
        assertEquals(reclaimed + 1, stat("bridge_pinned_reclaimed"));
        assertTrue(kept.isClosed());
        assertThrows(IllegalStateException.class, kept::buffer);
        kept.close();                                           // a no-op: the release reclaimed it
        free = bridge.allocatePinned(4096);                     // no task bound: held until close()
        assertEquals(4096, stat("pinned_in_use_bytes"));
        free.close();
        assertEquals(0, stat("pinned_in_use_bytes"));
    }
}
