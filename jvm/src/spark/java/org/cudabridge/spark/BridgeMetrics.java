package org.cudabridge.spark;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.function.ToLongFunction;

import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;

/**
 * The executor-level gauges: every one is registered in {@code ExecutorPlugin.init} (Spark drops
 * a plugin's metric source whose registry is empty right after {@code init}), under
 * {@code executor.<name>} (driver-side metrics are {@code driver.*}: in local mode both share one
 * registry, and a duplicate name would be dropped). Each gauge reads one snapshot of
 * {@link TaskBinder#statistics()} (at most {@code spark.cudabridge.metrics.refreshMs} old).
 */
public final class BridgeMetrics {
    public static final String PREFIX = "executor.";

    /** metric name (after {@code executor.}) -> statistics key. */
    public static final Map<String, String> GAUGES;

    static {
        Map<String, String> m = new LinkedHashMap<>();
        m.put("streams_in_use", "streams_in_use");
        m.put("streams", "streams");
        m.put("tasks_bound", "tasks_bound");
        m.put("tasks_bound_total", "tasks_bound_total");
        m.put("bytes_in_use", "in_use_bytes");
        m.put("bytes_reserved", "reserved_bytes");
        m.put("bytes_peak", "peak_in_use_bytes");
        m.put("bytes_peak_reserved", "peak_reserved_bytes");
        m.put("bytes_waiting_on_events", "waiting_on_events_bytes");
        m.put("allocations", "allocations");
        m.put("live_allocations", "live_allocations");
        m.put("event_polls", "event_polls");
        m.put("stream_polls", "stream_polls");
        m.put("gpu_waits", "gpu_waits");
        m.put("host_syncs", "host_syncs");
        m.put("oom", "oom");
        m.put("leaks_reclaimed", "leaks_reclaimed");
        m.put("leaked_bytes_reclaimed", "leaked_bytes_reclaimed");
        m.put("bridge_calls", "bridge_calls");
        m.put("bridge_thread_states", "bridge_thread_states");
        m.put("plugin_start_failed", "plugin_start_failed");
        m.put("plugin_tasks_started", "plugin_tasks_started");
        m.put("plugin_tasks_released", "plugin_tasks_released");
        m.put("plugin_tasks_failed", "plugin_tasks_failed");
        m.put("plugin_bind_failures", "plugin_bind_failures");
        GAUGES = Collections.unmodifiableMap(m);
    }

    private BridgeMetrics() {}

    /** Registers every gauge; returns how many. */
    public static int register(MetricRegistry registry, TaskBinder binder) {
        int n = 0;
        for (Map.Entry<String, String> e : GAUGES.entrySet()) {
            String key = e.getValue();
            registry.register(PREFIX + e.getKey(), gauge(binder, s -> s.getOrDefault(key, 0L)));
            n++;
        }
        return n;
    }

    private static Gauge<Long> gauge(TaskBinder binder, ToLongFunction<Map<String, Long>> read) {
        return () -> read.applyAsLong(binder.statistics());
    }
}
