package org.cudabridge.harness;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.util.Arrays;
import java.util.Locale;

import org.cudabridge.CudaBridge;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.HostRegistration;
import org.cudabridge.PinnedBuffer;
import org.cudabridge.TaskScope;

/**
 * Java side of bench/bench_copies.py: for each size, the median time of a copy and the synchronize
 * after it (end to end: the asynchronous ones are only done then), both directions, from a Java heap
 * array, a pinned buffer of the pinned pool, registered off-heap memory and unregistered off-heap
 * memory; then, in the same round and process, the anchors timed from Python
 * (tools.copy_bench: the host's memcpy, and CuPy's pinned and pageable cudaMemcpyAsync on a GPU).
 * Prints one line {@code BENCH <json>}: per round, {candidate: {size: median ns}}.
 * Args: sizes (comma-separated bytes), repetitions per size, rounds.
 */
public final class CopyBench {
    interface Op {
        void run() throws Exception;
    }

    static long median(CudaBridge b, Op op, int reps) throws Exception {
        return median(b, op, reps, true);
    }

    /** The median of {@code reps} timed runs of op (after one untimed), each followed by a synchronize if sync. */
    static long median(CudaBridge b, Op op, int reps, boolean sync) throws Exception {
        op.run();
        b.synchronize();
        long[] t = new long[reps];
        for (int i = 0; i < reps; i++) {
            long t0 = System.nanoTime();
            op.run();
            if (sync) {
                b.synchronize();
            }
            t[i] = System.nanoTime() - t0;
        }
        Arrays.sort(t);
        return t[reps / 2];
    }

    public static void main(String[] args) throws Exception {
        long[] sizes = Arrays.stream(args[0].split(",")).mapToLong(Long::parseLong).toArray();
        int reps = Integer.parseInt(args[1]);
        int rounds = Integer.parseInt(args[2]);
        Class<?> uc = Class.forName("sun.misc.Unsafe");
        Field f = uc.getDeclaredField("theUnsafe");
        f.setAccessible(true);
        Object unsafe = f.get(null);
        Method allocate = uc.getMethod("allocateMemory", long.class);
        Method free = uc.getMethod("freeMemory", long.class);
        CudaBridge b = CudaBridge.start();
        StringBuilder out = new StringBuilder("{\"rounds\": [");
        try (TaskScope t = b.bindTask(1)) {
            for (int r = 0; r < rounds; r++) {
                StringBuilder row = new StringBuilder();
                String[] modes = {"heap_in", "heap_out", "pinned_in", "pinned_out", "registered_in", "registered_out",
                        "address_in", "address_out", "pinned_alloc"};
                long[][] ns = new long[modes.length][sizes.length];
                for (int s = 0; s < sizes.length; s++) {
                    long n = sizes[s];
                    byte[] heap = new byte[(int) n];
                    long reg = (long) allocate.invoke(unsafe, n);
                    long plain = (long) allocate.invoke(unsafe, n);
                    try (DeviceBuffer dev = b.allocate(n); PinnedBuffer pin = b.allocatePinned(n);
                         HostRegistration h = b.registerHost(reg, n)) {
                        ns[0][s] = median(b, () -> dev.copyFrom(heap), reps);
                        ns[1][s] = median(b, () -> dev.copyTo(heap), reps);
                        ns[2][s] = median(b, () -> dev.copyFrom(pin.buffer(), 0), reps);
                        ns[3][s] = median(b, () -> dev.copyTo(pin.buffer(), 0), reps);
                        ns[4][s] = median(b, () -> dev.copyFromAddress(h.address(), n, 0), reps);
                        ns[5][s] = median(b, () -> dev.copyToAddress(h.address(), n, 0), reps);
                        ns[6][s] = median(b, () -> dev.copyFromAddress(plain, n, 0), reps);
                        ns[7][s] = median(b, () -> dev.copyToAddress(plain, n, 0), reps);
                    } finally {
                        free.invoke(unsafe, reg);
                        free.invoke(unsafe, plain);
                    }
                    // allocatePinned + close from the pool (no copy ran, so the block is free again at once)
                    ns[8][s] = median(b, () -> b.allocatePinned(n).close(), reps, false);
                }
                for (int m = 0; m < modes.length; m++) {
                    row.append(m > 0 ? ", " : "").append('"').append(modes[m]).append("\": {");
                    for (int s = 0; s < sizes.length; s++) {
                        row.append(s > 0 ? ", " : "").append(String.format(Locale.ROOT, "\"%d\": %d", sizes[s], ns[m][s]));
                    }
                    row.append('}');
                }
                String anchors = b.callTool("copy_bench", String.format(Locale.ROOT, "{\"task\": 1, \"sizes\": [%s], \"reps\": %d}",
                        args[0], reps));
                out.append(r > 0 ? ", " : "").append('{').append(row).append(", \"anchors\": ").append(anchors).append('}');
            }
        }
        out.append("]}");
        b.shutdown();
        System.out.println("BENCH " + out);
    }
}
