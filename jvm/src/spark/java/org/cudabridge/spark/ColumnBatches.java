package org.cudabridge.spark;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.cudabridge.CudaBridge;
import org.cudabridge.DType;
import org.cudabridge.DeviceArray;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.PythonFunction;

/**
 * One partition of {@link GpuPython#mapBatches}: its rows in batches through the Python function,
 * as an iterator of the output rows (one batch at a time in memory). Per batch: each input column
 * into a primitive array, then into a device buffer of the task (a staged copy through the pinned
 * slots); one call of the function over batches; each output column back into a primitive array;
 * every buffer freed before the next batch.
 */
final class ColumnBatches implements Iterator<Row> {
    private final Iterator<Row> rows;
    private final CudaBridge bridge;
    private final PythonFunction batches;
    private final List<String> inNames;
    private final List<DType> inTypes;
    private final List<DType> outTypes;
    private final int batchRows;
    private final HostColumn[] in;
    private HostColumn[] out = new HostColumn[0];
    private int outRows;
    private int next;
    private long rowsRead;

    ColumnBatches(Iterator<Row> rows, String reference, byte[] pickled, List<String> inNames, List<DType> inTypes,
                  List<String> outNames, List<DType> outTypes, int batchRows) {
        this.rows = rows;
        this.bridge = CudaBridge.get();
        PythonFunction f = pickled != null ? bridge.pythonFunction(pickled)
                : bridge.pythonFunction(reference, GpuPython.searchPaths());
        this.batches = f.overBatches(inNames, outNames, outTypes);
        this.inNames = inNames;
        this.inTypes = inTypes;
        this.outTypes = outTypes;
        this.batchRows = batchRows;
        this.in = new HostColumn[inTypes.size()];
        for (int c = 0; c < in.length; c++) {
            in[c] = HostColumn.of(inTypes.get(c), batchRows);
        }
    }

    @Override
    public boolean hasNext() {
        while (next >= outRows) {
            if (!rows.hasNext()) {
                return false;
            }
            runBatch();
        }
        return true;
    }

    @Override
    public Row next() {
        if (!hasNext()) {
            throw new NoSuchElementException();
        }
        Object[] values = new Object[out.length];
        for (int c = 0; c < out.length; c++) {
            values[c] = out[c].get(next);
        }
        next++;
        return RowFactory.create(values);
    }

    private void runBatch() {
        int n = 0;
        while (n < batchRows && rows.hasNext()) {
            Row r = rows.next();
            for (int c = 0; c < in.length; c++) {
                if (r.isNullAt(c)) {
                    throw new IllegalArgumentException("mapBatches: column " + inNames.get(c) + " is null at row "
                            + (rowsRead + n) + " of this partition; batches take non-null columns (filter or fill "
                            + "the nulls first)");
                }
                in[c].set(n, r, c);
            }
            n++;
        }
        rowsRead += n;
        List<DeviceBuffer> buffers = new ArrayList<>();
        List<?> results = null;
        try {
            Object[] args = new Object[in.length];
            for (int c = 0; c < in.length; c++) {
                DType t = inTypes.get(c);
                DeviceBuffer b = bridge.allocate(Math.max(1L, (long) n * t.itemSize()));
                buffers.add(b);
                in[c].copyTo(b, n);
                args[c] = b.asArrayAt(0, t, n);
            }
            results = (List<?>) batches.call(args);
            HostColumn[] cols = new HostColumn[outTypes.size()];
            int m = results.isEmpty() ? 0 : (int) ((DeviceArray) results.get(0)).shape()[0];
            for (int c = 0; c < cols.length; c++) {
                DeviceArray a = (DeviceArray) results.get(c);
                cols[c] = HostColumn.of(outTypes.get(c), m);
                cols[c].copyFrom(a.buffer(), m);
            }
            out = cols;
            outRows = m;
            next = 0;
        } finally {
            for (DeviceBuffer b : buffers) {
                b.close();
            }
            if (results != null) {
                for (Object o : results) {
                    ((DeviceArray) o).close();
                }
            }
        }
    }

