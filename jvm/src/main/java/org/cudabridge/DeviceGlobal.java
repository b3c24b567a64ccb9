package org.cudabridge;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * A {@code __constant__} or {@code __device__} variable of a loaded {@link CudaModule}
 * ({@link CudaModule#global(String)}): its device address and size on the module's GPU.
 *
 * <p>Copies from and to primitive arrays ({@code copyFrom}, {@code copyTo}: the overloads of
 * {@link HostArrayCopies}, shared with {@link DeviceBuffer}) run on the current task's stream,
 * ordered with the task's other work, and complete on return: a value written before a launch is
 * what the kernel reads (the array may change once the call returns), and {@code copyTo} after a
 * launch returns what the kernel wrote. Data is copied in native byte order; byte offsets into the
 * global are {@code long}s, element indexes into Java arrays {@code int}s. Every argument is
 * checked in Java, before anything crosses into Python.
 *
 * <p>A module is loaded once per executor and GPU, so a global is shared by every task that uses
 * the module there: tasks that write different values to it while another's kernels may read it
 * race, as they would on any GPU. Pass per-task values as kernel arguments.
 */
public final class DeviceGlobal extends HostArrayCopies {
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

    // --- the array copies (HostArrayCopies): checked there, then one call into Python ------------

    @Override
    String nullArray(boolean source) {
        return "the array is null";
    }

    @Override
    void checkRange(String call, long offset, long bytes) {
        if (offset < 0 || offset > size - bytes) {
            throw new IndexOutOfBoundsException(call + ": range [" + offset + ", " + offset + "+" + bytes
                    + ") is outside global " + name + " of " + size + " bytes");
        }
        if (bytes > Integer.MAX_VALUE - 8) {
            throw new IllegalArgumentException(call + ": " + bytes + " bytes in one copy; copy at most 2^31-9");
        }
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

    /** The elements, as bytes in native order, into the global on the current task's stream. */
    @Override
    void arrayIn(String call, Object array, int index, int length, int shift, long offset) {
        ByteBuffer b = ByteBuffer.allocate(length << shift).order(ByteOrder.nativeOrder());
        if (array instanceof byte[] a) {
            b.put(a, index, length);
        } else if (array instanceof short[] a) {
            b.asShortBuffer().put(a, index, length);
        } else if (array instanceof int[] a) {
            b.asIntBuffer().put(a, index, length);
        } else if (array instanceof long[] a) {
            b.asLongBuffer().put(a, index, length);
        } else if (array instanceof float[] a) {
            b.asFloatBuffer().put(a, index, length);
        } else {
            b.asDoubleBuffer().put((double[]) array, index, length);
        }
        TaskScope task = task(call);
        bridge.control().copyToGlobal(task.taskAttemptId(), moduleId, name, offset, b.array());
    }

    /** The global's bytes, after the current task's queued work, into the elements (native order). */
    @Override
    void arrayOut(String call, Object array, int index, int length, int shift, long offset) {
        long bytes = (long) length << shift;
        TaskScope task = task(call);
        byte[] got = bridge.control().copyFromGlobal(task.taskAttemptId(), moduleId, name, offset, (int) bytes);
        if (got.length != bytes) {
            throw new IllegalStateException(call + ": asked for " + bytes + " bytes, got " + got.length);
        }
        ByteBuffer b = ByteBuffer.wrap(got).order(ByteOrder.nativeOrder());
        if (array instanceof byte[] a) {
            b.get(a, index, length);
        } else if (array instanceof short[] a) {
            b.asShortBuffer().get(a, index, length);
        } else if (array instanceof int[] a) {
            b.asIntBuffer().get(a, index, length);
        } else if (array instanceof long[] a) {
            b.asLongBuffer().get(a, index, length);
        } else if (array instanceof float[] a) {
            b.asFloatBuffer().get(a, index, length);
        } else {
            b.asDoubleBuffer().get((double[]) array, index, length);
        }
    }
}
