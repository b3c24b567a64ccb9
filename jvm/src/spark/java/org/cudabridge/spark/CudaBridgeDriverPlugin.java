package org.cudabridge.spark;

import java.util.Collections;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;

import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import scala.Tuple2;
import org.cudabridge.executor.PluginConf;
import org.cudabridge.executor.Failures;

/**
 * The driver side: checks every {@code spark.cudabridge.*} key against the settings table, plugin
 * and service keys alike ({@link org.cudabridge.Settings#checkAll}: an unknown key, with the
 * nearest known one, or a value its type refuses fails the application at start, once, on the
 * driver, without Python, instead of every executor), hands every {@code spark.cudabridge.*} key to the executor
 * plugins, and collects the executors' {@link ExecutorReport}s into {@code driver.*} metrics
 * (names distinct from the executors' {@code executor.*}: in local mode both share a registry).
 */
public final class CudaBridgeDriverPlugin implements DriverPlugin {
    private static final Logger LOG = LoggerFactory.getLogger(CudaBridgeDriverPlugin.class);
    private static volatile CudaBridgeDriverPlugin running;

    private final ConcurrentHashMap<String, ExecutorReport> reports = new ConcurrentHashMap<>();
    private final ConcurrentHashMap<String, Boolean> failuresLogged = new ConcurrentHashMap<>();

    static CudaBridgeDriverPlugin running() {
        return running;
    }

    @Override
    public Map<String, String> init(SparkContext sc, PluginContext ctx) {
        Map<String, String> all = new HashMap<>();
        for (Tuple2<String, String> kv : sc.getConf().getAll()) {
            all.put(kv._1(), kv._2());
        }
        PluginConf conf = new PluginConf(all);
        try {
            conf.validate();
        } catch (IllegalArgumentException e) {
            LOG.error("cudabridge: the configuration is refused: {}", e.getMessage());
            throw new IllegalArgumentException("cudabridge: " + e.getMessage(), e);
        }
        running = this;
        LOG.info("cudabridge: driver plugin passes {} spark.cudabridge.* key(s) to the executors", conf.entries().size());
        return new HashMap<>(conf.entries());
    }

    @Override
    public void registerMetrics(String appId, PluginContext ctx) {
        MetricRegistry r = ctx.metricRegistry();
        r.register("driver.executors_reporting", (Gauge<Long>) () -> (long) reports.size());
        r.register("driver.executors_failed", (Gauge<Long>) () ->
                reports.values().stream().filter(x -> !x.available()).count());
        for (String key : new String[] {"plugin_tasks_released", "leaks_reclaimed", "in_use_bytes", "peak_in_use_bytes",
                "oom", "bridge_calls_total"}) {
            r.register("driver.executors_" + key, (Gauge<Long>) () -> sum(key));
        }
    }

    private long sum(String key) {
        long s = 0;
        for (ExecutorReport x : reports.values()) {
            s += x.statistics().getOrDefault(key, 0L);
        }
        return s;
    }

    @Override
    public Object receive(Object message) {
        if (message instanceof ExecutorReport) {
            ExecutorReport r = (ExecutorReport) message;
            reports.merge(r.executorId(), r, (old, neu) -> neu.sequence() > old.sequence() ? neu : old);
            if (!r.available() && failuresLogged.putIfAbsent(r.executorId(), Boolean.TRUE) == null) {
                LOG.error("cudabridge: executor {} has no GPU service: {}", r.executorId(),
                        Failures.oneLine(String.valueOf(r.failure())));
            }
            return null;
        }
        throw new IllegalArgumentException("cudabridge driver plugin: unexpected message " + message);
    }

    /** The latest report's statistics of each executor. */
    Map<String, Map<String, Long>> reports() {
        Map<String, Map<String, Long>> m = new TreeMap<>();
        for (Map.Entry<String, ExecutorReport> e : reports.entrySet()) {
            m.put(e.getKey(), e.getValue().statistics());
        }
        return Collections.unmodifiableMap(m);
    }

    /** Failure reasons of executors whose service did not start, by executor id. */
    public static Map<String, String> executorFailures() {
        CudaBridgeDriverPlugin d = running;
        Map<String, String> m = new TreeMap<>();
        if (d != null) {
            for (ExecutorReport r : d.reports.values()) {
                if (!r.available()) {
                    m.put(r.executorId(), r.failure());
                }
            }
        }
        return m;
    }

    @Override
    public void shutdown() {
        LOG.info("cudabridge: driver plugin down; {} executor(s) reported", reports.size());
    }
}
