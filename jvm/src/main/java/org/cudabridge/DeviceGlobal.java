package org.cudabridge;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Objects;

/**
 * A {@code __constant__} or {@code __device__} variable of a loaded {@link CudaModule}
 * ({@link CudaModule#global(String)}): its device address and size on the module's GPU.
 *
 * <p>Copies run on the current task's stream, ordered with the task's other work: a value
 * written before a launch is what the kernel reads, and {@code copyTo} after a launch returns
 * what the kernel wrote (it is complete on return). Data is copied in native byte order; byte
 * offsets into the global are {@code long}s, element indexes into Java arrays {@code int}s. Every
 * argument is checked here, before anything crosses into Python.
 *
 * <p>A module is loaded once per executor and GPU, so a global is shared by every task that uses
 * the module there: tasks that write different values to it while another's kernels may read it
 * race, as they would on any GPU. Pass per-task values as kernel arguments.
 */
public final class DeviceGlobal {
    private final CudaBridge bridge;
    private final long moduleId;
    private final String name;
    private final long address;
    private final long size;
    private final int gpu;

    DeviceGlobal(CudaBridge bridge, long moduleId, String name, long address, long size, int gpu) {
        this.bridge = bridge;
        this.moduleId = moduleId;
        this.name = name;
        this.address = address;
        this.size = size;
        this.gpu = gpu;
    }

    /** The name it was asked for by. */
    public String name() { return name; }

    /** Its device address (on GPU {@link #gpu()}). */
    public long address() { return address; }

    /** Its size in bytes. */
    public long size() { return size; }

    /** The CUDA ordinal of the module's GPU. */
    public int gpu() { return gpu; }

    @Override
    public String toString() {
        return "DeviceGlobal[" + name + ", " + size + " bytes at 0x" + Long.toHexString(address) + " on GPU " + gpu + "]";
    }

    // --- checks, then one call into Python ------------------------------------------------------

    private long checked(String call, Object array, int arrayLength, int index, int length, int shift, long offset) {
        Objects.requireNonNull(array, call + ": the array is null");
        Objects.checkFromIndexSize(index, length, arrayLength);
        long bytes = (long) length << shift;
        if (offset < 0 || offset > size - bytes) {
            throw new IndexOutOfBoundsException(call + ": range [" + offset + ", " + offset + "+" + bytes
                    + ") is outside global " + name + " of " + size + " bytes");
        }
        if (bytes > Integer.MAX_VALUE - 8) {
            throw new IllegalArgumentException(call + ": " + bytes + " bytes in one copy; copy at most 2^31-9");
        }
        return bytes;
    }

    private TaskScope task(String call) {
        TaskScope task = bridge.currentTask();
        if (task.gpu() != gpu) {
            throw new IllegalStateException(call + ": global " + name + " is of a module on GPU " + gpu + ", task "
                    + task.taskAttemptId() + " runs on GPU " + task.gpu());
        }
        bridge.checkRunning(call);
        return task;
    }

    private void in(String call, long offset, ByteBuffer bytes) {
        TaskScope task = task(call);
        bridge.control().copyToGlobal(task.taskAttemptId(), moduleId, name, offset, bytes.array());
    }

    private ByteBuffer out(String call, long offset, long bytes) {
        TaskScope task = task(call);
        byte[] got = bridge.control().copyFromGlobal(task.taskAttemptId(), moduleId, name, offset, (int) bytes);
        if (got.length != bytes) {
            throw new IllegalStateException(call + ": asked for " + bytes + " bytes, got " + got.length);
        }
        return ByteBuffer.wrap(got).order(ByteOrder.nativeOrder());
    }

    private static ByteBuffer staging(long bytes) {
        return ByteBuffer.allocate((int) bytes).order(ByteOrder.nativeOrder());
    }

    // --- host to global -------------------------------------------------------------------------

    /** Copies {@code src[index, index+length)} into the global from byte {@code dstOffset}. */
    public void copyFrom(byte[] src, int index, long dstOffset, int length) {
        long bytes = checked("copyFrom(byte[])", src, src == null ? 0 : src.length, index, length, 0, dstOffset);
        ByteBuffer b = staging(bytes);
        b.put(src, index, length);
        in("copyFrom(byte[])", dstOffset, b);
    }

