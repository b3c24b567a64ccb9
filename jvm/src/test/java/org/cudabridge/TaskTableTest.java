package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.concurrent.atomic.AtomicReference;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/** The Java task registry on the real bridge (emulated device): binds (and their refusals, with
 *  nothing left bound in Java or Python), releases one by one and batched, attachments. */
@Tag("own-jvm")
class TaskTableTest extends RunningBridge {
    @AfterEach
    void nothingLeftBound() {
        bridge.detach();
        assertEquals(0, bridge.tasksBound());
        assertEquals(0L, stat("tasks_bound"), "no task left bound in Python");
    }

    @Test
    void aBindMakesTheTaskCurrentAndItsReleaseEndsIt() {
        TaskScope t = bridge.bindTask(1);
        assertSame(t, bridge.currentTask());
        assertTrue(t.isBound() && t.stream() != 0);
        assertEquals(t.stream(), bridge.stream(), "stream() is the current task's");
        DeviceBuffer leak = bridge.allocate(4096);
        ReleaseReport r = bridge.releaseTask(1);
        assertEquals(ReleaseReport.of(1, 1, 4096), r);
        assertFalse(leak.isAlive());
        assertSame(r, t.release(), "a second release gives the first report");
        IllegalStateException e = assertThrows(IllegalStateException.class, bridge::currentTask);
        assertTrue(e.getMessage().contains("no task is bound"), e.getMessage());
    }

    @Test
    void withNoTaskBoundAllocateAndStreamAreRefused() {
        bridge.detach();
        assertRefused(IllegalStateException.class, () -> bridge.allocate(10), "no task is bound");
        assertRefused(IllegalStateException.class, bridge::stream, "no task is bound");
    }

    @Test
    void badBindsAreRefusedAndBindNothing() {
        long total = stat("tasks_bound_total");
        assertRefused(IllegalArgumentException.class, () -> bridge.bindTask(-1), "non-negative");
        assertRefused(NullPointerException.class, () -> bridge.bindTask(2, null, null), "priority");
        assertRefused(CudaBridgeException.class, () -> bridge.bindTask(2, "7"), "not owned");   // only Python knows
        assertEquals(0, bridge.tasksBound());
        assertEquals(total, stat("tasks_bound_total"), "no refused bind reached Python's count");
        try (TaskScope t = bridge.bindTask(2)) {
            assertRefused(IllegalStateException.class, () -> bridge.bindTask(2), "bound already");
            assertEquals(1, bridge.tasksBound(), t.toString());
            assertEquals(1L, stat("tasks_bound"));
        }
        assertRefused(IllegalStateException.class, () -> bridge.releaseTask(2), "not bound");   // released: unknown now
        assertRefused(IllegalStateException.class, () -> bridge.releaseTask(99), "not bound");
    }

    @Test
    void aTaskBoundOnOneThreadIsBoundAlreadyOnAnother() throws Exception {
        try (TaskScope t = bridge.bindTask(7)) {
            AtomicReference<Throwable> caught = new AtomicReference<>();
            Thread other = new Thread(() -> {
                try {
                    bridge.bindTask(7);
                } catch (Throwable e) {
                    caught.set(e);
                }
            });
            other.start();
            other.join();
            IllegalStateException e = assertInstanceOf(IllegalStateException.class, caught.get());
            assertTrue(e.getMessage().contains("bound already"), e.getMessage());
            assertSame(t, bridge.currentTask(), "this thread's task is untouched");
        }
    }

    @Test
    void badDeferredBindsAreRefusedAtOnceAndRegisterNothing() {
        assertRefused(IllegalArgumentException.class, () -> bridge.bindTaskDeferred(-2, null, Priority.NORMAL),
                "non-negative");
        assertRefused(NullPointerException.class, () -> bridge.bindTaskDeferred(14, null, null), "priority");
        assertEquals(0, bridge.tasksBound());
        TaskScope e = bridge.bindTaskDeferred(14, null, Priority.NORMAL);
        assertRefused(IllegalStateException.class, () -> bridge.bindTaskDeferred(14, null, Priority.NORMAL),
                "bound already");
        assertRefused(IllegalStateException.class, () -> bridge.bindTask(14), "bound already");
        assertEquals(0L, stat("tasks_bound"), "the refused synchronous bind left nothing in Python");
        assertEquals(1, bridge.tasksBound());
        e.release();
    }

