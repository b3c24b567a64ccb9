package org.cudabridge;

import java.util.List;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The Java side of the task registry: the task attempts bound through this API, by id, and each
 * thread's current task. Keyed by task attempt id, never by thread: Spark reuses task threads,
 * and several threads can work for one task ({@link #attach}).
 *
 * <p>Invariant: a scope is in {@code tasks} from its bind until its release began; a thread's
 * current task is a scope that was bound or attached on that thread and not detached since (it
 * may have been released meanwhile: {@link #currentTask} refuses it then).
 */
final class TaskTable {
    private static final ThreadLocal<TaskScope> CURRENT = new ThreadLocal<>();

    private final CudaBridge bridge;
    private final ConcurrentHashMap<Long, TaskScope> tasks = new ConcurrentHashMap<>();

    TaskTable(CudaBridge bridge) {
        this.bridge = bridge;
    }

    TaskScope bind(long taskAttemptId, String gpuAddress, Priority priority) {
        checkBind(taskAttemptId, priority);
        StreamBinding b = bindInPython(taskAttemptId, gpuAddress, priority);
        return register(new TaskScope(this, taskAttemptId, b, true));
    }

    TaskScope bindDeferred(long taskAttemptId, String gpuAddress, Priority priority) {
        checkBind(taskAttemptId, priority);
        return register(new TaskScope(this, taskAttemptId, gpuAddress, priority));
    }

    private void checkBind(long taskAttemptId, Priority priority) {
        if (taskAttemptId < 0) {
            throw new IllegalArgumentException("bindTask: task attempt id must be non-negative, got " + taskAttemptId);
        }
        Objects.requireNonNull(priority, "bindTask: priority");
        bridge.checkRunning("bindTask");
        if (tasks.containsKey(taskAttemptId)) {
            throw new IllegalStateException("bindTask: task " + taskAttemptId + " is bound already");
        }
    }

    private TaskScope register(TaskScope scope) {
        if (tasks.putIfAbsent(scope.taskAttemptId(), scope) != null) {
            // A concurrent bind of the same id won the race: undo this one in Python if it was bound.
            if (scope.isBound()) {
                NativeBridge.releaseTask(scope.taskAttemptId());
            }
            throw new IllegalStateException("bindTask: task " + scope.taskAttemptId() + " is bound already");
        }
        CURRENT.set(scope);
        return scope;
    }

    /** The bind in Python (a scope's deferred bind calls it too). */
    StreamBinding bindInPython(long taskAttemptId, String gpuAddress, Priority priority) {
        bridge.checkRunning("bindTask");
        return NativeBridge.bindTask(taskAttemptId, gpuAddress, priority);
    }

    ReleaseReport release(long taskAttemptId) {
        TaskScope scope = tasks.get(taskAttemptId);
        if (scope == null) {
            throw new IllegalStateException("releaseTask: task " + taskAttemptId + " is not bound through this bridge");
        }
        return scope.release();
    }

    /** See {@link CudaBridge#releaseTasks}: one call into Python for the scopes bound there. */
    ReleaseReport[] releaseAll(List<TaskScope> scopes) {
        int n = scopes.size();
        for (TaskScope s : scopes) {
            if (!s.isOwned()) {
                throw new IllegalStateException("task " + s.taskAttemptId() + " was bound outside the Java API");
            }
        }
        ReleaseReport[] reports = new ReleaseReport[n];
        long[] ids = new long[n];
        int[] where = new int[n];
        int k = 0;
        for (int i = 0; i < n; i++) {
            TaskScope s = scopes.get(i);
            ReleaseStart start = s.beginRelease();
            if (start == ReleaseStart.ALREADY) {
                reports[i] = s.release(); // the first release's report
                continue;
            }
            forget(s);
            if (start == ReleaseStart.IN_PYTHON && bridge.isRunning()) {
                ids[k] = s.taskAttemptId();
                where[k++] = i;
            } else {
                reports[i] = ReleaseReport.empty(s.taskAttemptId());
                s.endRelease(reports[i]);
            }
        }
        if (k == 0) {
            return reports;
        }
        ReleaseReport[] got;
        try {
            got = NativeBridge.releaseTasks(java.util.Arrays.copyOf(ids, k));
        } catch (RuntimeException e) { // the whole call failed (e.g. the service closed): say so for each
            got = new ReleaseReport[k];
            for (int j = 0; j < k; j++) {
                got[j] = ReleaseReport.failed(ids[j], String.valueOf(e.getMessage()));
            }
        }
        for (int j = 0; j < k; j++) {
            scopes.get(where[j]).endRelease(got[j]);
            reports[where[j]] = got[j];
        }
        return reports;
    }

    /** A scope's own release (its first {@link TaskScope#release()}). */
    ReleaseReport releaseScope(TaskScope scope, boolean boundInPython) {
        forget(scope);
        if (!bridge.isRunning() || !boundInPython) {
            return ReleaseReport.empty(scope.taskAttemptId());
        }
        return NativeBridge.releaseTask(scope.taskAttemptId());
    }

    private void forget(TaskScope scope) {
        tasks.remove(scope.taskAttemptId(), scope);
        if (CURRENT.get() == scope) {
            CURRENT.remove();
        }
    }

    Attachment attach(long taskAttemptId) {
        bridge.checkRunning("attach");
        TaskScope scope = tasks.get(taskAttemptId);
        if (scope == null) {
            // bound by Python code: not ours to release
            scope = new TaskScope(this, taskAttemptId, bridge.control().lookupTask(taskAttemptId), false);
        }
        Attachment a = new Attachment(scope, CURRENT.get());
        CURRENT.set(scope);
        return a;
    }

    /** Ends an attachment on its thread: the previous current task comes back, unless released. */
    static void restore(TaskScope previous) {
        if (previous != null && !previous.isReleased()) {
            CURRENT.set(previous);
        } else {
            CURRENT.remove();
        }
    }

    static void detach() {
        CURRENT.remove();
    }

    /** The thread's live current task, or null (no task bound, or released). */
    TaskScope currentTaskOrNull() {
        TaskScope t = CURRENT.get();
        return t == null || t.isReleased() ? null : t;
    }

    TaskScope currentTask() {
        TaskScope t = CURRENT.get();
        if (t == null) {
            throw new IllegalStateException("no task is bound on thread '" + Thread.currentThread().getName()
                    + "': call CudaBridge.bindTask (the plugin does in onTaskStart) or attach(taskAttemptId)");
        }
        t.checkLive("currentTask");
        return t;
    }

    int size() {
        return tasks.size();
    }

    /** The service closed: every scope is dead, with no call into Python. */
    void markAllReleased() {
        for (TaskScope t : tasks.values()) {
            t.markReleased();
        }
        tasks.clear();
    }
}
