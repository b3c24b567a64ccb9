package org.cudabridge.executor;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.locks.LockSupport;
import java.util.function.BooleanSupplier;
import java.util.function.LongConsumer;
import java.util.logging.Logger;

/**
 * Tells the service when Spark kills a running task (a cancelled job, a speculative copy whose
 * twin won): Spark interrupts the task's thread, which a thread waiting inside the service (an
 * allocation waiting for memory, a bind waiting for admission) never sees, since it waits in
 * Python. This daemon thread looks at each running task's "interrupted" flag (Spark's
 * {@code TaskContext.isInterrupted}, handed over at task start) every {@link #POLL_NANOS} while
 * tasks run, and ends a killed task's waits once ({@code CudaBridge.cancelWaits}): the task's
 * thread then gets out, and the task ends and is released as any failed task. Parked while no
 * task runs. Invariant: each task is cancelled at most once, and only while it runs.
 */
final class KillWatch {
    private static final Logger LOG = Logger.getLogger(KillWatch.class.getName());
    static final long POLL_NANOS = 50_000_000L;

    private final Map<Long, BooleanSupplier> running = new ConcurrentHashMap<>();
    private final Map<Long, Boolean> cancelled = new ConcurrentHashMap<>();
    private final LongConsumer cancel;
    private final Thread thread;
    private volatile boolean stopped;

    KillWatch(String name, LongConsumer cancel) {
        this.cancel = cancel;
        this.thread = new Thread(this::loop, name);
        this.thread.setDaemon(true);
        this.thread.start();
    }

    /** A task starts on this executor; {@code interrupted} says whether Spark killed it. */
    void started(long task, BooleanSupplier interrupted) {
        running.put(task, interrupted);
        LockSupport.unpark(thread);
    }

    /** The task ended (its release follows). */
    void ended(long task) {
        running.remove(task);
        cancelled.remove(task);
    }

    void stop() {
        stopped = true;
        LockSupport.unpark(thread);
    }

    int running() {
        return running.size();
    }

    private void loop() {
        while (!stopped) {
            if (running.isEmpty()) {
                LockSupport.parkNanos(this, 1_000_000_000L);
                continue;
            }
            for (Map.Entry<Long, BooleanSupplier> e : running.entrySet()) {
                long task = e.getKey();
                if (cancelled.containsKey(task) || !e.getValue().getAsBoolean()) {
                    continue;
                }
                cancelled.put(task, Boolean.TRUE);
                try {
                    cancel.accept(task);
                } catch (RuntimeException ex) {   // the service shut down meanwhile, say: nothing waits any more
                    LOG.fine("cudabridge: ending the waits of killed task " + task + " failed: " + ex);
                }
            }
            LockSupport.parkNanos(this, POLL_NANOS);
        }
    }
}
