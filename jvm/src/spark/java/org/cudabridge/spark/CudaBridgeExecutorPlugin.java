package org.cudabridge.spark;

import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.spark.SparkConf;
import org.apache.spark.TaskContext;
import org.apache.spark.TaskFailedReason;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.resource.ResourceInformation;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import scala.Tuple2;
import org.cudabridge.executor.TaskBinder;
import org.cudabridge.executor.PluginConf;
import org.cudabridge.executor.Failures;

/**
 * The executor side: one bridge and service per executor JVM.
 *
 * <p>{@code init} never throws: an exception out of it makes a cluster master relaunch executors
 * forever (Spark's standalone master does). A service that cannot start leaves the executor up, logs one error
 * line, and every GPU call of its tasks fails fast with the reason ({@code GpuTask.bridge()}).
 * The metrics are registered in {@code init} either way ({@code executor.plugin_start_failed}
 * reads 1 then).
 */
public final class CudaBridgeExecutorPlugin implements ExecutorPlugin {
    private static final Logger LOG = LoggerFactory.getLogger(CudaBridgeExecutorPlugin.class);

    private volatile TaskBinder binder;
    private volatile PluginContext context;
    private volatile String gpuResource;
    private ScheduledExecutorService reporter;
    private long reportSequence;
    private Map<String, Long> lastReported;

    @Override
    public void init(PluginContext ctx, Map<String, String> extraConf) {
        String executorId = "?";
        try {
            context = ctx;
            executorId = ctx.executorID();
            Map<String, String> conf = new HashMap<>();
            SparkConf sc = ctx.conf();
            for (Tuple2<String, String> kv : sc.getAll()) {
                conf.put(kv._1(), kv._2());
            }
            if (extraConf != null) {
                conf.putAll(extraConf); // what the driver plugin passed on
            }
            PluginConf pc = null;
            try {
                pc = new PluginConf(conf);
                gpuResource = pc.gpuResource(); // a string: never refused
            } catch (Throwable t) {
                // only if the settings table cannot be read: TaskBinder.start fails the same way and records why
            }
            String[] gpus = null;
            Map<String, ResourceInformation> resources = ctx.resources();
            if (resources != null) {
                ResourceInformation gpu = resources.get(gpuResource);
                if (gpu != null) {
                    gpus = gpu.addresses();
                }
            }
            binder = TaskBinder.start(executorId, conf, gpus);
            BridgeMetrics.register(ctx.metricRegistry(), binder);
            long interval;
            try {
                interval = pc.reportIntervalMs();
            } catch (RuntimeException e) {
                // refused by TaskBinder.start as well (the binder records why); the reports still
                // tell the driver of the failure
                interval = PluginConf.defaults().reportIntervalMs();
            }
            if (interval > 0) {
                startReporter(interval);
            }
        } catch (Throwable t) { // never out of init
            LOG.error("cudabridge: executor {} plugin init failed: {}", executorId, Failures.oneLine(String.valueOf(t)));
            if (binder == null) {
                binder = TaskBinder.failed(executorId, "plugin init failed: " + Failures.describe(t));
            }
        }
    }

