package org.cudabridge.executor;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLongArray;

import org.cudabridge.ReleaseReport;

/**
 * The executor plugin's own counters, one object: each is named once, in {@link Counter}, and the
 * executor metrics register each under that name ({@code MetricNames} in the Spark jar).
 *
 * <p>Invariant the snapshots rely on: {@link #snapshot()} reads the counters in {@link Counter}'s
 * order, the ended attempts ({@code plugin_tasks_succeeded}, {@code plugin_tasks_failed}) before
 * {@code plugin_releases_pending} (see {@link ExecutorStatistics#ended} and {@link ExecutorStatistics}).
 */
public final class ExecutorCounters {
    /** A counter, its metric name, and the unit it is kept in (divided by {@code scale} when read). */
    public enum Counter {
        START_FAILED("plugin_start_failed", 1),         // 1 when the executor has no GPU service
        START_MS("plugin_start_ms", 1_000_000),        // the bridge's start, kept in ns
        TASKS_STARTED("plugin_tasks_started", 1),
        TASKS_SUCCEEDED("plugin_tasks_succeeded", 1),
        TASKS_FAILED("plugin_tasks_failed", 1),
        TASKS_RELEASED("plugin_tasks_released", 1),
        RELEASES_PENDING("plugin_releases_pending", 1), // handed to the lifecycle thread, not done yet
        BIND_FAILURES("plugin_bind_failures", 1),
        BINDS_AHEAD("plugin_binds_ahead", 1),           // applied on the lifecycle thread
        BINDS_NEVER_APPLIED("plugin_binds_never_applied", 1), // ended before any GPU use: never bound in Python
        RELEASE_FAILURES("plugin_release_failures", 1),
        LEAKS_RECLAIMED("plugin_leaks_reclaimed", 1),   // summed from the release reports
        LEAKED_BYTES_RECLAIMED("plugin_leaked_bytes_reclaimed", 1),
        BIND_US_TOTAL("plugin_bind_us_total", 1000),    // task threads' time in onTaskStart's bind, kept in ns
        RELEASE_US_TOTAL("plugin_release_us_total", 1000), // ... and in releases, kept in ns
        LIFECYCLE_CPU_US("plugin_lifecycle_cpu_us", 1000), // the lifecycle thread's CPU time, kept in ns
        RELEASE_BATCHES("plugin_release_batches", 1);   // release calls into Python (one task or a batch)

        private final String metric;
        private final long scale;

        Counter(String metric, long scale) {
            this.metric = metric;
            this.scale = scale;
        }

        public String metric() {
            return metric;
        }
    }

    /** Every counter's metric name, in {@link Counter}'s order. */
    public static final List<String> NAMES;

    static {
        List<String> names = new ArrayList<>();
        for (Counter c : Counter.values()) {
            names.add(c.metric);
        }
        NAMES = Collections.unmodifiableList(names);
    }

    private final AtomicLongArray values = new AtomicLongArray(Counter.values().length);

    public void increment(Counter c) {
        values.incrementAndGet(c.ordinal());
    }

    public void add(Counter c, long delta) {
        values.addAndGet(c.ordinal(), delta);
    }

    /** For gauges kept by one thread (the lifecycle thread's CPU time, the start time). */
    public void set(Counter c, long value) {
        values.set(c.ordinal(), value);
    }

    /** Counts one task attempt's release report; false if it says the release failed. */
    boolean countRelease(ReleaseReport r, boolean neverBound) {
        if (r.failure() != null) {
            increment(Counter.RELEASE_FAILURES);
            return false;
        }
        increment(Counter.TASKS_RELEASED);
        if (neverBound) {
            increment(Counter.BINDS_NEVER_APPLIED);
        }
        add(Counter.LEAKS_RECLAIMED, r.leaksReclaimed());
        add(Counter.LEAKED_BYTES_RECLAIMED, r.leakedBytesReclaimed());
        return true;
    }

    /** The raw value, in the unit the counter is kept in. */
    public long raw(Counter c) {
        return values.get(c.ordinal());
    }

    /** Every counter by metric name, in {@link Counter}'s order, in its metric's unit. */
    public Map<String, Long> snapshot() {
        Map<String, Long> m = new LinkedHashMap<>();
        for (Counter c : Counter.values()) {
            m.put(c.metric, values.get(c.ordinal()) / c.scale);
        }
        return m;
    }
}
