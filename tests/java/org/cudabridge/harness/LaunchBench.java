package org.cudabridge.harness;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.atomic.AtomicLong;

import org.cudabridge.CudaBridge;
import org.cudabridge.CudaKernel;
import org.cudabridge.CudaModule;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.LaunchConfig;
import org.cudabridge.ModuleSource;
import org.cudabridge.TaskScope;

/**
 * Java side of bench/bench_launch.py: the host time of one launch of an empty kernel from Java
 * (CudaKernel.launch: one JNI call, the arguments marshalled in C), and in the same process and
 * the same rounds the anchors timed from Python by tools.launch_bench: CuPy's RawKernel, the
 * cuda.bindings cuLaunchKernel, and cuLaunchKernel from C (bench/launch_floor.c). Then aggregate
 * launches/s of 1 and N Java threads (each its own task and stream), and a module load from the
 * cache against its first compile. Every launch batch ends with an untimed synchronize, so that
 * the device's launch queue never fills. Prints one line {@code BENCH <json>}.
 * Args: launches per sample, rounds, thread counts ("1,16"), seconds per thread count, floor library.
 */
public final class LaunchBench {
    static final String SOURCE = "extern \"C\" __global__ void empty(float* p, int n, float a) { }\n";
    static final int BATCH = 256;

    static String percentiles(long[] ns, double meanNs) {
        long[] s = ns.clone();
        Arrays.sort(s);
        return String.format(Locale.ROOT, "{\"p50_ns\": %d, \"p99_ns\": %d, \"mean_ns\": %.1f, \"n\": %d}",
                s[s.length / 2], s[Math.min(s.length - 1, (int) ((long) s.length * 99 / 100))], meanNs, s.length);
    }

    static String javaLaunches(CudaBridge b, CudaKernel k, DeviceBuffer buf, int n) {
        LaunchConfig one = LaunchConfig.grid(1).block(32);
        long[] samples = new long[n];
        long total = 0;
        for (int i = 0; i < n; i++) {
            long t0 = System.nanoTime();
            k.launch(one, buf, n, 1.0f);
            long dt = System.nanoTime() - t0;
            samples[i] = dt;
            total += dt;
            if ((i + 1) % BATCH == 0) b.synchronize();
        }
        b.synchronize();
        return percentiles(samples, total / (double) n);
    }

    static double threads(CudaBridge b, CudaModule m, int count, double seconds, int round) throws Exception {
        CyclicBarrier start = new CyclicBarrier(count + 1);
        AtomicLong launches = new AtomicLong();
        long deadline[] = {0};
        List<Thread> ts = new ArrayList<>();
        List<Throwable> errors = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            long task = 1000L * (round + 1) + 100 * count + i;
            Thread t = new Thread(() -> {
                try (TaskScope s = b.bindTask(task); DeviceBuffer buf = b.allocate(4096)) {
                    CudaKernel k = m.kernel("empty");
                    LaunchConfig one = LaunchConfig.grid(1).block(32);
                    start.await();
                    long mine = 0;
                    while (System.nanoTime() < deadline[0]) {
                        for (int j = 0; j < BATCH; j++) k.launch(one, buf, j, 1.0f);
                        mine += BATCH;
                        b.synchronize();
                    }
                    launches.addAndGet(mine);
                } catch (Throwable e) {
                    synchronized (errors) {
                        errors.add(e);
                    }
                }
            });
            ts.add(t);
            t.start();
        }
        deadline[0] = System.nanoTime() + (long) (seconds * 1e9);
        start.await();
        long t0 = System.nanoTime();
        for (Thread t : ts) t.join();
        double elapsed = (System.nanoTime() - t0) / 1e9;
        if (!errors.isEmpty()) throw new RuntimeException(errors.get(0));
        return launches.get() / elapsed;
    }

    public static void main(String[] args) throws Exception {
        int n = Integer.parseInt(args[0]);
        int rounds = Integer.parseInt(args[1]);
        int[] counts = Arrays.stream(args[2].split(",")).mapToInt(Integer::parseInt).toArray();
        double seconds = Double.parseDouble(args[3]);
        String floor = args.length > 4 ? args[4] : "";
        CudaBridge b = CudaBridge.start();
        StringBuilder out = new StringBuilder("{");
        TaskScope loader = b.bindTask(1);
        long t0 = System.nanoTime();
        CudaModule m = b.loadModule(ModuleSource.cuda(SOURCE));
        long compile = System.nanoTime() - t0;
        long[] cached = new long[200];
        for (int i = 0; i < cached.length; i++) {
            long c0 = System.nanoTime();
            if (b.loadModule(ModuleSource.cuda(SOURCE)) == null) throw new IllegalStateException();
            cached[i] = System.nanoTime() - c0;
        }
        Arrays.sort(cached);
        out.append(String.format(Locale.ROOT, "\"load_first_ns\": %d, \"load_cached_ns\": %d", compile,
                cached[cached.length / 2]));
        String[] anchors = floor.isEmpty() ? new String[] {"cupy", "bindings"} : new String[] {"cupy", "bindings", "c"};
        out.append(", \"rounds\": [");
        try (TaskScope t = loader; DeviceBuffer buf = b.allocate(4096)) {
            CudaKernel k = m.kernel("empty");
            javaLaunches(b, k, buf, Math.max(n, 5000));      // warm up (and let the JIT compile)
            for (String a : anchors) {
                tool(b, a, buf, n, floor);
            }
            for (int r = 0; r < rounds; r++) {
                List<String> order = new ArrayList<>();
                order.add("java");
                order.addAll(Arrays.asList(anchors));
                java.util.Collections.rotate(order, -r);      // each candidate leads in turn
                StringBuilder row = new StringBuilder("{");
                for (String c : order) {
                    String res = c.equals("java") ? javaLaunches(b, k, buf, n) : tool(b, c, buf, n, floor);
                    row.append(row.length() > 1 ? ", " : "").append('"').append(c).append("\": ").append(res);
                }
                out.append(r > 0 ? ", " : "").append(row).append('}');
            }
        }
        out.append("], \"threads\": [");
        for (int r = 0; r < rounds; r++) {
            StringBuilder row = new StringBuilder("{");
            int[] order = counts.clone();
            if (r % 2 == 1) {
                for (int i = 0; i < order.length / 2; i++) {
                    int x = order[i];
                    order[i] = order[order.length - 1 - i];
                    order[order.length - 1 - i] = x;
                }
            }
            for (int c : order) {
                double rate = threads(b, m, c, seconds, r);
                row.append(row.length() > 1 ? ", " : "").append(String.format(Locale.ROOT, "\"%d\": %.1f", c, rate));
            }
            out.append(r > 0 ? ", " : "").append(row).append('}');
        }
        var stats = b.statistics();
        out.append(String.format(Locale.ROOT, "], \"bridge_launches\": %d, \"bridge_launches_referred\": %d}",
                stats.get("bridge_launches"), stats.get("bridge_launches_referred")));
        b.shutdown();
        System.out.println("BENCH " + out);
    }

    static String tool(CudaBridge b, String how, DeviceBuffer buf, int n, String floor) {
        String json = String.format(Locale.ROOT,
                "{\"task\": 1, \"how\": \"%s\", \"n\": %d, \"batch\": %d, \"ptr\": %d, \"source\": \"%s\", "
                        + "\"floor_library\": \"%s\"}",
                how, n, BATCH, buf.address(), SOURCE.replace("\"", "\\\"").replace("\n", "\\n"), floor);
        return b.callTool("launch_bench", json);
    }
}
