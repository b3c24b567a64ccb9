package org.cudabridge;

import java.util.Arrays;

/**
 * A device buffer's bytes as an array of {@link DType} elements in a shape: a Python function's
 * array argument ({@link DeviceBuffer#asArray}: a CuPy array over the same memory on a GPU, a torch
 * tensor with {@link #asTorch()}, a numpy array on the emulated device) and its array results (a
 * task-owned {@link DeviceBuffer} of their own: {@link #close()} frees it).
 */
public final class DeviceArray implements AutoCloseable {
    private final DeviceBuffer buffer;
    private final long offset;
    private final DType dtype;
    private final long[] shape;
    private final boolean torch;

    DeviceArray(DeviceBuffer buffer, long offset, DType dtype, long[] shape, boolean torch) {
        if (dtype == null || shape == null) {
            throw new NullPointerException("asArray: dtype and shape are required");
        }
        if (shape.length > 32) {
            throw new IllegalArgumentException("asArray: at most 32 dimensions, got " + shape.length);
        }
        long elements = 1;
        for (long d : shape) {
            if (d < 0) {
                throw new IllegalArgumentException("asArray: negative dimension in shape " + Arrays.toString(shape));
            }
            try {
                elements = Math.multiplyExact(elements, d);
            } catch (ArithmeticException e) {
                throw new IllegalArgumentException("asArray: shape " + Arrays.toString(shape) + " overflows");
            }
        }
        if (offset < 0 || offset % dtype.itemSize() != 0) {
            throw new IllegalArgumentException("asArray: offset " + offset + " is not a non-negative multiple of "
                    + dtype + "'s " + dtype.itemSize() + " bytes");
        }
        long bytes = elements > Long.MAX_VALUE / dtype.itemSize() ? -1 : elements * dtype.itemSize();
        if (bytes < 0 || offset > buffer.size() || bytes > buffer.size() - offset) {
            throw new IllegalArgumentException("asArray: a " + dtype + " array of shape " + Arrays.toString(shape)
                    + " needs " + (bytes < 0 ? "more than 2^63" : String.valueOf(bytes)) + " bytes from offset " + offset
                    + "; the buffer holds " + buffer.size());
        }
        this.buffer = buffer;
        this.offset = offset;
        this.dtype = dtype;
        this.shape = shape.clone();
        this.torch = torch;
    }

    public DeviceBuffer buffer() { return buffer; }

    /** Bytes from the buffer's start to the first element. */
    public long offset() { return offset; }

    public DType dtype() { return dtype; }

    public long[] shape() { return shape.clone(); }

    /** The number of elements (the shape's product). */
    public long elements() {
        long n = 1;
        for (long d : shape) {
            n *= d;
        }
        return n;
    }

    /** The array's bytes ({@link #elements()} times the item size). */
    public long bytes() { return elements() * dtype.itemSize(); }

    /** Whether the function receives it as a torch tensor rather than a CuPy array. */
    public boolean isTorch() { return torch; }

    /** The same array, received by the function as a torch tensor (DLPack; a CPU tensor over the
     *  emulated device's memory). */
    public DeviceArray asTorch() {
        return new DeviceArray(buffer, offset, dtype, shape, true);
    }

    /** Frees the buffer ({@link DeviceBuffer#close()}): for a function's result, which owns its buffer. */
    @Override
    public void close() {
        buffer.close();
    }

    @Override
    public String toString() {
        return "DeviceArray[" + dtype + Arrays.toString(shape) + (offset != 0 ? " at +" + offset : "") + " of " + buffer
                + (torch ? ", torch" : "") + "]";
    }
}
