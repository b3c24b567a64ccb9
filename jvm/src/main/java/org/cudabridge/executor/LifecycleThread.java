package org.cudabridge.executor;

import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.locks.LockSupport;

import org.cudabridge.ReleaseReport;
import org.cudabridge.TaskScope;

/**
 * The executor's lifecycle thread: it binds tasks ahead of their first GPU call and releases
 * ended tasks, off the task threads, in the order they were handed over; consecutive releases go
 * to Python as one batch.
 *
 * <p>Why it polls while tasks come and go, instead of being woken per task: a woken thread is
 * often run at once, preempting the task thread that woke it; each call into Python from here
 * finds the interpreter's code and data evicted by the JVM's work since the last one, which a
 * batch pays once; and every timed wake costs CPU whatever the interval, so the interval is long
 * (a release only returns memory later; a task's own GPU call binds it if the bind ahead has not
 * come yet). After {@link #IDLE_NANOS} without work it parks until the next hand-over wakes it, so
 * an idle executor costs nothing. The measurements behind these choices: bench/RESULTS.md,
 * "Task lifecycle inside Spark".
 *
 * <p>Invariant: {@link #pending()} counts the releases handed over and not yet done; it is raised
 * before a release is queued and lowered after its call into Python returned.
 */
final class LifecycleThread {
    /** What the thread does with the work handed to it. */
    interface Work {
        /** Applies a deferred bind (unless the task's own thread did, or the task ended). */
        void applyBind(TaskScope scope);

        /** Releases the tasks, one call into Python; never throws. */
        ReleaseReport[] releaseNow(List<TaskScope> scopes);
    }

    static final long POLL_NANOS = 20_000_000L;
    static final long IDLE_NANOS = 200_000_000L;

    private record Op(TaskScope scope, boolean release) {}

    private final Work work;
    private final ExecutorCounters counters;
    private final ConcurrentLinkedQueue<Op> ops = new ConcurrentLinkedQueue<>();
    private final AtomicBoolean asleep = new AtomicBoolean();   // parked until woken, else polling
    private final Thread thread;
    private volatile boolean stopped;

    LifecycleThread(String name, Work work, ExecutorCounters counters) {
        this.work = work;
        this.counters = counters;
        this.thread = new Thread(this::loop, name);
        this.thread.setDaemon(true);
        this.thread.start();
    }

    void bindAhead(TaskScope scope) {
        submit(new Op(scope, false));
    }

    void release(TaskScope scope) {
        counters.increment(ExecutorCounters.Counter.RELEASES_PENDING);
        submit(new Op(scope, true));
    }

    long pending() {
        return counters.raw(ExecutorCounters.Counter.RELEASES_PENDING);
    }

    private void submit(Op op) {
        ops.add(op);
        if (asleep.get() && asleep.compareAndSet(true, false)) {
            LockSupport.unpark(thread);
        }
    }

    /** Waits (at most {@code timeoutNanos}) until every release handed over is done. */
    void finish(long timeoutNanos) {
        long deadline = System.nanoTime() + timeoutNanos;
        while (pending() > 0 && System.nanoTime() < deadline) {
            if (thread.isAlive()) {
                LockSupport.unpark(thread);
                LockSupport.parkNanos(200_000L);
            } else {
                drain();
            }
        }
    }

    /** Ends the thread (what is still queued is dropped: call {@link #finish} first). */
    void stop() {
        stopped = true;
        LockSupport.unpark(thread);
    }

    private void loop() {
        ThreadMXBean mx = ManagementFactory.getThreadMXBean();
        boolean cpu = mx.isCurrentThreadCpuTimeSupported();
        long lastWork = System.nanoTime();
        while (!stopped) {
            if (!ops.isEmpty()) {
                drain();
                if (cpu) {
                    counters.set(ExecutorCounters.Counter.LIFECYCLE_CPU_US, mx.getCurrentThreadCpuTime());
                }
                lastWork = System.nanoTime();
            }
            if (stopped) {
                return;
            }
            if (System.nanoTime() - lastWork < IDLE_NANOS) {
                LockSupport.parkNanos(this, POLL_NANOS);
            } else {
                asleep.set(true);
                if (ops.isEmpty() && !stopped) {   // checked after saying so: no wake-up is lost
                    LockSupport.parkNanos(this, 1_000_000_000L);
                }
                asleep.set(false);
            }
        }
    }

    /** Runs every queued op in order: consecutive releases as one batch, binds one by one. */
    private synchronized void drain() {
        List<TaskScope> batch = new ArrayList<>();
        Op op;
        while ((op = ops.poll()) != null) {
            if (op.release()) {
                batch.add(op.scope());
                continue;
            }
            releaseBatch(batch);
            if (!stopped) {
                work.applyBind(op.scope());
            }
        }
        releaseBatch(batch);
    }

    private void releaseBatch(List<TaskScope> batch) {
        if (batch.isEmpty()) {
            return;
        }
        try {
            work.releaseNow(batch);
        } finally {
            counters.add(ExecutorCounters.Counter.RELEASES_PENDING, -batch.size());
            batch.clear();
        }
    }
}
