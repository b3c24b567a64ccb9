package org.cudabridge.harness;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
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
 * array, a pinned buffer of the pinned pool and registered off-heap memory (both with the asynchronous
 * forms, copyFromAsync / copyFromAddressAsync and their copyTo twins), unregistered off-heap
 * memory and a plain direct ByteBuffer (allocateDirect), and allocatePinned + close; then, in the same round and process, the anchors timed from Python
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
        String[] modes = {"heap_in", "heap_out", "pinned_in", "pinned_out", "registered_in", "registered_out",
                "address_in", "address_out", "direct_in", "direct_out", "pinned_alloc"};
        int k = sizes.length;
        try (TaskScope t = b.bindTask(1)) {
            // every buffer made once and kept over the rounds (a region is registered once, never per round)
            byte[][] heap = new byte[k][];
            long[] reg = new long[k];
            long[] plain = new long[k];
            DeviceBuffer[] dev = new DeviceBuffer[k];
            PinnedBuffer[] pin = new PinnedBuffer[k];
            HostRegistration[] h = new HostRegistration[k];
            ByteBuffer[] direct = new ByteBuffer[k];   // ByteBuffer.allocateDirect: pageable
            for (int s = 0; s < k; s++) {
                heap[s] = new byte[(int) sizes[s]];
                reg[s] = (long) allocate.invoke(unsafe, sizes[s]);
                plain[s] = (long) allocate.invoke(unsafe, sizes[s]);
                dev[s] = b.allocate(sizes[s]);
                pin[s] = b.allocatePinned(sizes[s]);
                h[s] = b.registerHost(reg[s], sizes[s]);
                direct[s] = ByteBuffer.allocateDirect((int) sizes[s]);
            }
            for (int r = 0; r < rounds; r++) {
                StringBuilder row = new StringBuilder();
                long[][] ns = new long[modes.length][k];
                for (int s = 0; s < k; s++) {
                    long n = sizes[s];
                    byte[] a = heap[s];
                    DeviceBuffer d = dev[s];
                    ByteBuffer p = pin[s].buffer();
                    long ra = h[s].address();
                    long pa = plain[s];
                    ns[0][s] = median(b, () -> d.copyFrom(a), reps);
                    ns[1][s] = median(b, () -> d.copyTo(a), reps);
                    ns[2][s] = median(b, () -> d.copyFromAsync(p, 0), reps);
                    ns[3][s] = median(b, () -> d.copyToAsync(p, 0), reps);
                    ns[4][s] = median(b, () -> d.copyFromAddressAsync(ra, n, 0), reps);
                    ns[5][s] = median(b, () -> d.copyToAddressAsync(ra, n, 0), reps);
                    ns[6][s] = median(b, () -> d.copyFromAddress(pa, n, 0), reps);
                    ns[7][s] = median(b, () -> d.copyToAddress(pa, n, 0), reps);
                    ByteBuffer db = direct[s];
                    ns[8][s] = median(b, () -> d.copyFrom(db, 0), reps);
                    ns[9][s] = median(b, () -> d.copyTo(db, 0), reps);
                    // allocatePinned + close from the pool (no copy ran, so the block is free again at once)
                    // a few microseconds each: warmed up and sampled 10x more than the copies, so that
                    // the JIT and caches are warm and the median is steady
                    for (int w = 0; w < 10 * reps; w++) {
                        b.allocatePinned(n).close();
                    }
                    ns[10][s] = median(b, () -> b.allocatePinned(n).close(), 10 * reps, false);
                }
                for (int m = 0; m < modes.length; m++) {
                    row.append(m > 0 ? ", " : "").append('"').append(modes[m]).append("\": {");
                    for (int s = 0; s < k; s++) {
                        row.append(s > 0 ? ", " : "").append(String.format(Locale.ROOT, "\"%d\": %d", sizes[s], ns[m][s]));
                    }
                    row.append('}');
                }
                String anchors = b.callTool("copy_bench", String.format(Locale.ROOT, "{\"task\": 1, \"sizes\": [%s], \"reps\": %d}",
                        args[0], reps));
                out.append(r > 0 ? ", " : "").append('{').append(row).append(", \"anchors\": ").append(anchors).append('}');
            }
            for (int s = 0; s < k; s++) {
                h[s].close();
                pin[s].close();
                dev[s].close();
                free.invoke(unsafe, reg[s]);
                free.invoke(unsafe, plain[s]);
            }
        }
        out.append("]}");
        b.shutdown();
        System.out.println("BENCH " + out);
    }
}
