package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The JNI natives called straight, past the Java API's checks (as NativeBridge's comment says tests
 * may): the C side checks its arrays and counts, and Python refuses every handle that is not live;
 * a refused batch changes nothing. How Python's errors are typed in Java: {@link CudaBridgeExceptionTest}.
 */
@Tag("own-jvm")
class NativeBridgeTest extends RunningBridge {
    @AfterEach
    void nothingLeft() {
        bridge.detach();
        assertEquals(0, bridge.tasksBound());
        assertEquals(0L, stat("live_allocations"));
    }

    @Test
    void aReleasedTasksHandleIsNotFreedAgainAndAHandleNeverHandedOutIsRefused() {
        TaskScope t = bridge.bindTask(1);
        DeviceBuffer leaked = bridge.allocate(4096);
        assertEquals(1, t.release().leaksReclaimed());
        long live = stat("live_allocations");
        long frees = stat("bridge_frees") + stat("bridge_batched_frees");
        // past Java's own check (a close racing the release gets here): the release freed it, so
        // a free has no effect and counts nothing (issue 23 item 3)
        NativeBridge.free(leaked.handle());
        NativeBridge.freeMany(new long[] {leaked.handle()}, 1);
        assertEquals(live, stat("live_allocations"));
        assertEquals(frees, stat("bridge_frees") + stat("bridge_batched_frees"));
        long bogus = leaked.handle() + (1L << 30 << 6);          // never handed out
        assertRefused(CudaBridgeException.class, () -> NativeBridge.free(bogus), "not live");
        assertRefused(CudaBridgeException.class, () -> NativeBridge.freeMany(new long[] {leaked.handle(), bogus}, 2),
                "nothing was freed");
    }

    @Test
    void aBatchWithABogusHandleOrADuplicateFreesNothing() {
        try (TaskScope t = bridge.bindTask(2)) {
            DeviceBuffer x = bridge.allocate(100);
            DeviceBuffer y = bridge.allocate(100);
            long live = stat("live_allocations");
            assertRefused(CudaBridgeException.class, () -> NativeBridge.freeMany(new long[] {x.handle(), 0x77}, 2),
                    "nothing was freed");
            assertRefused(CudaBridgeException.class, () -> NativeBridge.freeMany(new long[] {x.handle(), x.handle()}, 2),
                    "twice");
            assertEquals(live, stat("live_allocations"), "nothing freed by the refused batches");
            assertTrue(x.isAlive() && y.isAlive(), t.toString());
            assertEquals(2, bridge.free(x, y, x));
        }
    }

    @Test
    void allocateAndTaskStreamRefuseAnOutArrayTooShortBeforePythonAllocates() {
        try (TaskScope t = bridge.bindTask(4)) {
            long live = stat("live_allocations");
            assertRefused(IllegalArgumentException.class, () -> NativeBridge.allocate(4, 64, new long[1]), "long[2]");
            assertRefused(IllegalArgumentException.class, () -> NativeBridge.allocate(4, 64, null), "long[2]");
            assertEquals(live, stat("live_allocations"), "nothing was allocated");
            assertRefused(IllegalArgumentException.class, () -> NativeBridge.taskStream(4, new long[1]), "long[2]");
            long[] out = new long[2];
            NativeBridge.taskStream(4, out);
            assertEquals(t.stream(), out[0]);
        }
    }

    @Test
    void freeManyRefusesACountPastItsArray() {
        assertThrows(IndexOutOfBoundsException.class, () -> NativeBridge.freeMany(new long[1], 2));
    }

    @Test
    void releaseTasksChecksItsArrays() {
        assertThrows(NullPointerException.class, () -> NativeBridge.releaseTasks(null, 0, new long[0]));
        assertRefused(IndexOutOfBoundsException.class, () -> NativeBridge.releaseTasks(new long[1], 2, new long[4]),
                "outside");
        assertRefused(IndexOutOfBoundsException.class, () -> NativeBridge.releaseTasks(new long[2], 2, new long[3]),
                "shorter");
    }

