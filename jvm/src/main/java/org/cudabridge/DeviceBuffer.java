package org.cudabridge;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.util.Objects;

/**
 * Device memory owned by a task, ordered on the task's stream.
 *
 * <p>Copies between host memory and the buffer come in two forms, by name:
 * <ul>
 * <li>{@code copyFrom} / {@code copyTo} (and {@code copyFromAddress} / {@code copyToAddress})
 *     complete on return, for every kind of host memory: the source may change, or the
 *     destination be read, once the call returns, and work queued on the stream afterwards sees
 *     the data. Heap arrays (the overloads of {@link HostArrayCopies}) and pageable memory are
 *     staged; page-locked memory (a {@link PinnedBuffer}, a {@link HostRegistration}'s range) is
 *     one DMA on the stream followed by a wait for that stream.</li>
 * <li>{@code copyFromAsync} / {@code copyToAsync} (and {@code copyFromAddressAsync} /
 *     {@code copyToAddressAsync}) are ordered on the task's stream and return once the copy is
 *     queued: keep the memory unchanged, or read it, only after a {@link CudaBridge#synchronize()}.
 *     They take page-locked memory only (the range inside a live pinned buffer or an open
 *     registration) and refuse anything else with an {@link IllegalArgumentException} before
 *     anything is copied.</li>
 * </ul>
 * Direct-buffer copies read or write {@code remaining()} bytes from {@code position()} and do not
 * move the position. Device to device ({@link #copyFrom(DeviceBuffer, long, long, long)}) and
 * {@link #memset} involve no host memory: they are queued on the stream.
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

    /** The buffer's bytes as an array of {@code dtype} in {@code shape}, for a Python function
     *  ({@link PythonFunction#call}); no shape: one dimension over the whole buffer (whose size must
     *  then be a multiple of the item size). Checked against the buffer's size here. */
    public DeviceArray asArray(DType dtype, long... shape) {
        return asArrayAt(0, dtype, shape);
    }

    /** As {@link #asArray}, from byte {@code offset} (a multiple of the item size). */
    public DeviceArray asArrayAt(long offset, DType dtype, long... shape) {
        java.util.Objects.requireNonNull(dtype, "asArray: dtype");
        if (shape == null || shape.length == 0) {
            long rest = size - offset;
            if (offset < 0 || rest < 0 || rest % dtype.itemSize() != 0) {
                throw new IllegalArgumentException("asArray: " + rest + " bytes from offset " + offset
                        + " are not a whole number of " + dtype + " elements (" + dtype.itemSize() + " bytes each)");
            }
            shape = new long[] {rest / dtype.itemSize()};
        }
        return new DeviceArray(this, offset, dtype, shape, false);
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

    // --- host memory outside the heap: direct ByteBuffers, addresses ----------------------------
    // copyFrom/copyTo complete on return for any memory; the Async forms take page-locked memory
    // only, and return once the copy is queued on the stream.

    private static void requireDirect(String call, ByteBuffer b) {
        Objects.requireNonNull(b, call + ": ByteBuffer is null");
        if (!b.isDirect()) {
            throw new IllegalArgumentException(call + ": the ByteBuffer is not direct; copy heap data with the "
                    + "byte[] overloads (they stage it), or use CudaBridge.allocatePinned");
        }
    }

    private static void requireWritable(String call, ByteBuffer b) {
        if (b.isReadOnly()) {
            throw new IllegalArgumentException(call + ": the ByteBuffer is read-only");
        }
    }

    private static void checkAddress(String call, long address, long bytes) {
        if (address == 0) {
            throw new IllegalArgumentException(call + ": the host address is 0");
        }
        if (bytes < 0) {
            throw new IllegalArgumentException(call + ": negative size " + bytes);
        }
    }

    /** The address of a direct ByteBuffer's {@code position()} (JNI's GetDirectBufferAddress: no
     *  call into Python, nothing changed). */
    private static long positionAddress(ByteBuffer b) {
        return NativeBridge.address(b) + b.position();
    }

    /** The asynchronous forms' admission: the range lies in page-locked memory, or the call is
     *  refused here, before anything is copied. */
    private void requirePageLocked(String call, String what, long address, long bytes, String instead) {
        if (!memory.isPageLocked(address, bytes)) {
            throw new IllegalArgumentException(call + ": " + what + " [0x" + Long.toHexString(address) + ", +"
                    + bytes + ") is not page-locked: it lies inside no live pinned buffer (CudaBridge.allocatePinned, "
                    + "isPinned() true) and no open registration (CudaBridge.registerHost); use " + instead
                    + ", which completes on return for any memory");
        }
    }

    /** Copies {@code src.remaining()} bytes from {@code src.position()} to byte {@code dstOffset};
     *  complete on return: {@code src} may change once it returns, and later work on the stream
     *  sees the data. Any direct ByteBuffer: pageable memory ({@code allocateDirect}) is staged,
     *  page-locked memory (a {@link PinnedBuffer}'s, a registered region's) is one DMA on the
     *  buffer's stream, then a wait for that stream. For a copy that returns at once, see
     *  {@link #copyFromAsync(ByteBuffer, long)}. */
    public void copyFrom(ByteBuffer src, long dstOffset) {
        String call = "copyFrom(ByteBuffer)";
        requireDirect(call, src);
        long bytes = src.remaining();
        checkRange(call, dstOffset, bytes);
        check(call);
        memory.checkRunning(call);
        completeOnReturn(NativeBridge.copyInDirect(handle, dstOffset, src, src.position(), bytes), call);
    }

    /** Copies {@code dst.remaining()} bytes from byte {@code srcOffset} to {@code dst.position()};
     *  complete on return: the bytes are in {@code dst} when it returns (after the work queued on
     *  the stream before it). Any direct ByteBuffer, as {@link #copyFrom(ByteBuffer, long)}. */
    public void copyTo(ByteBuffer dst, long srcOffset) {
        String call = "copyTo(ByteBuffer)";
        requireDirect(call, dst);
        requireWritable(call, dst);
        long bytes = dst.remaining();
        checkRange(call, srcOffset, bytes);
        check(call);
        memory.checkRunning(call);
        completeOnReturn(NativeBridge.copyOutDirect(handle, srcOffset, dst, dst.position(), bytes), call);
    }

    /** Copies {@code src.remaining()} bytes from {@code src.position()} to byte {@code dstOffset},
     *  asynchronously: one DMA queued on the buffer's stream (the task's), after its earlier work;
     *  returns once it is queued. Keep {@code src}'s memory unchanged until a
     *  {@link CudaBridge#synchronize()}. The memory must be page-locked: the whole range inside a
     *  live {@link PinnedBuffer} (a slice of one's ByteBuffer is fine) or an open
     *  {@link HostRegistration}; anything else (a heap or {@code allocateDirect} ByteBuffer, a
     *  pinned buffer's pageable fallback, a closed one) is refused with an
     *  {@link IllegalArgumentException} before anything is copied. */
    public void copyFromAsync(ByteBuffer src, long dstOffset) {
        String call = "copyFromAsync(ByteBuffer)";
        requireDirectAsync(call, src, "copyFrom(ByteBuffer, long)");
        long bytes = src.remaining();
        checkRange(call, dstOffset, bytes);
        check(call);
        memory.checkRunning(call);
        requirePageLocked(call, "the ByteBuffer's memory", positionAddress(src), bytes, "copyFrom(ByteBuffer, long)");
        NativeBridge.copyInDirect(handle, dstOffset, src, src.position(), bytes);
    }

    /** Copies {@code dst.remaining()} bytes from byte {@code srcOffset} to {@code dst.position()},
     *  asynchronously: one DMA queued on the buffer's stream; read {@code dst} only after a
     *  {@link CudaBridge#synchronize()}. Page-locked memory only, as
     *  {@link #copyFromAsync(ByteBuffer, long)}. */
    public void copyToAsync(ByteBuffer dst, long srcOffset) {
        String call = "copyToAsync(ByteBuffer)";
        requireDirectAsync(call, dst, "copyTo(ByteBuffer, long)");
        requireWritable(call, dst);
        long bytes = dst.remaining();
        checkRange(call, srcOffset, bytes);
        check(call);
        memory.checkRunning(call);
        requirePageLocked(call, "the ByteBuffer's memory", positionAddress(dst), bytes, "copyTo(ByteBuffer, long)");
        NativeBridge.copyOutDirect(handle, srcOffset, dst, dst.position(), bytes);
    }

    /** After a copy that must be complete on return: {@code queued} is the native side's answer,
     *  whether it queued an asynchronous DMA (page-locked memory, made by any front of the
     *  service); then wait for the stream, so that the copy is done when the caller goes on. */
    private void completeOnReturn(boolean queued, String call) {
        if (queued) {
            memory.awaitStream(task, call);
        }
    }

    private static void requireDirectAsync(String call, ByteBuffer b, String instead) {
        Objects.requireNonNull(b, call + ": ByteBuffer is null");
        if (!b.isDirect()) {
            throw new IllegalArgumentException(call + ": the ByteBuffer is not direct: heap memory is never "
                    + "page-locked; use " + instead + " or the array overloads, which complete on return, or a "
                    + "PinnedBuffer (CudaBridge.allocatePinned)");
        }
    }

    /** Copies {@code bytes} from off-heap memory at {@code hostAddress} (an Arrow buffer's
     *  {@code memoryAddress()}, an off-heap column vector's, Unsafe's) to byte {@code dstOffset};
     *  complete on return: the memory may change once it returns. The address cannot be checked: a
     *  wrong one crashes the JVM, as any native copy would. Pageable memory is staged; a range
     *  inside a registered region ({@link CudaBridge#registerHost}) or a pinned buffer is one DMA on
     *  the buffer's stream, then a wait for that stream. For a copy that returns at once, see
     *  {@link #copyFromAddressAsync}. */
    public void copyFromAddress(long hostAddress, long bytes, long dstOffset) {
        String call = "copyFromAddress";
        checkAddress(call, hostAddress, bytes);
        checkRange(call, dstOffset, bytes);
        check(call);
        memory.checkRunning(call);
        completeOnReturn(NativeBridge.copyInAddress(handle, dstOffset, hostAddress, bytes), call);
    }

    /** Copies {@code bytes} from byte {@code srcOffset} to off-heap memory at {@code hostAddress}
     *  (not checked: see {@link #copyFromAddress}); complete on return: the bytes are there when it
     *  returns, whatever the memory. */
    public void copyToAddress(long hostAddress, long bytes, long srcOffset) {
        String call = "copyToAddress";
        checkAddress(call, hostAddress, bytes);
        checkRange(call, srcOffset, bytes);
        check(call);
        memory.checkRunning(call);
        completeOnReturn(NativeBridge.copyOutAddress(handle, srcOffset, hostAddress, bytes), call);
    }

    /** Copies {@code bytes} from page-locked memory at {@code hostAddress} to byte {@code dstOffset},
     *  asynchronously: one DMA queued on the buffer's stream; keep the memory unchanged until a
     *  {@link CudaBridge#synchronize()} (and close its registration only after it: close waits for
     *  the copies queued from the region). The range must lie inside an open
     *  {@link HostRegistration} (or a live pinned buffer); anything else is refused with an
     *  {@link IllegalArgumentException} before anything is copied. The address is not checked
     *  further: see {@link #copyFromAddress}. */
    public void copyFromAddressAsync(long hostAddress, long bytes, long dstOffset) {
        String call = "copyFromAddressAsync";
        checkAddress(call, hostAddress, bytes);
        checkRange(call, dstOffset, bytes);
        check(call);
        memory.checkRunning(call);
        requirePageLocked(call, "the host memory", hostAddress, bytes, "copyFromAddress");
        NativeBridge.copyInAddress(handle, dstOffset, hostAddress, bytes);
    }

    /** Copies {@code bytes} from byte {@code srcOffset} to page-locked memory at {@code hostAddress},
     *  asynchronously: read the memory only after a {@link CudaBridge#synchronize()}. Page-locked
     *  memory only, as {@link #copyFromAddressAsync}. */
    public void copyToAddressAsync(long hostAddress, long bytes, long srcOffset) {
        String call = "copyToAddressAsync";
        checkAddress(call, hostAddress, bytes);
        checkRange(call, srcOffset, bytes);
        check(call);
        memory.checkRunning(call);
        requirePageLocked(call, "the host memory", hostAddress, bytes, "copyToAddress");
        NativeBridge.copyOutAddress(handle, srcOffset, hostAddress, bytes);
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
