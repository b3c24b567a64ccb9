package org.cudabridge.executor;

import java.util.Collections;
import java.util.Map;
import java.util.TreeMap;
import java.util.logging.Logger;

import org.cudabridge.CudaBridge;

/**
 * The executor's numbers as the metrics and the driver's reports read them: the service's
 * statistics ({@link CudaBridge#statistics()}) merged with the plugin's own
 * {@link ExecutorCounters}, as one snapshot that a sink reading twenty gauges gets from one call
 * into Python.
 *
 * <p>Invariant: a snapshot reads the plugin's counters before the service's statistics, and the
 * binder counts an attempt ended only after its release is done or counted pending. So a snapshot
 * that counts {@code n} attempts ended and none pending ({@link #ended}) holds the service's
 * statistics of after their releases, their leaks included, and the service's
 * {@code leaks_reclaimed} is never behind {@code plugin_leaks_reclaimed}.
 */
public final class ExecutorStatistics {
    private static final Logger LOG = Logger.getLogger(ExecutorStatistics.class.getName());

    private final ExecutorCounters counters;
    private final CudaBridge bridge;      // null: no service (its start failed)
    private final long refreshNanos;
    private final Object lock = new Object();
    private volatile Map<String, Long> snapshot = Collections.emptyMap();
    private volatile long snapshotAt;
    private volatile boolean frozen;      // the service shut down: the last snapshot stays

    ExecutorStatistics(ExecutorCounters counters, CudaBridge bridge, long refreshMs) {
        this.counters = counters;
        this.bridge = bridge;
        this.refreshNanos = refreshMs * 1_000_000L;
    }

    /**
     * Task attempts whose end (success or failure) a snapshot counts, or 0 while releases of
     * ended attempts are still pending: once this reaches {@code n}, the snapshot counts the
     * leaks of those {@code n} attempts.
     */
    public static long ended(Map<String, Long> statistics) {
        if (statistics.getOrDefault("plugin_releases_pending", 0L) > 0) {
            return 0;
        }
        return statistics.getOrDefault("plugin_tasks_succeeded", 0L) + statistics.getOrDefault("plugin_tasks_failed", 0L);
    }

    /** A snapshot at most {@code spark.cudabridge.metrics.refreshMs} old. */
    Map<String, Long> get() {
        if (System.nanoTime() - snapshotAt < refreshNanos && !snapshot.isEmpty()) {
            return snapshot;
        }
        return refresh();
    }

    /** A fresh snapshot now (at most one caller at a time goes to Python). */
    Map<String, Long> refresh() {
        synchronized (lock) {
            Map<String, Long> plugin = counters.snapshot();   // first: see the invariant
            Map<String, Long> m = new TreeMap<>();
            if (bridge != null && !frozen) {
                try {
                    m.putAll(bridge.statistics());
                } catch (Throwable t) {
                    if (!frozen) {
                        LOG.fine("cudabridge: statistics failed: " + t);
                    }
                    m.putAll(snapshot);
                }
            } else {
                m.putAll(snapshot);
            }
            m.putAll(plugin);
            Map<String, Long> done = Collections.unmodifiableMap(m);
            snapshot = done;
            snapshotAt = System.nanoTime();
            return done;
        }
    }

    /** From now on the service is not asked again (it shut down); the plugin's counters still are. */
    void freeze() {
        frozen = true;
    }
}
