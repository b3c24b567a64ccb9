package org.cudabridge.executor;

import java.util.List;
import java.util.Map;
import java.util.logging.Logger;

import org.cudabridge.CudaBridge;
import org.cudabridge.CudaBridgeException;
import org.cudabridge.Priority;
import org.cudabridge.ReleaseReport;
import org.cudabridge.TaskScope;
import org.cudabridge.executor.ExecutorCounters.Counter;

import static org.cudabridge.executor.Failures.describe;
import static org.cudabridge.executor.Failures.oneLine;

/**
 * What the executor plugin does with the bridge, without any Spark class: start it (never
 * throwing), bind a task attempt on its own thread at task start, release it at task end
 * (counting leaks), snapshot statistics for the gauges, shut down. The plugin
 * ({@code CudaBridgeExecutorPlugin}) calls it from Spark's hooks; the Java harness
 * ({@code org.cudabridge.examples.TaskHarness}) calls it the same way with no Spark present, so
 * the task code of the examples runs on the real GPU exactly as under the plugin. It logs with
 * the JDK's logging, as the whole core jar does (Spark routes that into its own logs).
 *
 * <p>The bound scope of the thread's current task attempt is kept in a {@link ThreadLocal}:
 * Spark calls {@code onTaskSucceeded}/{@code onTaskFailed} on the task's thread, where
 * {@code TaskContext.get()} is already null.
 *
 * <p>No task thread needs to cross into Python at a task's start or end: on a busy executor a
 * thread waiting for the GIL waits for every other Python caller and for the OS to schedule it.
 * A task is bound in Python at its first GPU call ({@code taskBind=lazy}, the default: a task
 * that never touches the GPU costs no Python call at all), or ahead of it on the
 * {@link LifecycleThread} ({@code ahead}), or in onTaskStart ({@code eager}); it is released on
 * the lifecycle thread, in the order tasks ended ({@code asyncRelease}, the default).
 */
public final class TaskBinder {
    private static final Logger LOG = Logger.getLogger(TaskBinder.class.getName());
    private static volatile TaskBinder current;

    private final String executorId;
    private final CudaBridge bridge;          // null when the start failed
    private final String failure;             // null when the bridge runs
    // From PluginConf; without a bridge (its start failed) none of them is used.
    private final Priority priority;
    private final TaskBind taskBind;
    private final TaskReleaser releaser;       // null when the start failed
    private final KillWatch killWatch;         // null when the start failed
    private final ThreadLocal<TaskScope> scope = new ThreadLocal<>();
    private final ThreadLocal<String> bindFailure = new ThreadLocal<>();
    private final ExecutorCounters counters = new ExecutorCounters();

    private final ExecutorStatistics statistics;
    private volatile boolean shutDown;
    private volatile String shutdownFailure;   // why the service's shutdown failed, or null

    private TaskBinder(String executorId, CudaBridge bridge, String failure, PluginConf conf) {
        this.executorId = executorId;
        this.bridge = bridge;
        this.failure = failure;
        this.priority = conf == null ? null : conf.taskPriority();
        this.taskBind = conf == null ? null : conf.taskBind();
        this.statistics = new ExecutorStatistics(counters, bridge, conf == null ? 0 : conf.metricsRefreshMs());
        this.releaser = bridge == null ? null
                : new TaskReleaser(executorId, bridge, counters, conf.asyncRelease(), taskBind == TaskBind.AHEAD);
        this.killWatch = bridge == null ? null : new KillWatch("cudabridge-kill-watch-" + executorId, bridge::cancelWaits);
        counters.set(Counter.START_FAILED, bridge == null ? 1 : 0);
    }

    /**
     * Starts the bridge and the service; never throws. On failure the reason is kept, one error
     * line is logged, and every GPU call of every task fails fast with that reason
     * ({@link GpuTask#bridge()}, {@link CudaBridge#get()}).
     *
     * @param gpuAddresses the executor's GPU resource addresses (null or empty: all visible GPUs)
     */
    public static TaskBinder start(String executorId, Map<String, String> sparkConf, String[] gpuAddresses) {
        long t0 = System.nanoTime();
        CudaBridge bridge = null;
        String reason = null;
        PluginConf conf = null;
        try {   // validate checks every key (service keys too) against the settings table
            conf = new PluginConf(sparkConf);
            conf.validate();
            bridge = CudaBridge.start(conf.toOptions(gpuAddresses, PluginConf.taskSlots(sparkConf)));
        } catch (Throwable t) { // never out of init: Spark would relaunch the executor forever
            reason = describe(t);
            bridge = null;
        }
        TaskBinder b = new TaskBinder(executorId, bridge, reason, bridge == null ? null : conf);
        b.counters.set(Counter.START_MS, System.nanoTime() - t0);
        if (reason != null) {
            LOG.severe("cudabridge: executor " + executorId + " has NO GPU service; every GPU call of its tasks will "
                    + "fail with: " + oneLine(reason));
        } else {
            LOG.info("cudabridge: executor " + executorId + " GPU service up in " + (System.nanoTime() - t0) / 1_000_000
                    + " ms: " + bridge.describe());
        }
        current = b;
        return b;
    }

