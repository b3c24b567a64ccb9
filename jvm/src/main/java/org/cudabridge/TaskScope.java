package org.cudabridge;

import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A bound task attempt: its stream and GPU, cached here on the Java side so that
 * {@link CudaBridge#stream()} never crosses into Python. Closing it releases the task: every
 * buffer it still holds is freed asynchronously on its stream and counted as a leak, and every
 * {@link DeviceBuffer} of it is dead from then on.
 *
 * <p>Keyed by task attempt id, never by thread: Spark reuses task threads, and several threads
 * can work for one task ({@link CudaBridge#attach(long)}).
 *
 * <p>A scope from {@link CudaBridge#bindTaskDeferred} is bound in Java at once and in Python
 * later, by whoever comes first: {@link #applyBind()} on another thread (the plugin's lifecycle
 * thread binds ahead, off the task's critical path), or the task's first GPU call (which then
 * binds on its own thread rather than wait for a thread that may not be scheduled yet). A scope
 * released before anyone applied its bind never used the GPU: it is never bound in Python and
 * its release calls nothing.
 */
public final class TaskScope implements AutoCloseable {
    private static final int PENDING = 0, BINDING = 1, BOUND = 2, FAILED = 3, CANCELLED = 4;

    private final TaskTable table;
    private final long taskAttemptId;
    private final String gpuAddress;
    private final Priority priority;
    private final boolean owned;
    private final AtomicInteger state;
    private final AtomicBoolean releasing = new AtomicBoolean();
    // Written before state becomes BOUND / FAILED (a volatile write), read after reading it.
    private long stream;
    private int gpu;
    private RuntimeException bindError;
    private volatile boolean released;
    private volatile ReleaseReport report;

    /** A scope bound already (in Python too). */
    TaskScope(TaskTable table, long taskAttemptId, StreamBinding binding, boolean owned) {
        this.table = table;
        this.taskAttemptId = taskAttemptId;
        this.gpuAddress = null;
        this.priority = null;
        this.stream = binding.stream();
        this.gpu = binding.gpu();
        this.owned = owned;
        this.state = new AtomicInteger(BOUND);
    }

    /** A scope whose bind in Python is still to be applied. */
    TaskScope(TaskTable table, long taskAttemptId, String gpuAddress, Priority priority) {
        this.table = table;
        this.taskAttemptId = taskAttemptId;
        this.gpuAddress = gpuAddress;
        this.priority = priority;
        this.owned = true;
        this.state = new AtomicInteger(PENDING);
    }

    public long taskAttemptId() { return taskAttemptId; }

    /** The task's CUDA stream handle ({@code cudaStream_t} as a long), for other JNI CUDA
     *  libraries. Applies a deferred bind first (waits for it if another thread is applying it). */
    public long stream() {
        awaitBound("stream");
        return stream;
    }

    /** The CUDA ordinal of the task's GPU (applies a deferred bind first, as {@link #stream()}). */
    public int gpu() {
        awaitBound("gpu");
        return gpu;
    }

    /** Whether this scope was bound through this Java API (and so may be released through it). */
    public boolean isOwned() { return owned; }

    public boolean isReleased() { return released; }

    /** Whether the task is bound in Python (its stream is known). */
    public boolean isBound() { return state.get() == BOUND; }

    /** Whether the task was released before anyone applied its deferred bind (it never used the
     *  GPU and was never bound in Python). */
    public boolean wasNeverBound() { return state.get() == CANCELLED; }

    /** Why the deferred bind of this task failed, or null (not failed, or not applied yet). */
    public String bindFailure() {
        if (state.get() != FAILED) {
            return null;
        }
        String m = bindError.getMessage();
        return m != null ? m : bindError.toString();
    }

    /**
     * Applies a deferred bind now on the calling thread, unless it is applied, being applied, or
     * the task was released already. Never throws: a failure is kept and thrown to the task's
     * GPU calls. Returns whether this call did the bind and it succeeded.
     */
    public boolean applyBind() {
        if (!state.compareAndSet(PENDING, BINDING)) {
            return false;
        }
        return bindNow();
    }

    private boolean bindNow() {
        boolean ok = false;
        try {
            StreamBinding b = table.bindInPython(taskAttemptId, gpuAddress, priority);
            stream = b.stream();
            gpu = b.gpu();
            ok = true;
        } catch (RuntimeException e) {
            bindError = e;
        } catch (Error e) {
            bindError = new CudaBridgeException("bindTask: " + e, "bind");
            throw e;
        } finally {
            synchronized (this) {
                state.set(ok ? BOUND : FAILED);
                notifyAll();
            }
        }
        return ok;
    }

    /** The scope bound in Python, applying or waiting for its bind; throws its failure. */
    private void awaitBound(String call) {
        int s = state.get();
        if (s == BOUND) {
            return;
        }
        if (s == PENDING && state.compareAndSet(PENDING, BINDING)) {
            bindNow();
        }
        // Another thread may have taken the bind between the read and the CAS: wait for it.
        switch (waitApplied()) {
            case BOUND:
                return;
            case FAILED:
                if (bindError instanceof CudaBridgeException) {
                    CudaBridgeException e = (CudaBridgeException) bindError;
                    throw new CudaBridgeException(call + ": task " + taskAttemptId + " could not be bound: "
                            + e.getMessage(), e.getPythonType(), e);
                }
                throw new IllegalStateException(call + ": task " + taskAttemptId + " could not be bound: "
                        + bindError.getMessage(), bindError);
            default: // CANCELLED: released before it was ever bound
                throw new IllegalStateException(call + ": task " + taskAttemptId + " was released");
        }
    }

    /** Releases the task (first call only; later calls return the first report). */
    public ReleaseReport release() {
        if (!owned) {
            throw new IllegalStateException("task " + taskAttemptId + " was bound outside the Java API "
                    + "(attached with CudaBridge.attach); release it where it was bound");
        }
        ReleaseStart start = beginRelease();
        if (start == ReleaseStart.ALREADY) {
            ReleaseReport r = report;
            return r != null ? r : ReleaseReport.empty(taskAttemptId);
        }
        ReleaseReport r = table.releaseScope(this, start == ReleaseStart.IN_PYTHON);
        report = r;
        return r;
    }

    /** The first call marks the task dead and says whether it must be released in Python; later
     *  calls say it was released already. */
    ReleaseStart beginRelease() {
        if (!releasing.compareAndSet(false, true)) {
            return ReleaseStart.ALREADY;
        }
        // Dead in Java first: from here on every use of the task's buffers is refused in Java,
        // before Python frees them.
        released = true;
        // Never bound in Python (nobody applied the bind): nothing to release there. A bind being
        // applied now finishes first; a failed one left nothing in Python either.
        boolean bound = !state.compareAndSet(PENDING, CANCELLED) && waitApplied() == BOUND;
        return bound ? ReleaseStart.IN_PYTHON : ReleaseStart.JAVA_ONLY;
    }

    void endRelease(ReleaseReport r) {
        report = r;
    }

    /** The state once no bind is in progress (a bind is one short call: an interrupt does not
     *  cut the wait short, and the flag is kept). */
    private int waitApplied() {
        boolean interrupted = false;
        synchronized (this) {
            while (state.get() == BINDING) {
                try {
                    wait();
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
        return state.get();
    }

    /** Marks the scope released without calling Python (the service was shut down). */
    void markReleased() {
        releasing.set(true);
        released = true;
        state.compareAndSet(PENDING, CANCELLED);
    }

    void checkLive(String call) {
        if (released) {
            throw new IllegalStateException(call + ": task " + taskAttemptId + " was released");
        }
        awaitBound(call);
    }

    /** Releases the task, as {@link #release()}. */
    @Override
    public void close() {
        if (owned) {
            release();
        }
    }

    @Override
    public String toString() {
        int s = state.get();
        String where = s == BOUND ? "GPU " + gpu + ", stream 0x" + Long.toHexString(stream)
                : s == FAILED ? "bind failed" : s == CANCELLED ? "never bound" : "bind pending";
        return "TaskScope(task " + taskAttemptId + ", " + where + (released ? ", released)" : ")");
    }
}
