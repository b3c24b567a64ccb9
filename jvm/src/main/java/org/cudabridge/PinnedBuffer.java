package org.cudabridge;

import java.nio.ByteBuffer;

/**
 * Page-locked host memory as a direct {@link ByteBuffer}: copies between it and a
 * {@link DeviceBuffer} are truly asynchronous on the buffer's stream (from pageable memory CUDA
 * copies synchronously). Keep it alive and unchanged until a {@link CudaBridge#synchronize()}.
 * Do not touch the ByteBuffer after {@link #close()}: its memory is returned then.
 */
public final class PinnedBuffer implements AutoCloseable {
    private final ByteBuffer buffer;
    private final long size;
    private volatile boolean closed;

    PinnedBuffer(ByteBuffer buffer, long size) {
        this.buffer = buffer;
        this.size = size;
    }

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
