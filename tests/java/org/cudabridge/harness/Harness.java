package org.cudabridge.harness;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.cudabridge.CudaBridge;
import org.cudabridge.CudaBridgeException;
import org.cudabridge.DeviceBuffer;
import org.cudabridge.NativeBridge;
import org.cudabridge.PinnedBuffer;
import org.cudabridge.TaskScope;
import org.cudabridge.ThreadStates;
import org.cudabridge.BridgeOptions;

/**
 * Whole-JVM scenarios for tests/test_jvm_bridge.py, each run in a plain {@code java} process (not
 * one JPype started): {@code java -cp <cudabridge.jar>:<org.jpype.jar>:<classes>
 * org.cudabridge.harness.Harness <scenario> [args]}. Only load scenarios live here (stress, rss,
 * race, threads, gate: many threads, memory growth, timing), and startfail, a start on a Python
 * without cudabridge, which needs the jar without the build's defaults beside it; every other
 * check of the Java API is a JUnit test under jvm/src/test/java (./dev/junit). The bridge starts
 * from system properties ({@code -Dcudabridge.python}, {@code -Dspark.cudabridge.*}) and the build's
 * defaults. Each scenario prints {@code RESULT key=value} lines and exits 0, or prints
 * {@code FAIL ...} and exits 1; a check that does not hold fails.
 */
