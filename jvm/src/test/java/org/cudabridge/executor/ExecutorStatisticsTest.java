package org.cudabridge.executor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;

import java.util.Map;

import org.cudabridge.executor.ExecutorCounters.Counter;
import org.junit.jupiter.api.Test;

class ExecutorStatisticsTest {
    @Test
    void endedCountsNothingWhileReleasesArePending() {
        assertEquals(5, ExecutorStatistics.ended(Map.of("plugin_tasks_succeeded", 3L, "plugin_tasks_failed", 2L)));
        assertEquals(0, ExecutorStatistics.ended(Map.of("plugin_tasks_succeeded", 3L, "plugin_releases_pending", 1L)));
        assertEquals(0, ExecutorStatistics.ended(Map.of()));
    }

    @Test
    void withoutAServiceASnapshotHoldsThePluginsCounters() {
        ExecutorCounters c = new ExecutorCounters();
        c.increment(Counter.TASKS_STARTED);
        ExecutorStatistics s = new ExecutorStatistics(c, null, 0);
        Map<String, Long> m = s.refresh();
        assertEquals(1L, m.get("plugin_tasks_started"));
        assertEquals(new java.util.TreeSet<>(ExecutorCounters.NAMES), new java.util.TreeSet<>(m.keySet()),
                "no service: the plugin's counters and nothing else");
    }

    @Test
    void aSnapshotIsReusedWithinTheRefreshInterval() {
        ExecutorCounters c = new ExecutorCounters();
        ExecutorStatistics cached = new ExecutorStatistics(c, null, 60_000);
        Map<String, Long> first = cached.get();
        c.increment(Counter.TASKS_STARTED);
        assertSame(first, cached.get(), "younger than refreshMs: the same snapshot");
        assertEquals(1L, cached.refresh().get("plugin_tasks_started"), "refresh always reads");
        ExecutorStatistics fresh = new ExecutorStatistics(c, null, 0);
        assertNotSame(fresh.get(), fresh.get());
    }
}
