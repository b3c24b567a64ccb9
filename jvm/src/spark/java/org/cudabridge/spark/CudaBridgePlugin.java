package org.cudabridge.spark;

import java.util.Collections;
import java.util.Map;
import java.util.TreeMap;

import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.SparkPlugin;
import org.cudabridge.executor.ExecutorStatistics;

/**
 * The Spark plugin: {@code --conf spark.plugins=org.cudabridge.spark.CudaBridgePlugin}, with
 * {@code python -m cudabridge.spark classpath} on {@code spark.driver.extraClassPath} and
 * {@code spark.executor.extraClassPath}, or {@code --jars $(python -m cudabridge.spark jars)} with
 * {@code spark.cudabridge.python} naming the executors' environment (docs/deploy.md).
 *
 * <ul>
 *   <li>driver: {@link CudaBridgeDriverPlugin} passes every {@code spark.cudabridge.*} key to the
 *       executors, collects their statistics reports, and registers {@code driver.*} metrics;</li>
 *   <li>executor: {@link CudaBridgeExecutorPlugin} starts the bridge and the service in
 *       {@code init} (never throwing), binds each task attempt in {@code onTaskStart}, releases it
 *       in {@code onTaskSucceeded}/{@code onTaskFailed}, shuts the service down in
 *       {@code shutdown}, and registers {@code executor.*} metrics.</li>
 * </ul>
 */
public final class CudaBridgePlugin implements SparkPlugin {
    /** Metric names appear as {@code plugin.<this>.<name>} in every sink. */
    public static final String METRIC_SOURCE = "plugin." + CudaBridgePlugin.class.getName();

    @Override
    public DriverPlugin driverPlugin() {
        return new CudaBridgeDriverPlugin();
    }

    @Override
    public ExecutorPlugin executorPlugin() {
        return new CudaBridgeExecutorPlugin();
    }

    /** On the driver: the latest statistics report of each executor, by executor id (empty
     *  when no executor has reported, or the driver plugin is not running in this JVM). */
    public static Map<String, Map<String, Long>> executorReports() {
        CudaBridgeDriverPlugin d = CudaBridgeDriverPlugin.running();
        return d == null ? Collections.emptyMap() : d.reports();
    }

    /** On the driver: the executors' reports summed, key by key ({@code executors}: how many reported). */
    public static Map<String, Long> executorTotals() {
        Map<String, Long> sum = new TreeMap<>();
        Map<String, Map<String, Long>> reports = executorReports();
        for (Map<String, Long> r : reports.values()) {
            for (Map.Entry<String, Long> e : r.entrySet()) {
                sum.merge(e.getKey(), e.getValue(), Long::sum);
            }
        }
        sum.put("executors", (long) reports.size());
        return sum;
    }

    /**
     * On the driver: waits (at most {@code timeoutMs}) until the executors' reports together
     * count at least {@code attempts} ended task attempts, and returns their totals. Reports
     * come every {@code spark.cudabridge.reportIntervalMs}.
     */
    public static Map<String, Long> awaitExecutorTotals(long attempts, long timeoutMs) throws InterruptedException {
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        Map<String, Long> t = executorTotals();
        while (ExecutorStatistics.ended(t) < attempts && System.nanoTime() < deadline) {
            Thread.sleep(50);
            t = executorTotals();
        }
        return t;
    }
}
