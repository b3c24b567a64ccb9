package org.cudabridge;

import java.util.Objects;

/**
 * The primitive-array copies of device memory, written once for {@link DeviceBuffer} and
 * {@link DeviceGlobal}: byte, short, int, long, float and double arrays, to the device
 * ({@code copyFrom}) and back ({@code copyTo}), a whole array or {@code length} elements from
 * {@code index} at a byte offset into the device memory.
 *
 * <p>Each call checks its arguments here, in Java, before anything crosses into the native layer
 * (a null array: {@link NullPointerException}; an element range outside the array or a byte range
 * outside the device memory: {@link IndexOutOfBoundsException}; what the class limits besides:
 * {@link #checkRange}), then hands the checked copy to its class ({@link #arrayIn},
 * {@link #arrayOut}), which moves the bytes. Data is copied in native byte order; element indexes
 * into arrays are {@code int}s, byte offsets into device memory {@code long}s.
 *
 * <p>Every one completes on return: {@code copyFrom} has read the array (it may change at once)
 * and later work on the task's stream sees the data; {@code copyTo} has written it. The garbage
 * collector moves heap arrays, so they are never page-locked and have no asynchronous form:
 * copies ordered on the stream that return at once take page-locked memory
 * ({@link DeviceBuffer#copyFromAsync(java.nio.ByteBuffer, long)}).
 */
abstract class HostArrayCopies {
    HostArrayCopies() {}

    /** The refusal of a null array, in the class's words (without the call's name). */
    abstract String nullArray(boolean source);

    /** Refuses the device range [offset, offset + bytes) outside this memory, and whatever else the
     *  class does not copy in one call. */
    abstract void checkRange(String call, long offset, long bytes);

    /** Copies {@code array[index, index + length)}, elements of {@code 1 << shift} bytes, to byte
     *  {@code offset}: every argument checked, complete on return. */
    abstract void arrayIn(String call, Object array, int index, int length, int shift, long offset);

    /** Copies {@code length << shift} bytes from byte {@code offset} into {@code array[index, index + length)}:
     *  every argument checked, complete on return. */
    abstract void arrayOut(String call, Object array, int index, int length, int shift, long offset);

    private void in(String call, Object array, int arrayLength, int index, int length, int shift, long dstOffset) {
        if (array == null) {
            throw new NullPointerException(call + ": " + nullArray(true));
        }
        Objects.checkFromIndexSize(index, length, arrayLength);
        checkRange(call, dstOffset, (long) length << shift);
        arrayIn(call, array, index, length, shift, dstOffset);
    }

    private void out(String call, Object array, int arrayLength, int index, int length, int shift, long srcOffset) {
        if (array == null) {
            throw new NullPointerException(call + ": " + nullArray(false));
        }
        Objects.checkFromIndexSize(index, length, arrayLength);
        checkRange(call, srcOffset, (long) length << shift);
        arrayOut(call, array, index, length, shift, srcOffset);
    }

    // --- host to device ---------------------------------------------------------------------------

    /** Copies {@code src[index, index+length)} to byte {@code dstOffset}; complete on return. */
    public void copyFrom(byte[] src, int index, long dstOffset, int length) {
        in("copyFrom(byte[])", src, src == null ? 0 : src.length, index, length, 0, dstOffset);
    }

    /** Copies all of {@code src} to byte 0; complete on return. */
    public void copyFrom(byte[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    public void copyFrom(short[] src, int index, long dstOffset, int length) {
        in("copyFrom(short[])", src, src == null ? 0 : src.length, index, length, 1, dstOffset);
    }

    public void copyFrom(short[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    public void copyFrom(int[] src, int index, long dstOffset, int length) {
        in("copyFrom(int[])", src, src == null ? 0 : src.length, index, length, 2, dstOffset);
    }

    public void copyFrom(int[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    public void copyFrom(long[] src, int index, long dstOffset, int length) {
        in("copyFrom(long[])", src, src == null ? 0 : src.length, index, length, 3, dstOffset);
    }

    public void copyFrom(long[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    public void copyFrom(float[] src, int index, long dstOffset, int length) {
        in("copyFrom(float[])", src, src == null ? 0 : src.length, index, length, 2, dstOffset);
    }

    public void copyFrom(float[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    public void copyFrom(double[] src, int index, long dstOffset, int length) {
        in("copyFrom(double[])", src, src == null ? 0 : src.length, index, length, 3, dstOffset);
    }

    public void copyFrom(double[] src) { copyFrom(src, 0, 0, src == null ? 0 : src.length); }

    // --- device to host ---------------------------------------------------------------------------

    /** Copies the bytes from {@code srcOffset} into {@code dst[index, index+length)}; complete on return. */
    public void copyTo(byte[] dst, int index, long srcOffset, int length) {
        out("copyTo(byte[])", dst, dst == null ? 0 : dst.length, index, length, 0, srcOffset);
    }

    /** Fills all of {@code dst} from byte 0; complete on return. */
    public void copyTo(byte[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }

    public void copyTo(short[] dst, int index, long srcOffset, int length) {
        out("copyTo(short[])", dst, dst == null ? 0 : dst.length, index, length, 1, srcOffset);
    }

    public void copyTo(short[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }

    public void copyTo(int[] dst, int index, long srcOffset, int length) {
        out("copyTo(int[])", dst, dst == null ? 0 : dst.length, index, length, 2, srcOffset);
    }

    public void copyTo(int[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }

    public void copyTo(long[] dst, int index, long srcOffset, int length) {
        out("copyTo(long[])", dst, dst == null ? 0 : dst.length, index, length, 3, srcOffset);
    }

    public void copyTo(long[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }

    public void copyTo(float[] dst, int index, long srcOffset, int length) {
        out("copyTo(float[])", dst, dst == null ? 0 : dst.length, index, length, 2, srcOffset);
    }

    public void copyTo(float[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }

    public void copyTo(double[] dst, int index, long srcOffset, int length) {
        out("copyTo(double[])", dst, dst == null ? 0 : dst.length, index, length, 3, srcOffset);
    }

    public void copyTo(double[] dst) { copyTo(dst, 0, 0, dst == null ? 0 : dst.length); }
}
