package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * Issue 23 item 3: {@link DeviceBuffer#close()} documents that a close after its task's release has
 * no effect, and so must one racing it: a thread closing buffers (one by one and in batches) while
 * the task's own thread releases the task got {@code InvalidFree} (18 of 120,000 closes); each
 * buffer is freed once, by its close or as the release's leak. And threads allocating while the
 * bridge shuts down end with the shutdown error, not {@code InvalidFree} (6 of 8 threads did).
 */
@Tag("own-jvm")
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class CloseReleaseRaceTest extends RunningBridge {
    @Test
    @Order(1)
    void closesRacingTheirTasksReleaseNeverThrowAndFreeEachBufferOnce() throws Exception {
        int rounds = 150;
        int closers = 4;
        int each = 120;
        long before = stat("bridge_frees") + stat("bridge_batched_frees");
        long leaks = 0;
        List<Throwable> failures = Collections.synchronizedList(new ArrayList<>());
        for (int round = 0; round < rounds; round++) {
            TaskScope scope = bridge.bindTask(5000 + round);
            DeviceBuffer[] bufs = new DeviceBuffer[closers * each];
            for (int i = 0; i < bufs.length; i++) {
                bufs[i] = bridge.allocate(256);
            }
            CyclicBarrier go = new CyclicBarrier(closers + 1);
            List<Thread> threads = new ArrayList<>();
            for (int c = 0; c < closers; c++) {
                int from = c * each;
                Random rng = new Random(round * 31L + c);
                Thread closer = new Thread(() -> {
                    try {
                        go.await(30, TimeUnit.SECONDS);
                        for (int i = from; i < from + each; ) {
                            int n = rng.nextInt(4) == 0 ? 5 : 1;   // one by one, or a batch
                            if (n == 1) {
                                bufs[i].close();
                            } else {
                                bridge.free(Arrays.copyOfRange(bufs, i, Math.min(from + each, i + n)));
                            }
                            i += n;
                        }
                    } catch (Throwable e) {
                        failures.add(e);
                    }
                }, "closer-" + round + "-" + c);
                threads.add(closer);
                closer.start();
            }
            go.await(30, TimeUnit.SECONDS);
            Thread.sleep(0, new Random(round).nextInt(400_000));
            leaks += scope.release().leaksReclaimed();   // the release, racing the closes
            for (Thread t : threads) {
                t.join(30_000);
                assertFalse(t.isAlive(), "a closing thread hung");
            }
        }
        assertTrue(failures.isEmpty(), failures.size() + " close(s) that raced their task's release threw: " + failures);
        long freed = stat("bridge_frees") + stat("bridge_batched_frees") - before;
        assertEquals(rounds * (long) closers * each, freed + leaks, "each buffer freed once: " + freed
                + " by its close, " + leaks + " by its release");
        assertEquals(0, stat("in_use_bytes"));
    }

    @Test
    @Order(2)
    void threadsAllocatingWhileTheBridgeShutsDownGetTheShutdownError() throws Exception {
        int threads = 8;
        CyclicBarrier go = new CyclicBarrier(threads + 1);
        List<Throwable> ends = Collections.synchronizedList(new ArrayList<>());
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            long task = 6000 + t;
            Thread w = new Thread(() -> {
                try {
                    bridge.bindTask(task);
                    go.await(30, TimeUnit.SECONDS);
                    while (true) {
                        DeviceBuffer b = bridge.allocate(4096);
                        b.close();
                    }
                } catch (Throwable e) {
                    ends.add(e);
                }
            }, "allocator-" + t);
            workers.add(w);
            w.start();
        }
        go.await(30, TimeUnit.SECONDS);
        Thread.sleep(50);
        bridge.shutdown();
        for (Thread w : workers) {
            w.join(30_000);
            assertFalse(w.isAlive(), "an allocating thread hung");
        }
        assertEquals(threads, ends.size());
        for (Throwable e : ends) {
            assertTrue(e instanceof IllegalStateException && e.getMessage().contains("cudabridge was shut down"),
                    "not the shutdown error: " + e);
        }
    }
}
