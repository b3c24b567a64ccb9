package org.cudabridge.examples;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;

import org.cudabridge.CudaBridge;
import org.cudabridge.CudaKernel;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.LaunchConfig;
import org.cudabridge.ModuleSource;

/**
 * The per-partition GPU work of example (a), with no Spark class in it: the Spark job
 * ({@link GpuPartitionJob}) runs it inside each task, the Java harness ({@link TaskHarness}) runs
 * it on threads bound exactly as the plugin binds them.
 *
 * <p>On the task's own stream: copy the partition's {@code int}s to the device, copy them
 * device-to-device into the first half of a result buffer, launch the example's own CUDA kernel
 * {@code fill_tag} over the second half (a tag derived from the partition; the module is compiled
 * once per executor, every later task gets it from the bridge's cache), copy the whole result
 * back and check every element. Optionally leak one small buffer on purpose (the plugin reclaims
 * it at task end and counts it). On the emulated device the kernel's host kernel runs
 * ({@code spark-examples/python/example_kernels.py}, named by {@code spark.cudabridge.emulatedKernels}).
 */
public final class PartitionWork {
    /** The example's kernel: p[i] = tag for i < n, over a grid-stride loop. */
    static final String SOURCE = """
            extern "C" __global__ void fill_tag(unsigned* p, int n, unsigned tag) {
                for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
                    p[i] = tag;
            }
            """;

    private PartitionWork() {}

    /** What one partition's task did. */
    public static final class Result implements Serializable {
        private static final long serialVersionUID = 1L;
        public int partition;
        public long taskAttemptId;
        public int attempt;
        public String executorId;
        public long stream;
        public int gpu;
        public int elements;
        public long bytesMoved;
        public long checksum;
        public long expectedChecksum;
        public int mismatches;
        public int leakedOnPurpose;
        public long nanos;

        public boolean ok() {
            return mismatches == 0 && checksum == expectedChecksum;
        }

        @Override
        public String toString() {
            return "Result(partition " + partition + ", attempt " + taskAttemptId + ", stream 0x" + Long.toHexString(stream)
                    + ", " + bytesMoved + " bytes, " + (ok() ? "ok" : mismatches + " mismatches") + ")";
        }
    }

    /** Partition indexes from a comma-separated list ("3,7"), as {@code --fail-first-attempt} takes them. */
    public static List<Integer> partitions(String list) {
        List<Integer> out = new ArrayList<>();
        for (String p : list.split(",")) {
            out.add(Integer.parseInt(p.trim()));
        }
        return out;
    }

    /** The partition's input: deterministic, different per partition. */
    public static int value(int partition, int i) {
        int x = partition * 0x9E3779B1 + i * 0x85EBCA6B;
        x ^= x >>> 15;
        x *= 0x2C1B3C6D;
        return x ^ (x >>> 13);
    }

    public static int[] input(int partition, int elements) {
        int[] data = new int[elements];
        for (int i = 0; i < elements; i++) {
            data[i] = value(partition, i);
        }
        return data;
    }

    public static long checksum(int[] data, int from, int to) {
        long s = 0;
        for (int i = from; i < to; i++) {
            s += data[i] & 0xFFFFFFFFL;
        }
        return s;
    }

    /** The tag the kernel writes (non-negative, so it fits any JSON integer reader). */
    public static int tag(int partition) {
        return 0x5A000000 | (partition & 0xFFFFFF);
    }

    /** The job without the GPU: the same input, checksum and check on the host (the bench's baseline). */
    public static Result runOnHost(int partition, int elements) {
        long t0 = System.nanoTime();
        Result r = new Result();
        r.partition = partition;
        r.elements = elements;
        int[] data = input(partition, elements);
        int[] copy = new int[2 * elements];
        System.arraycopy(data, 0, copy, 0, elements);
        java.util.Arrays.fill(copy, elements, 2 * elements, tag(partition));
        r.expectedChecksum = checksum(data, 0, elements);
        r.checksum = checksum(copy, 0, elements);
        r.mismatches = mismatches(copy, partition, elements);
        r.nanos = System.nanoTime() - t0;
        return r;
    }

    private static int mismatches(int[] back, int partition, int elements) {
        int bad = 0;
        int tag = tag(partition);
        for (int i = 0; i < elements; i++) {
            if (back[i] != value(partition, i)) {
                bad++;
            }
            if (back[elements + i] != tag) {
                bad++;
            }
        }
        return bad;
    }

    /**
     * Runs the partition's work on the calling thread's bound task (its stream).
     *
     * @param leak leave one 4 KiB buffer unclosed on purpose (reclaimed by the task's release)
     */
    public static Result run(CudaBridge bridge, int partition, int elements, boolean leak) {
        if (elements <= 0) {
            throw new IllegalArgumentException("elements must be positive, got " + elements);
        }
        long t0 = System.nanoTime();
        Result r = new Result();
        r.partition = partition;
        r.elements = elements;
        r.stream = bridge.stream();
        r.gpu = bridge.currentTask().gpu();
        r.taskAttemptId = bridge.currentTask().taskAttemptId();
        int[] data = input(partition, elements);
        r.expectedChecksum = checksum(data, 0, elements);
        long bytes = 4L * elements;
        DeviceBuffer in = bridge.allocate(bytes);
        DeviceBuffer out = null;
        try {
            out = bridge.allocate(2 * bytes);
            in.copyFrom(data);                                   // host -> device, on the task's stream
            out.copyFrom(in, 0, 0, bytes);                       // device -> device, same stream
            CudaKernel fill = bridge.loadModule(ModuleSource.cuda(SOURCE)).kernel("fill_tag");   // cached per executor
            fill.launch(LaunchConfig.grid(Math.min(1024, (elements + 255) / 256)).block(256),
                    out.at(bytes), elements, tag(partition));   // the second half, same stream
            int[] back = new int[2 * elements];
            out.copyTo(back);                                    // device -> host: after the kernel (stream order)
            r.bytesMoved = bytes + bytes + 2 * bytes;
            r.checksum = checksum(back, 0, elements);
            r.mismatches = mismatches(back, partition, elements);
            if (leak) {
                DeviceBuffer leaked = bridge.allocate(4096);    // never closed: the plugin reclaims it
                leaked.memset(0xAB);
                r.leakedOnPurpose = 1;
            }
        } finally {
            if (out != null) {
                bridge.free(in, out);                            // one call into Python for both
            } else {
                in.close();
            }
        }
        r.nanos = System.nanoTime() - t0;
        return r;
    }

    /** A first attempt that fails after allocating (and filling) device memory, never freed by
     *  the task: the plugin's release at onTaskFailed must reclaim it. Always throws. */
    public static void failAfterAllocating(CudaBridge bridge, int partition, int elements) {
        DeviceBuffer b = bridge.allocate(4L * elements);
        b.copyFrom(input(partition, elements));
        throw new IllegalStateException("planned failure of the first attempt of partition " + partition
                + " after allocating " + b.size() + " bytes on stream 0x" + Long.toHexString(b.stream()));
    }
}
