package org.cudabridge;

/**
 * Off-heap memory page-locked for the bridge ({@link CudaBridge#registerHost}): the asynchronous
 * copies take it ({@link DeviceBuffer#copyFromAddressAsync}, {@link DeviceBuffer#copyToAddressAsync},
 * and {@link DeviceBuffer#copyFromAsync} of a direct ByteBuffer over it), one DMA at the link's
 * speed ordered on the buffer's stream: keep the memory unchanged, or read it, only after a
 * synchronize. The copies that complete on return ({@link DeviceBuffer#copyFromAddress},
 * {@link DeviceBuffer#copyToAddress}) take it too, waiting for the stream after the DMA. Register
 * a long-lived region once (an Arrow vector's value buffer, an off-heap column), never per batch:
 * registering costs far more than a copy. {@link #close()}
 * unregisters it (once; again is a no-op): it first waits for the copies queued from or into the
 * region (it synchronizes the streams they were queued on), so once it returns nothing reads or
 * writes the memory and it may be freed. Copies into the range by the task bound on the closing
 * thread are refused from then on until that task's release, since its memory may be freed (closed
 * with no task bound: every copy, until a new registration covers the range); past the task the
 * memory may be a new allocation, which copies may use. Close it before freeing the memory.
 */
public final class HostRegistration implements AutoCloseable {
    private final CudaBridge bridge;
    private final PageLockedMemory pageLocked;
    private final long address;
    private final long bytes;
    private volatile boolean closed;   // read without the lock by the copies' lookup (PageLockedMemory)

    HostRegistration(CudaBridge bridge, PageLockedMemory pageLocked, long address, long bytes) {
        this.bridge = bridge;
        this.pageLocked = pageLocked;
        this.address = address;
        this.bytes = bytes;
    }

    public long address() {
        return address;
    }

    public long bytes() {
        return bytes;
    }

    public boolean isClosed() {
        return closed;
    }

    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        pageLocked.remove(address, this);
        bridge.checkRunning("HostRegistration.close");
        TaskScope task = bridge.currentTaskOrNull();   // whose later copies into the range are refused
        bridge.control().unregisterHost(address, task == null ? 0 : task.taskAttemptId());
    }
}
