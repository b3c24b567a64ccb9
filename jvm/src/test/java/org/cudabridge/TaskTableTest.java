package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.concurrent.atomic.AtomicReference;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/** The Java task registry on the real bridge (emulated device): binds, releases, attachments. */
@Tag("own-jvm")
class TaskTableTest {
    static CudaBridge bridge;

    @BeforeAll
    static void start() {
        bridge = CudaBridge.start();
    }

    @AfterAll
    static void stop() {
        bridge.shutdown();
    }

    @AfterEach
    void nothingLeftBound() {
        bridge.detach();
        assertEquals(0, bridge.tasksBound());
    }

    @Test
    void aBindMakesTheTaskCurrentAndItsReleaseEndsIt() {
        TaskScope t = bridge.bindTask(1);
        assertSame(t, bridge.currentTask());
        assertTrue(t.isBound() && t.stream() != 0);
        DeviceBuffer leak = bridge.allocate(4096);
        ReleaseReport r = bridge.releaseTask(1);
        assertEquals(ReleaseReport.of(1, 1, 4096), r);
        assertFalse(leak.isAlive());
        assertSame(r, t.release(), "a second release gives the first report");
        IllegalStateException e = assertThrows(IllegalStateException.class, bridge::currentTask);
        assertTrue(e.getMessage().contains("no task is bound"), e.getMessage());
    }

    @Test
    void badBindsAreRefusedAndBindNothing() {
        assertThrows(IllegalArgumentException.class, () -> bridge.bindTask(-1));
        assertThrows(NullPointerException.class, () -> bridge.bindTask(2, null, null));
        try (TaskScope t = bridge.bindTask(2)) {
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> bridge.bindTask(2));
            assertTrue(e.getMessage().contains("bound already"), e.getMessage());
            assertEquals(1, bridge.tasksBound(), t.toString());
        }
        assertThrows(IllegalStateException.class, () -> bridge.releaseTask(2), "released: unknown now");
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
        TaskScope a = bridge.bindTask(10);
        bridge.allocate(1000);
        TaskScope gone = bridge.bindTask(11);
        NativeBridge.releaseTask(11);                                  // released behind the Java API's back
        TaskScope b = bridge.bindTaskDeferred(12, null, Priority.NORMAL); // never bound in Python
        ReleaseReport[] r = bridge.releaseTasks(List.of(a, gone, b));
        assertEquals(ReleaseReport.of(10, 1, 1000), r[0]);
        assertEquals(11, r[1].taskAttemptId());
        assertNotNull(r[1].failure());
        assertTrue(r[1].failure().contains("UnknownTask") && r[1].failure().contains("11"), r[1].failure());
        assertEquals(ReleaseReport.empty(12), r[2]);
        assertSame(r[0], a.release());
        assertTrue(gone.isReleased() && b.wasNeverBound());
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
    void attachingAnUnknownTaskSaysSo() {
        CudaBridgeException e = assertThrows(CudaBridgeException.class, () -> bridge.attach(999_999));
        assertTrue(e.getMessage().contains("999999"), e.getMessage());
    }
}
