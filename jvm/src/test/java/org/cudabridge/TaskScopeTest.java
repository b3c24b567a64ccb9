package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * A task scope on the real bridge (emulated device): its release reclaims what the task still
 * holds, once; a deferred bind ({@link CudaBridge#bindTaskDeferred}) reaches Python only when
 * applied (by the task's first GPU call or by {@link TaskScope#applyBind()} on another thread),
 * exactly once when both race; a scope released before anyone applied it is never bound in Python;
 * a bind only Python refuses fails the task's first GPU call with the reason and leaves nothing.
 * Python's own counts ({@code tasks_bound}, {@code tasks_bound_total}) are checked alongside Java's.
 */
@Tag("own-jvm")
class TaskScopeTest extends RunningBridge {
    @AfterEach
    void nothingLeftBound() {
        bridge.detach();
        assertEquals(0, bridge.tasksBound(), "no task left in Java");
        assertEquals(0L, stat("tasks_bound"), "no task left in Python");
        assertEquals(0L, stat("live_allocations"));
    }

    @Test
    void aReleaseReclaimsTheTasksLeaksOnceAndRepeatsItsReport() {
        TaskScope t = bridge.bindTask(3);
        bridge.allocate(4096);
        bridge.allocate(4096);
        ReleaseReport rep = t.release();
        assertEquals(2, rep.leaksReclaimed(), rep.toString());
        assertEquals(8192, rep.leakedBytesReclaimed(), rep.toString());
        assertTrue(t.isReleased());
        assertSame(rep, t.release(), "a second release returns the first report");
        assertRefused(IllegalStateException.class, () -> bridge.allocate(10), "no task is bound");
    }

    @Test
    void theFirstGpuCallAppliesADeferredBind() {
        long bound0 = stat("tasks_bound_total");
        TaskScope a = bridge.bindTaskDeferred(10, null, Priority.NORMAL);
        assertFalse(a.isBound(), "not bound in Python before any GPU use");
        assertEquals(bound0, stat("tasks_bound_total"));
        assertSame(a, bridge.currentTask(), "current task set at once");
        try (DeviceBuffer buf = bridge.allocate(256)) {
            assertTrue(a.isBound(), "the allocate bound it");
            assertEquals(bound0 + 1, stat("tasks_bound_total"));
            assertNotEquals(0L, a.stream());
            assertEquals(a.stream(), buf.stream(), "buffer on the task's stream");
            buf.memset(7);
        }
        assertFalse(a.applyBind(), "applyBind after the bind does nothing");
        assertEquals(0, a.release().leaksReclaimed());
        assertEquals(0L, stat("tasks_bound"), "released in Python");
        assertEquals(bound0 + 1, stat("tasks_bound_total"));
    }

    @Test
    void aScopeReleasedBeforeItsBindWasAppliedIsNeverBoundInPython() {
        long bound0 = stat("tasks_bound_total");
        TaskScope never = bridge.bindTaskDeferred(11, null, Priority.NORMAL);
        ReleaseReport r = never.release();
        assertEquals(0, r.leaksReclaimed());
        assertTrue(never.wasNeverBound());
        assertEquals(bound0, stat("tasks_bound_total"), "never bound in Python");
        assertFalse(never.applyBind(), "applyBind after the release does nothing");
        assertRefused(IllegalStateException.class, never::stream, "released");
        assertRefused(IllegalStateException.class, () -> bridge.allocate(10), "no task is bound");
    }

    @Test
    void applyBindOnAnotherThreadBindsOnceAndTheTasksThreadSeesTheStream() throws Exception {
        long bound0 = stat("tasks_bound_total");
        TaskScope c = bridge.bindTaskDeferred(12, null, Priority.HIGH);
        AtomicBoolean applied = new AtomicBoolean();
        Thread t = new Thread(() -> applied.set(c.applyBind()));
        t.start();
        t.join();
        assertTrue(applied.get(), "applyBind on another thread did the bind");
        assertTrue(c.isBound());
        assertEquals(bound0 + 1, stat("tasks_bound_total"), "bound once, by the other thread");
        assertEquals(c.stream(), bridge.stream(), "the task's thread sees the stream");
        DeviceBuffer leak = bridge.allocate(4096);
        ReleaseReport rc = c.release();
        assertEquals(1, rc.leaksReclaimed(), rc.toString());
        assertFalse(leak.isAlive());
        assertEquals(bound0 + 1, stat("tasks_bound_total"), "no second bind");
    }

    @Test
    void aBindOnlyPythonRefusesFailsTheFirstGpuCallAndLeavesNothing() {
        long bound0 = stat("tasks_bound_total");
        TaskScope d = bridge.bindTaskDeferred(13, "7", Priority.NORMAL);
        assertNull(d.bindFailure(), "no failure before the bind is applied");
        assertRefused(CudaBridgeException.class, () -> bridge.allocate(10), "could not be bound", "not owned");
        String why = d.bindFailure();
        assertTrue(why != null && why.contains("not owned"), "bindFailure says why: " + why);
        assertRefused(CudaBridgeException.class, bridge::stream, "not owned");
        assertFalse(d.applyBind(), "applyBind of a failed bind does nothing");
        assertEquals(0, d.release().leaksReclaimed(), "a failed bind releases nothing");
        assertEquals(bound0, stat("tasks_bound_total"), "nothing was bound in Python");
    }

    @Test
    void racersSeeTheOneStreamAndEachTaskIsBoundOnce() throws Exception {
        int tasks = 200;
        int racers = 4;
        long bound0 = stat("tasks_bound_total");
        AtomicLong wrong = new AtomicLong();
        for (int k = 0; k < tasks; k++) {
            TaskScope x = bridge.bindTaskDeferred(1000 + k, null, Priority.NORMAL);
            CountDownLatch go = new CountDownLatch(1);
            List<Thread> ts = new ArrayList<>();
            long[] seen = new long[racers];
            for (int j = 0; j < racers; j++) {
                final int jj = j;
                Thread th = new Thread(() -> {
                    try {
                        go.await();
                        if (jj == 0) {
                            x.applyBind();
                        } else {
                            seen[jj] = x.stream();
                        }
                    } catch (Throwable ex) {
                        wrong.incrementAndGet();
                    }
                });
                th.start();
                ts.add(th);
            }
            go.countDown();
            for (Thread th : ts) {
                th.join();
            }
            for (int j = 1; j < racers; j++) {
                if (seen[j] != x.stream()) {
                    wrong.incrementAndGet();
                }
            }
            x.release();
        }
        assertEquals(0, wrong.get(), "every racer saw the one stream");
        assertEquals(bound0 + tasks, stat("tasks_bound_total"), "each raced task bound exactly once in Python");
    }
}
