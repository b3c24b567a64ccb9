package org.cudabridge.examples;

import java.util.zip.CRC32;

import org.apache.spark.sql.api.java.UDF1;
import org.cudabridge.CudaBridge;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.executor.GpuTask;

/**
 * Example (b)'s UDF: {@code gpu_crc32(binary) -> bigint}. Copies the bytes to the GPU on the
 * calling task's stream, copies them device-to-device into a second buffer, copies that back and
 * returns the CRC-32 of what came back: equal to SQL's {@code crc32(payload)} when the round trip
 * is exact. Register from PySpark with
 * {@code spark.udf.registerJavaFunction("gpu_crc32", "org.cudabridge.examples.GpuRoundTripCrc32", LongType())}.
 * It runs on the executor's task threads (not in a Python worker), where the plugin bound the task.
 */
public final class GpuRoundTripCrc32 implements UDF1<byte[], Long> {
    private static final long serialVersionUID = 1L;

    @Override
    public Long call(byte[] payload) {
        if (payload == null) {
            return null;
        }
        CRC32 crc = new CRC32();
        if (payload.length == 0) {
            return crc.getValue();
        }
        CudaBridge bridge = GpuTask.bridge();
        byte[] back = new byte[payload.length];
        try (DeviceBuffer a = bridge.allocate(payload.length); DeviceBuffer b = bridge.allocate(payload.length)) {
            a.copyFrom(payload);                       // host -> device, task stream
            b.copyFrom(a, 0, 0, payload.length);       // device -> device, same stream
            b.copyTo(back);                            // device -> host, after the copy (stream order)
        }
        crc.update(back);
        return crc.getValue();
    }
}
