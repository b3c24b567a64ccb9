package org.cudabridge.examples;

import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;
import org.cudabridge.CudaBridge;
import org.cudabridge.spark.CudaBridgePlugin;
import org.cudabridge.executor.GpuTask;
import org.cudabridge.executor.TaskBinder;
import org.cudabridge.executor.ExecutorStatistics;

/**
 * Example (a): every partition's task copies its data to the GPU on its own stream, runs the
 * service's kernel on it, copies the result back and checks it ({@link PartitionWork}).
 *
 * <pre>
 * spark-submit --class org.cudabridge.examples.GpuPartitionJob \
 *   --conf spark.driver.extraClassPath=$CP --conf spark.executor.extraClassPath=$CP \
 *   --conf spark.plugins=org.cudabridge.spark.CudaBridgePlugin \
 *   cudabridge-examples.jar [--partitions 64] [--elements 16384] [--no-leak] [--fail-first-attempt 3,7]
 *   [--work gpu|host|stream] [--rounds 1] [--summary-json out.json] [--linger-ms 0] [--no-stop]
 * </pre>
 *
 * {@code --work host} runs the same data and checks on the host with no GPU call (the
 * benchmark's plugin-overhead baseline; it runs with or without the plugin); {@code --work stream}
 * does the same and asks for the task's stream once (the least a GPU task does: the plugin then
 * binds and releases every task in Python). {@code --no-stop} leaves {@code spark.stop()} to
 * Spark's shutdown hook, as many applications do: the plugin and the service then shut down while
 * the JVM exits.
 */
public final class GpuPartitionJob {
    private GpuPartitionJob() {}

