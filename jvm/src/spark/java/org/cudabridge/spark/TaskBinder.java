package org.cudabridge.spark;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import java.util.logging.Level;
import java.util.logging.Logger;

import org.cudabridge.CudaBridge;
import org.cudabridge.CudaBridgeException;
import org.cudabridge.Priority;
import org.cudabridge.ReleaseReport;
import org.cudabridge.TaskScope;

/**
 * What the executor plugin does with the bridge, without any Spark class: start it (never
 * throwing), bind a task attempt on its own thread at task start, release it at task end
 * (counting leaks), snapshot statistics for the gauges, shut down. The plugin
 * ({@link CudaBridgeExecutorPlugin}) calls it from Spark's hooks; the Java harness
 * ({@code org.cudabridge.examples.TaskHarness}) calls it the same way with no Spark present, so
 * the task code of the examples runs on the real GPU exactly as under the plugin.
 *
 * <p>The bound scope of the thread's current task attempt is kept in a {@link ThreadLocal}:
 * Spark calls {@code onTaskSucceeded}/{@code onTaskFailed} on the task's thread, where
 * {@code TaskContext.get()} is already null.
 *
 * <p>No task thread crosses into Python at a task's start or end: on a busy executor a thread
 * waiting for the GIL waits for every other Python caller and for the OS to schedule it
 * (measured in Spark local[4] on 2 cores: 2-10 ms per bind in onTaskStart, against 80 us in a
 * quiet JVM). A task is bound in Python at its first GPU call ({@code taskBind=lazy}, the
 * default: a task that never touches the GPU costs no Python call at all), or ahead of it on the
 * lifecycle thread ({@code ahead}), or in onTaskStart ({@code eager}); it is released on the
 * lifecycle thread, in the order tasks ended.
 */
public final class TaskBinder {
    private static final Logger LOG = Logger.getLogger(TaskBinder.class.getName());
    private static volatile TaskBinder current;

    private final String executorId;
    private final CudaBridge bridge;          // null when the start failed
    private final String failure;             // null when the bridge runs
    // From PluginConf; without a bridge (its start failed) none of them is used.
    private final Priority priority;
    private final long refreshNanos;
    private final boolean asyncRelease;
    private final TaskBind taskBind;
    /** Work of the lifecycle thread, in order: a scope to bind ahead, or one to release. */
    private final ConcurrentLinkedQueue<Op> ops = new ConcurrentLinkedQueue<>();
    /** The lifecycle thread is parked until woken (idle for a while); else it polls. */
    private final AtomicBoolean lifecycleAsleep = new AtomicBoolean();
    private final AtomicLong releasesPending = new AtomicLong();
    private volatile Thread lifecycle;
    private final ThreadLocal<TaskScope> scope = new ThreadLocal<>();
    private final ThreadLocal<String> bindFailure = new ThreadLocal<>();

    final AtomicLong tasksStarted = new AtomicLong();
    final AtomicLong tasksSucceeded = new AtomicLong();
    final AtomicLong tasksFailed = new AtomicLong();
    final AtomicLong tasksReleased = new AtomicLong();
    final AtomicLong bindFailures = new AtomicLong();
    final AtomicLong bindsAhead = new AtomicLong();
    final AtomicLong releaseBatches = new AtomicLong();
    final AtomicLong bindsNeverApplied = new AtomicLong();
    final AtomicLong releaseFailures = new AtomicLong();
    final AtomicLong leaksReclaimed = new AtomicLong();
    final AtomicLong leakedBytesReclaimed = new AtomicLong();
    final AtomicLong startNanos = new AtomicLong();
    final AtomicLong bindNanos = new AtomicLong();
    final AtomicLong releaseNanos = new AtomicLong();
    /** CPU time of the lifecycle thread so far (its polls included), read on that thread. */
    private volatile long lifecycleCpuNanos;

    private final Object snapshotLock = new Object();
    private volatile Map<String, Long> snapshot = Collections.emptyMap();
    private volatile long snapshotAt;
    private volatile boolean shutDown;
    private volatile String shutdownFailure;   // why the service's shutdown failed, or null