    public void copyFrom(byte[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    public void copyFrom(short[] src, int index, long dstOffset, int length) {
        long bytes = checked("copyFrom(short[])", src, src == null ? 0 : src.length, index, length, 1, dstOffset);
        ByteBuffer b = staging(bytes);
        b.asShortBuffer().put(src, index, length);
        in("copyFrom(short[])", dstOffset, b);
    }

    public void copyFrom(short[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    public void copyFrom(int[] src, int index, long dstOffset, int length) {
        long bytes = checked("copyFrom(int[])", src, src == null ? 0 : src.length, index, length, 2, dstOffset);
        ByteBuffer b = staging(bytes);
        b.asIntBuffer().put(src, index, length);
        in("copyFrom(int[])", dstOffset, b);
    }

    public void copyFrom(int[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    public void copyFrom(long[] src, int index, long dstOffset, int length) {
        long bytes = checked("copyFrom(long[])", src, src == null ? 0 : src.length, index, length, 3, dstOffset);
        ByteBuffer b = staging(bytes);
        b.asLongBuffer().put(src, index, length);
        in("copyFrom(long[])", dstOffset, b);
    }

    public void copyFrom(long[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    public void copyFrom(float[] src, int index, long dstOffset, int length) {
        long bytes = checked("copyFrom(float[])", src, src == null ? 0 : src.length, index, length, 2, dstOffset);
        ByteBuffer b = staging(bytes);
        b.asFloatBuffer().put(src, index, length);
        in("copyFrom(float[])", dstOffset, b);
    }

    public void copyFrom(float[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    public void copyFrom(double[] src, int index, long dstOffset, int length) {
        long bytes = checked("copyFrom(double[])", src, src == null ? 0 : src.length, index, length, 3, dstOffset);
        ByteBuffer b = staging(bytes);
        b.asDoubleBuffer().put(src, index, length);
        in("copyFrom(double[])", dstOffset, b);
    }

    public void copyFrom(double[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    // --- global to host -------------------------------------------------------------------------

    /** Copies the global's bytes from {@code srcOffset} into {@code dst[index, index+length)}; complete on return. */
    public void copyTo(byte[] dst, int index, long srcOffset, int length) {
        long bytes = checked("copyTo(byte[])", dst, dst == null ? 0 : dst.length, index, length, 0, srcOffset);
        out("copyTo(byte[])", srcOffset, bytes).get(dst, index, length);
    }

    public void copyTo(byte[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }

    public void copyTo(short[] dst, int index, long srcOffset, int length) {
        long bytes = checked("copyTo(short[])", dst, dst == null ? 0 : dst.length, index, length, 1, srcOffset);
        out("copyTo(short[])", srcOffset, bytes).asShortBuffer().get(dst, index, length);
    }

    public void copyTo(short[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }

    public void copyTo(int[] dst, int index, long srcOffset, int length) {
        long bytes = checked("copyTo(int[])", dst, dst == null ? 0 : dst.length, index, length, 2, srcOffset);
        out("copyTo(int[])", srcOffset, bytes).asIntBuffer().get(dst, index, length);
    }

    public void copyTo(int[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }

    public void copyTo(long[] dst, int index, long srcOffset, int length) {
        long bytes = checked("copyTo(long[])", dst, dst == null ? 0 : dst.length, index, length, 3, srcOffset);
        out("copyTo(long[])", srcOffset, bytes).asLongBuffer().get(dst, index, length);
    }

    public void copyTo(long[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }

    public void copyTo(float[] dst, int index, long srcOffset, int length) {
        long bytes = checked("copyTo(float[])", dst, dst == null ? 0 : dst.length, index, length, 2, srcOffset);
        out("copyTo(float[])", srcOffset, bytes).asFloatBuffer().get(dst, index, length);
    }

    public void copyTo(float[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }

    public void copyTo(double[] dst, int index, long srcOffset, int length) {
        long bytes = checked("copyTo(double[])", dst, dst == null ? 0 : dst.length, index, length, 3, srcOffset);
        out("copyTo(double[])", srcOffset, bytes).asDoubleBuffer().get(dst, index, length);
    }

    public void copyTo(double[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }
}
