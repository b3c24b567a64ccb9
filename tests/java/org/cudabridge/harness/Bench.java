package org.cudabridge.harness;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.cudabridge.CudaBridge;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.NativeBridge;
import org.cudabridge.PythonFunction;
import org.cudabridge.TaskScope;

/**
 * Java side of bench/bench_jvm.py: per-call p50/p99 of stream(), allocate+free, the empty bridge
 * call and 1 MiB copies from Java threads, batched frees, pairs/s for 1..16 threads, and then the
 * same operations timed from Python in this same process (tools.python_bench). Prints one line
 * {@code BENCH <json>}. Args: n (samples per op), copies, seconds per thread count and round, threads list, rounds.
 */
public final class Bench {
    static final int SIZE = 4096;

    static String percentiles(long[] ns) {
        long[] s = ns.clone();
        Arrays.sort(s);
        return String.format(Locale.ROOT, "{\"p50_ns\": %d, \"p99_ns\": %d, \"n\": %d}", s[s.length / 2],
                s[Math.min(s.length - 1, (int) ((long) s.length * 99 / 100))], s.length);
    }

    interface Op {
        void run();
    }

    static String time(Op op, int n) {
        for (int i = 0; i < Math.min(n, 20000); i++) op.run(); // warm up (and let the JIT compile)
        long[] samples = new long[n];
        for (int i = 0; i < n; i++) {
            long t0 = System.nanoTime();
            op.run();
            samples[i] = System.nanoTime() - t0;
        }
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) op.run();
        double mean = (System.nanoTime() - t0) / (double) n;
        String p = percentiles(samples);
        return p.substring(0, p.length() - 1) + String.format(Locale.ROOT, ", \"mean_ns\": %.1f}", mean);
    }

    public static void main(String[] args) throws Exception {
        int n = Integer.parseInt(args[0]);
        int copies = Integer.parseInt(args[1]);
        double seconds = Double.parseDouble(args[2]);
        int[] threadCounts = Arrays.stream(args[3].split(",")).mapToInt(Integer::parseInt).toArray();
        int rounds = args.length > 4 ? Integer.parseInt(args[4]) : 3;
        CudaBridge b = CudaBridge.start();
        StringBuilder out = new StringBuilder("{");
        long[] gateState = new long[4];
        NativeBridge.gateStats(gateState); // as the library was configured (-Dcudabridge.gate, read through Settings)
        out.append("\"gated\": ").append(gateState[0] != 0);
        try (TaskScope t = b.bindTask(1)) {
            long[] sink = {0};
            out.append(", \"stream\": ").append(time(() -> sink[0] += b.stream(), n));
            out.append(", \"alloc_free\": ").append(time(() -> b.allocate(SIZE).close(), n));
            out.append(", \"ping\": ").append(time(NativeBridge::ping, n));
            // a trivial Python function (bench/bench_functions.py:add) called for the task
            String functions = System.getProperty("bench.functions");
            if (functions != null) {
                PythonFunction add = b.pythonFunction("bench_functions:add", List.of(functions));
                Integer two = 2, forty = 40;
                out.append(", \"function_call\": ").append(time(() -> add.call(two, forty), n));
            }
            byte[] mib = new byte[1 << 20];
            try (DeviceBuffer buf = b.allocate(1 << 20)) {
                out.append(", \"copy_in\": ").append(time(() -> buf.copyFrom(mib), copies));
                out.append(", \"copy_out\": ").append(time(() -> buf.copyTo(mib), copies));
            }
            // batched frees: 8 buffers per call; only the free call is timed
            int batches = Math.max(1000, n / 8);
            DeviceBuffer[] batch = new DeviceBuffer[8];
            long[] samples = new long[batches];
            for (int k = -1000; k < batches; k++) {
                for (int i = 0; i < 8; i++) batch[i] = b.allocate(SIZE);
                long t0 = System.nanoTime();
                b.free(batch);
                long dt = System.nanoTime() - t0;
                if (k >= 0) samples[k] = dt;
            }
            long total = 0;
            for (long s : samples) total += s;
            out.append(", \"batched_free_8\": ").append(percentiles(samples));
            out.append(String.format(Locale.ROOT, ", \"batched_free_ns_per_free\": %.1f", total / (8.0 * batches)));
            if (sink[0] == 42) System.out.print(""); // keep the stream() loop alive
        }
        // Thread scaling: rounds, each measuring every thread count from Java and then from
        // Python, so that the ratios compare measurements made close together (the machine's
        // speed drifts by 2x over minutes).
        out.append(", \"rounds\": [");
        for (int round = 0; round < rounds; round++) {
            StringBuilder java = new StringBuilder();
            StringBuilder fairness = new StringBuilder();
            StringBuilder gate = new StringBuilder();
            for (int ti = 0; ti < threadCounts.length; ti++) {
                int threads = threadCounts[ti];
                long[] perThread = new long[threads];
                AtomicBoolean stop = new AtomicBoolean();
                CyclicBarrier barrier = new CyclicBarrier(threads + 1);
                List<Thread> ts = new ArrayList<>();
                for (int k = 0; k < threads; k++) {
                    final long task = 100 + 1000L * round + 100L * ti + k;
                    final int slot = k;
                    Thread th = new Thread(() -> {
                        try (TaskScope t = b.bindTask(task)) {
                            for (int i = 0; i < 5000; i++) b.allocate(SIZE).close(); // warm up
                            barrier.await();
                            long mine = 0;
                            while (!stop.get()) {
                                b.allocate(SIZE).close();
                                mine++;
                            }
                            perThread[slot] = mine;
                        } catch (Exception e) {
                            throw new RuntimeException(e);
                        }
                    });
                    ts.add(th);
                    th.start();
                }
                long[] g0 = new long[4];
                long[] g1 = new long[4];
                barrier.await();
                NativeBridge.gateStats(g0);
                long t0 = System.nanoTime();
                Thread.sleep((long) (seconds * 1000));
                stop.set(true);
                for (Thread th : ts) th.join();
                double secs = (System.nanoTime() - t0) / 1e9;
                NativeBridge.gateStats(g1);
                long total = 0, min = Long.MAX_VALUE, max = 0;
                for (long v : perThread) {
                    total += v;
                    min = Math.min(min, v);
                    max = Math.max(max, v);
                }
                String sep = ti == 0 ? "" : ", ";
                java.append(sep).append('"').append(threads).append("\": ")
                        .append(String.format(Locale.ROOT, "%.0f", total / secs));
                // the slowest and the fastest thread's share of the pairs, against an even share
                fairness.append(sep).append('"').append(threads).append("\": [")
                        .append(String.format(Locale.ROOT, "%.3f, %.3f", min * threads / (double) total,
                                max * threads / (double) total)).append(']');
                gate.append(sep).append('"').append(threads).append("\": ")
                        .append(String.format(Locale.ROOT, "[%.0f, %.0f]", (g1[2] - g0[2]) / secs, (g1[3] - g0[3]) / secs));
            }
            out.append(round == 0 ? "" : ", ").append("{\"java\": {").append(java).append("}, \"fairness\": {")
                    .append(fairness).append("}, \"handoffs_per_s\": {").append(gate).append("}, \"python\": ")
                    .append(b.callTool("python_threads", "{\"seconds\": " + seconds + ", \"threads\": [" + args[3]
                            + "], \"size\": " + SIZE + "}")).append('}');
        }
        out.append("]");
        out.append(", \"python\": ").append(b.callTool("python_bench",
                "{\"n\": " + n + ", \"copies\": " + copies + ", \"size\": " + SIZE + "}"));
        out.append("}");
        System.out.println("BENCH " + out);
        System.out.flush();
        System.exit(0);
    }
}