    // While tasks come and go the lifecycle thread wakes every POLL_NANOS and does all that was
    // queued meanwhile, in one batch:
    // - it is not woken per task: on a busy executor the OS often runs a woken thread at once,
    //   preempting the task thread that woke it (measured: about 1 ms per onTaskStart in Spark
    //   local[4] on 2 cores);
    // - each call into Python from this thread finds the interpreter's code and data evicted by
    //   the JVM's work since the last one (measured: a release costs 8 us warm, 100 us cold); a
    //   batch pays that once;
    // - each timed wake costs CPU (measured on this project's 2-core VM: 20-70 us a wake, whatever
    //   the interval), so the interval is long: a release waits up to 20 ms (nothing but memory
    //   waits for it), a bind ahead as long (a task's GPU call that comes first binds it itself).
    // After IDLE_NANOS without work it parks until the next task wakes it (an idle executor
    // costs nothing).
    private static final long POLL_NANOS = 20_000_000L;
    private static final long IDLE_NANOS = 200_000_000L;

    private static final class Op {
        final TaskScope scope;
        final boolean release;

        Op(TaskScope scope, boolean release) {
            this.scope = scope;
            this.release = release;
        }
    }

    private TaskBinder(String executorId, CudaBridge bridge, String failure, Priority priority, long refreshMs,
                       boolean asyncRelease, TaskBind taskBind) {
        this.executorId = executorId;
        this.bridge = bridge;
        this.failure = failure;
        this.priority = priority;
        this.refreshNanos = refreshMs * 1_000_000L;
        this.asyncRelease = asyncRelease && bridge != null;
        this.taskBind = taskBind;
        if (bridge != null && (this.asyncRelease || taskBind == TaskBind.AHEAD)) {
            Thread t = new Thread(this::lifecycleLoop, "cudabridge-lifecycle-" + executorId);
            t.setDaemon(true);
            lifecycle = t;
            t.start();
        }
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
        Priority priority = null;
        long refreshMs = 0;
        boolean async = false;
        TaskBind bind = null;
        try {   // validate checks every key (service keys too) against the settings table
            PluginConf conf = new PluginConf(sparkConf);
            conf.validate();
            priority = conf.taskPriority();
            refreshMs = conf.metricsRefreshMs();
            async = conf.asyncRelease();
            bind = conf.taskBind();
            bridge = CudaBridge.start(conf.toOptions(gpuAddresses));
        } catch (Throwable t) { // never out of init: Spark would relaunch the executor forever
            reason = describe(t);
            bridge = null;
        }
        TaskBinder b = new TaskBinder(executorId, bridge, reason, priority, refreshMs, async, bind);
        b.startNanos.set(System.nanoTime() - t0);
        if (reason != null) {
            LOG.severe("cudabridge: executor " + executorId + " has NO GPU service; every GPU call of its tasks will "
                    + "fail with: " + oneLine(reason));
        } else {
            LOG.info("cudabridge: executor " + executorId + " GPU service up in " + (b.startNanos.get() / 1_000_000)
                    + " ms: " + bridge.describe());
        }
        current = b;
        return b;
    }

    /** A binder whose service is unavailable for {@code reason} (every GPU call fails with it). */
    static TaskBinder failed(String executorId, String reason) {
        TaskBinder b = new TaskBinder(executorId, null, reason, null, 0, false, null); // no bridge: none is used
        LOG.severe("cudabridge: executor " + executorId + " has NO GPU service; every GPU call of its tasks will "
                + "fail with: " + oneLine(reason));
        current = b;
        return b;
    }

    /** The binder of this JVM (the last started), or null. */
    public static TaskBinder current() {
        return current;
    }

    static String describe(Throwable t) {
        if (t instanceof ExceptionInInitializerError && t.getCause() != null) {
            return describe(t.getCause()); // e.g. the settings table could not be read
        }
        String m = t.getMessage();
        return (m == null || m.isEmpty()) ? t.toString() : (t instanceof CudaBridgeException || m.startsWith("cudabridge")
                ? m : t.getClass().getName() + ": " + m);
    }

