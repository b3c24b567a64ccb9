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
import org.cudabridge.executor.GpuTask;

/**
 * Example (c): every partition's task runs a CUDA kernel of its own ({@link HistogramWork}: a
 * histogram with atomics, compiled once per executor, launched on the task's stream, checked
 * against the CPU's). On the emulated device the kernel's host kernel runs
 * ({@code spark-examples/python/example_kernels.py}).
 *
 * <pre>
 * spark-submit --class org.cudabridge.examples.GpuHistogramJob ... cudabridge-examples.jar
 *   [--partitions 16] [--elements 65536] [--fail-first-attempt 3,7] [--summary-json out.json]
 * </pre>
 */
public final class GpuHistogramJob {
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
        PartitionWork.Result r = HistogramWork.run(GpuTask.bridge(), index, n, () -> {
            TaskContext tc = TaskContext.get();
            if (tc != null && tc.attemptNumber() == 0 && failFirst.contains(index)) {
                throw new IllegalStateException("planned failure of the first attempt of partition " + index
                        + " with its kernel queued");
            }
        });
        return Collections.singletonList(new int[] {r.ok() ? 1 : 0, (int) r.checksum}).iterator();
    }
}
