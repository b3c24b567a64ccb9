package org.cudabridge;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.util.Objects;

/**
 * Device memory owned by a task, ordered on the task's stream.
 *
 * <p>Copies from and to Java heap arrays (the overloads of {@link HostArrayCopies}, shared with
 * {@link DeviceGlobal}) are complete when they return (the garbage collector moves heap arrays, so
 * they are staged through native memory). Copies from and to direct
 * {@link ByteBuffer}s are asynchronous on the buffer's stream when the memory is pinned
 * ({@link CudaBridge#allocatePinned}); keep the ByteBuffer alive and unchanged until
 * {@link CudaBridge#synchronize()}. Direct-buffer copies read {@code remaining()} bytes from
 * {@code position()} and do not move the position.
 *
 * <p>{@link #close()} frees asynchronously (it never blocks); a second close has no effect. A
 * buffer whose task was released is dead: every use is refused, and close does nothing (the
 * release freed it). Byte offsets into the device buffer are {@code long}s; element indexes into
 * Java arrays are {@code int}s. Data is copied in native byte order.
 */
public final class DeviceBuffer extends HostArrayCopies implements AutoCloseable {
    private static final int LIVE = 0;
    private static final int CLOSED = 1;
    private static final VarHandle STATE;

    static {
        try {
            STATE = MethodHandles.lookup().findVarHandle(DeviceBuffer.class, "state", int.class);
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError(e);
        }
    }

    private final DeviceMemory memory;
    private final TaskScope task;
    private final long handle;
    private final long address;
    private final long size;
    @SuppressWarnings("unused") // accessed through STATE
    private volatile int state;

    DeviceBuffer(DeviceMemory memory, TaskScope task, long handle, long address, long size) {
        this.memory = memory;
        this.task = task;
        this.handle = handle;
        this.address = address;
        this.size = size;
    }

    /** The device pointer. */
    public long address() { return address; }

    /** An address inside a buffer, as a kernel argument ({@link #at}). */
    public record Pointer(DeviceBuffer buffer, long offset) {}

    /** The address {@code offset} bytes into this buffer, for a kernel argument
     *  ({@link CudaKernel#launch}); {@code offset} may be the size (the end). */
    public Pointer at(long offset) {
        if (offset < 0 || offset > size) {
            throw new IndexOutOfBoundsException("at: offset " + offset + " outside the buffer's " + size + " bytes");
        }
        return new Pointer(this, offset);
    }

    /** The size asked for, in bytes. */
    public long size() { return size; }

    /** The stream the buffer is ordered on (its task's stream). */
    public long stream() { return task.stream(); }

    public int gpu() { return task.gpu(); }

    public long taskAttemptId() { return task.taskAttemptId(); }

    /** The bridge's handle (the Python side's identity of this buffer). */
    public long handle() { return handle; }

    /** Neither closed nor dead (its task released). */
    public boolean isAlive() { return state == LIVE && !task.isReleased(); }

    void check(String call) {
        if (state != LIVE) {
            throw new IllegalStateException(call + ": device buffer " + this + " was closed");
        }
        if (task.isReleased()) {
            throw new IllegalStateException(call + ": device buffer " + this + " is dead: its task "
                    + task.taskAttemptId() + " was released");
        }
    }

    @Override
    void checkRange(String call, long offset, long bytes) {
        if (offset < 0 || bytes < 0 || offset > size - bytes) {
            throw new IndexOutOfBoundsException(call + ": range [" + offset + ", " + offset + "+" + bytes
                    + ") is outside the device buffer of " + size + " bytes");
        }
    }

    /** Marks the buffer closed if it is live; false if it was closed already (or is dead). */
    boolean claimForFree() {
        if (task.isReleased()) {
            return false;
        }
        return STATE.compareAndSet(this, LIVE, CLOSED);
    }

    boolean taskReleased() {
        return task.isReleased();
    }

    /** Undoes {@link #claimForFree} after a free that Python refused (nothing was freed). */
    void unclaim() {
        if (!task.isReleased()) {
            STATE.setVolatile(this, LIVE);
        }
    }

    /** Frees the buffer asynchronously on its stream. A second close, or a close after the task
     *  was released, has no effect: also one that raced the release (begun on another thread, or
     *  by {@link CudaBridge#shutdown()}), since the release frees the buffer itself. */
    @Override
    public void close() {
        if (!claimForFree()) {
            return;
        }
        try {
            memory.free(handle);
        } catch (RuntimeException e) {
            // The task is marked released before its release reaches Python, so a refusal seen
            // with the task released may be the release's own doing: it freed the buffer.
            if (task.isReleased()) {
                return;
            }
            unclaim();
            throw e;
        }
    }

    // --- heap arrays (the overloads are HostArrayCopies'; complete on return) --------------------

    @Override
    String nullArray(boolean source) {
        return source ? "source array is null" : "destination array is null";
    }

    @Override
    void arrayIn(String call, Object array, int index, int length, int shift, long dstOffset) {
        check(call);
        memory.checkRunning(call);
        NativeBridge.copyIn(handle, dstOffset, array, (long) index << shift, (long) length << shift, 1 << shift);
    }

    @Override
    void arrayOut(String call, Object array, int index, int length, int shift, long srcOffset) {
        check(call);
        memory.checkRunning(call);
        NativeBridge.copyOut(handle, srcOffset, array, (long) index << shift, (long) length << shift, 1 << shift);
    }

