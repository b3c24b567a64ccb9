package org.cudabridge.executor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.cudabridge.ReleaseReport;
import org.cudabridge.TaskScope;
import org.junit.jupiter.api.Test;

/** The lifecycle thread with a recording Work: order, batches and the pending count. No bridge:
 *  the scopes are null placeholders that the recording Work only counts. */
class LifecycleThreadTest {
    static final class Recording implements LifecycleThread.Work {
        final List<String> calls = Collections.synchronizedList(new ArrayList<>());
        final CountDownLatch gate;

        Recording(CountDownLatch gate) {
            this.gate = gate;
        }

        @Override
        public void applyBind(TaskScope scope) {
            calls.add("bind");
        }

        @Override
        public ReleaseReport[] releaseNow(List<TaskScope> scopes) {
            try {
                gate.await(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            calls.add("release x" + scopes.size());
            return new ReleaseReport[scopes.size()];
        }
    }

    @Test
    void releasesQueuedTogetherGoAsOneBatchInOrderWithTheBinds() throws Exception {
        ExecutorCounters counters = new ExecutorCounters();
        CountDownLatch gate = new CountDownLatch(1);
        Recording work = new Recording(gate);
        LifecycleThread t = new LifecycleThread("test-lifecycle", work, counters);
        try {
            t.release(null);                 // the thread takes this one and waits at the gate
            long deadline = System.nanoTime() + 5_000_000_000L;
            while (t.pending() == 1 && work.calls.isEmpty() && System.nanoTime() < deadline && !gateReached(t)) {
                Thread.sleep(1);
            }
            t.release(null);
            t.release(null);
            t.bindAhead(null);
            t.release(null);
            assertEquals(4, t.pending(), "counted before it is done");
            gate.countDown();
            t.finish(10_000_000_000L);
            assertEquals(0, t.pending());
            assertEquals(List.of("release x1", "release x2", "bind", "release x1"), work.calls);
        } finally {
            t.stop();
        }
    }

    /** Gives the lifecycle thread its first poll interval to take the first release. */
    private static boolean gateReached(LifecycleThread t) throws InterruptedException {
        Thread.sleep(LifecycleThread.POLL_NANOS / 1_000_000 + 20);
        return true;
    }

    @Test
    void anIdleThreadWakesForTheNextHandOver() throws Exception {
        ExecutorCounters counters = new ExecutorCounters();
        CountDownLatch open = new CountDownLatch(0);
        Recording work = new Recording(open);
        LifecycleThread t = new LifecycleThread("test-lifecycle-idle", work, counters);
        try {
            Thread.sleep(LifecycleThread.IDLE_NANOS / 1_000_000 + 100);   // parked now
            long t0 = System.nanoTime();
            t.release(null);
            t.finish(5_000_000_000L);
            assertEquals(List.of("release x1"), work.calls);
            assertTrue(System.nanoTime() - t0 < 900_000_000L, "woken by the hand-over, not by its 1 s timeout");
        } finally {
            t.stop();
        }
    }
}
