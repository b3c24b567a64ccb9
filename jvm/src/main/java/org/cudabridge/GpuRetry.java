package org.cudabridge;

import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.function.Supplier;

/**
 * Runs a block of GPU work again when the deadlock breaker failed one of its allocations
 * ({@link GpuOutOfMemoryException.Reason#BREAKER}: every task holding memory on the GPU was
 * waiting, and this task, the youngest, was picked to give way):
 * <pre>{@code
 * long sum = GpuRetry.withRetry(() -> {
 *     DeviceBuffer a = bridge.allocate(n);    // freed by the retry if the block fails
 *     DeviceBuffer b = bridge.allocate(n);
 *     ...
 *     return result;
 * });
 * }</pre>
 * Before each retry every buffer the block allocated on this thread and did not close is freed
 * (the block gave way: what it held goes to the others), and the thread waits a little (10 ms, then
 * doubling) for the tasks that waited to take it. Buffers the block allocated and kept are not
 * touched when it succeeds. Any other failure, including out of memory for another reason
 * ({@code TOO_LARGE}: split the work; {@code TIMEOUT}: waited {@code oomWait} already), frees the
 * same buffers and is thrown as it is; so is the breaker's after the last attempt.
 */
public final class GpuRetry {
    /** Attempts of {@link #withRetry(Supplier)}. */
    public static final int DEFAULT_ATTEMPTS = 8;

    private GpuRetry() {}

    public static <T> T withRetry(Supplier<T> block) {
        return withRetry(DEFAULT_ATTEMPTS, block);
    }

    public static <T> T withRetry(int attempts, Supplier<T> block) {
        Objects.requireNonNull(block, "withRetry: block");
        if (attempts < 1) {
            throw new IllegalArgumentException("withRetry: attempts must be at least 1, got " + attempts);
        }
        long pauseMs = 10;
        for (int attempt = 1;; attempt++) {
            List<DeviceBuffer> made = new ArrayList<>();
            List<DeviceBuffer> outer = DeviceMemory.trackAllocations(made);
            try {
                return block.get();
            } catch (RuntimeException e) {
                freeAll(made);
                boolean breaker = e instanceof GpuOutOfMemoryException oom
                        && oom.reason() == GpuOutOfMemoryException.Reason.BREAKER;
                if (!breaker || attempt >= attempts) {
                    throw e;
                }
                // the waiters take what it gave back before its retry does (they re-check at once,
                // it pauses first); a failure to tell them only delays them to their next poll
                try {
                    CudaBridge.get().control().memoryReturned();
                } catch (RuntimeException ignored) {
                    // the bridge shut down meanwhile: the retry fails with that
                }
            } finally {
                DeviceMemory.trackAllocations(outer);
                if (outer != null) {
                    outer.addAll(made);   // an enclosing retry frees them too if it fails
                }
            }
            try {
                Thread.sleep(pauseMs);
            } catch (InterruptedException ie) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException("withRetry: interrupted before a retry", ie);
            }
            pauseMs = Math.min(pauseMs * 2, 1000);
        }
    }

    private static void freeAll(List<DeviceBuffer> made) {
        for (int i = made.size() - 1; i >= 0; i--) {
            DeviceBuffer b = made.get(i);
            if (b.isAlive()) {
                try {
                    b.close();
                } catch (RuntimeException ignored) {
                    // its task's release freed it meanwhile: nothing to give back
                }
            }
        }
        made.clear();
    }
}
