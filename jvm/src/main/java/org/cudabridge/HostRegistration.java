package org.cudabridge;

/**
 * Off-heap memory page-locked for the bridge ({@link CudaBridge#registerHost}): copies from and to
 * it ({@link DeviceBuffer#copyFromAddress}, {@link DeviceBuffer#copyToAddress}) run asynchronously
 * at the link's speed. Register a long-lived region once (an Arrow vector's value buffer, an
 * off-heap column), never per batch: registering costs far more than a copy. {@link #close()}
 * unregisters it (once; again is a no-op); copies into the range are refused from then on, since
 * its memory may be freed. Close it before freeing the memory.
 */
public final class HostRegistration implements AutoCloseable {
    private final CudaBridge bridge;
    private final long address;
    private final long bytes;
    private boolean closed;

    HostRegistration(CudaBridge bridge, long address, long bytes) {
        this.bridge = bridge;
        this.address = address;
        this.bytes = bytes;
    }

    public long address() {
        return address;
    }

    public long bytes() {
        return bytes;
    }

    public synchronized boolean isClosed() {
        return closed;
    }

    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        bridge.checkRunning("HostRegistration.close");
        bridge.control().unregisterHost(address);
    }
}
