package org.cudabridge.executor;

import java.util.List;
import java.util.logging.Logger;

import org.cudabridge.CudaBridge;
import org.cudabridge.ReleaseReport;
import org.cudabridge.TaskScope;
import org.cudabridge.executor.ExecutorCounters.Counter;

import static org.cudabridge.executor.Failures.describe;
import static org.cudabridge.executor.Failures.oneLine;

/**
 * Releases ended task attempts and applies binds ahead, on the {@link LifecycleThread} where the
 * configuration says so ({@code asyncRelease}, {@code taskBind=ahead}), else on the calling
 * thread; counts every release in the {@link ExecutorCounters}. Never throws from a release.
 */
final class TaskReleaser implements LifecycleThread.Work {
    private static final Logger LOG = Logger.getLogger(TaskReleaser.class.getName());

    private final CudaBridge bridge;
    private final ExecutorCounters counters;
    private final boolean async;
    private final LifecycleThread lifecycle;   // null: nothing is handed over
    private volatile boolean stopped;

    TaskReleaser(String executorId, CudaBridge bridge, ExecutorCounters counters, boolean asyncRelease,
                 boolean bindsAhead) {
        this.bridge = bridge;
        this.counters = counters;
        this.async = asyncRelease;
        this.lifecycle = asyncRelease || bindsAhead
                ? new LifecycleThread("cudabridge-lifecycle-" + executorId, this, counters) : null;
    }

    /** Hands a deferred bind to the lifecycle thread (configured with {@code bindsAhead}). */
    void bindAhead(TaskScope s) {
        lifecycle.bindAhead(s);
    }

    @Override
    public void applyBind(TaskScope s) {
        // Not if the task's own thread bound it first or the task ended already (then it
        // never touched the GPU and is never bound in Python).
        if (!stopped && s.applyBind()) {
            counters.increment(Counter.BINDS_AHEAD);
        }
    }

    /** A task attempt ended: hands its release over (null: no report yet), or releases it here
     *  when releases are not asynchronous or it was never bound in Python (no Python call then). */
    ReleaseReport end(TaskScope s) {
        if (async && !stopped && s.isBound()) {
            bridge.detach(); // this thread has no current task from now on (clears a ThreadLocal)
            lifecycle.release(s);
            return null;
        }
        return releaseNow(List.of(s))[0];
    }

    /** Releases the scopes with one call into Python, counting and logging each; a report per
     *  scope, null where its release failed (or after {@link #stop()}). */
    @Override
    public ReleaseReport[] releaseNow(List<TaskScope> scopes) {
        ReleaseReport[] reports = new ReleaseReport[scopes.size()];
        if (stopped) {
            return reports;
        }
        long t0 = System.nanoTime();
        ReleaseReport[] got;
        try {
            got = bridge.releaseTasks(scopes);
        } catch (Throwable t) {
            counters.add(Counter.RELEASE_FAILURES, scopes.size());
            LOG.warning("cudabridge: releasing " + scopes.size() + " task attempt(s) failed: " + oneLine(describe(t)));
            return reports;
        }
        counters.add(Counter.RELEASE_US_TOTAL, System.nanoTime() - t0);
        counters.increment(Counter.RELEASE_BATCHES);
        for (int i = 0; i < got.length; i++) {
            if (counters.countRelease(got[i], scopes.get(i).wasNeverBound())) {
                reports[i] = got[i];
            } else {
                LOG.warning("cudabridge: releasing task attempt " + got[i].taskAttemptId() + " failed: "
                        + oneLine(got[i].failure()));
            }
        }
        return reports;
    }

    long pending() {
        return lifecycle == null ? 0 : lifecycle.pending();
    }

    /** Waits (at most {@code timeoutNanos}) for the releases handed over. */
    void finish(long timeoutNanos) {
        if (lifecycle != null) {
            lifecycle.finish(timeoutNanos);
        }
    }

    /** No release after this (the service shuts down). */
    void stop() {
        stopped = true;
        if (lifecycle != null) {
            lifecycle.stop();
        }
    }
}
