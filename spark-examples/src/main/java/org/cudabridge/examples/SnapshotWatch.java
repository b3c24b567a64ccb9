package org.cudabridge.examples;

import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;

import org.cudabridge.executor.TaskBinder;
import org.cudabridge.executor.ExecutorStatistics;

/**
 * Takes {@link TaskBinder#refresh()} snapshots in a loop while tasks run and end, as the
 * executor's reports to the driver do, and checks the two things a reader of one snapshot relies
 * on: the service's {@code leaks_reclaimed} is never behind the plugin's own
 * {@code plugin_leaks_reclaimed} (which counts release reports the service already made), and,
 * when every task attempt leaks one allocation, a snapshot that counts {@code n} attempts ended
 * ({@link TaskBinder#ended}) shows at least {@code n} leaks reclaimed.
 */
final class SnapshotWatch {
    private final TaskBinder binder;
    private final boolean oneLeakPerAttempt;
    private final Thread thread;
    private final AtomicLong checked = new AtomicLong();
    private final AtomicLong inconsistent = new AtomicLong();
    private volatile String firstProblem;
    private volatile boolean stop;

    private SnapshotWatch(TaskBinder binder, boolean oneLeakPerAttempt) {
        this.binder = binder;
        this.oneLeakPerAttempt = oneLeakPerAttempt;
        this.thread = new Thread(this::loop, "snapshot-watch");
        this.thread.setDaemon(true);
    }

    static SnapshotWatch start(TaskBinder binder, boolean oneLeakPerAttempt) {
        SnapshotWatch w = new SnapshotWatch(binder, oneLeakPerAttempt);
        w.thread.start();
        return w;
    }

    private void loop() {
        while (!stop) {
            check(binder.refresh());
        }
    }

    private void check(Map<String, Long> s) {
        checked.incrementAndGet();
        long service = s.getOrDefault("leaks_reclaimed", 0L);
        long plugin = s.getOrDefault("plugin_leaks_reclaimed", 0L);
        long ended = ExecutorStatistics.ended(s);
        String problem = null;
        if (service < plugin) {
            problem = "leaks_reclaimed " + service + " < plugin_leaks_reclaimed " + plugin;
        } else if (oneLeakPerAttempt && service < ended) {
            problem = "leaks_reclaimed " + service + " < " + ended + " task attempts ended";
        }
        if (problem != null && inconsistent.getAndIncrement() == 0) {
            firstProblem = problem;
        }
    }

    void stop() throws InterruptedException {
        stop = true;
        thread.join();
        check(binder.refresh());
    }

    long checked() {
        return checked.get();
    }

    long inconsistent() {
        return inconsistent.get();
    }

    String firstProblem() {
        return firstProblem;
    }
}
