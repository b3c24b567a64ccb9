package org.cudabridge;

import java.nio.ByteBuffer;

/**
 * Page-locked host memory as a direct {@link ByteBuffer}, from the executor's pinned pool
 * ({@code spark.cudabridge.pinnedPool}): copies between it and a {@link DeviceBuffer} are truly
 * asynchronous on the buffer's stream (from pageable memory CUDA copies synchronously). Keep it
 * alive and unchanged until a {@link CudaBridge#synchronize()}. Do not touch the ByteBuffer after
 * {@link #close()}: its memory goes back to the pool then (handed out again only once the copies
 * queued from or into it have passed). When neither the pool nor {@code cudaHostAlloc} could
 * serve it, the memory is pageable ({@link #isPinned()} false; counted in the statistics).
 */
public final class PinnedBuffer implements AutoCloseable {
    private final ByteBuffer buffer;
    private final long size;
    private final boolean pinned;
    private volatile boolean closed;

    PinnedBuffer(ByteBuffer buffer, long size, boolean pinned) {
        this.buffer = buffer;
        this.size = size;
        this.pinned = pinned;
    }

    /** Whether the memory is page-locked (false: the pageable fallback; copies are then staged). */
    public boolean isPinned() { return pinned; }

    /** The memory, as a direct ByteBuffer in native byte order. */
    public ByteBuffer buffer() {
        if (closed) {
            throw new IllegalStateException("pinned buffer was closed");
        }
        return buffer;
    }

    public long size() { return size; }

    public boolean isClosed() { return closed; }

    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        NativeBridge.freePinned(buffer);
        closed = true;
    }
}
