package org.cudabridge.examples;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;

import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;
import org.cudabridge.CudaBridge;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.GpuOutOfMemoryException;
import org.cudabridge.GpuRetry;
import org.cudabridge.executor.GpuTask;

/**
 * Example (f): more GPU memory asked for at once than the pool holds, without failed jobs. Each
 * task builds up {@code --chunks} buffers of {@code --chunk-mib} MiB (its peak), holds them for
 * {@code --hold-ms} while it fills and checks them, and frees them; with {@code local[N]}, N tasks
 * at once ask for N times their peak. With {@code --io-ms}, each task first spends that long off the
 * GPU (reading its input: no GPU memory held), as Spark's tasks overlap I/O with other tasks' GPU
 * work, the reason an executor runs more tasks than fit on its GPU at once. Allocations that do not fit wait for other tasks' frees
 * ({@code spark.cudabridge.oomWait}); when every task holding memory waits, the deadlock breaker
 * fails the youngest one's allocation, and {@link GpuRetry#withRetry} frees what the task built and
 * builds it again. {@code --no-retry} runs the work without it (a breaker's out of memory then fails
 * the task attempt, and Spark retries it).
 *
 * <pre>
 * spark-submit --class org.cudabridge.examples.GpuPressureJob --conf spark.cudabridge.poolLimit=64m ... \
 *   cudabridge-examples.jar [--partitions 16] [--chunks 4] [--chunk-mib 8] [--hold-ms 20] [--io-ms 0] [--no-retry]
 *   [--cancel-after-ms 500] [--rounds 1] [--slow-partition 0 --slow-ms 8000 [--kill-slow-after-ms 1000]]
 *   [--summary-json out.json]
 * </pre>
 * {@code --cancel-after-ms}: a first job of the same tasks is cancelled ({@code cancelJobGroup}) that
 * long after it started, while its tasks hold memory and wait; then the job runs again to show the
 * executor keeps serving. {@code --slow-partition P --slow-ms X}: the first attempt of partition P holds
 * its memory X ms; with {@code --kill-slow-after-ms Y} the driver kills that attempt Y ms after it
 * started, as Spark kills the losing copy when a speculative twin wins ({@code killTaskAttempt} with
 * {@code interruptThread}), and Spark runs it again. (Spark never places a speculative copy on a
 * host that runs an attempt of its task, so in {@code local-cluster}, one host, speculation itself
 * launches none; with {@code spark.speculation} on a cluster of several hosts a real copy wins and
 * Spark kills the slow attempt the same way: tests/test_spark_speculation.py.) Prints tasks run, retries, failures checked, and the service's statistics.
 */
public final class GpuPressureJob {
    private GpuPressureJob() {}

    /** Buffers tasks of the cancelled job held when they were killed, left for their release to
     *  reclaim (in local mode the executor is this JVM: the driver reads it). */
    static final java.util.concurrent.atomic.AtomicLong LEFT_AT_KILL = new java.util.concurrent.atomic.AtomicLong();