public final class Harness {
    private static int failures;

    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            System.err.println("usage: Harness <scenario> [args]");
            System.exit(2);
        }
        String scenario = args[0];
        String[] rest = Arrays.copyOfRange(args, 1, args.length);
        switch (scenario) {
            case "stress": stress(Integer.parseInt(rest[0]), Integer.parseInt(rest[1])); break;
            case "rss": rss(Long.parseLong(rest[0]), Long.parseLong(rest[1]), Integer.parseInt(rest[2])); break;
            case "race": race(rest[0]); break;
            case "threads": threads(Integer.parseInt(rest[0]), Integer.parseInt(rest[1])); break;
            case "startfail": startFail(rest); break;
            case "gate": gate(Integer.parseInt(rest[0])); break;
            default:
                System.err.println("unknown scenario " + scenario);
                System.exit(2);
        }
        System.out.flush();
        // Exit explicitly: Python's emulated-stream workers are daemon threads, but be certain the
        // JVM does not wait on anything (System.exit while Python threads run exits with the code,
        // without hanging: docs/architecture.md, "Facts the code relies on").
        System.exit(failures == 0 ? 0 : 1);
    }

    static void result(String key, Object value) {
        System.out.println("RESULT " + key + "=" + value);
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            failures++;
            System.out.println("FAIL " + what);
        }
    }

    interface Body {
        void run() throws Exception;
    }

    /** Runs body, expects an exception of type t whose message contains every fragment. */
    static <T extends Throwable> T expect(Class<T> t, String what, Body body, String... fragments) {
        try {
            body.run();
        } catch (Throwable e) {
            if (!t.isInstance(e)) {
                check(false, what + ": expected " + t.getSimpleName() + ", got " + e);
                return null;
            }
            String m = String.valueOf(e.getMessage());
            for (String f : fragments) {
                check(m.contains(f), what + ": message lacks '" + f + "': " + m);
            }
            return t.cast(e);
        }
        check(false, what + ": expected " + t.getSimpleName() + ", nothing was thrown");
        return null;
    }

    static long stat(CudaBridge b, String key) {
        Long v = b.statistics().get(key);
        if (v == null) {
            throw new IllegalStateException("no statistic " + key + " in " + b.statistics().keySet());
        }
        return v;
    }

    static long rssKb() throws IOException {
        for (String line : Files.readAllLines(Paths.get("/proc/self/status"))) {
            if (line.startsWith("VmRSS:")) {
                return Long.parseLong(line.replaceAll("[^0-9]", ""));
            }
        }
        throw new IOException("no VmRSS");
    }

    static byte[] pattern(Random r, int n) {
        byte[] a = new byte[n];
        r.nextBytes(a);
        return a;
    }

    // --- scenarios --------------------------------------------------------------------------------

    /** (a) threads x cycles of allocate / copy in / copy out / compare / free, one task per thread,
     *  all on the one shared pool; then every byte is back in the pool. */
    static void stress(int threads, int cycles) throws Exception {
        CudaBridge b = CudaBridge.start();
        AtomicLong verified = new AtomicLong();
        ConcurrentLinkedQueue<Throwable> errors = new ConcurrentLinkedQueue<>();
        CountDownLatch go = new CountDownLatch(1);
        List<Thread> ts = new ArrayList<>();
        for (int k = 0; k < threads; k++) {
            final int id = k;
            Thread t = new Thread(() -> {
                try {
                    go.await();
                    Random r = new Random(id);
                    try (TaskScope task = b.bindTask(1000 + id)) {
                        List<DeviceBuffer> pending = new ArrayList<>();
                        for (int c = 0; c < cycles; c++) {
                            int n = 1 + r.nextInt(c % 97 == 0 ? 300_000 : 8192);
                            byte[] data = pattern(r, n);
                            byte[] back = new byte[n];
                            DeviceBuffer buf = b.allocate(n);
                            buf.copyFrom(data);
                            buf.copyTo(back);
                            if (!Arrays.equals(data, back)) {
                                throw new AssertionError("thread " + id + " cycle " + c + ": data differs");
                            }
                            verified.incrementAndGet();
                            if (c % 3 == 0) {
                                pending.add(buf);
                                if (pending.size() == 8) {
                                    b.free(pending);
                                    pending.clear();
                                }
                            } else {
                                buf.close();
                            }
                        }
                        b.free(pending);
                    }
                } catch (Throwable e) {
                    errors.add(e);
                }
            }, "stress-" + k);
            ts.add(t);
            t.start();
        }
        long t0 = System.nanoTime();
        go.countDown();
        for (Thread t : ts) t.join();
        double secs = (System.nanoTime() - t0) / 1e9;
        for (Throwable e : errors) {
            e.printStackTrace(System.out);
        }
        check(errors.isEmpty(), errors.size() + " thread(s) failed");
        result("verified", verified.get());
        result("seconds", secs);
        check(verified.get() == (long) threads * cycles, "every cycle verified");
        String pool = b.callTool("pool_statistics", "{}");
        result("pool", pool);
        Map<String, Long> s = b.statistics();
        result("live_allocations", s.get("live_allocations"));
        result("in_use_bytes", s.get("in_use_bytes"));
        result("reserved_bytes", s.get("reserved_bytes"));
        // every reserved byte not in use: free (safe, in a stream's bins, pending) or a spare piece
        long free = s.get("free_safe_bytes") + s.get("free_in_streams_bytes") + s.get("free_pending_bytes")
                + s.get("spare_bytes");
        result("free_bytes", free);
        result("leaks_reclaimed", s.get("leaks_reclaimed"));
        result("bridge_live_handles", s.get("bridge_live_handles"));
        check(s.get("live_allocations") == 0, "no live allocation");
        check(s.get("in_use_bytes") == 0, "no bytes in use");
        check(free == s.get("reserved_bytes"), "every reserved byte is free in the pool");
        check(s.get("leaks_reclaimed") == 0, "no leaks");
        check(s.get("bridge_live_handles") == 0, "no live handles in the bridge");
    }

    /** (b) process RSS at `first` and at `total` bridge calls, over `threads` threads. */
    static void rss(long first, long total, int threads) throws Exception {
        CudaBridge b = CudaBridge.start();
        AtomicLong calls = new AtomicLong();
        long[] marks = new long[2];
        Object lock = new Object();
        ConcurrentLinkedQueue<Throwable> errors = new ConcurrentLinkedQueue<>();
        List<Thread> ts = new ArrayList<>();
        long perThread = total / threads;
        for (int k = 0; k < threads; k++) {
            final int id = k;
            Thread t = new Thread(() -> {
                try (TaskScope task = b.bindTask(5000 + id)) {
                    byte[] data = new byte[256];
                    byte[] back = new byte[256];
                    DeviceBuffer[] batch = new DeviceBuffer[8];
                    long mine = 0;
                    while (mine < perThread) {
                        // one round: 8 allocate, memset, copy in, copy out (1/8), 1 batched free,
                        // a ping and a stream(): 8 + 8 + 8 + 1 + 1 + 1 = 27 bridge calls
                        for (int i = 0; i < 8; i++) {
                            batch[i] = b.allocate(64 + 64 * i);
                            batch[i].memset(i);
                            batch[i].copyFrom(data, 0, 0, 64);
                        }
                        batch[0].copyTo(back, 0, 0, 64);
                        b.free(batch);
                        NativeBridge.ping();
                        b.stream();
                        mine += 27;
                        long c = calls.addAndGet(27);
                        if (c >= first && marks[0] == 0) {
                            synchronized (lock) {
                                if (marks[0] == 0) {
                                    marks[0] = rssKb();
                                }
                            }
                        }
                        if (c / 100_000 != (c - 27) / 100_000) {
                            System.out.println("SAMPLE calls=" + c + " rss_kb=" + rssKb());
                        }
                    }
                } catch (Throwable e) {
                    errors.add(e);
                }
            }, "rss-" + k);
            ts.add(t);
        }
        long t0 = System.nanoTime();
        for (Thread t : ts) t.start();
        for (Thread t : ts) t.join();
        marks[1] = rssKb();
        for (Throwable e : errors) e.printStackTrace(System.out);
        check(errors.isEmpty(), "threads failed");
        double secs = (System.nanoTime() - t0) / 1e9;
        result("calls", calls.get());
        result("seconds", secs);
        result("rss_first_kb", marks[0]);
        result("rss_last_kb", marks[1]);
        double growth = (marks[1] - marks[0]) / (double) marks[0];
        result("growth", growth);
        check(growth < 0.05, "RSS grew " + (100 * growth) + "% between " + first + " and " + calls.get() + " calls");
        check(stat(b, "live_allocations") == 0, "no live allocations");
    }

    /** (d) the seven-step race from two Java threads, two tasks on two streams. Expects
     *  -Dspark.cudabridge.poolLimit=2m (B must reuse A's block) and, for the naive run,
     *  -Dspark.cudabridge.testStreamArena=naive_arena:NaiveArena (tests/ on -Dcudabridge.pythonPath). */
    static void race(String policy) throws Exception {
        CudaBridge b = CudaBridge.start();
        // the pool's stream arenas come from -Dspark.cudabridge.testStreamArena (fixed at start-up)
        result("policy", policy);
        final int nbytes = 2 << 20;
        final double delay = 0.15;
        final int patternA = 0xA5A5A5A5;
        final int patternB = 0x5B5B5B5B;
        CountDownLatch aFreed = new CountDownLatch(1);
        long[] ptrs = new long[2];
        boolean[] intact = new boolean[2];
        long[] streams = new long[2];
        ConcurrentLinkedQueue<Throwable> errors = new ConcurrentLinkedQueue<>();
        Thread ta = new Thread(() -> {
            try (TaskScope t = b.bindTask(201); PinnedBuffer host = b.allocatePinned(nbytes)) {
                streams[0] = t.stream();
                DeviceBuffer a = b.allocate(nbytes);                                            // 1
                b.callTool("fill_u32", "{\"handle\": " + a.handle() + ", \"value\": " + (patternA & 0xFFFFFFFFL)
                        + ", \"delay_s\": " + delay + "}");                                     // 2
                b.callTool("spin", "{\"task\": 201, \"seconds\": " + delay + "}");
                a.copyToAsync(host.buffer(), 0);                                                // 3 (async: pinned)
                ptrs[0] = a.address();
                a.close();                                                                      // 4
                aFreed.countDown();
                b.synchronize();                                                                // 7
                intact[0] = allWords(host.buffer(), patternA);
            } catch (Throwable e) {
                errors.add(e);
                aFreed.countDown();
            }
        }, "task-A");
        Thread tb = new Thread(() -> {
            try (TaskScope t = b.bindTask(202); PinnedBuffer host = b.allocatePinned(nbytes)) {
                streams[1] = t.stream();
                aFreed.await();
                DeviceBuffer buf = b.allocate(nbytes);                                          // 5
                ptrs[1] = buf.address();
                b.callTool("fill_u32", "{\"handle\": " + buf.handle() + ", \"value\": " + patternB + "}"); // 6
                b.callTool("spin", "{\"task\": 202, \"seconds\": " + (3 * delay) + "}");
                buf.copyToAsync(host.buffer(), 0);
                b.synchronize();
                intact[1] = allWords(host.buffer(), patternB);
                buf.close();
            } catch (Throwable e) {
                errors.add(e);
            }
        }, "task-B");
        ta.start();
        tb.start();
        ta.join();
        tb.join();
        for (Throwable e : errors) e.printStackTrace(System.out);
        check(errors.isEmpty(), "race threads failed");
        result("different_streams", streams[0] != streams[1]);
        result("same_block", ptrs[0] == ptrs[1]);
        result("a_intact", intact[0]);
        result("b_intact", intact[1]);
        String pool = b.callTool("pool_statistics", "{}");
        result("pool", pool);
    }

    static boolean allWords(ByteBuffer buf, int word) {
        ByteBuffer b = buf.duplicate().order(ByteOrder.LITTLE_ENDIAN);
        for (int i = 0; i + 4 <= b.capacity(); i += 4) {
            if (b.getInt(i) != word) {
                return false;
            }
        }
        return true;
    }

    /** The bridge's gate (bridge/hot_gate.h): with `loopers` threads calling allocate/free as fast
     *  as they can, (a) a thread making sparse calls gets every one through while they still run
     *  (nobody is starved by the biased gate), (b) every looper makes progress, (c) a thread
     *  waiting in synchronize (not gated) holds up no one, and the gate reports hand-offs. */
    static void gate(int loopers) throws Exception {
        CudaBridge b = CudaBridge.start();
        long[] g0 = new long[4];
        NativeBridge.gateStats(g0);
        result("gate_enabled", g0[0]);
        result("gate_hold_ns", g0[1]);
        AtomicBoolean stop = new AtomicBoolean();
        long[] counts = new long[loopers];
        ConcurrentLinkedQueue<Throwable> errors = new ConcurrentLinkedQueue<>();
        CountDownLatch running = new CountDownLatch(loopers);
        List<Thread> ts = new ArrayList<>();
        for (int k = 0; k < loopers; k++) {
            final int slot = k;
            Thread t = new Thread(() -> {
                try (TaskScope task = b.bindTask(20_000 + slot)) {
                    running.countDown();
                    long n = 0;
                    while (!stop.get()) {
                        b.allocate(4096).close();
                        n++;
                    }
                    counts[slot] = n;
                } catch (Throwable e) {
                    errors.add(e);
                }
            }, "looper-" + k);
            ts.add(t);
            t.start();
        }
        running.await();
        // (c) a synchronize on a stream busy for 2 s, on its own thread, while (a) runs
        AtomicLong syncDone = new AtomicLong();
        Thread waiter = new Thread(() -> {
            try (TaskScope task = b.bindTask(29_999)) {
                b.callTool("spin", "{\"task\": 29999, \"seconds\": 2.0}");
                b.synchronize();
                syncDone.set(System.nanoTime());
            } catch (Throwable e) {
                errors.add(e);
            }
        }, "synchronizer");
        waiter.start();
        long sparseDone = 0;
        int sparse = 0;
        boolean loopersStillRunning = true;
        try (TaskScope task = b.bindTask(29_998)) {
            for (; sparse < 100; sparse++) {
                Thread.sleep(1);
                try (DeviceBuffer buf = b.allocate(256)) {
                    buf.memset(7);
                }
            }
            sparseDone = System.nanoTime();
            for (Thread t : ts) loopersStillRunning &= t.isAlive();
            waiter.join();
        } finally {
            stop.set(true); // whatever failed, the loopers stop and the JVM can exit
            for (Thread t : ts) t.join();
        }
        long[] g1 = new long[4];
        NativeBridge.gateStats(g1);
        for (Throwable e : errors) e.printStackTrace(System.out);
        check(errors.isEmpty(), errors.size() + " threads failed");
        result("sparse_calls", sparse);
        check(sparse == 100, "the sparse thread made all its calls");
        check(loopersStillRunning, "the sparse thread finished while the loopers still ran");
        check(syncDone.get() != 0 && sparseDone < syncDone.get(),
                "the sparse calls went through while another thread waited in synchronize");
        long min = Long.MAX_VALUE;
        for (long c : counts) min = Math.min(min, c);
        result("looper_min_pairs", min);
        check(min > 0, "every looper made progress");
        result("handoffs", g1[2] - g0[2]);
        result("sleeps", g1[3] - g0[3]);
        if (g0[0] == 1 && loopers > 1) {
            check(g1[2] > g0[2], "the gate handed off between threads");
        }
        check(stat(b, "in_use_bytes") == 0, "every byte back: " + stat(b, "in_use_bytes"));
    }

    /** (f) many short-lived Java threads call in; the interpreter's thread states stay bounded. */
    static void threads(int total, int concurrent) throws Exception {
        CudaBridge b = CudaBridge.start();
        ThreadStates base = CudaBridge.threadStates();
        result("states_before", base.inInterpreter());
        ConcurrentLinkedQueue<Throwable> errors = new ConcurrentLinkedQueue<>();
        long peak = 0;
        int started = 0;
        while (started < total) {
            List<Thread> wave = new ArrayList<>();
            for (int i = 0; i < concurrent && started < total; i++, started++) {
                final int id = started;
                Thread t = new Thread(() -> {
                    try (TaskScope task = b.bindTask(10_000 + id)) {
                        for (int k = 0; k < 5; k++) {
                            b.allocate(128).close();
                        }
                        NativeBridge.ping();
                    } catch (Throwable e) {
                        errors.add(e);
                    }
                }, "short-" + id);
                wave.add(t);
                t.start();
            }
            for (Thread t : wave) t.join();
            peak = Math.max(peak, CudaBridge.threadStates().inInterpreter());
        }
        for (Throwable e : errors) e.printStackTrace(System.out);
        check(errors.isEmpty(), errors.size() + " threads failed");
        // Java's join returns before the OS thread has run its TLS destructors: wait for them.
        ThreadStates after = CudaBridge.threadStates();
        for (int i = 0; i < 200 && after.created() - after.deleted() > base.created() - base.deleted() + 1; i++) {
            Thread.sleep(10);
            after = CudaBridge.threadStates();
        }
        result("states_after", after.inInterpreter());
        result("states_peak", peak);
        result("created", after.created());
        result("deleted", after.deleted());
        result("interpreter", b.callTool("interpreter", "{}"));
        check(after.created() - base.created() >= total,
                "every thread made its own state (" + (after.created() - base.created()) + ")");
        check(after.inInterpreter() <= base.inInterpreter() + 2,
                "thread states back near " + base.inInterpreter() + ": " + after.inInterpreter());
        check(peak <= base.inInterpreter() + concurrent + 4, "peak " + peak + " bounded by the concurrent threads");
    }

    /** Start-up failures: args = python [pythonpath]; expects the start to fail, prints the message;
     *  then, with args[2..] as a second python/pythonpath, a retry that must succeed ("-" for none). */
    static void startFail(String[] args) {
        BridgeOptions o = new BridgeOptions().python(args[0]).set("backend", "emulated");
        if (args.length > 1 && !args[1].equals("-")) {
            for (String p : args[1].split(":")) o.addPythonPath(p);
        }
        boolean ok = CudaBridge.tryStart(o);
        result("started", ok);
        CudaBridgeException f = CudaBridge.startFailure();
        if (f != null) {
            result("failure_type", f.getPythonType());
            System.out.println("MESSAGE-BEGIN");
            System.out.println(f.getMessage());
            System.out.println("MESSAGE-END");
            CudaBridgeException fast = expect(CudaBridgeException.class, "get() after a failed start",
                    CudaBridge::get, "its start failed");
            check(fast != null && fast.getCause() == f, "get() carries the recorded failure");
        }
        if (args.length > 2) {
            BridgeOptions retry = new BridgeOptions().python(args[2]).set("backend", "emulated");
            if (args.length > 3 && !args[3].equals("-")) {
                for (String p : args[3].split(":")) retry.addPythonPath(p);
            }
            CudaBridge b = CudaBridge.start(retry);
            try (TaskScope t = b.bindTask(1); DeviceBuffer buf = b.allocate(16)) {
                buf.memset(3);
            }
            result("retry_started", true);
            result("describe", b.describe());
        }
    }
}