    /** A binder whose service is unavailable for {@code reason} (every GPU call fails with it). */
    public static TaskBinder failed(String executorId, String reason) {
        TaskBinder b = new TaskBinder(executorId, null, reason, null);
        LOG.severe("cudabridge: executor " + executorId + " has NO GPU service; every GPU call of its tasks will "
                + "fail with: " + oneLine(reason));
        current = b;
        return b;
    }

    /** The binder of this JVM (the last started), or null. */
    public static TaskBinder current() {
        return current;
    }

    public boolean isAvailable() { return bridge != null && !shutDown; }

    /** Why the service is not available (start failure), or null. */
    public String failure() { return failure; }

    public String executorId() { return executorId; }

    /** The sticky CUDA error that made this executor's GPU unusable, or null (also when the bridge
     *  is not running or the question itself fails). One call into Python. */
    public String deviceError() {
        if (bridge == null || shutDown) {
            return null;
        }
        try {
            return bridge.deviceError();
        } catch (RuntimeException e) {
            LOG.fine("cudabridge: device health probe failed: " + oneLine(describe(e)));
            return null;
        }
    }

    /** The running bridge, or an exception that says why there is none (fast: no Python call). */
    public CudaBridge bridge() {
        if (bridge == null) {
            throw new CudaBridgeException("cudabridge is not available on executor " + executorId
                    + ": its start failed: " + failure, "startup");
        }
        if (shutDown) {
            throw new IllegalStateException("cudabridge on executor " + executorId + " was shut down");
        }
        String bf = bindFailure.get();
        if (bf != null) {
            throw new CudaBridgeException("cudabridge: this task could not be bound to a stream: " + bf, "bind");
        }
        return bridge;
    }

    /**
     * Binds a task attempt on the calling thread (the task's own thread): in Java at once, in
     * Python as {@code spark.cudabridge.taskBind} says (at the first GPU call by default).
     * Never throws: a failure is counted, logged, and makes this task's GPU calls fail with its
     * reason (a deferred bind's failure reaches the task's first GPU call, and is counted when the
     * task ends).
     *
     * @param gpuAddress the task's GPU resource address, or null for the executor's only GPU
     * @return whether the task is bound
     */
    public boolean onTaskStart(long taskAttemptId, String gpuAddress) {
        return onTaskStart(taskAttemptId, gpuAddress, null);
    }

    /**
     * As {@link #onTaskStart(long, String)}, with {@code interrupted}: whether Spark killed the task
     * (its {@code TaskContext.isInterrupted}), which {@link KillWatch} polls so that a killed task's
     * waits inside the service end at once; null: not watched.
     */
    public boolean onTaskStart(long taskAttemptId, String gpuAddress, java.util.function.BooleanSupplier interrupted) {
        return onTaskStart(taskAttemptId, gpuAddress, interrupted, 0);
    }

    /**
     * As {@link #onTaskStart(long, String, java.util.function.BooleanSupplier)}, with Spark's
     * attempt number: a retried attempt (above 0) is admitted ahead of the first attempts waiting
     * ({@link CudaBridge#retriedAttempt}; one call into Python per retried attempt only).
     */
    public boolean onTaskStart(long taskAttemptId, String gpuAddress, java.util.function.BooleanSupplier interrupted,
                               int attemptNumber) {
        counters.increment(Counter.TASKS_STARTED);
        if (attemptNumber > 0 && isAvailable()) {
            try {
                bridge.retriedAttempt(taskAttemptId);
            } catch (RuntimeException e) {   // admitted in arrival order then: nothing else changes
                LOG.fine("cudabridge: marking task attempt " + taskAttemptId + " as retried failed: " + e);
            }
        }
        if (interrupted != null && killWatch != null) {
            killWatch.started(taskAttemptId, interrupted);
        }
        bindFailure.remove();
        if (!isAvailable()) {
            return false;
        }
        TaskScope stale = scope.get();
        if (stale != null) {
            // The previous attempt on this thread never reported its end (Spark always does; be safe).
            scope.remove();
            releaser.releaseNow(List.of(stale));
        }
        long t0 = System.nanoTime();
        try {
            if (taskBind == TaskBind.EAGER) {
                scope.set(bridge.bindTask(taskAttemptId, gpuAddress, priority));
            } else {
                TaskScope s = bridge.bindTaskDeferred(taskAttemptId, gpuAddress, priority);
                scope.set(s);
                if (taskBind == TaskBind.AHEAD) {
                    releaser.bindAhead(s);
                }
            }
            counters.add(Counter.BIND_US_TOTAL, System.nanoTime() - t0);
            return true;
        } catch (Throwable t) {
            counters.increment(Counter.BIND_FAILURES);
            String why = describe(t);
            bindFailure.set(why);
            LOG.warning("cudabridge: task attempt " + taskAttemptId + " on executor " + executorId
                    + " could not be bound: " + oneLine(why));
            return false;
        }
    }

