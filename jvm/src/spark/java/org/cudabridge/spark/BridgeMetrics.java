package org.cudabridge.spark;

import java.util.Map;
import java.util.function.ToLongFunction;

import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import org.cudabridge.executor.TaskBinder;

/**
 * The executor-level gauges: every one is registered in {@code ExecutorPlugin.init} (Spark drops
 * a plugin's metric source whose registry is empty right after {@code init}), under
 * {@code executor.<name>} (driver-side metrics are {@code driver.*}: in local mode both share one
 * registry, and a duplicate name would be dropped). Each gauge reads one snapshot of
 * {@link TaskBinder#statistics()} (at most {@code spark.cudabridge.metrics.refreshMs} old).
 */
public final class BridgeMetrics {
    public static final String PREFIX = "executor.";


    private BridgeMetrics() {}

    /** Registers every gauge; returns how many. */
    public static int register(MetricRegistry registry, TaskBinder binder) {
        int n = 0;
        for (String name : MetricNames.NAMES) {
            registry.register(PREFIX + name, gauge(binder, s -> s.getOrDefault(name, 0L)));
            n++;
        }
        return n;
    }

    private static Gauge<Long> gauge(TaskBinder binder, ToLongFunction<Map<String, Long>> read) {
        return () -> read.applyAsLong(binder.statistics());
    }
}
