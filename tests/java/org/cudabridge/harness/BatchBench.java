package org.cudabridge.harness;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Locale;

import org.cudabridge.CudaBridge;
import org.cudabridge.DType;
import org.cudabridge.DeviceArray;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.PythonFunction;
import org.cudabridge.TaskScope;

/**
 * Java side of bench/bench_batches.py: the per-batch path of GpuPython.mapBatches without Spark
 * (ColumnBatches' steps over primitive arrays): per batch, the input columns (id BIGINT, x DOUBLE)
 * from heap arrays into task buffers (staged copies), one call of example (d)'s transform over
 * batches (spark-examples/python/example_batches.py), the output columns (id, y, positive) back
 * into heap arrays, every buffer freed. Reads commands on stdin: {@code round} runs one round of
 * {@code batches} batches and prints {@code ROUND <json>}; {@code quit} ends. Args: rows per batch,
 * batches per round, the folder of example_batches.py.
 */
public final class BatchBench {
    public static void main(String[] args) throws Exception {
        int n = Integer.parseInt(args[0]);
        int batches = Integer.parseInt(args[1]);
        String folder = args[2];
        CudaBridge b = CudaBridge.start();
        long[] id = new long[n];
        double[] x = new double[n];
        for (int i = 0; i < n; i++) {
            id[i] = i;
            x[i] = (i % 1000) * 0.25 - 120.0;
        }
        long[] outId = new long[n];
        double[] y = new double[n];
        byte[] positive = new byte[n];
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (TaskScope t = b.bindTask(1)) {
            PythonFunction f = b.pythonFunction("example_batches:transform", List.of(folder))
                    .overBatches(List.of("id", "x"), List.of("id", "y", "positive"),
                            List.of(DType.INT64, DType.FLOAT64, DType.BOOL));
            System.out.println("READY " + t.taskAttemptId());
            System.out.flush();
            String line;
            while ((line = in.readLine()) != null && !line.equals("quit")) {
                double checksum = 0;
                long t0 = System.nanoTime();
                for (int k = 0; k < batches; k++) {
                    DeviceBuffer bi = b.allocate(8L * n);
                    DeviceBuffer bx = b.allocate(8L * n);
                    bi.copyFrom(id);
                    bx.copyFrom(x);
                    List<?> out = (List<?>) f.call(bi.asArray(DType.INT64), bx.asArray(DType.FLOAT64));
                    ((DeviceArray) out.get(0)).buffer().copyTo(outId);
                    ((DeviceArray) out.get(1)).buffer().copyTo(y);
                    ((DeviceArray) out.get(2)).buffer().copyTo(positive);
                    for (Object o : out) {
                        ((DeviceArray) o).close();
                    }
                    bi.close();
                    bx.close();
                    checksum += y[n - 1] + outId[n / 2] + positive[0];
                }
                double seconds = (System.nanoTime() - t0) / 1e9;
                System.out.println(String.format(Locale.ROOT, "ROUND {\"seconds\": %.6f, \"rows\": %d, \"checksum\": %.6f}",
                        seconds, (long) n * batches, checksum));
                System.out.flush();
            }
        }
        b.shutdown();
    }
}
