package org.cudabridge.examples;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.cudabridge.CudaBridge;
import org.cudabridge.Settings;
import org.cudabridge.executor.GpuTask;
import org.cudabridge.executor.TaskBinder;

/**
 * Example (a)'s task code without Spark, for the GPU machine (no Spark there): starts the bridge
 * and binds/releases task attempts through {@link TaskBinder}, the code the plugin runs in
 * {@code init}/{@code onTaskStart}/{@code onTaskSucceeded}/{@code onTaskFailed}/{@code shutdown},
 * on a pool of task threads as an executor has, and runs {@link PartitionWork} in each task.
 * Planned failures ({@code --fail-first-attempt}) fail a first attempt after allocating; the
 * harness retries it under a new attempt id, as Spark does.
 *
 * <pre>
 * java -cp cudabridge.jar:cudabridge-spark.jar:cudabridge-examples.jar:org.jpype.jar \
 *   [-Dspark.cudabridge.backend=cuda] [-Dcudabridge.python=.../python] \
 *   org.cudabridge.examples.TaskHarness [--tasks 256] [--threads 8] [--elements 65536] [--fail-first-attempt 3,7]
 *   [--bind-only] (tasks only bound and released: the plugin's own per-task cost)
 *   [--gpu-address A] (each task's GPU resource address, as Spark's scheduler gives it; default none:
 *   the executor's only GPU)
 *   [--check-snapshots] (a thread takes statistics snapshots all through the task phase, as the
 *   executor's reports to the driver do, and checks that each is consistent: see SnapshotWatch)
 *   [--work partition|histogram] (each task's work: example (a)'s PartitionWork, the default, or
 *   example (c)'s HistogramWork)
 * </pre>
 * Prints the same summary as the Spark job and exits 1 if any check fails (verify failures,
 * leaks not reclaimed as planned, memory still in use, a task not released).
 */
public final class TaskHarness {
    private TaskHarness() {}