    // --- direct ByteBuffers -------------------------------------------------------------------

    private static void requireDirect(String call, ByteBuffer b) {
        Objects.requireNonNull(b, call + ": ByteBuffer is null");
        if (!b.isDirect()) {
            throw new IllegalArgumentException(call + ": the ByteBuffer is not direct; copy heap data with the "
                    + "byte[] overloads (they stage it), or use CudaBridge.allocatePinned");
        }
    }

    /** Copies {@code src.remaining()} bytes from {@code src.position()} to byte {@code dstOffset},
     *  asynchronously on the buffer's stream (when {@code src} is pinned). */
    public void copyFrom(ByteBuffer src, long dstOffset) {
        requireDirect("copyFrom(ByteBuffer)", src);
        long bytes = src.remaining();
        checkRange("copyFrom(ByteBuffer)", dstOffset, bytes);
        check("copyFrom(ByteBuffer)");
        memory.checkRunning("copyFrom(ByteBuffer)");
        NativeBridge.copyInDirect(handle, dstOffset, src, src.position(), bytes);
    }

    /** Copies {@code dst.remaining()} bytes from byte {@code srcOffset} to {@code dst.position()},
     *  asynchronously on the buffer's stream (when {@code dst} is pinned). */
    public void copyTo(ByteBuffer dst, long srcOffset) {
        requireDirect("copyTo(ByteBuffer)", dst);
        if (dst.isReadOnly()) {
            throw new IllegalArgumentException("copyTo(ByteBuffer): the ByteBuffer is read-only");
        }
        long bytes = dst.remaining();
        checkRange("copyTo(ByteBuffer)", srcOffset, bytes);
        check("copyTo(ByteBuffer)");
        memory.checkRunning("copyTo(ByteBuffer)");
        NativeBridge.copyOutDirect(handle, srcOffset, dst, dst.position(), bytes);
    }

    // --- off-heap memory by address -------------------------------------------------------------

    /** Copies {@code bytes} from off-heap memory at {@code hostAddress} (an Arrow buffer's
     *  {@code memoryAddress()}, an off-heap column vector's, Unsafe's) to byte {@code dstOffset}.
     *  The address cannot be checked: a wrong one crashes the JVM, as any native copy would.
     *  From a region registered with {@link CudaBridge#registerHost} the copy is asynchronous on
     *  the buffer's stream (keep the memory unchanged until a synchronize); from any other memory
     *  it returns once the bytes are staged. */
    public void copyFromAddress(long hostAddress, long bytes, long dstOffset) {
        checkAddress("copyFromAddress", hostAddress, bytes);
        checkRange("copyFromAddress", dstOffset, bytes);
        check("copyFromAddress");
        memory.checkRunning("copyFromAddress");
        NativeBridge.copyInAddress(handle, dstOffset, hostAddress, bytes);
    }

    /** Copies {@code bytes} from byte {@code srcOffset} to off-heap memory at {@code hostAddress}
     *  (not checked: see {@link #copyFromAddress}). Into a registered region the copy is
     *  asynchronous (read the memory after a synchronize); into other memory the bytes are there
     *  on return. */
    public void copyToAddress(long hostAddress, long bytes, long srcOffset) {
        checkAddress("copyToAddress", hostAddress, bytes);
        checkRange("copyToAddress", srcOffset, bytes);
        check("copyToAddress");
        memory.checkRunning("copyToAddress");
        NativeBridge.copyOutAddress(handle, srcOffset, hostAddress, bytes);
    }

    private static void checkAddress(String call, long address, long bytes) {
        if (address == 0) {
            throw new IllegalArgumentException(call + ": the host address is 0");
        }
        if (bytes < 0) {
            throw new IllegalArgumentException(call + ": negative size " + bytes);
        }
    }

    // --- device to device, memset -----------------------------------------------------------------

    /** Copies {@code bytes} from {@code src} at {@code srcOffset} to this buffer at {@code dstOffset},
     *  asynchronously on this buffer's stream (after the source stream's queued work). */
    public void copyFrom(DeviceBuffer src, long srcOffset, long dstOffset, long bytes) {
        Objects.requireNonNull(src, "copyFrom(DeviceBuffer): source is null");
        checkRange("copyFrom(DeviceBuffer)", dstOffset, bytes);
        src.checkRange("copyFrom(DeviceBuffer) source", srcOffset, bytes);
        check("copyFrom(DeviceBuffer)");
        src.check("copyFrom(DeviceBuffer) source");
        memory.checkRunning("copyFrom(DeviceBuffer)");
        NativeBridge.copyDevice(handle, dstOffset, src.handle, srcOffset, bytes);
    }

    /** Sets every byte to {@code value} (0-255), asynchronously on the buffer's stream. */
    public void memset(int value) { memset(value, 0, size); }

    public void memset(int value, long offset, long bytes) {
        if (value < 0 || value > 255) {
            throw new IllegalArgumentException("memset: value must be a byte value 0-255, got " + value);
        }
        checkRange("memset", offset, bytes);
        check("memset");
        memory.memset(handle, offset, value, bytes);
    }

    @Override
    public String toString() {
        return "DeviceBuffer(0x" + Long.toHexString(address) + ", " + size + " bytes, task " + task.taskAttemptId()
                + ", stream 0x" + Long.toHexString(task.stream()) + ")";
    }
}
