package org.cudabridge;

import java.nio.ByteBuffer;

/**
 * Page-locked host memory as a direct {@link ByteBuffer}, from the executor's pinned pool
 * ({@code spark.cudabridge.pinnedPool}): the memory the asynchronous copies take
 * ({@link DeviceBuffer#copyFromAsync}, {@link DeviceBuffer#copyToAsync}: one DMA ordered on the
 * buffer's stream, returning at once; keep the memory unchanged, or read it, only after a
 * {@link CudaBridge#synchronize()}). The copies that complete on return
 * ({@link DeviceBuffer#copyFrom(ByteBuffer, long)}, {@link DeviceBuffer#copyTo(ByteBuffer, long)})
 * take it too: they wait for the stream after the DMA. Do not touch the ByteBuffer after
 * {@link #close()}: its memory goes back to the pool then (handed out again only once the copies
 * queued from or into it have passed). When neither the pool nor {@code cudaHostAlloc} could
 * serve it, the memory is pageable ({@link #isPinned()} false; counted in the statistics): the
 * asynchronous copies refuse it, the others stage it. A buffer allocated on a thread with a bound
 * task belongs to that task: its release reclaims it (counted as {@code bridge_pinned_reclaimed}),
 * as it reclaims device buffers; one allocated with no task bound is held until {@link #close()}.
 */
public final class PinnedBuffer implements AutoCloseable {
    private final ByteBuffer buffer;
    private final long address;
    private final long size;
    private final boolean pinned;
    private final TaskScope owner;   // null: allocated with no task bound, held until close()
    private final PageLockedMemory pageLocked;
    private volatile boolean closed;

    PinnedBuffer(ByteBuffer buffer, long address, long size, boolean pinned, TaskScope owner,
                 PageLockedMemory pageLocked) {
        this.buffer = buffer;
        this.address = address;
        this.size = size;
        this.pinned = pinned;
        this.owner = owner;
        this.pageLocked = pageLocked;
    }

    /** The memory's address. */
    long address() { return address; }

    /** Whether the memory is gone: closed, or reclaimed with the task that allocated it. */
    public boolean isClosed() { return closed || (owner != null && owner.isReleased()); }

    /** Whether the memory is page-locked (false: the pageable fallback; copies are then staged, and
     *  the asynchronous copies refuse it). */
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
        pageLocked.remove(address, this);
        if (owner == null || !owner.isReleased()) {   // else its task's release reclaimed it already
            NativeBridge.freePinned(buffer);
        }
    }
}
