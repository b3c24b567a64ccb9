package org.cudabridge.executor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicBoolean;

import org.junit.jupiter.api.Test;

/** KillWatch: a running task whose interrupted flag turns true is cancelled once, promptly; an ended one never. */
class KillWatchTest {
    @Test
    void aKilledTaskIsCancelledOnceAndAnEndedOneNever() throws Exception {
        List<Long> cancelled = new CopyOnWriteArrayList<>();
        KillWatch w = new KillWatch("test-kill-watch", cancelled::add);
        try {
            AtomicBoolean killed1 = new AtomicBoolean();
            AtomicBoolean killed2 = new AtomicBoolean();
            w.started(1, killed1::get);
            w.started(2, killed2::get);
            Thread.sleep(3 * KillWatch.POLL_NANOS / 1_000_000);
            assertTrue(cancelled.isEmpty());
            w.ended(2);
            killed2.set(true);   // ended before: never cancelled
            killed1.set(true);
            long deadline = System.nanoTime() + 5_000_000_000L;
            while (cancelled.isEmpty() && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            Thread.sleep(3 * KillWatch.POLL_NANOS / 1_000_000);
            assertEquals(List.of(1L), cancelled);
            assertEquals(1, w.running());
            w.ended(1);
            assertEquals(0, w.running());
        } finally {
            w.stop();
        }
    }

    @Test
    void aFailingCancelIsSwallowedAndTheWatchGoesOn() throws Exception {
        List<Long> cancelled = new CopyOnWriteArrayList<>();
        KillWatch w = new KillWatch("test-kill-watch-2", t -> {
            cancelled.add(t);
            if (t == 5) {
                throw new IllegalStateException("shut down");
            }
        });
        try {
            w.started(5, () -> true);
            w.started(6, () -> true);
            long deadline = System.nanoTime() + 5_000_000_000L;
            while (cancelled.size() < 2 && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            assertTrue(cancelled.containsAll(List.of(5L, 6L)), cancelled.toString());
        } finally {
            w.stop();
        }
    }
}