    public static void main(String[] args) throws Exception {
        int tasks = 256;
        int threads = 8;
        int elements = 65536;
        boolean leak = true;
        boolean bindOnly = false;
        String summaryJson = null;
        String gpuAddress = null;
        boolean checkSnapshots = false;
        boolean histogramWork = false;
        Set<Integer> failFirst = new HashSet<>();
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--tasks": tasks = Integer.parseInt(args[++i]); break;
                case "--threads": threads = Integer.parseInt(args[++i]); break;
                case "--elements": elements = Integer.parseInt(args[++i]); break;
                case "--no-leak": leak = false; break;
                case "--bind-only": bindOnly = true; leak = false; break;
                case "--summary-json": summaryJson = args[++i]; break;
                case "--gpu-address": gpuAddress = args[++i]; break;
                case "--check-snapshots": checkSnapshots = true; break;
                case "--fail-first-attempt": failFirst.addAll(PartitionWork.partitions(args[++i])); break;
                case "--work": histogramWork = switch (args[++i]) {
                    case "partition" -> false;
                    case "histogram" -> true;
                    default -> throw new IllegalArgumentException("--work takes partition or histogram, got " + args[i]);
                }; break;
                default:
                    throw new IllegalArgumentException("unknown argument " + args[i] + "; see the class comment");
            }
        }
        Map<String, String> conf = new HashMap<>();
        for (String name : System.getProperties().stringPropertyNames()) {
            if (name.startsWith(Settings.prefix())) {
                conf.put(name, System.getProperty(name));
            }
        }
        long t0 = System.nanoTime();
        TaskBinder binder = TaskBinder.start("harness", conf, null);     // as ExecutorPlugin.init
        long startupNanos = System.nanoTime() - t0;
        if (!binder.isAvailable()) {
            System.err.println("cudabridge did not start: " + binder.failure());
            System.exit(2);
        }
        CudaBridge bridge = binder.bridge();
        final int n = elements;
        final boolean leakIt = leak;
        final int total = tasks;
        final boolean onlyBind = bindOnly;
        final String address = gpuAddress;
        final boolean histogram = histogramWork;
        AtomicInteger next = new AtomicInteger();
        AtomicLong attemptIds = new AtomicLong(1);
        AtomicInteger plannedFailures = new AtomicInteger();
        AtomicInteger unexpected = new AtomicInteger();
        ConcurrentLinkedQueue<PartitionWork.Result> results = new ConcurrentLinkedQueue<>();
        List<Thread> pool = new ArrayList<>();
        SnapshotWatch watch = checkSnapshots ? SnapshotWatch.start(binder, leak && !bindOnly) : null;
        long t1 = System.nanoTime();
        for (int t = 0; t < threads; t++) {
            Thread th = new Thread(() -> {
                for (int p = next.getAndIncrement(); p < total; p = next.getAndIncrement()) {
                    for (int attempt = 0; ; attempt++) {
                        long id = attemptIds.getAndIncrement();
                        binder.onTaskStart(id, address);                   // as onTaskStart
                        boolean ok = false;
                        try {
                            CudaBridge b = GpuTask.bridge();
                            if (onlyBind) {           // the plugin's own cost: bind and release, no work
                                PartitionWork.Result r = new PartitionWork.Result();
                                r.partition = p;
                                r.stream = b.stream();
                                r.executorId = "harness";
                                results.add(r);
                                ok = true;
                                break;     // the finally releases first
                            }
                            if (attempt == 0 && failFirst.contains(p)) {
                                PartitionWork.failAfterAllocating(b, p, n);
                            }
                            PartitionWork.Result r = histogram ? HistogramWork.run(b, p, n, () -> { })
                                    : PartitionWork.run(b, p, n, leakIt);
                            r.attempt = attempt;
                            r.executorId = "harness";
                            results.add(r);
                            ok = true;
                        } catch (IllegalStateException e) {
                            if (attempt == 0 && failFirst.contains(p)) {
                                plannedFailures.incrementAndGet();
                            } else {
                                unexpected.incrementAndGet();
                                e.printStackTrace();
                            }
                        } catch (RuntimeException e) {
                            unexpected.incrementAndGet();
                            e.printStackTrace();
                        } finally {
                            binder.onTaskEnd(ok);                          // as onTaskSucceeded / onTaskFailed
                        }
                        if (ok || attempt >= 1) {
                            break;
                        }
                    }
                }
            }, "task-thread-" + t);
            pool.add(th);
            th.start();
        }
        for (Thread th : pool) {
            th.join();
        }
        long phaseNanos = System.nanoTime() - t1;
        if (watch != null) {
            watch.stop();
        }
        long waitUntil = System.nanoTime() + 10_000_000_000L;
        while (binder.releasesPending() > 0 && System.nanoTime() < waitUntil) {
            Thread.sleep(1); // the release thread finishes the last tasks' releases
        }
        List<PartitionWork.Result> done = new ArrayList<>(results);
        Collections.sort(done, (a, b) -> Integer.compare(a.partition, b.partition));
        Summary s = Summary.of(done);
        Map<String, Long> st = binder.refresh();
        long attempts = (long) tasks + failFirst.size();
        long expectedLeaks = (leak && !histogram ? tasks : 0) + failFirst.size();
        s.put("backend", describeBackend(bridge.describe()));
        s.put("threads", threads).put("elements_per_partition", elements);
        s.put("task_attempts", st.getOrDefault("plugin_tasks_started", 0L));
        s.put("planned_failures", plannedFailures.get()).put("unexpected_failures", unexpected.get());
        s.put("tasks_released", st.getOrDefault("plugin_tasks_released", 0L));
        s.put("leaks_reclaimed", st.getOrDefault("leaks_reclaimed", 0L));
        s.put("live_allocations_after", st.getOrDefault("live_allocations", 0L));
        s.put("in_use_bytes_after", st.getOrDefault("in_use_bytes", 0L));
        s.put("startup_ms", String.format("%.1f", startupNanos / 1e6));
        s.put("task_phase_ms", String.format("%.1f", phaseNanos / 1e6));
        s.put("ms_per_task", String.format("%.3f", phaseNanos / 1e6 / attempts));
        s.statistics(st);
        List<String> problems = new ArrayList<>();
        if ((Integer) s.get("tasks_run") != tasks) {
            problems.add("tasks run " + s.get("tasks_run") + " != " + tasks);
        }
        if ((Integer) s.get("verify_failures") != 0) {
            problems.add(s.get("verify_failures") + " verify failures");
        }
        if (unexpected.get() != 0 || plannedFailures.get() != failFirst.size()) {
            problems.add("failures: planned " + plannedFailures.get() + "/" + failFirst.size() + ", unexpected " + unexpected.get());
        }
        check(problems, "tasks released", st.getOrDefault("plugin_tasks_released", 0L), attempts);
        check(problems, "leaks reclaimed", st.getOrDefault("leaks_reclaimed", 0L), expectedLeaks);
        check(problems, "live allocations", st.getOrDefault("live_allocations", -1L), 0);
        check(problems, "bytes in use", st.getOrDefault("in_use_bytes", -1L), 0);
        check(problems, "tasks bound", st.getOrDefault("tasks_bound", -1L), 0);
        // staging is the GPUs' own slots: none held once the copies ended, and no copy took pinned
        // memory of its own (a fallback of the pinned pool); the pool holds only pinned buffers
        check(problems, "staging slots held", st.getOrDefault("staging_slots_held", -1L), 0);
        check(problems, "pinned fallbacks to cudaHostAlloc", st.getOrDefault("pinned_fallbacks_host_alloc", -1L), 0);
        check(problems, "pinned bytes in use", st.getOrDefault("pinned_in_use_bytes", -1L), 0);
        if (watch != null) {
            s.put("snapshots_checked", watch.checked()).put("snapshots_inconsistent", watch.inconsistent());
            if (watch.inconsistent() > 0) {
                problems.add(watch.inconsistent() + " of " + watch.checked() + " statistics snapshots inconsistent, first: "
                        + watch.firstProblem());
            }
        }
        s.put("checks", problems.isEmpty() ? "ok" : String.join("; ", problems));
        System.out.print(s.render());
        s.writeJson(summaryJson);
        binder.shutdown();                                                    // as ExecutorPlugin.shutdown
        System.exit(problems.isEmpty() ? 0 : 1);
    }

    private static void check(List<String> problems, String what, long got, long want) {
        if (got != want) {
            problems.add(what + " " + got + " != " + want);
        }
    }

    private static String describeBackend(String json) {
        int i = json.indexOf("\"backend\": \"");
        if (i < 0) {
            return json;
        }
        int from = i + "\"backend\": \"".length();
        return json.substring(from, json.indexOf('"', from));
    }
}
