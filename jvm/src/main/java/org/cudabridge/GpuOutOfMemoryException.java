package org.cudabridge;

/**
 * The GPU's memory pool could not satisfy an allocation, after reclaiming completed frees, taking
 * blocks in flight with a device-side wait and one host synchronize. The numbers tell
 * fragmentation (large {@link #reserved()}, small {@link #largestFree()}) from exhaustion.
 */
public class GpuOutOfMemoryException extends CudaBridgeException {
    private static final long serialVersionUID = 1L;

    private final long requested;
    private final long inUse;
    private final long reserved;
    private final long largestFree;
    private final long waitingOnEvents;
    private final long limit;
    private final int device;

    public GpuOutOfMemoryException(String message, String pythonType, long requested, long inUse, long reserved,
                                   long largestFree, long waitingOnEvents, long limit, int device) {
        super(message, pythonType);
        this.requested = requested;
        this.inUse = inUse;
        this.reserved = reserved;
        this.largestFree = largestFree;
        this.waitingOnEvents = waitingOnEvents;
        this.limit = limit;
        this.device = device;
    }

    /** Bytes asked for (rounded to the pool's 256-byte blocks). */
    public long requested() { return requested; }
    /** Bytes of blocks handed out and not yet freed. */
    public long inUse() { return inUse; }
    /** Bytes the pool holds from the device. */
    public long reserved() { return reserved; }
    /** The largest free block. */
    public long largestFree() { return largestFree; }
    /** Free bytes still waiting for their streams' work to pass them. */
    public long waitingOnEvents() { return waitingOnEvents; }
    /** The most the pool may reserve. */
    public long limit() { return limit; }
    /** The CUDA ordinal. */
    public int device() { return device; }
}
