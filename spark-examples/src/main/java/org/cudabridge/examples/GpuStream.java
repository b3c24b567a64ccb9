package org.cudabridge.examples;

import org.apache.spark.sql.api.java.UDF1;
import org.cudabridge.executor.GpuTask;

/** Example (b)'s second UDF: {@code gpu_stream(any) -> bigint}, the calling task's CUDA stream
 *  handle (the argument is ignored; it keeps the optimizer from treating the call as a constant). */
public final class GpuStream implements UDF1<Object, Long> {
    private static final long serialVersionUID = 1L;

    @Override
    public Long call(Object ignored) {
        return GpuTask.stream();
    }
}
