package org.cudabridge;

import java.util.Arrays;
import java.util.List;

/**
 * The GPU's memory pool could not satisfy an allocation, after reclaiming completed frees, taking
 * blocks in flight with a device-side wait and one host synchronize, and, for a task's allocation,
 * after waiting for other tasks' frees ({@link #reason()} says why it stopped waiting). The numbers tell
 * fragmentation (large {@link #reservedBytes()}, small {@link #largestFreeBlockBytes()}) from
 * exhaustion. They are Python's {@code OutOfDeviceMemory.FIELDS}, in that order, named in
 * camelCase ({@link #FIELDS}; a test compares the two lists) as the pool's statistics name them.
 */
public class GpuOutOfMemoryException extends CudaBridgeException {
    private static final long serialVersionUID = 1L;

    /** The numbers' names, in the order the bridge passes them. */
    public static final List<String> FIELDS = List.of("requestedBytes", "inUseBytes", "reservedBytes",
            "largestFreeBlockBytes", "waitingOnEventsBytes", "limitBytes", "device", "reason");

    /** Why the allocation failed (Python's {@code OutOfDeviceMemory.REASONS}, same order). */
    public enum Reason {
        /** It could not wait: no task's allocation, or its task's release began. */
        NO_WAIT,
        /** The deadlock breaker failed it: every task holding memory on the GPU was waiting. Free
         *  what the work allocated and retry it ({@link GpuRetry}). */
        BREAKER,
        /** It cannot fit even with every task's memory back: split the work. */
        TOO_LARGE,
        /** It waited {@code spark.cudabridge.oomWait} for other tasks' frees and releases. */
        TIMEOUT
    }

    private final long[] fields;

    /** @param fields the numbers in {@link #FIELDS} order */
    public GpuOutOfMemoryException(String message, String pythonType, long[] fields) {
        super(message, pythonType);
        if (fields == null || fields.length != FIELDS.size()) {
            throw new IllegalArgumentException("GpuOutOfMemoryException: expected " + FIELDS.size() + " numbers "
                    + FIELDS + ", got " + (fields == null ? "null" : Arrays.toString(fields)));
        }
        this.fields = fields.clone();
    }

    private long field(String name) { return fields[FIELDS.indexOf(name)]; }

    /** Bytes asked for (rounded to the pool's 256-byte blocks). */
    public long requestedBytes() { return field("requestedBytes"); }
    /** Bytes of blocks handed out and not yet freed. */
    public long inUseBytes() { return field("inUseBytes"); }
    /** Bytes the pool holds from the device. */
    public long reservedBytes() { return field("reservedBytes"); }
    /** The largest free block. */
    public long largestFreeBlockBytes() { return field("largestFreeBlockBytes"); }
    /** Free bytes still waiting for their streams' work to pass them. */
    public long waitingOnEventsBytes() { return field("waitingOnEventsBytes"); }
    /** The most the pool may reserve. */
    public long limitBytes() { return field("limitBytes"); }
    /** The CUDA ordinal. */
    public int device() { return (int) field("device"); }
    /** Why it failed; {@link Reason#BREAKER} says a retry after freeing may succeed. */
    public Reason reason() {
        long code = field("reason");
        Reason[] all = Reason.values();
        return code >= 0 && code < all.length ? all[(int) code] : Reason.NO_WAIT;
    }
}
