package org.cudabridge;

import java.util.List;
import java.util.Locale;

/**
 * The element type of a device array passed to or returned from a Python function
 * ({@link DeviceBuffer#asArray}, {@link PythonFunction}). A constant's code is its index in
 * {@code functions/dtypes.py}'s {@code DTYPES}, which the build writes into the jar; the class
 * refuses to load if the two disagree.
 */
public enum DType {
    BOOL(1), INT8(1), UINT8(1), INT16(2), INT32(4), INT64(8), FLOAT32(4), FLOAT64(8);

    private final int itemSize;

    DType(int itemSize) {
        this.itemSize = itemSize;
    }

    static {
        List<String> names = BuildTables.lines(BuildTables.DTYPES);
        DType[] all = values();
        boolean same = names.size() == all.length;
        for (int i = 0; same && i < all.length; i++) {
            same = names.get(i).equals(all[i].pythonName());
        }
        if (!same) {
            throw new IllegalStateException("org.cudabridge.DType " + List.of(all) + " disagrees with the jar's dtypes "
                    + names + ": rebuild the jar (python -m cudabridge build)");
        }
    }

    /** Bytes per element. */
    public int itemSize() {
        return itemSize;
    }

    /** The name numpy, CuPy and torch give it ({@code "float32"}). */
    public String pythonName() {
        return name().toLowerCase(Locale.ROOT);
    }

    /** The code the bridge sends (the index in the shared table). */
    int code() {
        return ordinal();
    }

    static DType ofCode(long code) {
        DType[] all = values();
        if (code < 0 || code >= all.length) {
            throw new IllegalStateException("unknown dtype code " + code + " from Python: rebuild the jar");
        }
        return all[(int) code];
    }
}