    @Test
    void releaseTasksFailsAnUnknownIdAloneWithAMessage() {
        long[] outs = new long[2];
        String[] failures = NativeBridge.releaseTasks(new long[] {424242}, 1, outs);
        assertNotNull(failures, "a failed release returns the messages");
        assertEquals(1, failures.length);
        assertNotNull(failures[0]);
        assertTrue(failures[0].contains("424242"), failures[0]);
        assertEquals(-1, outs[0]);
        assertEquals(-1, outs[1]);
    }

    @Test
    void releaseTasksReturnsNullWhenEveryReleaseSucceeded() {
        TaskScope t = bridge.bindTask(3);
        bridge.allocate(512);
        long[] outs = new long[2];
        assertNull(NativeBridge.releaseTasks(new long[] {3}, 1, outs));
        assertEquals(1, outs[0]);
        assertEquals(512, outs[1]);
        assertFalse(t.isReleased(), "released behind the Java API's back: Java still holds the scope");
        ReleaseReport r = bridge.releaseTasks(List.of(t))[0];
        assertNotNull(r.failure(), "its release through the API then fails in Python: " + r);
        assertTrue(t.isReleased());
    }

    /**
     * A Java thread inside a bridge call of a task is published with what the call is for, from
     * before its wait for the GIL until it leaves (issue 28): its task (a synchronize), a buffer's
     * owner (a memset names only the handle), or unknown (a release of a batch); a ping, which can
     * give no GPU memory back, is not. Java sees such a thread RUNNABLE, Python not at all: the
     * deadlock breaker reads this. A Python function holds the GIL until it sees each.
     */
    @Test
    @SuppressWarnings("try")   // scopes held for their task binding only
    void threadsInsideCallsAreSeenWithTheirTask() throws Exception {
        PythonFunction hold = bridge.pythonFunction("functions_for_tests:hold_gil_until_entering", PythonFunctionTest.PATH);
        AtomicBoolean stop = new AtomicBoolean();
        AtomicReference<Throwable> failed = new AtomicReference<>();
        CountDownLatch going = new CountDownLatch(4);   // each thread made one call
        List<Thread> threads = List.of(
                looping(stop, failed, going, () -> bridge.synchronize(), 12L),   // names its task
                looping(stop, failed, going, null, 15L),                        // names a handle of task 15
                looping(stop, failed, going, () -> NativeBridge.releaseTasks(new long[] {424242}, 1, new long[2]), -1L),
                looping(stop, failed, going, NativeBridge::ping, -1L));
        String task;
        String owner;
        String unknown;
        try (TaskScope t = bridge.bindTask(11)) {
            threads.forEach(Thread::start);
            assertTrue(going.await(30, TimeUnit.SECONDS));
            task = (String) hold.call(12L, 10.0);
            owner = (String) hold.call(15L, 10.0);
            unknown = (String) hold.call(-1L, 10.0);
        } finally {
            stop.set(true);
            for (Thread th : threads) {
                th.join();
            }
        }
        assertNull(failed.get());
        assertTrue(List.of(task.split(",")).contains("12"), task);
        assertTrue(List.of(owner.split(",")).contains("15"), owner);
        assertTrue(List.of(unknown.split(",")).contains("-1"), unknown);
        try (TaskScope t = bridge.bindTask(13)) {
            assertEquals("13", hold.call(-2L, 0.0), "only its own call (a Python function of task 13) once they stopped");
        }
    }

    /** A thread bound to {@code task} (when not -1) that calls {@code call} until {@code stop};
     *  with no call, task 15's memsets of a buffer by its handle alone. */
    @SuppressWarnings("try")
    static Thread looping(AtomicBoolean stop, AtomicReference<Throwable> failed, CountDownLatch going, Runnable call,
                          long task) {
        return new Thread(() -> {
            try (TaskScope s = task >= 0 ? bridge.bindTask(task) : null) {
                DeviceBuffer b = call == null ? bridge.allocate(64) : null;
                Runnable r = call != null ? call : () -> NativeBridge.memset(b.handle(), 0, 0, 64);
                for (boolean first = true; !stop.get(); first = false) {
                    r.run();
                    if (first) {
                        going.countDown();
                    }
                }
                if (b != null) {
                    b.close();
                }
            } catch (Throwable e) {
                failed.set(e);
                going.countDown();
            }
        });
    }
}
