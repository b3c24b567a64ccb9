package org.cudabridge.spark;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

/** The executor gauges' names (after {@code executor.}) and the statistics key each reads. No
 *  Spark or Dropwizard class here: the Java harness prints the same names without either. */
public final class MetricNames {
    private MetricNames() {}

    /** metric name -> statistics key. */
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
        m.put("plugin_releases_pending", "plugin_releases_pending");
        m.put("plugin_bind_failures", "plugin_bind_failures");
        m.put("plugin_binds_ahead", "plugin_binds_ahead");
        m.put("plugin_binds_never_applied", "plugin_binds_never_applied");
        m.put("plugin_bind_us_total", "plugin_bind_us_total");
        m.put("plugin_release_us_total", "plugin_release_us_total");
        m.put("plugin_lifecycle_cpu_us", "plugin_lifecycle_cpu_us");
        m.put("plugin_release_batches", "plugin_release_batches");
        GAUGES = Collections.unmodifiableMap(m);
    }

}
