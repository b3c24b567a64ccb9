package org.cudabridge;

/**
 * Off-heap memory page-locked for the bridge ({@link CudaBridge#registerHost}): copies from and to
 * it ({@link DeviceBuffer#copyFromAddress}, {@link DeviceBuffer#copyToAddress}) run asynchronously
 * at the link's speed. Register a long-lived region once (an Arrow vector's value buffer, an
 * off-heap column), never per batch: registering costs far more than a copy. {@link #close()}
 * unregisters it (once; again is a no-op): it first waits for the copies queued from or into the
 * region (it synchronizes the streams they were queued on), so once it returns nothing reads or
 * writes the memory and it may be freed. Copies into the range by the task bound on the closing
 * thread are refused from then on until that task's release, since its memory may be freed (closed
 * with no task bound: every copy, until a new registration covers the range); past the task the
 * memory may be a new allocation, which copies may use. Close it before freeing the memory.
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
        TaskScope task = bridge.currentTaskOrNull();   // whose later copies into the range are refused
        bridge.control().unregisterHost(address, task == null ? 0 : task.taskAttemptId());
    }
}
