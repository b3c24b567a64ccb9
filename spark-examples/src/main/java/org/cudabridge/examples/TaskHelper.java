package org.cudabridge.examples;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.cudabridge.Attachment;
import org.cudabridge.CudaBridge;
import org.cudabridge.CudaKernel;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.LaunchConfig;
import org.cudabridge.ModuleSource;
import org.cudabridge.TaskScope;

/**
 * A helper thread of a task (example (f)'s cancelled job): attached to the task, it allocates,
 * copies into, launches a kernel over and frees a buffer, again and again, until it is stopped or
 * the service refuses it (the task was killed and released under it). What it held when refused
 * was the task's, reclaimed by the task's release: counted in {@link #LEFT}, how each helper ended
 * in {@link #ENDINGS} (in local mode the executor is the driver's JVM: the driver reads them).
 */
final class TaskHelper implements AutoCloseable {
    static final AtomicLong STARTED = new AtomicLong();
    /** Buffers helpers held when the service refused them (their task's release reclaimed them). */
    static final AtomicLong LEFT = new AtomicLong();
    /** Buffers whose close met their task's release (the task released when close returned): a
     *  close that races the release returns quietly, and either freed the buffer or found it
     *  reclaimed by the release (DeviceBuffer.close), so each may or may not count as a leak. */
    static final AtomicLong CLOSES_RACED = new AtomicLong();
    /** How helpers ended: "stopped", or the simple name of the exception that refused them. */
    static final Map<String, AtomicLong> ENDINGS = new ConcurrentHashMap<>();

    private static final long BYTES = 1 << 20;

    private final AtomicBoolean stop = new AtomicBoolean();
    private final Thread thread;

    /** Starts a helper for the calling thread's task. */
    TaskHelper(CudaBridge bridge) {
        TaskScope task = bridge.currentTask();
        CudaKernel sum = bridge.loadModule(ModuleSource.cuda(GpuArrowSumJob.SOURCE)).kernel("sum_i64");   // once per executor
        thread = new Thread(() -> run(bridge, task, sum), "task-helper-" + task.taskAttemptId());
        thread.setDaemon(true);
        STARTED.incrementAndGet();
        thread.start();
    }

    @SuppressWarnings("try")   // the attachment is held for the thread's task only
    private void run(CudaBridge bridge, TaskScope task, CudaKernel sum) {
        DeviceBuffer acc = null;
        DeviceBuffer b = null;
        long[] values = new long[(int) (BYTES / 8)];
        String ending = "stopped";
        try (Attachment a = bridge.attach(task.taskAttemptId())) {
            acc = bridge.allocate(8);
            acc.memset(0);
            while (!stop.get()) {
                b = bridge.allocate(BYTES);
                b.copyFrom(values);
                sum.launch(LaunchConfig.grid(4).block(256), b, values.length, acc);
                bridge.synchronize();
                b.close();
                b = null;
                if (task.isReleased()) {
                    CLOSES_RACED.incrementAndGet();
                }
            }
            acc.close();
            acc = null;
        } catch (RuntimeException e) {
            ending = e.getClass().getSimpleName();
            // what it allocated and did not free: its task's release reclaims it (or did already)
            LEFT.addAndGet((acc != null ? 1 : 0) + (b != null ? 1 : 0));
        }
        ENDINGS.computeIfAbsent(ending, k -> new AtomicLong()).incrementAndGet();
    }

    /** Helpers ended so far, however. */
    static long ended() {
        return ENDINGS.values().stream().mapToLong(AtomicLong::get).sum();
    }

    /** Stops the helper and waits for it (a task that ends normally). */
    @Override
    public void close() {
        stop.set(true);
        try {
            thread.join();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();   // killed while it waited: the helper stops by itself
        }
    }
}
