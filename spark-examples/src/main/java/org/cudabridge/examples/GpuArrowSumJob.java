package org.cudabridge.examples;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Set;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.cudabridge.CudaBridge;
import org.cudabridge.CudaKernel;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.HostRegistration;
import org.cudabridge.LaunchConfig;
import org.cudabridge.ModuleSource;
import org.cudabridge.executor.GpuTask;

/**
 * Example (e): off-heap Arrow batches reduced on the GPU. Each task fills an Arrow
 * {@code BigIntVector} (off-heap memory, Arrow Java ships in Spark's jars) from its rows in batches,
 * registers the vector's value buffer once ({@link CudaBridge#registerHost}: page-locked, so that its
 * copies can be single DMAs at the link's speed), copies each batch to the GPU from the buffer's
 * address asynchronously ({@link DeviceBuffer#copyFromAddressAsync}, ordered on the task's stream; the
 * task synchronizes before refilling the vector), and adds it into a device accumulator with a kernel of
 * its own (atomics). The driver checks the sum of the tasks' results against Spark's own
 * {@code sum}. On the emulated device the kernel's host kernel runs
 * ({@code spark-examples/python/example_kernels.py}).
 *
 * <pre>
 * spark-submit --class org.cudabridge.examples.GpuArrowSumJob ... cudabridge-examples.jar
 *   [--rows 2000000] [--partitions 8] [--batch 65536] [--fail-first-attempt 3] [--summary-json out.json]
 * </pre>
 */
public final class GpuArrowSumJob {
    static final String SOURCE = """
            extern "C" __global__ void sum_i64(const long long* v, int n, unsigned long long* total) {
                long long mine = 0;
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
                    mine += v[i];
                atomicAdd(total, (unsigned long long)mine);
            }
            """;

    private GpuArrowSumJob() {}

    public static void main(String[] args) throws Exception {
        long rows = 2_000_000;
        int partitions = 8;
        int batch = 65536;
        String summaryJson = null;
        Set<Integer> failFirst = new HashSet<>();
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--rows": rows = Long.parseLong(args[++i]); break;
                case "--partitions": partitions = Integer.parseInt(args[++i]); break;
                case "--batch": batch = Integer.parseInt(args[++i]); break;
                case "--summary-json": summaryJson = args[++i]; break;
                case "--fail-first-attempt": failFirst.addAll(PartitionWork.partitions(args[++i])); break;
                default:
                    throw new IllegalArgumentException("unknown argument " + args[i] + "; see the class comment");
            }
        }
        SparkSession spark = SparkSession.builder().appName("cudabridge-example-e").getOrCreate();
        // values with negatives and large magnitudes, so a lost or doubled batch changes the sum
        Dataset<Row> data = spark.range(0, rows, 1, partitions).selectExpr("(id * 2654435761) % 1000003 - 500000 AS v");
        long expected = data.selectExpr("sum(v)").first().getLong(0);
        final int b = batch;
        final Set<Integer> fails = failFirst;
        JavaRDD<Row> rdd = data.toJavaRDD();
        List<long[]> parts = rdd.mapPartitionsWithIndex((Integer index, Iterator<Row> it) -> partition(index, it, b, fails),
                true).collect();
        long total = 0;
        long counted = 0;
        for (long[] p : parts) {
            total += p[0];
            counted += p[1];
        }
        Summary s = new Summary();
        s.put("tasks_run", parts.size()).put("rows_counted", counted).put("rows_expected", rows)
                .put("gpu_sum", total).put("spark_sum", expected).put("verify_failures", total == expected ? 0 : 1);
        System.out.print(s.render());
        s.writeJson(summaryJson);
        spark.stop();
        if (total != expected || counted != rows) {
            System.exit(1);
        }
    }

    /** One task: {its rows' sum computed on the GPU, rows counted}. */
    static Iterator<long[]> partition(int index, Iterator<Row> rows, int batch, Set<Integer> failFirst) {
        CudaBridge bridge = GpuTask.bridge();
        CudaKernel sum = bridge.loadModule(ModuleSource.cuda(SOURCE)).kernel("sum_i64");   // once per executor
        long count = 0;
        long[] total = new long[1];
        try (BufferAllocator arrow = new RootAllocator();
             BigIntVector values = new BigIntVector("v", arrow);
             DeviceBuffer staged = bridge.allocate(8L * batch);
             DeviceBuffer acc = bridge.allocate(8)) {
            values.allocateNew(batch);   // off-heap, fixed: never reallocated, so its address holds
            long address = values.getDataBuffer().memoryAddress();
            acc.memset(0);
            HostRegistration registered = bridge.registerHost(address, 8L * batch);   // once, not per batch
            try {
                while (rows.hasNext()) {
                    int n = 0;
                    while (n < batch && rows.hasNext()) {
                        values.set(n++, rows.next().getLong(0));
                    }
                    staged.copyFromAddressAsync(address, 8L * n, 0);   // registered memory: queued on the task's stream
                    sum.launch(LaunchConfig.grid(Math.max(1, Math.min(64, (n + 255) / 256))).block(256), staged, n, acc);
                    count += n;
                    // the next batch overwrites the vector: its copy must have read it first
                    bridge.synchronize();
                    TaskContext tc = TaskContext.get();
                    if (tc != null && tc.attemptNumber() == 0 && failFirst.contains(index)) {
                        throw new IllegalStateException("planned failure of the first attempt of partition " + index
                                + " with its memory registered and its buffers allocated");
                    }
                }
                acc.copyTo(total);
            } finally {
                registered.close();   // before Arrow frees the memory (the enclosing try)
            }
        }
        return Collections.singletonList(new long[] {total[0], count}).iterator();
    }
}