    /**
     * Ends the calling thread's task attempt: its leftover buffers are freed on its stream and
     * counted as leaks. With {@code spark.cudabridge.asyncRelease=true} (the default) the release
     * is handed to the lifecycle thread and this returns null at once; otherwise, and for a task
     * never bound in Python (no Python call then), it releases here and returns the report.
     * Returns null as well if no task was bound. Never throws.
     */
    public ReleaseReport onTaskEnd(boolean succeeded) {
        try {
            return end();
        } finally {
            // Counted last: a snapshot that counts this attempt ended sees its release done or pending.
            counters.increment(succeeded ? Counter.TASKS_SUCCEEDED : Counter.TASKS_FAILED);
        }
    }

    private ReleaseReport end() {
        bindFailure.remove();
        TaskScope s = scope.get();
        if (s == null) {
            return null;
        }
        scope.remove();
        if (killWatch != null) {
            killWatch.ended(s.taskAttemptId());
        }
        String bf = s.bindFailure();
        if (bf != null) {
            counters.increment(Counter.BIND_FAILURES);
            LOG.warning("cudabridge: task attempt " + s.taskAttemptId() + " on executor " + executorId
                    + " could not be bound: " + oneLine(bf));
        }
        return releaser.end(s);
    }

    /** Releases handed to the lifecycle thread and not yet done. */
    public long releasesPending() {
        return releaser == null ? 0 : releaser.pending();
    }

    /** The task attempt bound on the calling thread, or -1. */
    public long currentTaskAttempt() {
        TaskScope s = scope.get();
        return s == null ? -1 : s.taskAttemptId();
    }

    /** The plugin's own counters, by metric name ({@link ExecutorCounters#NAMES}). */
    public Map<String, Long> pluginCounters() {
        return counters.snapshot();
    }

    /** The executor's numbers, at most {@code spark.cudabridge.metrics.refreshMs} old
     *  ({@link ExecutorStatistics}). After shutdown: the last snapshot. */
    public Map<String, Long> statistics() {
        return statistics.get();
    }

    /** A fresh snapshot of the executor's numbers now. */
    public Map<String, Long> refresh() {
        return statistics.refresh();
    }

    /** Drains the streams, returns memory, destroys streams and events (the bridge's
     *  shutdown); statistics keep their last values. Never throws. */
    public void shutdown() {
        if (shutDown) {
            return;
        }
        if (releaser != null) {
            releaser.finish(10_000_000_000L);   // the releases handed over first: their leaks are counted
        }
        statistics.refresh();
        statistics.freeze();
        if (releaser != null) {
            releaser.stop();
        }
        if (killWatch != null) {
            killWatch.stop();
        }
        shutDown = true;
        if (bridge != null) {
            try {
                bridge.shutdown();
            } catch (Throwable t) {
                shutdownFailure = describe(t);
                LOG.warning("cudabridge: shutdown of executor " + executorId + "'s service failed: " + oneLine(shutdownFailure));
            }
        }
        Map<String, Long> s = statistics.get();
        LOG.info("cudabridge: executor " + executorId + " shut down: tasks started " + s.get("plugin_tasks_started")
                + ", released " + s.get("plugin_tasks_released") + ", leaks reclaimed " + s.get("plugin_leaks_reclaimed")
                + " (" + s.get("plugin_leaked_bytes_reclaimed") + " bytes), peak bytes in use "
                + s.getOrDefault("peak_in_use_bytes", 0L));
    }

    public boolean isShutDown() { return shutDown; }

    /** Why the service's shutdown failed (it threw), or null: also for a caller that logs through
     *  something other than the JDK's logging, which the JDK resets at JVM exit. */
    public String shutdownFailure() { return shutdownFailure; }
}