    static String oneLine(String s) {
        String flat = s.replace("\r", "").replace("\n", " | ").replaceAll("\\s+", " ").trim();
        return flat.length() > 2000 ? flat.substring(0, 2000) + " ..." : flat;
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
        tasksStarted.incrementAndGet();
        bindFailure.remove();
        if (!isAvailable()) {
            return false;
        }
        TaskScope stale = scope.get();
        if (stale != null) {
            // The previous attempt on this thread never reported its end (Spark always does; be safe).
            scope.remove();
            release(stale);
        }
        long t0 = System.nanoTime();
        try {
            if (taskBind == TaskBind.EAGER) {
                scope.set(bridge.bindTask(taskAttemptId, gpuAddress, priority));
            } else {
                TaskScope s = bridge.bindTaskDeferred(taskAttemptId, gpuAddress, priority);
                scope.set(s);
                if (taskBind == TaskBind.AHEAD) {
                    submit(new Op(s, false));
                }
            }
            bindNanos.addAndGet(System.nanoTime() - t0);
            return true;
        } catch (Throwable t) {
            bindFailures.incrementAndGet();
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
     * is handed to the executor's lifecycle thread and this returns null at once (the task's
     * thread leaves its task now; the release, one call into Python, runs off the task's critical
     * path, and fewer task threads queue for the GIL); otherwise, and for a task never bound in
     * Python (no Python call then), it releases here and returns the report. Returns null as well
     * if no task was bound. Never throws.
     */
    public ReleaseReport onTaskEnd(boolean succeeded) {
        try {
            return end();
        } finally {
            // Counted last: a snapshot that counts this attempt ended sees its release done or pending.
            (succeeded ? tasksSucceeded : tasksFailed).incrementAndGet();
        }
    }

    private ReleaseReport end() {
        bindFailure.remove();
        TaskScope s = scope.get();
        if (s == null) {
            return null;
        }
        scope.remove();
        String bf = s.bindFailure();
        if (bf != null) {
            bindFailures.incrementAndGet();
            LOG.warning("cudabridge: task attempt " + s.taskAttemptId() + " on executor " + executorId
                    + " could not be bound: " + oneLine(bf));
        }
        if (asyncRelease && !shutDown && s.isBound()) {
            try {
                bridge.detach(); // this thread has no current task from now on
            } catch (RuntimeException e) {
                // detach only clears a ThreadLocal
            }
            releasesPending.incrementAndGet();
            submit(new Op(s, true));
            return null;
        }
        return release(s);
    }

    private void submit(Op op) {
        ops.add(op);
        if (lifecycleAsleep.get() && lifecycleAsleep.compareAndSet(true, false)) {
            LockSupport.unpark(lifecycle);
        }
    }

    private void lifecycleLoop() {
        java.lang.management.ThreadMXBean mx = java.lang.management.ManagementFactory.getThreadMXBean();
        boolean cpu = mx.isCurrentThreadCpuTimeSupported();
        long lastWork = System.nanoTime();
        while (!shutDown) {
            if (!ops.isEmpty()) {
                drain();
                if (cpu) {
                    lifecycleCpuNanos = mx.getCurrentThreadCpuTime();
                }
                lastWork = System.nanoTime();
            }
            if (shutDown) {
                return;
            }
            if (System.nanoTime() - lastWork < IDLE_NANOS) {
                LockSupport.parkNanos(this, POLL_NANOS);
            } else {
                lifecycleAsleep.set(true);
                if (ops.isEmpty() && !shutDown) {   // checked after saying so: no wake-up is lost
                    LockSupport.parkNanos(this, 1_000_000_000L);
                }
                lifecycleAsleep.set(false);
            }
        }
    }

    /** Runs every queued op in order: consecutive releases as one batch, binds one by one. */
    private void drain() {
        List<TaskScope> batch = new ArrayList<>();
        Op op;
        while ((op = ops.poll()) != null) {
            if (op.release) {
                batch.add(op.scope);
                continue;
            }
            releaseBatch(batch);
            // Not if the task's own thread bound it first or the task ended already (then it
            // never touched the GPU and is never bound in Python).
            if (!shutDown && op.scope.applyBind()) {
                bindsAhead.incrementAndGet();
            }
        }
        releaseBatch(batch);
    }

    private void releaseBatch(List<TaskScope> batch) {
        if (batch.isEmpty()) {
            return;
        }
        try {
            release(batch);
        } finally {
            releasesPending.addAndGet(-batch.size());
            batch.clear();
        }
    }

    /** Releases the scopes with one call into Python, counting and logging each; a report per
     *  scope, null where its release failed (or after shutdown). Never throws. */
    private ReleaseReport[] release(List<TaskScope> scopes) {
        ReleaseReport[] reports = new ReleaseReport[scopes.size()];
        if (shutDown) {
            return reports;
        }
        long t0 = System.nanoTime();
        ReleaseReport[] got;
        try {
            got = bridge.releaseTasks(scopes);
        } catch (Throwable t) {
            releaseFailures.addAndGet(scopes.size());
            LOG.warning("cudabridge: releasing " + scopes.size() + " task attempt(s) failed: " + oneLine(describe(t)));
            return reports;
        }
        releaseNanos.addAndGet(System.nanoTime() - t0);
        releaseBatches.incrementAndGet();
        for (int i = 0; i < got.length; i++) {
            TaskScope s = scopes.get(i);
            ReleaseReport r = got[i];
            if (r.failure() != null) {
                releaseFailures.incrementAndGet();
                LOG.warning("cudabridge: releasing task attempt " + s.taskAttemptId() + " failed: "
                        + oneLine(r.failure()));
                continue;
            }
            counted(s, r);
            reports[i] = r;
        }
        return reports;
    }

    private void counted(TaskScope s, ReleaseReport r) {
        tasksReleased.incrementAndGet();
        if (s.wasNeverBound()) {
            bindsNeverApplied.incrementAndGet();
        }
        if (r.leaksReclaimed() > 0) {
            leaksReclaimed.addAndGet(r.leaksReclaimed());
            leakedBytesReclaimed.addAndGet(r.leakedBytesReclaimed());
            if (LOG.isLoggable(Level.FINE)) {
                LOG.fine("cudabridge: " + r);
            }
        }
    }

    /** Releases handed to the release thread and not yet done. */
    public long releasesPending() {
        return releasesPending.get();
    }

    private ReleaseReport release(TaskScope s) {
        return release(Collections.singletonList(s))[0];
    }

    /** The task attempt bound on the calling thread, or -1. */
    public long currentTaskAttempt() {
        TaskScope s = scope.get();
        return s == null ? -1 : s.taskAttemptId();
    }

    /**
     * Task attempts whose end (success or failure) a snapshot counts, or 0 while releases of
     * ended attempts are still pending: once this reaches {@code n}, the snapshot counts the
     * leaks of those {@code n} attempts (see {@link #refresh()} for why that holds).
     */
    public static long ended(Map<String, Long> statistics) {
        if (statistics.getOrDefault("plugin_releases_pending", 0L) > 0) {
            return 0;
        }
        return statistics.getOrDefault("plugin_tasks_succeeded", 0L) + statistics.getOrDefault("plugin_tasks_failed", 0L);
    }

    /** The plugin's own counters, named once here; the executor metrics register each
     *  ({@link MetricNames}). Read in this order: the ended attempts before
     *  {@code plugin_releases_pending}, which {@link #ended} and {@link #refresh()} rely on. */
    public static final List<String> PLUGIN_COUNTERS = List.of(
            "plugin_start_failed", "plugin_start_ms", "plugin_tasks_started", "plugin_tasks_succeeded",
            "plugin_tasks_failed", "plugin_tasks_released", "plugin_releases_pending", "plugin_bind_failures",
            "plugin_binds_ahead", "plugin_binds_never_applied", "plugin_release_failures", "plugin_leaks_reclaimed",
            "plugin_leaked_bytes_reclaimed", "plugin_bind_us_total", "plugin_release_us_total",
            "plugin_lifecycle_cpu_us", "plugin_release_batches");

    public Map<String, Long> pluginCounters() {
        Map<String, Long> m = new LinkedHashMap<>();
        for (String name : PLUGIN_COUNTERS) {
            m.put(name, counter(name));
        }
        return m;
    }

    private long counter(String name) {
        return switch (name) {
            case "plugin_start_failed" -> bridge == null ? 1L : 0L;
            case "plugin_start_ms" -> startNanos.get() / 1_000_000L;
            case "plugin_tasks_started" -> tasksStarted.get();
            case "plugin_tasks_succeeded" -> tasksSucceeded.get();
            case "plugin_tasks_failed" -> tasksFailed.get();
            case "plugin_tasks_released" -> tasksReleased.get();
            case "plugin_releases_pending" -> releasesPending.get();
            case "plugin_bind_failures" -> bindFailures.get();
            case "plugin_binds_ahead" -> bindsAhead.get();                 // applied on the lifecycle thread
            case "plugin_binds_never_applied" -> bindsNeverApplied.get();  // ended before any GPU use: never bound in Python
            case "plugin_release_failures" -> releaseFailures.get();
            case "plugin_leaks_reclaimed" -> leaksReclaimed.get();         // summed from the release reports
            case "plugin_leaked_bytes_reclaimed" -> leakedBytesReclaimed.get();
            case "plugin_bind_us_total" -> bindNanos.get() / 1000;         // time the task threads spent in onTaskStart's bind
            case "plugin_release_us_total" -> releaseNanos.get() / 1000;   // ... and in the release
            case "plugin_lifecycle_cpu_us" -> lifecycleCpuNanos / 1000;    // the lifecycle thread's CPU time
            case "plugin_release_batches" -> releaseBatches.get();         // release calls (one task or a batch)
            default -> throw new IllegalStateException("TaskBinder: no counter " + name);
        };
    }

    /** Service statistics (through {@link CudaBridge#statistics()}) merged with the plugin's
     *  counters; a snapshot at most {@code spark.cudabridge.metrics.refreshMs} old, so a sink
     *  reading twenty gauges makes one call into Python. After shutdown: the last snapshot. */
    public Map<String, Long> statistics() {
        long now = System.nanoTime();
        if (now - snapshotAt < refreshNanos && !snapshot.isEmpty()) {
            return snapshot;
        }
        return refresh();
    }

    /**
     * A fresh snapshot now (at most one caller at a time goes to Python).
     *
     * <p>Invariant: the plugin's counters are read before the service's statistics, and an
     * attempt is counted ended only after its release is done or counted pending
     * ({@link #onTaskEnd}). So a snapshot that counts {@code n} attempts ended and none pending
     * holds the service's statistics of after their releases, their leaks included, and the
     * service's {@code leaks_reclaimed} is never behind {@code plugin_leaks_reclaimed}.
     */
    public Map<String, Long> refresh() {
        synchronized (snapshotLock) {
            Map<String, Long> plugin = pluginCounters();
            Map<String, Long> m = new TreeMap<>();
            if (bridge != null && !shutDown) {
                try {
                    m.putAll(bridge.statistics());
                } catch (Throwable t) {
                    if (!shutDown) {
                        LOG.fine("cudabridge: statistics failed: " + t);
                    }
                    Map<String, Long> last = snapshot;
                    m.putAll(last);
                }
            } else {
                m.putAll(snapshot);
            }
            m.putAll(plugin);
            m.put("bridge_calls", m.getOrDefault("bridge_calls_total", 0L)); // the bridge's hot-path calls into Python
            Map<String, Long> frozen = Collections.unmodifiableMap(m);
            snapshot = frozen;
            snapshotAt = System.nanoTime();
            return frozen;
        }
    }

    /** Drains the streams, returns memory, destroys streams and events (the bridge's
     *  shutdown); statistics keep their last values. Never throws. */
    public void shutdown() {
        if (shutDown) {
            return;
        }
        // Finish the releases handed to the lifecycle thread first (their leaks are counted).
        long deadline = System.nanoTime() + 10_000_000_000L;
        Thread worker = lifecycle;
        while (releasesPending.get() > 0 && System.nanoTime() < deadline) {
            if (worker != null && worker.isAlive()) {
                LockSupport.unpark(worker);
                LockSupport.parkNanos(200_000L);
            } else {
                drain();
            }
        }
        refresh();
        shutDown = true;
        Thread r = lifecycle;
        if (r != null) {
            LockSupport.unpark(r);
        }
        if (bridge != null) {
            try {
                bridge.shutdown();
            } catch (Throwable t) {
                shutdownFailure = describe(t);
                LOG.warning("cudabridge: shutdown of executor " + executorId + "'s service failed: " + oneLine(shutdownFailure));
            }
        }
        Map<String, Long> s = snapshot;
        LOG.info("cudabridge: executor " + executorId + " shut down: tasks started " + tasksStarted.get()
                + ", released " + tasksReleased.get() + ", leaks reclaimed " + leaksReclaimed.get()
                + " (" + leakedBytesReclaimed.get() + " bytes), peak bytes in use " + s.getOrDefault("peak_in_use_bytes", 0L));
    }

    public boolean isShutDown() { return shutDown; }

    /** Why the service's shutdown failed (it threw), or null: also for a caller that logs through
     *  something other than this class's java.util.logging, which the JDK resets at JVM exit. */
    public String shutdownFailure() { return shutdownFailure; }
}
