package org.cudabridge;

import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A bound task attempt: its stream and GPU, cached here on the Java side so that
 * {@link CudaBridge#stream()} never crosses into Python. Closing it releases the task: every
 * buffer it still holds is freed asynchronously on its stream and counted as a leak, and every
 * {@link DeviceBuffer} of it is dead from then on.
 *
 * <p>Keyed by task attempt id, never by thread: Spark reuses task threads, and several threads
 * can work for one task ({@link CudaBridge#attach(long)}).
 */
public final class TaskScope implements AutoCloseable {
    private final CudaBridge bridge;
    private final long taskAttemptId;
    private final long stream;
    private final int gpu;
    private final boolean owned;
    private final AtomicBoolean releasing = new AtomicBoolean();
    private volatile boolean released;
    private volatile ReleaseReport report;

    TaskScope(CudaBridge bridge, long taskAttemptId, long stream, int gpu, boolean owned) {
        this.bridge = bridge;
        this.taskAttemptId = taskAttemptId;
        this.stream = stream;
        this.gpu = gpu;
        this.owned = owned;
    }

    public long taskAttemptId() { return taskAttemptId; }

    /** The task's CUDA stream handle ({@code cudaStream_t} as a long), for other JNI CUDA libraries. */
    public long stream() { return stream; }

    /** The CUDA ordinal of the task's GPU. */
    public int gpu() { return gpu; }

    /** Whether this scope was bound through this Java API (and so may be released through it). */
    public boolean isOwned() { return owned; }

    public boolean isReleased() { return released; }

    /** Releases the task (first call only; later calls return the first report). */
    public ReleaseReport release() {
        if (!owned) {
            throw new IllegalStateException("task " + taskAttemptId + " was bound outside the Java API "
                    + "(attached with CudaBridge.attach); release it where it was bound");
        }
        if (!releasing.compareAndSet(false, true)) {
            ReleaseReport r = report;
            return r != null ? r : new ReleaseReport(taskAttemptId, 0, 0);
        }
        // Dead in Java first: from here on every use of the task's buffers is refused in Java,
        // before Python frees them.
        released = true;
        ReleaseReport r = bridge.releaseScope(this);
        report = r;
        return r;
    }

    /** Marks the scope released without calling Python (the service was shut down). */
    void markReleased() {
        releasing.set(true);
        released = true;
    }

    void checkLive(String call) {
        if (released) {
            throw new IllegalStateException(call + ": task " + taskAttemptId + " was released");
        }
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
        return "TaskScope(task " + taskAttemptId + ", GPU " + gpu + ", stream 0x" + Long.toHexString(stream)
                + (released ? ", released)" : ")");
    }
}