    /** One column of a batch on the host, as the primitive array of its type. */
    abstract static class HostColumn {
        abstract void set(int i, Row r, int c);

        abstract Object get(int i);

        /** The first {@code n} values into {@code b} (complete on return). */
        abstract void copyTo(DeviceBuffer b, int n);

        /** {@code n} values from {@code b} (complete on return). */
        abstract void copyFrom(DeviceBuffer b, int n);

        static HostColumn of(DType t, int n) {
            switch (t) {
                case BOOL: return new Bytes(n, true);
                case INT8: return new Bytes(n, false);
                case INT16: return new Shorts(n);
                case INT32: return new Ints(n);
                case INT64: return new Longs(n);
                case FLOAT32: return new Floats(n);
                case FLOAT64: return new Doubles(n);
                default: throw new IllegalArgumentException("mapBatches: no column of " + t);
            }
        }
    }

    static final class Bytes extends HostColumn {
        final byte[] v;
        final boolean bool;
        Bytes(int n, boolean bool) { v = new byte[n]; this.bool = bool; }
        void set(int i, Row r, int c) { v[i] = bool ? (byte) (r.getBoolean(c) ? 1 : 0) : r.getByte(c); }
        Object get(int i) { return bool ? (Object) (v[i] != 0) : (Object) v[i]; }
        void copyTo(DeviceBuffer b, int n) { b.copyFrom(v, 0, 0, n); }
        void copyFrom(DeviceBuffer b, int n) { b.copyTo(v, 0, 0, n); }
    }

    static final class Shorts extends HostColumn {
        final short[] v;
        Shorts(int n) { v = new short[n]; }
        void set(int i, Row r, int c) { v[i] = r.getShort(c); }
        Object get(int i) { return v[i]; }
        void copyTo(DeviceBuffer b, int n) { b.copyFrom(v, 0, 0, n); }
        void copyFrom(DeviceBuffer b, int n) { b.copyTo(v, 0, 0, n); }
    }

    static final class Ints extends HostColumn {
        final int[] v;
        Ints(int n) { v = new int[n]; }
        void set(int i, Row r, int c) { v[i] = r.getInt(c); }
        Object get(int i) { return v[i]; }
        void copyTo(DeviceBuffer b, int n) { b.copyFrom(v, 0, 0, n); }
        void copyFrom(DeviceBuffer b, int n) { b.copyTo(v, 0, 0, n); }
    }

    static final class Longs extends HostColumn {
        final long[] v;
        Longs(int n) { v = new long[n]; }
        void set(int i, Row r, int c) { v[i] = r.getLong(c); }
        Object get(int i) { return v[i]; }
        void copyTo(DeviceBuffer b, int n) { b.copyFrom(v, 0, 0, n); }
        void copyFrom(DeviceBuffer b, int n) { b.copyTo(v, 0, 0, n); }
    }

    static final class Floats extends HostColumn {
        final float[] v;
        Floats(int n) { v = new float[n]; }
        void set(int i, Row r, int c) { v[i] = r.getFloat(c); }
        Object get(int i) { return v[i]; }
        void copyTo(DeviceBuffer b, int n) { b.copyFrom(v, 0, 0, n); }
        void copyFrom(DeviceBuffer b, int n) { b.copyTo(v, 0, 0, n); }
    }

    static final class Doubles extends HostColumn {
        final double[] v;
        Doubles(int n) { v = new double[n]; }
        void set(int i, Row r, int c) { v[i] = r.getDouble(c); }
        Object get(int i) { return v[i]; }
        void copyTo(DeviceBuffer b, int n) { b.copyFrom(v, 0, 0, n); }
        void copyFrom(DeviceBuffer b, int n) { b.copyTo(v, 0, 0, n); }
    }
}
