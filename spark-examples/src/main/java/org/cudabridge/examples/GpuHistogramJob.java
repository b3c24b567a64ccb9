package org.cudabridge.examples;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Set;

import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;
import org.cudabridge.CudaBridge;
import org.cudabridge.CudaKernel;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.LaunchConfig;
import org.cudabridge.ModuleSource;
import org.cudabridge.executor.GpuTask;

/**
 * Example (c): every partition's task runs a CUDA kernel of its own. It compiles the histogram
 * kernel below (once per executor: the bridge caches the module), copies its partition's values
 * to the GPU, launches the kernel on its stream, copies the 16 bins back and checks them against
 * the same histogram computed on the CPU. On the emulated device the kernel's host twin runs
 * ({@code spark-examples/python/example_kernels.py}).
 *
 * <pre>
 * spark-submit --class org.cudabridge.examples.GpuHistogramJob ... cudabridge-examples.jar
 *   [--partitions 16] [--elements 65536] [--fail-first-attempt 3,7] [--summary-json out.json]
 * </pre>
 */
public final class GpuHistogramJob {
    static final String SOURCE = """
            extern "C" __global__ void histogram(const unsigned* data, int n, unsigned* bins) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) atomicAdd(&bins[data[i] % 16], 1u);
            }
            """;

    private GpuHistogramJob() {}

    public static void main(String[] args) throws Exception {
        int partitions = 16;
        int elements = 65536;
        String summaryJson = null;
        Set<Integer> failFirst = new HashSet<>();
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--partitions": partitions = Integer.parseInt(args[++i]); break;
                case "--elements": elements = Integer.parseInt(args[++i]); break;
                case "--summary-json": summaryJson = args[++i]; break;
                case "--fail-first-attempt": failFirst.addAll(PartitionWork.partitions(args[++i])); break;
                default:
                    throw new IllegalArgumentException("unknown argument " + args[i] + "; see the class comment");
            }
        }
        SparkSession spark = SparkSession.builder().appName("cudabridge-example-c").getOrCreate();
        JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
        List<Integer> ids = new ArrayList<>();
        for (int p = 0; p < partitions; p++) {
            ids.add(p);
        }
        final int n = elements;
        final Set<Integer> fails = failFirst;
        List<int[]> results = sc.parallelize(ids, partitions)
                .mapPartitionsWithIndex((Integer index, Iterator<Integer> it) -> partition(index, n, fails), true)
                .collect();
        int verified = 0;
        long counted = 0;
        for (int[] r : results) {
            verified += r[0];
            counted += r[1];
        }
        Summary s = new Summary();
        s.put("tasks_run", results.size()).put("verify_failures", results.size() - verified)
                .put("values_counted", counted).put("values_expected", (long) n * partitions);
        System.out.print(s.render());
        s.writeJson(summaryJson);
        spark.stop();
        if (verified != results.size() || counted != (long) n * partitions) {
            System.exit(1);
        }
    }

    /** One task: {verified (1 or 0), values counted}. */
    static Iterator<int[]> partition(int index, int n, Set<Integer> failFirst) {
        int[] values = new int[n];
        long seed = 0x9E3779B97F4A7C15L * (index + 1);
        int[] want = new int[16];
        for (int i = 0; i < n; i++) {
            seed ^= seed << 13;
            seed ^= seed >>> 7;
            seed ^= seed << 17;
            values[i] = (int) seed;
            want[Integer.remainderUnsigned(values[i], 16)]++;
        }
        CudaBridge bridge = GpuTask.bridge();
        CudaKernel histogram = bridge.loadModule(ModuleSource.cuda(SOURCE)).kernel("histogram");
        int[] bins = new int[16];
        try (DeviceBuffer data = bridge.allocate(4L * n); DeviceBuffer d = bridge.allocate(64)) {
            data.copyFrom(values);
            d.memset(0);
            histogram.launch(LaunchConfig.grid((n + 255) / 256).block(256), data, n, d);
            TaskContext tc = TaskContext.get();
            if (tc != null && tc.attemptNumber() == 0 && failFirst.contains(index)) {
                throw new IllegalStateException("planned failure of the first attempt of partition " + index
                        + " with its kernel queued");
            }
            d.copyTo(bins);
        }
        int counted = 0;
        boolean ok = true;
        for (int b = 0; b < 16; b++) {
            counted += bins[b];
            ok &= bins[b] == want[b];
        }
        return Collections.singletonList(new int[] {ok ? 1 : 0, counted}).iterator();
    }
}
