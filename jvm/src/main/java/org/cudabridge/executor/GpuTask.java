package org.cudabridge.executor;

import org.cudabridge.CudaBridge;

/**
 * Task code's entry point under the plugin: the executor's bridge, bound to the calling task.
 * Fails fast, with the reason, when the executor's service could not start or this task could
 * not be bound (the plugin never fails the executor for it). Spark-free: the Java harness uses
 * it the same way.
 */
public final class GpuTask {
    private GpuTask() {}

    /** The bridge; throws (no Python call) with the start failure or bind failure if any. */
    public static CudaBridge bridge() {
        TaskBinder b = TaskBinder.current();
        if (b == null) {
            return CudaBridge.get(); // started outside the plugin (or says why not)
        }
        return b.bridge();
    }

    /** The current task attempt's stream handle (cached on the Java side). */
    public static long stream() {
        return bridge().stream();
    }
}
