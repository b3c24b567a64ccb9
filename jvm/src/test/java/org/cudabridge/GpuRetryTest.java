package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Memory pressure through the bridge (issue 28) on the emulated device with a 64 MiB pool: an
 * allocation from Java that waits for another task's free (a JNI allocation holds the bridge's gate:
 * it lets it go while it waits, or the free it waits for could never pass), the deadlock breaker's
 * out of memory with its reason, and GpuRetry giving way and trying again.
 */
@Tag("own-jvm")
@SuppressWarnings("try")   // scopes held for their task binding only
class GpuRetryTest {
    static final long MIB = 1L << 20;
    static CudaBridge bridge;

    @BeforeAll
    static void start() {
        bridge = CudaBridge.start(BridgeOptions.fromSystemProperties().set("poolLimit", "64m").set("oomWait", "30"));
    }

    @AfterEach
    void released() {
        assertEquals(0, bridge.tasksBound());
        assertEquals(0L, bridge.statistics().get("in_use_bytes"));
    }

    @Test
    void anAllocationWaitsForAnotherTasksFreeWhichPassesTheGate() throws Exception {
        try (TaskScope a = bridge.bindTask(1)) {
            DeviceBuffer held = bridge.allocate(40 * MIB);
            AtomicReference<Throwable> failed = new AtomicReference<>();
            CountDownLatch got = new CountDownLatch(1);
            Thread other = new Thread(() -> {
                try (TaskScope b = bridge.bindTask(2); DeviceBuffer buf = bridge.allocate(40 * MIB)) {
                    got.countDown();
                } catch (Throwable e) {
                    failed.set(e);
                }
            });
            long waitsBefore = bridge.statistics().get("allocation_waits");
            other.start();
            awaitAWait(waitsBefore);   // it waited (a counter: the gauge is 0 between its short waits)
            assertNull(failed.get(), () -> String.valueOf(failed.get()));
            assertTrue(other.isAlive(), "still waiting: task 1 holds the memory and does not wait");
            held.close();   // a short call through the gate: the waiting thread let it go
            other.join(10_000);
            assertFalse(other.isAlive());
            assertNull(failed.get(), () -> String.valueOf(failed.get()));
            assertEquals(0, got.getCount());
        }
        assertTrue(bridge.statistics().get("allocation_waits") >= 1);
    }

    @Test
    void theBreakerFailsTheYoungestAndGpuRetryGivesWayAndSucceeds() throws Exception {
        AtomicInteger attempts = new AtomicInteger();
        AtomicReference<Throwable> failed = new AtomicReference<>();
        long breaksBefore = bridge.statistics().get("oom_breaks");
        try (TaskScope older = bridge.bindTask(10)) {
            DeviceBuffer first = bridge.allocate(30 * MIB);
            CountDownLatch youngHolds = new CountDownLatch(1);
            CountDownLatch olderWaits = new CountDownLatch(1);
            Thread young = new Thread(() -> {
                try (TaskScope y = bridge.bindTask(11)) {   // bound later: the younger
                    long sum = GpuRetry.withRetry(() -> {
                        int n = attempts.incrementAndGet();
                        DeviceBuffer mine = bridge.allocate(20 * MIB);   // freed by the retry when the block fails
                        if (n == 1) {
                            youngHolds.countDown();
                            await(olderWaits);
                        }
                        try (DeviceBuffer more = bridge.allocate(30 * MIB)) {   // both wait: the breaker picks this one
                            more.memset(1, 0, 4);
                        }
                        mine.close();
                        return 4L;
                    });
                    assertEquals(4L, sum);
                } catch (Throwable e) {
                    failed.set(e);
                }
            });
            young.start();
            await(youngHolds);
            long waitsBefore = bridge.statistics().get("allocation_waits");
            Thread waiter = new Thread(() -> {
                try (Attachment x = bridge.attach(10); DeviceBuffer second = bridge.allocate(30 * MIB)) {
                    second.memset(0);
                } catch (Throwable e) {
                    failed.compareAndSet(null, e);
                }
            });
            waiter.start();
            awaitAWait(waitsBefore);
            olderWaits.countDown();
            waiter.join(20_000);
            assertFalse(waiter.isAlive(), "the older task's allocation went through once the younger gave way");
            first.close();
            young.join(20_000);
            assertFalse(young.isAlive());
            assertNull(failed.get(), () -> String.valueOf(failed.get()));
        }
        // failed by the breaker at least once, then retried until it went through (a second break is
        // possible when the retry comes back before the older task's waiter took the memory)
        assertTrue(attempts.get() >= 2, "attempts " + attempts.get());
        assertEquals(attempts.get() - 1, bridge.statistics().get("oom_breaks") - breaksBefore);
    }

    @Test
    void anOutOfMemoryForAnotherReasonIsThrownAsItIsAndWhatTheBlockAllocatedIsFreed() {
        try (TaskScope t = bridge.bindTask(20)) {
            List<DeviceBuffer> seen = new ArrayList<>();
            DeviceBuffer outside = bridge.allocate(8 * MIB);
            GpuOutOfMemoryException oom = assertThrows(GpuOutOfMemoryException.class, () -> GpuRetry.withRetry(() -> {
                seen.add(bridge.allocate(40 * MIB));
                return bridge.allocate(40 * MIB);   // only this task holds memory: the breaker, at once, every attempt
            }));
            assertEquals(GpuOutOfMemoryException.Reason.BREAKER, oom.reason());
            assertEquals(GpuRetry.DEFAULT_ATTEMPTS, seen.size());
            for (DeviceBuffer b : seen) {
                assertFalse(b.isAlive(), "freed by the retry");
            }
            assertTrue(outside.isAlive(), "allocated before the block: not the block's");
            IllegalStateException other = new IllegalStateException("not a GPU error");
            assertSame(other, assertThrows(IllegalStateException.class, () -> GpuRetry.withRetry(() -> {
                throw other;
            })));
            outside.close();
        }
    }

    /** Until an allocation has waited since {@code before} (allocation_waits counts each one). */
    static void awaitAWait(long before) throws InterruptedException {
        long deadline = System.nanoTime() + 20_000_000_000L;
        while (bridge.statistics().get("allocation_waits") == before && System.nanoTime() < deadline) {
            Thread.sleep(2);
        }
        assertTrue(bridge.statistics().get("allocation_waits") > before, "no allocation waited");
    }

    static void await(CountDownLatch l) {
        try {
            if (!l.await(20, java.util.concurrent.TimeUnit.SECONDS)) {
                throw new IllegalStateException("timed out");
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
    }
}