    public static void main(String[] args) throws Exception {
        int partitions = 16;
        int chunks = 4;
        int chunkMib = 8;
        long holdMs = 20;
        long ioMs = 0;
        boolean retry = true;
        long cancelAfterMs = -1;
        int rounds = 1;
        int slowPartition = -1;
        long slowMs = 0;
        long killSlowAfterMs = -1;
        String summaryJson = null;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--partitions": partitions = Integer.parseInt(args[++i]); break;
                case "--chunks": chunks = Integer.parseInt(args[++i]); break;
                case "--chunk-mib": chunkMib = Integer.parseInt(args[++i]); break;
                case "--hold-ms": holdMs = Long.parseLong(args[++i]); break;
                case "--io-ms": ioMs = Long.parseLong(args[++i]); break;
                case "--no-retry": retry = false; break;
                case "--cancel-after-ms": cancelAfterMs = Long.parseLong(args[++i]); break;
                case "--rounds": rounds = Integer.parseInt(args[++i]); break;
                case "--slow-partition": slowPartition = Integer.parseInt(args[++i]); break;
                case "--slow-ms": slowMs = Long.parseLong(args[++i]); break;
                case "--kill-slow-after-ms": killSlowAfterMs = Long.parseLong(args[++i]); break;
                case "--summary-json": summaryJson = args[++i]; break;
                default: throw new IllegalArgumentException("unknown argument " + args[i] + "; see the class comment");
            }
        }
        SparkSession spark = SparkSession.builder().appName("cudabridge-example-f").getOrCreate();
        JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
        java.util.concurrent.atomic.AtomicLong attemptsEnded = new java.util.concurrent.atomic.AtomicLong();
        java.util.concurrent.atomic.AtomicLong speculative = new java.util.concurrent.atomic.AtomicLong();
        java.util.concurrent.atomic.AtomicLong killed = new java.util.concurrent.atomic.AtomicLong();
        final int slowIndex = slowPartition;
        final long killAfter = killSlowAfterMs;
        spark.sparkContext().addSparkListener(new org.apache.spark.scheduler.SparkListener() {
            @Override
            public void onTaskStart(org.apache.spark.scheduler.SparkListenerTaskStart start) {
                org.apache.spark.scheduler.TaskInfo info = start.taskInfo();
                if (killAfter < 0 || info.index() != slowIndex || info.attemptNumber() != 0) {
                    return;
                }
                // the kill Spark gives the losing copy when speculation's twin wins (interruptThread)
                long tid = info.taskId();
                Thread killer = new Thread(() -> {
                    try {
                        Thread.sleep(killAfter);
                        if (spark.sparkContext().killTaskAttempt(tid, true, "cudabridge example: the losing copy")) {
                            killed.incrementAndGet();
                        }
                    } catch (InterruptedException ignored) {
                        Thread.currentThread().interrupt();
                    }
                });
                killer.setDaemon(true);
                killer.start();
            }

            @Override
            public void onTaskEnd(org.apache.spark.scheduler.SparkListenerTaskEnd end) {
                attemptsEnded.incrementAndGet();
                if (end.taskInfo().speculative()) {
                    speculative.incrementAndGet();
                }
            }
        });
        List<Integer> ids = new ArrayList<>();
        for (int p = 0; p < partitions; p++) {
            ids.add(p);
        }
        final int c = chunks;
        final long bytes = (long) chunkMib << 20;
        final long hold = holdMs;
        final long io = ioMs;
        final boolean withRetry = retry;
        final int slowP = slowPartition;
        final long slow = slowMs;
        Summary s = new Summary();
        if (cancelAfterMs >= 0) {
            String cancelled = cancelOnce(sc, ids, partitions, c, bytes, hold, withRetry, cancelAfterMs);
            s.put("first_job", cancelled);
            // the killed tasks' helpers are refused once their tasks are released (at most 30 s)
            long deadline = System.nanoTime() + 30_000_000_000L;
            while (TaskHelper.ended() < TaskHelper.STARTED.get() && System.nanoTime() < deadline) {
                Thread.sleep(20);
            }
            s.put("buffers_left_at_kill", LEFT_AT_KILL.get() + TaskHelper.LEFT.get());
            s.put("helpers_started", TaskHelper.STARTED.get()).put("helpers_ended", TaskHelper.ended());
            s.put("helper_closes_raced_release", TaskHelper.CLOSES_RACED.get());
            s.put("helper_endings", new java.util.TreeMap<>(TaskHelper.ENDINGS).toString());
        }
        List<long[]> results = null;
        List<String> jobMs = new ArrayList<>();
        for (int round = 0; round < rounds; round++) {   // the job again: timings after the first are warm
            long t0 = System.nanoTime();
            results = sc.parallelize(ids, partitions)
                    .mapPartitions((Iterator<Integer> it) -> {
                        TaskContext tc = TaskContext.get();
                        // the first attempt of the slow partition holds its memory long: a speculative copy wins
                        boolean slowHere = tc.partitionId() == slowP && tc.attemptNumber() == 0;
                        sleep(io);   // the task's input, read off the GPU
                        return task(c, bytes, slowHere ? Math.max(hold, slow) : hold, withRetry, false, false);
                    }).collect();
            jobMs.add(String.format("%.1f", (System.nanoTime() - t0) / 1e6));
        }
        s.put("job_ms", jobMs.get(jobMs.size() - 1)).put("job_ms_rounds", String.join(",", jobMs));
        long retries = 0;
        long bad = 0;
        for (long[] r : results) {
            retries += r[0] - 1;
            bad += r[1];
        }
        s.put("tasks_run", results.size()).put("rounds", rounds).put("task_peak_bytes", c * bytes).put("retries", retries)
                .put("verify_failures", bad);
        Thread.sleep(200);   // the killed attempts' ends reach the listener
        s.put("speculative_attempts", speculative.get()).put("attempts_killed", killed.get());
        Map<String, Long> stats = GpuPartitionJob.PluginStatistics.after(attemptsEnded.get());
        s.statistics(stats);
        System.out.print(s.render());
        s.writeJson(summaryJson);
        spark.stop();
        if (bad != 0 || results.size() != partitions) {
            System.exit(1);
        }
    }

    /** Runs the job once and cancels it after {@code afterMs}: "cancelled", or what happened instead. */
    private static String cancelOnce(JavaSparkContext sc, List<Integer> ids, int partitions, int c, long bytes, long hold,
                                     boolean retry, long afterMs) throws InterruptedException {
        Thread canceller = new Thread(() -> {
            try {
                Thread.sleep(afterMs);
            } catch (InterruptedException e) {
                return;
            }
            sc.cancelJobGroup("pressure-cancelled");
        });
        sc.setJobGroup("pressure-cancelled", "cancelled on purpose", true);   // interrupt the tasks' threads
        canceller.start();
        String outcome;
        try {
            // held longer, so that the cancel finds tasks holding memory and waiting
            // no GpuRetry here: it would free what a killed task holds; this job leaves that to the releases
            // each task runs a helper thread that allocates, copies and launches for it until refused
            sc.parallelize(ids, partitions).mapPartitions((Iterator<Integer> it) -> task(c, bytes, hold * 20, false, true, true))
                    .collect();
            outcome = "completed before the cancel";
        } catch (Exception e) {
            outcome = String.valueOf(e.getMessage()).contains("cancel") ? "cancelled" : "failed: " + e;
        } finally {
            sc.clearJobGroup();
            canceller.join();
        }
        return outcome;
    }

    /** One task: {attempts of the block, verify failures}. {@code leaveAtKill}: a killed task leaves
     *  what it holds to its release (counted in {@link #LEFT_AT_KILL}) instead of freeing it.
     *  {@code helper}: a {@link TaskHelper} works for the task meanwhile; a killed task leaves it
     *  running, to be refused once the task is released. */
    static Iterator<long[]> task(int chunks, long bytes, long holdMs, boolean retry, boolean leaveAtKill, boolean helper) {
        CudaBridge bridge = GpuTask.bridge();
        TaskHelper h = helper ? new TaskHelper(bridge) : null;
        try {
            return task(bridge, chunks, bytes, holdMs, retry, leaveAtKill);
        } catch (RuntimeException e) {
            h = null;   // killed (or failed): the helper goes on until the service refuses it
            throw e;
        } finally {
            if (h != null) {
                h.close();
            }
        }
    }

    private static Iterator<long[]> task(CudaBridge bridge, int chunks, long bytes, long holdMs, boolean retry,
                                         boolean leaveAtKill) {
        long[] attempts = {0};
        java.util.function.Supplier<Long> block = () -> {
            attempts[0]++;
            List<DeviceBuffer> held = new ArrayList<>();
            long bad = 0;
            boolean killed = false;
            try {
                for (int i = 0; i < chunks; i++) {
                    DeviceBuffer b = bridge.allocate(bytes);
                    held.add(b);
                    b.memset(i + 1);
                    sleep(holdMs / chunks);
                }
                byte[] probe = new byte[16];
                for (int i = 0; i < chunks; i++) {
                    held.get(i).copyTo(probe, 0, bytes - 16, 16);
                    for (byte x : probe) {
                        bad += x == (byte) (i + 1) ? 0 : 1;
                    }
                }
            } catch (IllegalStateException e) {
                killed = e.getCause() instanceof InterruptedException;
                throw e;
            } finally {
                if (killed && leaveAtKill) {
                    LEFT_AT_KILL.addAndGet(held.size());
                } else {
                    for (DeviceBuffer b : held) {
                        b.close();
                    }
                }
            }
            return bad;
        };
        long bad;
        try {
            bad = retry ? GpuRetry.withRetry(block) : block.get();
        } catch (GpuOutOfMemoryException e) {
            TaskContext tc = TaskContext.get();
            throw new IllegalStateException("task " + tc.partitionId() + " attempt " + tc.attemptNumber()
                    + ": out of GPU memory (" + e.reason() + ")", e);
        }
        return Collections.singletonList(new long[] {attempts[0], bad}).iterator();
    }

    private static void sleep(long ms) {
        if (ms <= 0) {
            return;
        }
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted (the task was killed)", e);
        }
    }
}