    @Test
    void aDeferredBindReachesPythonOnlyWhenUsed() {
        TaskScope never = bridge.bindTaskDeferred(3, null, Priority.NORMAL);
        assertFalse(never.isBound());
        assertEquals(ReleaseReport.empty(3), never.release());
        assertTrue(never.wasNeverBound());
        TaskScope used = bridge.bindTaskDeferred(4, null, Priority.NORMAL);
        assertNotNull(bridge.allocate(256), "the first GPU call applies the bind");
        assertTrue(used.isBound());
        assertEquals(ReleaseReport.of(4, 1, 256), used.release());
    }

    @Test
    void aBatchReportsEachTaskInOrderAndAFailureAlone() {
        long total = stat("tasks_bound_total");
        TaskScope a = bridge.bindTask(10);
        DeviceBuffer aLeak = bridge.allocate(1000);
        TaskScope b = bridge.bindTaskDeferred(12, null, Priority.NORMAL); // never bound in Python
        TaskScope gone = bridge.bindTask(11);
        NativeBridge.releaseTask(11);                                  // released behind the Java API's back
        TaskScope first = bridge.bindTask(13);
        ReleaseReport firstReport = first.release();                   // released already
        TaskScope after = bridge.bindTask(14);                         // comes after the failure
        DeviceBuffer afterA = bridge.allocate(10);
        DeviceBuffer afterB = bridge.allocate(20);
        assertEquals(total + 4, stat("tasks_bound_total"), "the deferred one is not bound in Python");
        ReleaseReport[] r = bridge.releaseTasks(List.of(a, b, gone, first, after));
        assertEquals(5, r.length, "a report per scope");
        assertEquals(ReleaseReport.of(10, 1, 1000), r[0]);
        assertEquals(ReleaseReport.empty(12), r[1]);
        assertTrue(b.wasNeverBound());
        assertEquals(11, r[2].taskAttemptId());
        assertNotNull(r[2].failure());
        assertTrue(r[2].failure().contains("UnknownTask") && r[2].failure().contains("11")
                && r[2].failure().contains("not bound"), r[2].failure());
        assertSame(firstReport, r[3], "a released scope gives its first report");
        assertEquals(ReleaseReport.of(14, 2, 30), r[4], "the task after the failure is released too");
        assertFalse(aLeak.isAlive() || afterA.isAlive() || afterB.isAlive());
        assertTrue(a.isReleased() && gone.isReleased() && after.isReleased(), "all dead in Java");
        assertSame(r[0], a.release(), "a later release returns the batch's report");
        assertEquals(0, bridge.releaseTasks(List.of()).length, "an empty batch");
        assertEquals(0L, stat("live_allocations"));
    }

    @Test
    void anAttachmentLendsATaskToAnotherThreadAndRestoresItsOwn() throws Exception {
        TaskScope t = bridge.bindTask(20);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        Thread other = new Thread(() -> {
            try (TaskScope own = bridge.bindTask(21)) {
                try (Attachment a = bridge.attach(20)) {
                    assertSame(t, a.task());
                    assertEquals(t.stream(), bridge.stream());
                    bridge.allocate(64).close();
                }
                assertSame(own, bridge.currentTask(), "the thread's own task is back");
            } catch (Throwable e) {
                failed.set(e);
            }
        });
        other.start();
        other.join();
        assertNull(failed.get(), () -> String.valueOf(failed.get()));
        Attachment a = bridge.attach(20);
        Thread closer = new Thread(() -> {
            try {
                a.close();
            } catch (IllegalStateException e) {
                failed.set(e);
            }
        });
        closer.start();
        closer.join();
        assertNotNull(failed.get(), "an attachment closes only on its own thread");
        a.close();
        t.release();
    }

    @Test
    void aThreadWithoutATaskHasNoneAgainAfterItsAttachmentCloses() throws Exception {
        try (TaskScope t = bridge.bindTask(22)) {
            AtomicReference<Throwable> failed = new AtomicReference<>();
            Thread helper = new Thread(() -> {
                try {
                    try (Attachment a = bridge.attach(22)) {
                        assertSame(t, a.task());
                        assertEquals(t.stream(), bridge.stream(), "the attached thread sees the task's stream");
                        bridge.allocate(64).close();
                    }
                    assertRefused(IllegalStateException.class, bridge::stream, "no task is bound");
                } catch (Throwable e) {
                    failed.set(e);
                }
            });
            helper.start();
            helper.join();
            assertNull(failed.get(), () -> String.valueOf(failed.get()));
        }
    }

    @Test
    void attachingAnUnknownTaskSaysSo() {
        CudaBridgeException e = assertThrows(CudaBridgeException.class, () -> bridge.attach(999_999));
        assertTrue(e.getMessage().contains("999999") && e.getMessage().contains("not bound"), e.getMessage());
    }
}