    private void startReporter(long intervalMs) {
        reporter = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "cudabridge-report");
            t.setDaemon(true);
            return t;
        });
        reporter.scheduleWithFixedDelay(this::report, intervalMs, intervalMs, TimeUnit.MILLISECONDS);
    }

    /** Sends the statistics to the driver plugin if they changed since the last report. */
    private synchronized void report() {
        TaskBinder b = binder;
        PluginContext ctx = context;
        if (b == null || ctx == null) {
            return;
        }
        try {
            Map<String, Long> s = b.isShutDown() ? b.statistics() : b.refresh();
            if (s.equals(lastReported)) {
                return;
            }
            ctx.send(new ExecutorReport(b.executorId(), ++reportSequence, b.failure() == null, b.failure(), s));
            lastReported = s;
        } catch (Throwable t) {
            LOG.debug("cudabridge: report to the driver failed", t);
        }
    }

    /** The binder of this executor (for tests and the examples' summaries). */
    public TaskBinder binder() {
        return binder;
    }

    @Override
    public void onTaskStart() {
        TaskBinder b = binder;
        if (b == null) {
            return;
        }
        TaskContext tc = TaskContext.get();
        if (tc == null) {
            return;
        }
        String address = null;
        Map<String, ResourceInformation> res = tc.resourcesJMap();
        if (res != null && gpuResource != null) {
            ResourceInformation gpu = res.get(gpuResource);
            if (gpu != null && gpu.addresses().length > 0) {
                address = gpu.addresses()[0];
            }
        }
        b.onTaskStart(tc.taskAttemptId(), address, tc::isInterrupted, tc.attemptNumber());   // the kill watch polls the flag
    }

    @Override
    public void onTaskSucceeded() {
        TaskBinder b = binder;
        if (b != null) {
            b.onTaskEnd(true);
        }
    }

    @Override
    public void onTaskFailed(TaskFailedReason failureReason) {
        TaskBinder b = binder;
        if (b == null) {
            return;
        }
        b.onTaskEnd(false);
        if (!TaskFailures.mayBeGpuFault(failureReason)) {
            return;   // not through the GPU: no probe, no call into Python
        }
        String fatal = b.deviceError();
        if (fatal != null) {
            LOG.error("cudabridge: task attempt failed because the GPU is unusable, not because of its code: {}",
                    Failures.oneLine(failureReason.toErrorString()));
            replaceExecutor(b.executorId(), fatal);
        }
    }

    /** The exit code of an executor whose GPU became unusable (spark-rapids exits with the same). */
    public static final int GPU_UNUSABLE_EXIT_CODE = 20;

    private final AtomicBoolean exiting = new AtomicBoolean();

    /**
     * After a sticky CUDA error the context is unusable for the life of the process: every later
     * task would fail on this executor. Exiting the executor JVM makes Spark's cluster manager start
     * a fresh one and run the failed tasks elsewhere (Spark's plugin API has no call to ask for a
     * replacement; spark-rapids exits the same way). In local mode the executor is the driver and
     * nothing can replace it: the error is logged and tasks keep failing fast.
     */
    private void replaceExecutor(String executorId, String error) {
        if ("driver".equals(executorId)) {
            LOG.error("cudabridge: the GPU is unusable ({}); in local mode the executor cannot be replaced, "
                    + "so its GPU tasks will keep failing", Failures.oneLine(error));
            return;
        }
        if (!exiting.compareAndSet(false, true)) {
            return;
        }
        LOG.error("cudabridge: executor {}: the GPU is unusable ({}); exiting with code {} so that Spark starts "
                + "a new executor", executorId, Failures.oneLine(error), GPU_UNUSABLE_EXIT_CODE);
        // Not on the task's thread: Spark's shutdown hooks stop the executor, which waits for it.
        Thread t = new Thread(() -> System.exit(GPU_UNUSABLE_EXIT_CODE), "cudabridge-exit");
        t.setDaemon(true);
        t.start();
    }

    @Override
    public void shutdown() {
        ScheduledExecutorService r = reporter;
        if (r != null) {
            r.shutdownNow();
        }
        TaskBinder b = binder;
        if (b != null) {
            b.shutdown();
            report(); // the final numbers, best effort (the driver may be gone)
            // Through slf4j, not TaskBinder's java.util.logging: when this runs in a shutdown hook
            // (Spark's, when the application exits without spark.stop(), or an executor's on
            // SIGTERM) the JDK's LogManager hook may have reset java.util.logging already, and
            // TaskBinder's own lines are lost.
            String failed = b.shutdownFailure();
            if (failed != null) {
                LOG.warn("cudabridge: executor {} service shutdown failed: {}", b.executorId(), Failures.oneLine(failed));
            }
            Map<String, Long> s = b.statistics();
            LOG.info("cudabridge: executor {} plugin shut down: {} task attempt(s) released, {} leak(s) reclaimed",
                    b.executorId(), s.getOrDefault("plugin_tasks_released", 0L),
                    s.getOrDefault("plugin_leaks_reclaimed", 0L));
        }
    }
}
