package org.cudabridge;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.net.URISyntaxException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.CodeSource;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The entry point of the Java API: the executor's GPU service, hosted in this JVM.
 *
 * <p>Start once per JVM ({@link #start(Options)}; the Spark plugin does it in
 * {@code ExecutorPlugin.init} with {@link #tryStart(Options)}, which never throws and records a
 * failure so that every later GPU call fails fast with that reason). Then, per task:
 * <pre>{@code
 * CudaBridge bridge = CudaBridge.get();
 * try (TaskScope task = bridge.bindTask(taskAttemptId, gpuAddress)) {   // the plugin does this in onTaskStart
 *     long stream = bridge.stream();                                   // cached: no call into Python
 *     try (DeviceBuffer buf = bridge.allocate(1 << 20)) {
 *         buf.copyFrom(bytes);
 *         ...
 *     }
 * }                                                                     // releases the task
 * }</pre>
 *
 * <p>The current task of a thread is set by {@link #bindTask} on that thread, or by
 * {@link #attach(long)} on any other thread working for the same task. It is a task attempt id,
 * never "this thread's stream": Spark reuses task threads.
 *
 * <p>Hot calls ({@code allocate}, {@code close}, {@code free}, {@code memset}) go through JNI natives into
 * Python. The short ones pass a gate in the bridge library before they take the GIL: the thread
 * that passed it last keeps passing it for up to {@code -Dcudabridge.gate.holdMicros} (default: the
 * settings table's) while others wait, as Python's own threads keep the GIL for a switch interval, instead of the GIL
 * changing hands (and cores) at every call ({@code bridge/hot_gate.h} says why and measures it).
 * {@code -Dcudabridge.gate=false} turns it off. Calls that may wait for a stream (copies to heap
 * arrays, synchronize) never pass it.
 */
public final class CudaBridge {
    /** Properties file the build writes beside the jar and the library: defaults for the Python,
     *  its path and the library where neither the options nor the system properties give them. */
    public static final String NATIVE_PROPERTIES = "cudabridge-native.properties";
    public static final String LIBRARY_FILE = "libcudabridge_jni.so";

    private static final Object START_LOCK = new Object();
    private static volatile CudaBridge instance;
    private static volatile CudaBridgeException failure;
    private static final ThreadLocal<TaskScope> CURRENT = new ThreadLocal<>();
    private static final ThreadLocal<long[]> SCRATCH = ThreadLocal.withInitial(() -> new long[2]);

    private final ControlPlane control;
    private final Options options;
    private final ConcurrentHashMap<Long, TaskScope> tasks = new ConcurrentHashMap<>();
    private volatile boolean shutDown;

    private CudaBridge(ControlPlane control, Options options) {
        this.control = control;
        this.options = options;
    }

    // --- start-up -------------------------------------------------------------------------------

    /** Where Python, its path, the library and the service configuration come from. Unset
     *  values fall back to system properties ({@link Settings#PYTHON}, {@link Settings#PYTHON_PATH},
     *  {@link Settings#LIBRARY}), the environment ({@code CUDABRIDGE_PYTHON}), and the
     *  {@code cudabridge-native.properties} the build wrote beside the jar. The service keys are
     *  checked against the settings table ({@link Settings#checkAll}) before anything starts. */
    public static final class Options {
        private String python;
        private final List<String> pythonPath = new ArrayList<>();
        private String library;
        private final Map<String, String> conf = new LinkedHashMap<>();

        public Options python(String executable) { this.python = executable; return this; }

        public Options addPythonPath(String entry) { pythonPath.add(Objects.requireNonNull(entry)); return this; }

        public Options library(String path) { this.library = path; return this; }

        /** A service key, with or without the {@code spark.cudabridge.} prefix (e.g. {@code backend});
         *  kept with the prefix. Checked when the bridge starts. */
        public Options set(String key, String value) {
            Objects.requireNonNull(key);
            Objects.requireNonNull(value, "value of " + key);
            conf.put(key.startsWith(Settings.prefix()) ? key : Settings.prefix() + key, value);
            return this;
        }

        /** Every {@code spark.cudabridge.*} entry of a (Spark) configuration map. */
        public Options setAll(Map<String, String> entries) {
            for (Map.Entry<String, String> e : entries.entrySet()) {
                if (e.getKey().startsWith(Settings.prefix()) && e.getValue() != null) {
                    conf.put(e.getKey(), e.getValue());
                }
            }
            return this;
        }

        public String python() { return python; }
        public String library() { return library; }
        public List<String> pythonPath() { return Collections.unmodifiableList(pythonPath); }
        public Map<String, String> conf() { return Collections.unmodifiableMap(conf); }

        /** Options from system properties only (and {@code -Dspark.cudabridge.*} keys). */
        public static Options fromSystemProperties() {
            Options o = new Options();
            for (String name : System.getProperties().stringPropertyNames()) {
                if (name.startsWith(Settings.prefix())) {
                    o.conf.put(name, System.getProperty(name));
                }
            }
            return o;
        }

        Options resolved() {
            Options r = new Options();
            Properties built = nativeProperties();
            r.library = firstNonEmpty(library, Settings.property(Settings.LIBRARY), built.getProperty("library"),
                    besideJar(LIBRARY_FILE));
            r.python = firstNonEmpty(python, Settings.property(Settings.PYTHON), System.getenv(PYTHON_ENV),
                    built.getProperty("python"));
            r.pythonPath.addAll(pythonPath);
            for (String source : new String[] {Settings.property(Settings.PYTHON_PATH), built.getProperty("pythonpath")}) {
                if (source != null && !source.isEmpty()) {
                    for (String entry : source.split(File.pathSeparator)) {
                        if (!entry.isEmpty() && !r.pythonPath.contains(entry)) {
                            r.pythonPath.add(entry);
                        }
                    }
                }
            }
            r.conf.putAll(conf);
            return r;
        }
    }

    /** Starts the bridge (idempotent: later calls return the running bridge). Throws
     *  {@link CudaBridgeException} with the Python error and traceback if Python, cudabridge or
     *  JPype cannot be started; the failure is also recorded for {@link #get()}. A failed start
     *  may be retried (unless the interpreter itself failed to initialize).
     *
     *  <p>Before anything is loaded, the library file is checked against the size and SHA-256 the
     *  build recorded and for a sound ELF header and layout (a damaged library would crash the
     *  JVM in the dynamic loader); before Python starts, the library checks that the Python
     *  executable is a venv of the Python version it is linked to, or that installation's
     *  interpreter. Either refusal is a {@link CudaBridgeException} saying what is wrong. */
    public static CudaBridge start(Options options) {
        Objects.requireNonNull(options, "options");
        CudaBridge running = instance;
        if (running != null) {
            running.checkRunning("start");
            return running;
        }
        synchronized (START_LOCK) {
            if (instance != null) {
                instance.checkRunning("start");
                return instance;
            }
            try {
                CudaBridge b = doStart(options.resolved());
                failure = null;
                instance = b;
                return b;
            } catch (CudaBridgeException e) {
                failure = e;
                throw e;
            } catch (RuntimeException | LinkageError e) {
                CudaBridgeException wrapped = new CudaBridgeException("cudabridge start failed: " + e, "java", e);
                failure = wrapped;
                throw wrapped;
            }
        }
    }

    /** Starts from system properties and {@code -Dspark.cudabridge.*} keys. */
    public static CudaBridge start() {
        return start(Options.fromSystemProperties());
    }

    /** For {@code ExecutorPlugin.init}: starts, never throws. Returns whether the bridge runs;
     *  on failure the reason is kept ({@link #startFailure()}) and every later GPU call fails
     *  fast with it. */
    public static boolean tryStart(Options options) {
        try {
            start(options);
            return true;
        } catch (Throwable t) { // a plugin's init must never throw (Spark relaunches executors forever)
            if (failure == null) {
                failure = new CudaBridgeException("cudabridge start failed: " + t, "java", t);
            }
            return false;
        }
    }

    /** The reason the last start failed, or null. */
    public static CudaBridgeException startFailure() {
        return failure;
    }

    public static boolean isStarted() {
        CudaBridge b = instance;
        return b != null && !b.shutDown;
    }

    /** The running bridge; throws (fast) if it was never started, failed to start, or was shut down. */
    public static CudaBridge get() {
        CudaBridge b = instance;
        if (b != null) {
            b.checkRunning("CudaBridge.get");
            return b;
        }
        CudaBridgeException f = failure;
        if (f != null) {
            throw new CudaBridgeException("cudabridge is not available: its start failed: " + f.getMessage(),
                    f.getPythonType(), f);
        }
        throw new IllegalStateException("cudabridge is not started in this JVM: call CudaBridge.start first "
                + "(the Spark plugin does it in ExecutorPlugin.init)");
    }

    /** The environment variable naming the Python executable (the plugin key {@code python}'s). */
    private static final String PYTHON_ENV = Settings.setting("python").envName();

    private static CudaBridge doStart(Options o) {
        try {
            Settings.checkAll(o.conf); // before anything is loaded: a misspelled key fails here, without Python
        } catch (IllegalArgumentException e) {
            throw new CudaBridgeException("cudabridge: " + e.getMessage(), "java", e);
        }
        if (o.library == null) {
            throw new CudaBridgeException("cudabridge: the bridge library was not found: set -D" + Settings.LIBRARY
                    + " (built by `python -m cudabridge build`, beside cudabridge.jar)", "java");
        }
        if (!new File(o.library).isFile()) {
            throw new CudaBridgeException("cudabridge: no bridge library at " + o.library + " (build it with "
                    + "`python -m cudabridge build`, or set -D" + Settings.LIBRARY + ")", "java");
        }
        if (o.python == null) {
            throw new CudaBridgeException("cudabridge: no Python given: set -D" + Settings.PYTHON
                    + "=<venv>/bin/python or " + PYTHON_ENV + ", or Options.python", "java");
        }
        String library = new File(o.library).getAbsolutePath();
        // Checked before System.load (a truncated library crashes the JVM in the dynamic loader);
        // the Python executable is checked by the library, before Python starts.
        Path builtFile = nativePropertiesFile();
        NativeBridge.load(library, LibraryCheck.recordedFor(Paths.get(library),
                builtFile == null ? null : nativeProperties(), builtFile));
        NativeBridge.startPython(o.python, o.pythonPath.toArray(new String[0]), library, toJson(o.conf));
        ControlPlane plane = NativeBridge.control();
        if (plane == null) {
            throw new CudaBridgeException("cudabridge: Python started but installed no control plane", "java");
        }
        return new CudaBridge(plane, o);
    }

    private static String firstNonEmpty(String... values) {
        for (String v : values) {
            if (v != null && !v.isEmpty()) {
                return v;
            }
        }
        return null;
    }

    private static Path jarDirectory() {
        try {
            CodeSource cs = CudaBridge.class.getProtectionDomain().getCodeSource();
            if (cs == null || cs.getLocation() == null) {
                return null;
            }
            Path p = Paths.get(cs.getLocation().toURI());
            return Files.isDirectory(p) ? p : p.getParent();
        } catch (URISyntaxException | SecurityException | IllegalArgumentException e) {
            return null;
        }
    }

    private static String besideJar(String name) {
        Path dir = jarDirectory();
        if (dir == null) {
            return null;
        }
        Path p = dir.resolve(name);
        return Files.isRegularFile(p) ? p.toString() : null;
    }

    /** The build's {@code cudabridge-native.properties} beside the jar, or null. */
    private static Path nativePropertiesFile() {
        Path dir = jarDirectory();
        Path file = dir == null ? null : dir.resolve(NATIVE_PROPERTIES);
        return file != null && Files.isRegularFile(file) ? file : null;
    }

    private static Properties nativeProperties() {
        Properties p = new Properties();
        Path file = nativePropertiesFile();
        if (file != null) {
            try (InputStream in = Files.newInputStream(file)) {
                p.load(in);
            } catch (IOException | IllegalArgumentException e) {
                // defaults only: an unreadable file leaves them unset, and start says what is missing
            }
        }
        return p;
    }

    static String toJson(Map<String, String> conf) {
        StringBuilder sb = new StringBuilder("{");
        boolean first = true;
        for (Map.Entry<String, String> e : new TreeMap<>(conf).entrySet()) {
            if (!first) {
                sb.append(',');
            }
            first = false;
            quote(sb, e.getKey());
            sb.append(':');
            quote(sb, e.getValue());
        }
        return sb.append('}').toString();
    }

    static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                sb.append('\\').append(c);
            } else if (c < 0x20 || c > 0x7e) {
                sb.append(String.format("\\u%04x", (int) c));
            } else {
                sb.append(c);
            }
        }
        sb.append('"');
    }

    // --- tasks ----------------------------------------------------------------------------------

    void checkRunning(String call) {
        if (shutDown) {
            throw new IllegalStateException(call + ": cudabridge was shut down in this JVM");
        }
    }

    private ControlPlane control() {
        NativeBridge.ensureThreadState(); // pin: JPype proxy calls from this thread keep its Python state
        return control;
    }

    /** Binds a task attempt on the executor's only GPU; see {@link #bindTask(long, String, Priority)}. */
    public TaskScope bindTask(long taskAttemptId) {
        return bindTask(taskAttemptId, null, Priority.NORMAL);
    }

    /** Binds a task attempt to a normal-priority stream of the GPU with Spark address {@code gpuAddress}. */
    public TaskScope bindTask(long taskAttemptId, String gpuAddress) {
        return bindTask(taskAttemptId, gpuAddress, Priority.NORMAL);
    }

    /**
     * Binds a task attempt to a stream of a GPU ({@code gpuAddress} null: the executor's only GPU)
     * and makes it the calling thread's current task. Close the returned scope to release the task.
     * The plugin calls this in {@code onTaskStart}, on the task's thread.
     */
    public TaskScope bindTask(long taskAttemptId, String gpuAddress, Priority priority) {
        checkBind(taskAttemptId, priority);
        long[] r = bindInPython(taskAttemptId, gpuAddress, priority);
        return register(new TaskScope(this, taskAttemptId, r[0], (int) r[1], true));
    }

    /**
     * Binds a task attempt in Java now and in Python later, and makes it the calling thread's
     * current task: the bind crosses into Python when {@link TaskScope#applyBind()} is called
     * (from any thread: the plugin's lifecycle thread does, ahead of the task's GPU work) or at
     * the task's first GPU call on whichever thread comes first. So a task thread need not queue
     * for the GIL at task start, and a task that never touches the GPU is never bound in Python.
     * Errors only Python can see (a GPU address this executor does not own) reach the task's
     * first GPU call; {@link TaskScope#bindFailure()} tells them afterwards.
     */
    public TaskScope bindTaskDeferred(long taskAttemptId, String gpuAddress, Priority priority) {
        checkBind(taskAttemptId, priority);
        return register(new TaskScope(this, taskAttemptId, gpuAddress, priority));
    }

    private void checkBind(long taskAttemptId, Priority priority) {
        if (taskAttemptId < 0) {
            throw new IllegalArgumentException("bindTask: task attempt id must be non-negative, got " + taskAttemptId);
        }
        Objects.requireNonNull(priority, "bindTask: priority");
        checkRunning("bindTask");
        if (tasks.containsKey(taskAttemptId)) {
            throw new IllegalStateException("bindTask: task " + taskAttemptId + " is bound already");
        }
    }

    private TaskScope register(TaskScope scope) {
        if (tasks.putIfAbsent(scope.taskAttemptId(), scope) != null) {
            // A concurrent bind of the same id won the race: undo this one in Python if it was bound.
            if (scope.isBound()) {
                NativeBridge.releaseTask(scope.taskAttemptId(), new long[2]);
            }
            throw new IllegalStateException("bindTask: task " + scope.taskAttemptId() + " is bound already");
        }
        CURRENT.set(scope);
        return scope;
    }

    /** The bind in Python: {stream, GPU ordinal}. */
    long[] bindInPython(long taskAttemptId, String gpuAddress, Priority priority) {
        checkRunning("bindTask");
        long[] r = new long[2];
        NativeBridge.bindTask(taskAttemptId, gpuAddress, priority.wire(), r);
        return r;
    }

    /** Releases a bound task by id (the plugin's {@code onTaskSucceeded}/{@code onTaskFailed}). */
    public ReleaseReport releaseTask(long taskAttemptId) {
        TaskScope scope = tasks.get(taskAttemptId);
        if (scope == null) {
            throw new IllegalStateException("releaseTask: task " + taskAttemptId + " is not bound through this bridge");
        }
        return scope.release();
    }

    /**
     * Releases many tasks with one call into Python for those bound there (the plugin's lifecycle
     * thread batches the tasks that ended close together). Returns a report per scope, in order:
     * a scope released already gets its first report, one whose release failed in Python a report
     * whose {@link ReleaseReport#failure()} says why (the others are released all the same).
     */
    public ReleaseReport[] releaseTasks(List<TaskScope> scopes) {
        int n = scopes.size();
        ReleaseReport[] reports = new ReleaseReport[n];
        long[] ids = new long[n];
        int[] where = new int[n];
        int k = 0;
        for (int i = 0; i < n; i++) {
            TaskScope s = scopes.get(i);
            if (!s.isOwned()) {
                throw new IllegalStateException("task " + s.taskAttemptId() + " was bound outside the Java API");
            }
        }
        for (int i = 0; i < n; i++) {
            TaskScope s = scopes.get(i);
            Boolean inPython = s.beginRelease();
            if (inPython == null) {
                reports[i] = s.release(); // the first release's report
                continue;
            }
            forget(s);
            if (inPython && !shutDown) {
                ids[k] = s.taskAttemptId();
                where[k++] = i;
            } else {
                reports[i] = new ReleaseReport(s.taskAttemptId(), 0, 0);
                s.endRelease(reports[i]);
            }
        }
        if (k > 0) {
            long[] out = new long[2 * k];
            String messages;
            try {
                messages = NativeBridge.releaseTasks(ids, k, out);
            } catch (RuntimeException e) { // the whole call failed (e.g. the service closed): say so for each
                for (int j = 0; j < k; j++) {
                    TaskScope s = scopes.get(where[j]);
                    reports[where[j]] = ReleaseReport.failed(s.taskAttemptId(), String.valueOf(e.getMessage()));
                    s.endRelease(reports[where[j]]);
                }
                return reports;
            }
            String[] lines = messages == null ? new String[0] : messages.split("\n");
            int m = 0;
            for (int j = 0; j < k; j++) {
                TaskScope s = scopes.get(where[j]);
                ReleaseReport r = out[2 * j] < 0
                        ? ReleaseReport.failed(s.taskAttemptId(), m < lines.length ? lines[m++] : "release failed")
                        : new ReleaseReport(s.taskAttemptId(), out[2 * j], out[2 * j + 1]);
                s.endRelease(r);
                reports[where[j]] = r;
            }
        }
        return reports;
    }

    private void forget(TaskScope scope) {
        tasks.remove(scope.taskAttemptId(), scope);
        if (CURRENT.get() == scope) {
            CURRENT.remove();
        }
    }

    ReleaseReport releaseScope(TaskScope scope, boolean boundInPython) {
        forget(scope);
        if (shutDown || !boundInPython) {
            return new ReleaseReport(scope.taskAttemptId(), 0, 0);
        }
        long[] r = new long[2];
        NativeBridge.releaseTask(scope.taskAttemptId(), r);
        return new ReleaseReport(scope.taskAttemptId(), r[0], r[1]);
    }

    /** An attachment of the calling thread to a task; closing it restores the thread's previous task. */
    public static final class Attachment implements AutoCloseable {
        private final TaskScope scope;
        private final TaskScope previous;
        private final Thread thread;
        private boolean closed;

        Attachment(TaskScope scope, TaskScope previous) {
            this.scope = scope;
            this.previous = previous;
            this.thread = Thread.currentThread();
        }

        public TaskScope task() { return scope; }

        @Override
        public void close() {
            if (closed) {
                return;
            }
            if (Thread.currentThread() != thread) {
                throw new IllegalStateException("an Attachment must be closed on the thread that attached");
            }
            closed = true;
            if (previous != null && !previous.isReleased()) {
                CURRENT.set(previous);
            } else {
                CURRENT.remove();
            }
        }
    }

    /** Makes the calling thread work for a task bound elsewhere (another thread of the task, or
     *  Python code): its current task becomes {@code taskAttemptId} until the attachment closes. */
    public Attachment attach(long taskAttemptId) {
        checkRunning("attach");
        TaskScope scope = tasks.get(taskAttemptId);
        if (scope == null) {
            long[] r = control().lookupTask(taskAttemptId); // bound by Python code: not ours to release
            scope = new TaskScope(this, taskAttemptId, r[0], (int) r[1], false);
        }
        Attachment a = new Attachment(scope, CURRENT.get());
        CURRENT.set(scope);
        return a;
    }

    /** Clears the calling thread's current task (does not release it). */
    public void detach() {
        CURRENT.remove();
    }

    /** The calling thread's current task; throws if there is none or it was released. */
    public TaskScope currentTask() {
        TaskScope t = CURRENT.get();
        if (t == null) {
            throw new IllegalStateException("no task is bound on thread '" + Thread.currentThread().getName()
                    + "': call CudaBridge.bindTask (the plugin does in onTaskStart) or attach(taskAttemptId)");
        }
        t.checkLive("currentTask");
        return t;
    }

    /** The current task's stream handle, cached per task attempt: never a call into Python. */
    public long stream() {
        return currentTask().stream();
    }

    /** Bound tasks, by id, as this Java API knows them. */
    public int tasksBound() {
        return tasks.size();
    }

    // --- memory -----------------------------------------------------------------------------------

    /** {@code bytes} of device memory for the current task, ordered on its stream. */
    public DeviceBuffer allocate(long bytes) {
        if (bytes <= 0) {
            throw new IllegalArgumentException("allocate: size must be positive, got " + bytes);
        }
        TaskScope task = currentTask();
        checkRunning("allocate");
        long[] out = SCRATCH.get();
        NativeBridge.allocate(task.taskAttemptId(), bytes, out);
        return new DeviceBuffer(this, task, out[0], out[1], bytes);
    }

    void freeHandle(long handle) {
        checkRunning("free");
        NativeBridge.free(handle);
    }

    void memsetHandle(long handle, long offset, int value, long bytes) {
        checkRunning("memset");
        NativeBridge.memset(handle, offset, value, bytes);
    }

    /** Frees many buffers in one call into Python (each as {@link DeviceBuffer#close()} would).
     *  Closed and dead buffers are skipped; returns how many were freed. */
    public int free(DeviceBuffer... buffers) {
        Objects.requireNonNull(buffers, "free: buffers");
        long[] handles = new long[buffers.length];
        DeviceBuffer[] claimed = new DeviceBuffer[buffers.length];
        int n = 0;
        for (DeviceBuffer b : buffers) {
            if (b == null) {
                throw new NullPointerException("free: a buffer is null");
            }
        }
        checkRunning("free");
        for (DeviceBuffer b : buffers) {
            if (b.claimForFree()) {
                claimed[n] = b;
                handles[n++] = b.handle();
            }
        }
        if (n == 0) {
            return 0;
        }
        try {
            NativeBridge.freeMany(handles, n);
        } catch (RuntimeException e) {
            for (int i = 0; i < n; i++) {
                claimed[i].unclaim(); // Python freed none of them
            }
            throw e;
        }
        return n;
    }

    /** As {@link #free(DeviceBuffer...)}. */
    public int free(Collection<DeviceBuffer> buffers) {
        Objects.requireNonNull(buffers, "free: buffers");
        return free(buffers.toArray(new DeviceBuffer[0]));
    }

    /** Page-locked host memory (a direct ByteBuffer in native order) for asynchronous copies. */
    public PinnedBuffer allocatePinned(long bytes) {
        if (bytes <= 0 || bytes > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("allocatePinned: size must be in [1, 2^31-1], got " + bytes);
        }
        checkRunning("allocatePinned");
        ByteBuffer b = NativeBridge.allocPinned(bytes);
        return new PinnedBuffer(b.order(ByteOrder.nativeOrder()), bytes);
    }

    /** Blocks until the current task's stream has run everything queued on it. */
    public void synchronize() {
        TaskScope task = currentTask();
        checkRunning("synchronize");
        NativeBridge.synchronize(task.taskAttemptId());
    }

    // --- statistics and lifetime --------------------------------------------------------------------

    /** What {@link #statistics()} adds to the service's numbers, named once here. */
    public static final List<String> JAVA_STATISTICS = List.of("bridge_thread_states", "bridge_thread_states_created",
            "bridge_thread_states_deleted", "bridge_java_tasks_bound");

    /** Every key {@link #statistics()} holds, known without Python: the service's (the build writes
     *  Python's {@code BridgeControl.statistics_names()} into the jar as
     *  {@code org/cudabridge/statistics.txt}), then {@link #JAVA_STATISTICS}. */
    public static List<String> statisticsNames() {
        List<String> out = new ArrayList<>();
        try (java.io.InputStream in = CudaBridge.class.getResourceAsStream("/org/cudabridge/statistics.txt")) {
            if (in == null) {
                throw new IllegalStateException("cudabridge.jar has no org/cudabridge/statistics.txt: rebuild it "
                        + "(python -m cudabridge build)");
            }
            for (String line : new String(in.readAllBytes(), java.nio.charset.StandardCharsets.UTF_8).split("\n")) {
                if (!line.isBlank()) {
                    out.add(line.strip());
                }
            }
        } catch (java.io.IOException e) {
            throw new IllegalStateException("reading org/cudabridge/statistics.txt: " + e, e);
        }
        out.addAll(JAVA_STATISTICS);
        return Collections.unmodifiableList(out);
    }

    /** Executor-level numbers (pool bytes in use / reserved / peak, streams, tasks, event polls, GPU
     *  waits, host syncs, OOMs, leaks, the bridge's call counters and thread states): one snapshot,
     *  for metric gauges (poll it, say, once a second rather than per gauge). */
    public Map<String, Long> statistics() {
        checkRunning("statistics");
        Map<String, Long> m = new TreeMap<>(control().statistics());
        long[] ts = threadStates();
        long[] own = {ts[0], ts[1], ts[2], tasks.size()};   // JAVA_STATISTICS' order
        for (int i = 0; i < own.length; i++) {
            m.put(JAVA_STATISTICS.get(i), own[i]);
        }
        return Collections.unmodifiableMap(m);
    }

    /** {thread states in the interpreter, created by the bridge, deleted by the bridge}. */
    public static long[] threadStates() {
        long[] out = new long[3];
        NativeBridge.threadStates(out);
        return out;
    }

    /** The sticky CUDA error (an illegal address, a launch failure, an uncorrectable ECC error) that
     *  made a GPU of this executor unusable, or null. After one, every GPU call in the process fails
     *  and only a new process recovers: a plugin asks for a new executor ({@code CudaBridgePlugin}
     *  exits the executor JVM). Probes each GPU with one cheap call until an error is found. */
    public String deviceError() {
        checkRunning("deviceError");
        return control().deviceError();
    }

    /** JSON describing the Python side (executable, prefix, version, backend, GPUs). */
    public String describe() {
        return control().describe();
    }

    /** Calls {@code cudabridge.jvm.tools.<name>(**json)}: test kernels and in-process Python timings. */
    public String callTool(String name, String argsJson) {
        Objects.requireNonNull(name, "callTool: name");
        checkRunning("callTool");
        return control().callTool(name, argsJson == null ? "{}" : argsJson);
    }

    public Options options() {
        return options;
    }

    /** Closes the service: every task is released, streams drained, memory returned. Python stays
     *  up (it is never finalized in a JVM); the bridge cannot be started again in this JVM. */
    public void shutdown() {
        synchronized (START_LOCK) {
            if (shutDown) {
                return;
            }
            shutDown = true;
            for (TaskScope t : tasks.values()) {
                t.markReleased();
            }
            tasks.clear();
            control().shutdown();
        }
    }
}