    public static void main(String[] args) throws Exception {
        int partitions = 64;
        int elements = 16384;
        boolean leak = true;
        String work = "gpu";
        int rounds = 1;
        String summaryJson = null;
        long lingerMs = 0;
        boolean stop = true;
        Set<Integer> failFirst = new HashSet<>();
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--partitions": partitions = Integer.parseInt(args[++i]); break;
                case "--elements": elements = Integer.parseInt(args[++i]); break;
                case "--no-leak": leak = false; break;
                case "--work": work = parseWork(args[++i]); break;
                case "--rounds": rounds = Integer.parseInt(args[++i]); break;
                case "--summary-json": summaryJson = args[++i]; break;
                case "--linger-ms": lingerMs = Long.parseLong(args[++i]); break;
                case "--no-stop": stop = false; break;
                case "--fail-first-attempt": failFirst.addAll(PartitionWork.partitions(args[++i])); break;
                default:
                    throw new IllegalArgumentException("unknown argument " + args[i] + "; see the class comment");
            }
        }
        long jvmStart = ManagementFactory.getRuntimeMXBean().getStartTime();
        SparkSession spark = SparkSession.builder().appName("cudabridge-example-a").getOrCreate();
        long startupMs = System.currentTimeMillis() - jvmStart;
        JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
        final int n = elements;
        final boolean leakIt = leak;
        final boolean gpu = work.equals("gpu");
        final String how = work;
        final Set<Integer> fails = failFirst;
        List<Integer> ids = new ArrayList<>();
        for (int p = 0; p < partitions; p++) {
            ids.add(p);
        }
        List<PartitionWork.Result> results = null;
        long[] phaseNanos = new long[rounds];
        long[] phaseCpuNanos = new long[rounds];   // the whole process: in local mode driver, executor and Python
        for (int round = 0; round < rounds; round++) {
            long c0 = processCpuNanos();
            long t0 = System.nanoTime();
            results = sc.parallelize(ids, partitions).mapPartitionsWithIndex(
                    (Integer index, Iterator<Integer> it) -> partition(index, n, leakIt, how, fails), true)
                    .collect();
            phaseNanos[round] = System.nanoTime() - t0;
            phaseCpuNanos[round] = processCpuNanos() - c0;
        }
        Summary s = Summary.of(results);
        long attempts = (long) partitions * rounds + (gpu ? failFirst.size() : 0);
        s.put("work", work);
        s.put("partitions", partitions).put("elements_per_partition", elements).put("rounds", rounds);
        s.put("task_attempts_expected", attempts);
        s.put("plugin", String.valueOf(spark.conf().getOption("spark.plugins").getOrElse(() -> "")));
        s.put("startup_ms", startupMs);
        s.put("task_phase_ms", fmt(phaseNanos[rounds - 1]));
        s.put("task_phase_ms_rounds", Arrays.toString(Arrays.stream(phaseNanos).mapToObj(GpuPartitionJob::fmt).toArray()));
        s.put("task_phase_cpu_ms_rounds",
                Arrays.toString(Arrays.stream(phaseCpuNanos).mapToObj(GpuPartitionJob::fmt).toArray()));
        String plugins = String.valueOf(spark.conf().getOption("spark.plugins").getOrElse(() -> ""));
        // Without the plugin (the benchmark's baseline) its classes are not even on the class path.
        Map<String, Long> stats = plugins.contains("CudaBridgePlugin")
                ? PluginStatistics.after(attempts) : Collections.emptyMap();
        if (!stats.isEmpty()) {
            s.put("tasks_released", stats.getOrDefault("plugin_tasks_released", 0L));
            s.put("leaks_reclaimed", stats.getOrDefault("leaks_reclaimed", 0L));
            s.put("leaked_bytes_reclaimed", stats.getOrDefault("leaked_bytes_reclaimed", 0L));
            s.put("live_allocations_after", stats.getOrDefault("live_allocations", 0L));
            s.put("in_use_bytes_after", stats.getOrDefault("in_use_bytes", 0L));
            s.put("executors_reporting", stats.getOrDefault("executors", 1L));
            s.statistics(stats);
        }
        System.out.print(s.render());
        s.writeJson(summaryJson);
        if (lingerMs > 0) {
            Thread.sleep(lingerMs); // lets periodic metrics sinks report the final numbers
        }
        if (stop) {
            spark.stop();
        }
        if ((Integer) s.get("verify_failures") != 0) {
            System.exit(1);
        }
    }

    private static String parseWork(String w) {
        if (w.equals("gpu") || w.equals("host") || w.equals("stream")) {
            return w;
        }
        throw new IllegalArgumentException("--work gpu|host|stream, got " + w);
    }

    private static String fmt(long nanos) {
        return String.format("%.1f", nanos / 1e6);
    }

    /** One task: the partition's GPU work on the task's stream (bound by the plugin). */
    static Iterator<PartitionWork.Result> partition(int index, int elements, boolean leak, String work,
                                                    Set<Integer> failFirst) {
        TaskContext tc = TaskContext.get();
        PartitionWork.Result r;
        if (work.equals("gpu")) {
            CudaBridge bridge = GpuTask.bridge(); // fails fast with the reason if the executor has no service
            if (tc.attemptNumber() == 0 && failFirst.contains(index)) {
                PartitionWork.failAfterAllocating(bridge, index, elements);
            }
            r = PartitionWork.run(bridge, index, elements, leak);
        } else {
            r = PartitionWork.runOnHost(index, elements);
            r.taskAttemptId = tc.taskAttemptId();
            if (work.equals("stream")) {
                r.stream = GpuTask.bridge().stream();
            }
        }
        r.attempt = tc.attemptNumber();
        r.executorId = SparkEnv.get().executorId();
        return Collections.singletonList(r).iterator();
    }

    /** The plugin's statistics; a class of its own so that it loads only when the plugin is on. */
    static final class PluginStatistics {
        private PluginStatistics() {}

        /**
         * The service's statistics after the job: in local mode the executor plugin lives in this
         * JVM and is read directly (fresh); otherwise the executors' reports to the driver plugin,
         * once they count every task attempt ended (they come every spark.cudabridge.reportIntervalMs).
         */
        static Map<String, Long> after(long attempts) throws InterruptedException {
            TaskBinder local = TaskBinder.current();
            if (local != null && local.isAvailable() && "driver".equals(local.executorId())) {
                long deadline = System.nanoTime() + 10_000_000_000L;
                Map<String, Long> s = local.refresh();
                while (ExecutorStatistics.ended(s) < attempts && System.nanoTime() < deadline) {
                    Thread.sleep(20);
                    s = local.refresh();
                }
                return s;
            }
            return CudaBridgePlugin.awaitExecutorTotals(attempts, 15_000);
        }
    }

    /** CPU time of this process (every thread: the JVM's and, with the plugin, Python's), or -1. */
    static long processCpuNanos() {
        java.lang.management.OperatingSystemMXBean os = java.lang.management.ManagementFactory.getOperatingSystemMXBean();
        return os instanceof com.sun.management.OperatingSystemMXBean
                ? ((com.sun.management.OperatingSystemMXBean) os).getProcessCpuTime() : -1;
    }
}
