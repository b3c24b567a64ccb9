package org.cudabridge.examples;

import org.cudabridge.CudaBridge;
import org.cudabridge.CudaKernel;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.LaunchConfig;
import org.cudabridge.ModuleSource;

/**
 * The per-partition GPU work of example (c), with no Spark class in it: the Spark job
 * ({@link GpuHistogramJob}) runs it inside each task, the Java harness ({@link TaskHarness}
 * {@code --work histogram}) on threads bound as the plugin binds them.
 *
 * <p>Compiles the histogram kernel below (once per executor: the bridge caches the module),
 * copies the partition's values to the GPU, launches the kernel on the task's stream, copies the
 * 16 bins back and checks them against the same histogram computed on the CPU. On the emulated
 * device the kernel's host kernel runs ({@code spark-examples/python/example_kernels.py}).
 */
public final class HistogramWork {
    static final String SOURCE = """
            extern "C" __global__ void histogram(const unsigned* data, int n, unsigned* bins) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) atomicAdd(&bins[data[i] % 16], 1u);
            }
            """;

    private HistogramWork() {}

    /** The partition's values: a xorshift sequence seeded by the partition. */
    public static int[] values(int partition, int n) {
        int[] values = new int[n];
        long seed = 0x9E3779B97F4A7C15L * (partition + 1);
        for (int i = 0; i < n; i++) {
            seed ^= seed << 13;
            seed ^= seed >>> 7;
            seed ^= seed << 17;
            values[i] = (int) seed;
        }
        return values;
    }

    /** The histogram on the CPU: bins[v mod 16] counts, v unsigned. */
    public static int[] expected(int[] values) {
        int[] want = new int[16];
        for (int v : values) {
            want[Integer.remainderUnsigned(v, 16)]++;
        }
        return want;
    }

    /**
     * Runs the partition's histogram on the calling thread's bound task. {@code beforeCopyBack}
     * runs with the kernel queued (the Spark job fails a planned first attempt there).
     * The result's checksum is the values counted, its expected checksum the values given, its
     * mismatches the bins that differ from the CPU's.
     */
    public static PartitionWork.Result run(CudaBridge bridge, int partition, int n, Runnable beforeCopyBack) {
        long t0 = System.nanoTime();
        PartitionWork.Result r = new PartitionWork.Result();
        r.partition = partition;
        r.elements = n;
        r.stream = bridge.stream();
        r.gpu = bridge.currentTask().gpu();
        r.taskAttemptId = bridge.currentTask().taskAttemptId();
        int[] values = values(partition, n);
        int[] want = expected(values);
        CudaKernel histogram = bridge.loadModule(ModuleSource.cuda(SOURCE)).kernel("histogram");
        int[] bins = new int[16];
        try (DeviceBuffer data = bridge.allocate(4L * n); DeviceBuffer d = bridge.allocate(64)) {
            data.copyFrom(values);
            d.memset(0);
            histogram.launch(LaunchConfig.grid((n + 255) / 256).block(256), data, n, d);
            beforeCopyBack.run();
            d.copyTo(bins);
        }
        long counted = 0;
        for (int b = 0; b < 16; b++) {
            counted += bins[b];
            r.mismatches += bins[b] == want[b] ? 0 : 1;
        }
        r.checksum = counted;
        r.expectedChecksum = n;
        r.bytesMoved = 4L * n + 64;
        r.nanos = System.nanoTime() - t0;
        return r;
    }
}
