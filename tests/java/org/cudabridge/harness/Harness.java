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
import org.cudabridge.GpuOutOfMemoryException;
import org.cudabridge.NativeBridge;
import org.cudabridge.PinnedBuffer;
import org.cudabridge.Priority;
import org.cudabridge.ReleaseReport;
import org.cudabridge.TaskScope;
import org.cudabridge.ThreadStates;
import org.cudabridge.BridgeOptions;
import org.cudabridge.Attachment;

/**
 * Java task code for tests/test_jvm_bridge.py, run in a plain {@code java} process (not one JPype
 * started): {@code java -cp <cudabridge.jar>:<org.jpype.jar>:<classes> org.cudabridge.harness.Harness
 * <scenario> [args]}. The bridge starts from system properties ({@code -Dcudabridge.python},
 * {@code -Dspark.cudabridge.*}) and the build's defaults. Each scenario prints {@code RESULT key=value}
 * lines and exits 0, or prints {@code FAIL ...} and exits 1; a check that does not hold fails.
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
            case "smoke": smoke(); break;
            case "stress": stress(Integer.parseInt(rest[0]), Integer.parseInt(rest[1])); break;
            case "rss": rss(Long.parseLong(rest[0]), Long.parseLong(rest[1]), Integer.parseInt(rest[2])); break;
            case "errors": errors(); break;
            case "badinput": badInput(); break;
            case "race": race(rest[0]); break;
            case "threads": threads(Integer.parseInt(rest[0]), Integer.parseInt(rest[1])); break;
            case "startfail": startFail(rest); break;
            case "notstarted": notStarted(); break;
            case "gate": gate(Integer.parseInt(rest[0])); break;
            case "deferred": deferred(Integer.parseInt(rest[0])); break;
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

    static void smoke() {
        CudaBridge b = CudaBridge.start();
        result("describe", b.describe());
        try (TaskScope t = b.bindTask(1)) {
            result("stream", Long.toHexString(b.stream()));
            check(b.stream() == t.stream(), "stream() is the task's stream");
            byte[] data = pattern(new Random(1), 100_000);
            byte[] back = new byte[data.length];
            try (DeviceBuffer buf = b.allocate(data.length)) {
                buf.copyFrom(data);
                buf.copyTo(back);
                check(Arrays.equals(data, back), "byte[] round trip");
                int[] ints = {1, -2, 3, Integer.MAX_VALUE};
                int[] intsBack = new int[4];
                buf.copyFrom(ints, 0, 64, 4);
                buf.copyTo(intsBack, 0, 64, 4);
                check(Arrays.equals(ints, intsBack), "int[] round trip at an offset");
                long[] longs = {Long.MIN_VALUE, 7, 1L << 40};
                long[] longsBack = new long[3];
                buf.copyFrom(longs, 0, 8, 3);
                buf.copyTo(longsBack, 0, 8, 3);
                check(Arrays.equals(longs, longsBack), "long[] round trip");
                double[] ds = {Math.PI, -0.0, Double.MAX_VALUE};
                double[] dsBack = new double[3];
                buf.copyFrom(ds);
                buf.copyTo(dsBack);
                check(Arrays.equals(ds, dsBack), "double[] round trip");
                float[] fs = {1.5f, Float.NaN};
                float[] fsBack = new float[2];
                buf.copyFrom(fs);
                buf.copyTo(fsBack);
                check(Arrays.equals(fs, fsBack), "float[] round trip");
                buf.memset(0);
                buf.memset(0x5a, 10, 20);
                byte[] seg = new byte[40];
                buf.copyTo(seg, 0, 0, 40);
                boolean ok = true;
                for (int i = 0; i < 40; i++) {
                    ok &= seg[i] == ((i >= 10 && i < 30) ? (byte) 0x5a : 0);
                }
                check(ok, "memset of a sub-range");
                // direct and pinned buffers, device to device
                ByteBuffer direct = ByteBuffer.allocateDirect(4096);
                for (int i = 0; i < 4096; i++) direct.put(i, (byte) (i * 7));
                buf.copyFrom(direct, 0);
                try (DeviceBuffer other = b.allocate(4096); PinnedBuffer pinned = b.allocatePinned(4096)) {
                    other.copyFrom(buf, 0, 0, 4096);
                    other.copyTo(pinned.buffer(), 0);
                    b.synchronize();
                    ByteBuffer pb = pinned.buffer();
                    boolean same = true;
                    for (int i = 0; i < 4096; i++) same &= pb.get(i) == (byte) (i * 7);
                    check(same, "direct -> device -> device -> pinned");
                }
            }
            b.free(b.allocate(10), b.allocate(20), b.allocate(30));
        }
        Map<String, Long> s = b.statistics();
        result("live_allocations", s.get("live_allocations"));
        result("bridge_live_handles", s.get("bridge_live_handles"));
        check(s.get("live_allocations") == 0, "no live allocations at the end");
        check(s.get("bridge_batched_frees") == 3, "three batched frees counted");
    }

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
        result("free_bytes", s.get("free_safe_bytes") + s.get("free_in_streams_bytes"));
        result("leaks_reclaimed", s.get("leaks_reclaimed"));
        result("bridge_live_handles", s.get("bridge_live_handles"));
        check(s.get("live_allocations") == 0, "no live allocation");
        check(s.get("in_use_bytes") == 0, "no bytes in use");
        check(s.get("free_safe_bytes") + s.get("free_in_streams_bytes") == s.get("reserved_bytes"),
                "every reserved byte is free in the pool");
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

    /** (c) Python exceptions and out-of-memory reach Java with their types and messages; the JVM
     *  and the service keep working. Expects -Dspark.cudabridge.poolLimit=64m. */
    static void errors() {
        CudaBridge b = CudaBridge.start();
        try (TaskScope t = b.bindTask(7)) {
            // Hot path, Python-side checks (NativeBridge skips the Java ones on purpose).
            CudaBridgeException e = expect(CudaBridgeException.class, "free of a bogus handle",
                    () -> NativeBridge.free(0x123456789L), "InvalidFree", "not live");
            if (e != null) {
                check("cudabridge.errors.InvalidFree".equals(e.getPythonType()), "python type: " + e.getPythonType());
            }
            long[] out = new long[2];
            e = expect(CudaBridgeException.class, "allocate for an unknown task",
                    () -> NativeBridge.allocate(424242, 64, out), "UnknownTask", "424242");
            if (e != null) {
                check("cudabridge.errors.UnknownTask".equals(e.getPythonType()), "python type: " + e.getPythonType());
            }
            // Control path: a plain Python exception.
            e = expect(CudaBridgeException.class, "a Python ValueError",
                    () -> b.callTool("raise_error", "{\"kind\": \"ValueError\", \"message\": \"boom from python\"}"),
                    "ValueError: boom from python");
            if (e != null) {
                check("ValueError".equals(e.getPythonType()), "python type: " + e.getPythonType());
            }
            expect(CudaBridgeException.class, "a Python ZeroDivisionError",
                    () -> b.callTool("raise_error", "{\"kind\": \"ZeroDivisionError\", \"message\": \"zero\"}"),
                    "ZeroDivisionError: zero");
            expect(IllegalStateException.class, "bind of a task bound from another thread",
                    () -> {
                        Thread[] th = {null};
                        RuntimeException[] caught = {null};
                        th[0] = new Thread(() -> {
                            try {
                                b.bindTask(7);
                            } catch (RuntimeException x) {
                                caught[0] = x;
                            }
                        });
                        th[0].start();
                        th[0].join();
                        if (caught[0] != null) throw caught[0];
                    }, "bound already");
            // Out of memory: 40 MiB twice under a 64 MiB limit.
            DeviceBuffer big = b.allocate(40L << 20);
            GpuOutOfMemoryException oom = expect(GpuOutOfMemoryException.class, "out of memory",
                    () -> b.allocate(40L << 20), "OutOfDeviceMemory", "out of device memory");
            if (oom != null) {
                result("oom_message", oom.getMessage());
                check(oom.requestedBytes() == 40L << 20, "requested " + oom.requestedBytes());
                check(oom.inUseBytes() >= 40L << 20, "in use " + oom.inUseBytes());
                check(oom.reservedBytes() > 0 && oom.reservedBytes() <= 64L << 20, "reserved " + oom.reservedBytes());
                check(oom.largestFreeBlockBytes() < 40L << 20, "largest free " + oom.largestFreeBlockBytes());
                check(oom.limitBytes() == 64L << 20, "limit " + oom.limitBytes());
                check("cudabridge.errors.OutOfDeviceMemory".equals(oom.getPythonType()), "oom type " + oom.getPythonType());
            }
            big.close();
            // Still working: allocate, copy, verify, free.
            byte[] data = pattern(new Random(3), 1 << 20);
            byte[] back = new byte[data.length];
            try (DeviceBuffer buf = b.allocate(40L << 20)) {
                buf.copyFrom(data);
                buf.copyTo(back);
            }
            check(Arrays.equals(data, back), "the service works after the errors");
        }
        // Another thread, another task, after all that.
        Thread th = new Thread(() -> {
            try (TaskScope t = b.bindTask(8); DeviceBuffer buf = b.allocate(100)) {
                buf.memset(1);
            }
        });
        th.start();
        try {
            th.join();
        } catch (InterruptedException ie) {
            throw new RuntimeException(ie);
        }
        check(stat(b, "live_allocations") == 0, "no live allocations");
        result("errors_done", true);
    }

    /** (e) bad input: a clear Java exception, and nothing changes. */
    static void badInput() throws Exception {
        CudaBridge b = CudaBridge.start();
        expect(IllegalStateException.class, "allocate with no bound task", () -> b.allocate(10), "no task is bound");
        expect(IllegalStateException.class, "stream() with no bound task", b::stream, "no task is bound");
        expect(IllegalArgumentException.class, "negative task id", () -> b.bindTask(-1), "non-negative");
        expect(NullPointerException.class, "null priority", () -> b.bindTask(3, null, null), "priority");
        expect(CudaBridgeException.class, "unknown GPU address", () -> b.bindTask(3, "7"), "not owned");
        TaskScope t = b.bindTask(3);
        expect(IllegalStateException.class, "bind twice", () -> b.bindTask(3), "bound already");
        Map<String, Long> before = b.statistics();
        DeviceBuffer buf = b.allocate(1000);
        byte[] data = new byte[1000];
        Arrays.fill(data, (byte) 9);
        buf.copyFrom(data);
        expect(IllegalArgumentException.class, "negative size", () -> b.allocate(-5), "positive");
        expect(IllegalArgumentException.class, "zero size", () -> b.allocate(0), "positive");
        expect(CudaBridgeException.class, "absurd size", () -> b.allocate(Long.MAX_VALUE / 2), "exceeds the pool limit");
        expect(NullPointerException.class, "null array in", () -> buf.copyFrom((byte[]) null));
        expect(NullPointerException.class, "null array out", () -> buf.copyTo((int[]) null));
        expect(IndexOutOfBoundsException.class, "copy past the end", () -> buf.copyFrom(new byte[1001]), "outside");
        expect(IndexOutOfBoundsException.class, "copy at an offset past the end",
                () -> buf.copyFrom(new byte[10], 0, 995, 10), "outside");
        expect(IndexOutOfBoundsException.class, "negative device offset", () -> buf.copyTo(new byte[10], 0, -1, 10));
        expect(IndexOutOfBoundsException.class, "array range", () -> buf.copyFrom(new byte[10], 5, 0, 10));
        expect(IndexOutOfBoundsException.class, "long[] past the end", () -> buf.copyFrom(new long[126]), "outside");
        expect(IndexOutOfBoundsException.class, "memset past the end", () -> buf.memset(1, 900, 101), "outside");
        expect(IllegalArgumentException.class, "memset value", () -> buf.memset(300), "0-255");
        expect(IllegalArgumentException.class, "heap ByteBuffer", () -> buf.copyFrom(ByteBuffer.allocate(10), 0), "not direct");
        expect(IndexOutOfBoundsException.class, "direct ByteBuffer too large",
                () -> buf.copyFrom(ByteBuffer.allocateDirect(2000), 0), "outside");
        expect(NullPointerException.class, "null ByteBuffer", () -> buf.copyTo((ByteBuffer) null, 0));
        expect(IllegalArgumentException.class, "pinned size", () -> b.allocatePinned(0), "size");
        // nothing changed: the buffer still holds its bytes
        byte[] back = new byte[1000];
        buf.copyTo(back);
        check(Arrays.equals(data, back), "buffer intact after the refused calls");
        buf.close();
        buf.close(); // second close: no effect
        expect(IllegalStateException.class, "use after close", () -> buf.copyTo(back), "was closed");
        expect(IllegalStateException.class, "memset after close", () -> buf.memset(0), "was closed");
        check(b.free(buf) == 0, "freeing a closed buffer frees nothing");
        Map<String, Long> mid = b.statistics();
        check(mid.get("live_allocations").equals(before.get("live_allocations")), "live allocations back to before");
        check(mid.get("in_use_bytes").equals(before.get("in_use_bytes")), "bytes in use back to before");
        // a released task's buffers are dead
        DeviceBuffer leaked = b.allocate(4096);
        DeviceBuffer leaked2 = b.allocate(4096);
        ReleaseReport rep = t.release();
        result("release", rep);
        check(rep.leaksReclaimed() == 2 && rep.leakedBytesReclaimed() == 8192, "two leaks reclaimed: " + rep);
        check(!leaked.isAlive(), "a released task's buffer is dead");
        expect(IllegalStateException.class, "use of a dead buffer", () -> leaked.copyFrom(data, 0, 0, 10), "is dead");
        expect(IllegalStateException.class, "memset of a dead buffer", () -> leaked.memset(0), "is dead");
        leaked.close(); // no effect: the release freed it
        check(b.free(leaked2) == 0, "freeing a dead buffer frees nothing");
        expect(IllegalStateException.class, "allocate after the release", () -> b.allocate(10), "no task is bound");
        check(t.release().leaksReclaimed() == 2, "a second release returns the first report");
        // a stale handle straight into the hot path is refused by Python
        expect(CudaBridgeException.class, "stale handle", () -> NativeBridge.free(leaked.handle()), "not live");
        expect(CudaBridgeException.class, "batched frees with a stale handle",
                () -> NativeBridge.freeMany(new long[] {leaked.handle()}, 1), "nothing was freed");
        expect(IndexOutOfBoundsException.class, "freeMany count", () -> NativeBridge.freeMany(new long[1], 2));
        expect(IllegalStateException.class, "release an unknown task", () -> b.releaseTask(99), "not bound");
        // batched free with one bad handle frees nothing
        try (TaskScope t2 = b.bindTask(4)) {
            DeviceBuffer x = b.allocate(100);
            DeviceBuffer y = b.allocate(100);
            long live = stat(b, "live_allocations");
            expect(CudaBridgeException.class, "freeMany with a bogus handle",
                    () -> NativeBridge.freeMany(new long[] {x.handle(), 0x77}, 2), "nothing was freed");
            expect(CudaBridgeException.class, "freeMany with a duplicate",
                    () -> NativeBridge.freeMany(new long[] {x.handle(), x.handle()}, 2), "twice");
            check(stat(b, "live_allocations") == live, "nothing freed by the refused batches");
            check(b.free(x, y, x) == 2, "free(x, y, x) frees two");
            // attach from another thread of the same task
            Thread helper = new Thread(() -> {
                try (Attachment a = b.attach(4)) {
                    check(b.stream() == t2.stream(), "attached thread sees the task's stream");
                    b.allocate(64).close();
                }
                expect(IllegalStateException.class, "after detaching", b::stream, "no task is bound");
            });
            helper.start();
            helper.join();
            expect(CudaBridgeException.class, "attach to an unknown task", () -> b.attach(12345), "not bound");
        }
        check(stat(b, "live_allocations") == 0, "no live allocations at the end");
        result("badinput_done", true);
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
                a.copyTo(host.buffer(), 0);                                                     // 3 (async: pinned)
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
                buf.copyTo(host.buffer(), 0);
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

    /** (f) many short-lived Java threads call in; the interpreter's thread states stay bounded. */
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

    /** Calls before any start fail fast and clearly. */
    static void notStarted() {
        expect(IllegalStateException.class, "get() before start", CudaBridge::get, "not started");
        check(!CudaBridge.isStarted(), "not started");
        result("notstarted_done", true);
    }

    /** Deferred binds (bindTaskDeferred, as the plugin binds ahead): bound in Python by the first
     *  GPU call or by applyBind on another thread, exactly once when both race; a task released
     *  before anyone applied its bind is never bound in Python; a bind only Python can refuse
     *  (an unknown GPU address) fails the task's first GPU call with the reason and leaves
     *  nothing behind; Java-side refusals are immediate and change nothing. */
    static void deferred(int racers) throws Exception {
        CudaBridge b = CudaBridge.start();
        long bound0 = stat(b, "tasks_bound_total");
        // (a) the first GPU call binds it on the calling thread
        TaskScope a = b.bindTaskDeferred(10, null, Priority.NORMAL);
        check(!a.isBound() && stat(b, "tasks_bound_total") == bound0, "not bound in Python before any GPU use");
        check(b.currentTask() == a, "current task set at once");
        try (DeviceBuffer buf = b.allocate(256)) {
            check(a.isBound() && stat(b, "tasks_bound_total") == bound0 + 1, "the allocate bound it");
            check(buf.stream() == a.stream() && a.stream() != 0, "buffer on the task's stream");
            buf.memset(7);
        }
        check(!a.applyBind(), "applyBind after the bind does nothing");
        a.release();
        check(stat(b, "tasks_bound") == 0, "released in Python");
        // (b) released before anyone applied it: never bound in Python, nothing to release there
        TaskScope never = b.bindTaskDeferred(11, null, Priority.NORMAL);
        ReleaseReport r = never.release();
        check(r.leaksReclaimed() == 0 && stat(b, "tasks_bound_total") == bound0 + 1, "never bound in Python");
        check(!never.applyBind(), "applyBind after the release does nothing");
        expect(IllegalStateException.class, "stream of a released, never bound task", never::stream, "released");
        expect(IllegalStateException.class, "allocate after it", () -> b.allocate(10), "no task is bound");
        // (c) applyBind on another thread, then the task's thread uses the stream (no second bind)
        TaskScope c = b.bindTaskDeferred(12, null, Priority.HIGH);
        Thread t = new Thread(() -> check(c.applyBind(), "applyBind on another thread did the bind"));
        t.start();
        t.join();
        check(c.isBound() && stat(b, "tasks_bound_total") == bound0 + 2, "bound once, by the other thread");
        long s12 = c.stream();
        check(s12 == b.stream(), "the task's thread sees the stream");
        DeviceBuffer leak = b.allocate(4096);
        ReleaseReport rc = c.release();
        check(rc.leaksReclaimed() == 1 && !leak.isAlive(), "leak reclaimed: " + rc);
        // (d) a bind only Python refuses: the first GPU call fails with the reason, nothing is left
        TaskScope d = b.bindTaskDeferred(13, "7", Priority.NORMAL);
        check(d.bindFailure() == null, "no failure before the bind is applied");
        expect(CudaBridgeException.class, "deferred bind to an unknown GPU", () -> b.allocate(10), "could not be bound",
                "not owned");
        check(d.bindFailure() != null && d.bindFailure().contains("not owned"), "bindFailure says why: " + d.bindFailure());
        expect(CudaBridgeException.class, "stream() of the failed task", b::stream, "not owned");
        check(!d.applyBind(), "applyBind of a failed bind does nothing");
        check(d.release().leaksReclaimed() == 0, "a failed bind releases nothing");
        check(stat(b, "tasks_bound") == 0 && stat(b, "tasks_bound_total") == bound0 + 2, "nothing left in Python");
        // (e) Java-side refusals: immediate, nothing registered
        expect(IllegalArgumentException.class, "deferred negative id", () -> b.bindTaskDeferred(-2, null, Priority.NORMAL),
                "non-negative");
        expect(NullPointerException.class, "deferred null priority", () -> b.bindTaskDeferred(14, null, null),
                "priority");
        TaskScope e = b.bindTaskDeferred(14, null, Priority.NORMAL);
        expect(IllegalStateException.class, "deferred bind twice", () -> b.bindTaskDeferred(14, null, Priority.NORMAL),
                "bound already");
        expect(IllegalStateException.class, "bind of a pending id", () -> b.bindTask(14), "bound already");
        check(stat(b, "tasks_bound") == 0, "the refused synchronous bind left nothing in Python");
        e.release();
        check(b.tasksBound() == 0, "no task left in Java");
        // (f) races: for each task, racers threads call stream() while another applies the bind
        int tasks = 200;
        AtomicLong wrong = new AtomicLong();
        for (int k = 0; k < tasks; k++) {
            TaskScope x = b.bindTaskDeferred(1000 + k, null, Priority.NORMAL);
            CountDownLatch go = new CountDownLatch(1);
            List<Thread> ts = new ArrayList<>();
            long[] seen = new long[racers];
            for (int j = 0; j < racers; j++) {
                final int jj = j;
                Thread th = new Thread(() -> {
                    try {
                        go.await();
                        if (jj == 0) {
                            x.applyBind();
                        } else {
                            seen[jj] = x.stream();
                        }
                    } catch (Throwable ex) {
                        wrong.incrementAndGet();
                    }
                });
                th.start();
                ts.add(th);
            }
            go.countDown();
            for (Thread th : ts) {
                th.join();
            }
            for (int j = 1; j < racers; j++) {
                if (seen[j] != x.stream()) {
                    wrong.incrementAndGet();
                }
            }
            x.release();
        }
        check(wrong.get() == 0, "every racer saw the one stream: " + wrong.get() + " wrong");
        check(stat(b, "tasks_bound_total") == bound0 + 2 + tasks, "each raced task bound exactly once in Python");
        check(stat(b, "tasks_bound") == 0 && b.tasksBound() == 0, "all released");
        // (g) batched releases: one call into Python for the bound ones, each report in order; a
        // release that fails in Python (released behind the Java API's back) fails alone
        TaskScope g1 = b.bindTask(3000);
        DeviceBuffer g1leak = b.allocate(1000);
        TaskScope g2 = b.bindTaskDeferred(3001, null, Priority.NORMAL);   // never bound in Python
        TaskScope g3 = b.bindTask(3002);
        NativeBridge.releaseTask(3002, new long[2]);               // gone in Python, not in Java
        TaskScope g4 = b.bindTask(3003);
        ReleaseReport g4first = g4.release();                      // released already
        TaskScope g5 = b.bindTask(3004);
        DeviceBuffer g5a = b.allocate(10);
        DeviceBuffer g5b = b.allocate(20);
        ReleaseReport[] reps = b.releaseTasks(List.of(g1, g2, g3, g4, g5));
        check(reps.length == 5, "a report per scope");
        check(reps[0].failure() == null && reps[0].leaksReclaimed() == 1 && reps[0].leakedBytesReclaimed() == 1000,
                "bound task's leak reclaimed: " + reps[0]);
        check(reps[1].failure() == null && reps[1].leaksReclaimed() == 0 && g2.wasNeverBound(), "never bound: " + reps[1]);
        check(reps[2].failure() != null && reps[2].failure().contains("3002") && reps[2].failure().contains("not bound"),
                "the failed release says why: " + reps[2]);
        check(reps[3] == g4first, "a released scope gives its first report");
        check(reps[4].failure() == null && reps[4].leaksReclaimed() == 2 && reps[4].leakedBytesReclaimed() == 30,
                "the task after the failure released too: " + reps[4]);
        check(!g1leak.isAlive() && !g5a.isAlive() && g1.isReleased() && g3.isReleased(), "all dead in Java");
        check(g1.release() == reps[0], "a later release returns the batch's report");
        check(b.releaseTasks(List.of()).length == 0, "an empty batch");
        check(stat(b, "tasks_bound") == 0 && b.tasksBound() == 0, "nothing bound after the batch");
        expect(NullPointerException.class, "releaseTasks null ids", () -> NativeBridge.releaseTasks(null, 0, new long[0]));
        expect(IndexOutOfBoundsException.class, "releaseTasks n past the ids",
                () -> NativeBridge.releaseTasks(new long[1], 2, new long[4]), "outside");
        expect(IndexOutOfBoundsException.class, "releaseTasks out too short",
                () -> NativeBridge.releaseTasks(new long[2], 2, new long[3]), "shorter");
        long[] outs = new long[2];
        check(NativeBridge.releaseTasks(new long[] {424242}, 1, outs)[0] != null && outs[0] == -1,
                "an unknown task id fails alone, with a message");
        result("deferred_bound_total", stat(b, "tasks_bound_total") - bound0);
        result("deferred_done", true);
    }
}
