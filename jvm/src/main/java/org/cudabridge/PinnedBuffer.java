package org.cudabridge;

import java.nio.ByteBuffer;

/**
 * Page-locked host memory as a direct {@link ByteBuffer}, from the executor's pinned pool
 * ({@code spark.cudabridge.pinnedPool}): copies between it and a {@link DeviceBuffer} are truly
 * asynchronous on the buffer's stream (from pageable memory CUDA copies synchronously). Keep it
 * alive and unchanged until a {@link CudaBridge#synchronize()}. Do not touch the ByteBuffer after
 * {@link #close()}: its memory goes back to the pool then (handed out again only once the copies
 * queued from or into it have passed). When neither the pool nor {@code cudaHostAlloc} could
 * serve it, the memory is pageable ({@link #isPinned()} false; counted in the statistics). A
 * buffer allocated on a thread with a bound task belongs to that task: its release reclaims it
 * (counted as {@code bridge_pinned_reclaimed}), as it reclaims device buffers; one allocated with
 * no task bound is held until {@link #close()}.
 */
public final class PinnedBuffer implements AutoCloseable {
    private final ByteBuffer buffer;
    private final long size;
    private final boolean pinned;
    private final TaskScope owner;   // null: allocated with no task bound, held until close()
    private volatile boolean closed;

    PinnedBuffer(ByteBuffer buffer, long size, boolean pinned, TaskScope owner) {
        this.buffer = buffer;
        this.size = size;
        this.pinned = pinned;
        this.owner = owner;
    }

    /** Whether the memory is gone: closed, or reclaimed with the task that allocated it. */
    public boolean isClosed() { return closed || (owner != null && owner.isReleased()); }

    /** Whether the memory is page-locked (false: the pageable fallback; copies are then staged). */
    public boolean isPinned() { return pinned; }

    /** The memory, as a direct ByteBuffer in native byte order. */
    public ByteBuffer buffer() {
        if (closed) {
            throw new IllegalStateException("pinned buffer was closed");
        }
        if (owner != null && owner.isReleased()) {
            throw new IllegalStateException("pinned buffer was reclaimed with task " + owner.taskAttemptId());
        }
        return buffer;
    }

    public long size() { return size; }


    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        if (owner == null || !owner.isReleased()) {   // else its task's release reclaimed it already
            NativeBridge.freePinned(buffer);
        }
    }
}
