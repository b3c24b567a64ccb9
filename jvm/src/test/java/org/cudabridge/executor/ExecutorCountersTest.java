package org.cudabridge.executor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import org.cudabridge.ReleaseReport;
import org.cudabridge.executor.ExecutorCounters.Counter;
import org.junit.jupiter.api.Test;

class ExecutorCountersTest {
    @Test
    void everyCounterHasItsMetricNameOnceInOrder() {
        ExecutorCounters c = new ExecutorCounters();
        List<String> names = new ArrayList<>(c.snapshot().keySet());
        assertEquals(ExecutorCounters.NAMES, names);
        assertEquals(names.size(), names.stream().distinct().count());
        assertTrue(names.stream().allMatch(n -> n.startsWith("plugin_")));
        // the snapshots' invariant: the ended attempts are read before the pending releases
        assertTrue(names.indexOf("plugin_tasks_succeeded") < names.indexOf("plugin_releases_pending"));
        assertTrue(names.indexOf("plugin_tasks_failed") < names.indexOf("plugin_releases_pending"));
    }

    @Test
    void timesAreKeptInNanosecondsAndReadInTheirMetricsUnit() {
        ExecutorCounters c = new ExecutorCounters();
        c.set(Counter.START_MS, 2_500_000_000L);
        c.add(Counter.BIND_US_TOTAL, 7_999);
        c.add(Counter.RELEASE_US_TOTAL, 1_000);
        Map<String, Long> s = c.snapshot();
        assertEquals(2500L, s.get("plugin_start_ms"));
        assertEquals(7L, s.get("plugin_bind_us_total"));
        assertEquals(1L, s.get("plugin_release_us_total"));
        assertEquals(2_500_000_000L, c.raw(Counter.START_MS));
    }

    @Test
    void aReleaseReportIsCountedAsItSays() {
        ExecutorCounters c = new ExecutorCounters();
        assertTrue(c.countRelease(new ReleaseReport(1, 2, 300, null), false));
        assertTrue(c.countRelease(new ReleaseReport(2, 0, 0, null), true));
        assertFalse(c.countRelease(new ReleaseReport(3, 0, 0, "UnknownTask: not bound"), false));
        Map<String, Long> s = c.snapshot();
        assertEquals(2L, s.get("plugin_tasks_released"));
        assertEquals(1L, s.get("plugin_binds_never_applied"));
        assertEquals(1L, s.get("plugin_release_failures"));
        assertEquals(2L, s.get("plugin_leaks_reclaimed"));
        assertEquals(300L, s.get("plugin_leaked_bytes_reclaimed"));
    }
}
