package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicBoolean;

import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * No staging mutex is held across a driver call. On the emulated device the driver runs Python,
 * which may drop the GIL inside any call (here every event query sleeps: tests/faulty_backend.py's
 * slow_event_queries); a quick copy that asked its slot's event with the GIL's mutex held let a
 * thread holding the GIL (statistics) wait for that mutex while the quick copy waited for the GIL,
 * and both waited for ever (jvm/staging_pool.h). Four threads of small copies through one
 * staging slot, and a thread reading the statistics all the while. A JVM of its own: the bridge's
 * settings are fixed for its JVM.
 */
@Tag("own-jvm")
class StagingDriverCallTest {
    @Test
    void quickCopiesAndStatisticsTogetherNeverDeadlock() throws Exception {
        CudaBridge bridge = CudaBridge.start(BridgeOptions.fromSystemProperties()
                .addPythonPath(Path.of("tests").toAbsolutePath().toString())
                .set("backendWrapper", "faulty_backend:slow_event_queries")
                .set("stagingCopies", "1").set("stagingSlotBytes", "64k").set("stagingWait", "5"));
        AtomicBoolean stop = new AtomicBoolean();
        Thread statistics = new Thread(() -> {
            while (!stop.get()) {
                bridge.statistics();
            }
        }, "statistics");
        statistics.start();
        try {
            Concurrently.run(4, id -> {
                try (TaskScope scope = bridge.bindTask(300 + id); DeviceBuffer buf = bridge.allocate(4096)) {
                    assertEquals(300 + id, scope.taskAttemptId());
                    byte[] in = new byte[4096];
                    byte[] out = new byte[4096];
                    for (int k = 0; k < 40; k++) {
                        Arrays.fill(in, (byte) (id * 40 + k));
                        buf.copyFrom(in);   // small: the quick path, one slot whose event is asked each time
                        buf.copyTo(out);
                        assertArrayEquals(in, out, "thread " + id + ", round " + k);
                    }
                }
            });
            stop.set(true);
            statistics.join();
            long quick = bridge.statistics().get("staging_quick_copies");
            assertTrue(quick > 0, "the small copies took the quick path (" + quick + ")");
        } finally {
            stop.set(true);
            statistics.join();
            bridge.shutdown();
        }
    }
}
