package org.cudabridge.executor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.Map;

import org.cudabridge.CudaBridge;
import org.cudabridge.CudaBridgeException;
import org.cudabridge.ReleaseReport;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/** The executor side without Spark, on the real bridge (emulated device), as the plugin drives it. */
@Tag("own-jvm")
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class TaskBinderTest {
    static TaskBinder binder;

    static Map<String, String> conf(String... kv) {
        Map<String, String> m = new HashMap<>();
        m.put("spark.cudabridge.backend", "emulated");
        m.put("spark.cudabridge.metrics.refreshMs", "0");
        for (int i = 0; i < kv.length; i += 2) {
            m.put(kv[i], kv[i + 1]);
        }
        return m;
    }

    @Test
    @Order(1)
    void aMisspelledKeyLeavesTheExecutorUpWithoutAService() {
        TaskBinder b = TaskBinder.start("1", conf("spark.cudabridge.poolLimt", "1g"), null);
        assertFalse(b.isAvailable());
        assertTrue(b.failure().contains("poolLimt"), b.failure());
        assertFalse(b.onTaskStart(1, null), "no bind without a service");
        CudaBridgeException e = assertThrows(CudaBridgeException.class, GpuTask::bridge);
        assertTrue(e.getMessage().contains("its start failed"), e.getMessage());
        assertNull(b.onTaskEnd(false));
        Map<String, Long> s = b.statistics();
        assertEquals(1L, s.get("plugin_start_failed"));
        assertEquals(1L, s.get("plugin_tasks_started"));
        assertEquals(1L, s.get("plugin_tasks_failed"));
    }

    @Test
    @Order(2)
    void tasksAreBoundLazilyReleasedOnTheLifecycleThreadAndTheirLeaksCounted() {
        binder = TaskBinder.start("1", conf(), null);
        assertTrue(binder.isAvailable(), binder.failure());
        for (long id = 10; id < 20; id++) {
            assertTrue(binder.onTaskStart(id, null));
            assertEquals(id, binder.currentTaskAttempt());
            boolean usesGpu = id % 2 == 0;
            if (usesGpu) {
                GpuTask.bridge().allocate(1000);      // leaked on purpose; the first GPU call binds
            }
            ReleaseReport r = binder.onTaskEnd(id != 13);
            if (usesGpu) {
                assertNull(r, "released on the lifecycle thread: no report here");
            } else {
                assertEquals(ReleaseReport.class, r.getClass(), "never bound in Python: released at once, no call");
                assertEquals(0, r.leaksReclaimed());
            }
        }
        long deadline = System.nanoTime() + 10_000_000_000L;
        Map<String, Long> s = binder.refresh();
        while (ExecutorStatistics.ended(s) < 10 && System.nanoTime() < deadline) {
            s = binder.refresh();
        }
        assertEquals(10, ExecutorStatistics.ended(s));
        assertEquals(9L, s.get("plugin_tasks_succeeded"));
        assertEquals(10L, s.get("plugin_tasks_released"));
        assertEquals(5L, s.get("plugin_binds_never_applied"), "the tasks that never used the GPU");
        assertEquals(5L, s.get("plugin_leaks_reclaimed"));
        assertEquals(5L, s.get("leaks_reclaimed"), "the service agrees");
        assertEquals(0L, s.get("in_use_bytes"));
        assertEquals(0L, s.get("tasks_bound"));
    }

    @Test
    @Order(3)
    void anUnknownGpuAddressFailsTheTasksGpuCallsWithTheReason() {
        assertTrue(binder.onTaskStart(30, "7"), "bound in Java; the address is checked in Python");
        RuntimeException e = assertThrows(RuntimeException.class, () -> GpuTask.bridge().allocate(10));
        assertTrue(e.getMessage().contains("not owned by this executor"), e.getMessage());
        ReleaseReport r = binder.onTaskEnd(false);
        assertEquals(0, r == null ? 0 : r.leaksReclaimed());
        assertEquals(1L, binder.refresh().get("plugin_bind_failures"));
    }

    @Test
    @Order(4)
    void shutdownFinishesTheReleasesAndKeepsTheLastNumbers() {
        assertTrue(binder.onTaskStart(40, null));
        GpuTask.bridge().allocate(512);
        binder.onTaskEnd(true);
        binder.shutdown();
        assertFalse(binder.isAvailable());
        assertNull(binder.shutdownFailure());
        assertFalse(CudaBridge.isStarted());
        Map<String, Long> s = binder.statistics();
        assertEquals(0L, s.get("plugin_releases_pending"));
        assertEquals(6L, s.get("plugin_leaks_reclaimed"));
        assertEquals(0L, s.get("in_use_bytes"), "the service's last numbers, from before its shutdown");
        assertThrows(IllegalStateException.class, GpuTask::bridge);
    }
}
