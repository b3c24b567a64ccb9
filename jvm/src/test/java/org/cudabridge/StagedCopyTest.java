package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.Random;

import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Heap-array copies through a tiny staging ring (2 slots of 4 KiB), so that every copy of more
 * than 8 KiB reuses each slot several times within one call: chunk order, a partial last chunk,
 * copies shorter than a slot, zero-length copies, offsets on both sides, and eight threads (each
 * its own task and ring) interleaving copies in and out. Every byte is checked. On a GPU the ring
 * is the pinned one of bridge/staging_ring.h (a slot rewritten before its DMA finished would
 * corrupt a chunk); on the emulated device the Python path runs the same checks.
 */
@Tag("own-jvm")
class StagedCopyTest {
    @Test
    void everyByteArrivesThroughATinyRingFromManyThreads() throws Exception {
        CudaBridge bridge = CudaBridge.start(BridgeOptions.fromSystemProperties()
                .set("stagingSlots", "2").set("stagingSlotBytes", "4096"));
        try {
            Concurrently.run(8, id -> {
                try (TaskScope scope = bridge.bindTask(100 + id)) {
                    Random rnd = new Random(id);
                    for (int size : new int[] {0, 1, 4095, 4096, 4097, 8192, 8193, 3 * 4096 + 17, 1 << 20}) {
                        byte[] src = new byte[size + 64];
                        rnd.nextBytes(src);
                        try (DeviceBuffer buf = bridge.allocate(Math.max(1, size + 32))) {
                            buf.copyFrom(src, 7, 5, size);           // a source and a device offset
                            byte[] back = new byte[size + 64];
                            buf.copyTo(back, 3, 5, size);
                            byte[] want = new byte[size];
                            System.arraycopy(src, 7, want, 0, size);
                            byte[] got = new byte[size];
                            System.arraycopy(back, 3, got, 0, size);
                            assertArrayEquals(want, got, "thread " + id + ", " + size + " bytes");
                        }
                    }
                    int[] ints = new int[50_000];                      // an int[] of several chunks
                    for (int i = 0; i < ints.length; i++) ints[i] = i * 31 + id;
                    try (DeviceBuffer buf = bridge.allocate(4L * ints.length)) {
                        buf.copyFrom(ints);
                        int[] back = new int[ints.length];
                        buf.copyTo(back);
                        assertArrayEquals(ints, back);
                    }
                    assertEquals(100 + id, scope.taskAttemptId());
                }
            });
        } finally {
            bridge.shutdown();
        }
    }
}
