package org.cudabridge;

import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * The entry point of the Java API: the executor's GPU service, hosted in this JVM.
 *
 * <p>Start once per JVM ({@link #start(BridgeOptions)}, or {@link #tryStart(BridgeOptions)}, which
 * never throws and records a failure so that every later GPU call fails fast with that reason;
 * the Spark plugin starts it in {@code ExecutorPlugin.init} through
 * {@code org.cudabridge.executor.TaskBinder.start}, which catches every failure). Then, per task:
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
 * <p>This class is the front; the work is done by a class per concern: {@link Launcher} (start,
 * with {@link BridgeOptions} and {@link InstallLayout}), {@link TaskTable} (bind, attach,
 * release), {@link DeviceMemory} and {@link BridgeStatistics}. Hot calls ({@code allocate},
 * {@code close}, {@code free}, {@code memset}) go through {@link NativeBridge}'s JNI natives into
 * Python; the short ones pass the bridge library's GIL gate first (docs/jvm-bridge.md).
 */
public final class CudaBridge {
    private final ControlPlane control;
    private final BridgeOptions options;
    private final TaskTable tasks;
    private final DeviceMemory memory;
    private final java.util.concurrent.ConcurrentHashMap<String, PythonFunction> functions =
            new java.util.concurrent.ConcurrentHashMap<>();
    private volatile boolean shutDown;

    CudaBridge(ControlPlane control, BridgeOptions options) {
        this.control = control;
        this.options = options;
        this.tasks = new TaskTable(this);
        this.memory = new DeviceMemory(this, tasks);
    }

    // --- start-up -------------------------------------------------------------------------------

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
    public static CudaBridge start(BridgeOptions options) {
        return Launcher.start(options);
    }

    /** Starts from system properties and {@code -Dspark.cudabridge.*} keys. */
    public static CudaBridge start() {
        return start(BridgeOptions.fromSystemProperties());
    }

    /** For {@code ExecutorPlugin.init}: starts, never throws. Returns whether the bridge runs;
     *  on failure the reason is kept ({@link #startFailure()}) and every later GPU call fails
     *  fast with it. */
    public static boolean tryStart(BridgeOptions options) {
        return Launcher.tryStart(options);
    }

    /** The reason the last start failed, or null. */
    public static CudaBridgeException startFailure() {
        return Launcher.failure();
    }

    public static boolean isStarted() {
        CudaBridge b = Launcher.instance();
        return b != null && b.isRunning();
    }

    /** The running bridge; throws (fast) if it was never started, failed to start, or was shut down. */
    public static CudaBridge get() {
        return Launcher.get();
    }

    public BridgeOptions options() {
        return options;
    }

    boolean isRunning() {
        return !shutDown;
    }

    void checkRunning(String call) {
        if (shutDown) {
            throw new IllegalStateException(call + ": cudabridge was shut down in this JVM");
        }
    }

    /** What a call that failed throws: the shutdown error when the bridge is shut down now (a
     *  {@link #shutdown()} racing the call: {@code shutDown} is set before the service closes, so
     *  a refusal the closing caused is seen with it set), else {@code e} itself. */
    RuntimeException shutDownOr(String call, RuntimeException e) {
        String down = call + ": cudabridge was shut down in this JVM";
        return !shutDown || down.equals(e.getMessage()) ? e : new IllegalStateException(down, e);
    }

    ControlPlane control() {
        NativeBridge.ensureThreadState(); // pin: JPype proxy calls from this thread keep its Python state
        return control;
    }

    // --- tasks (TaskTable) ----------------------------------------------------------------------

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
        return tasks.bind(taskAttemptId, gpuAddress, priority);
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
        return tasks.bindDeferred(taskAttemptId, gpuAddress, priority);
    }

    /** Releases a bound task by id (the plugin's {@code onTaskSucceeded}/{@code onTaskFailed}). */
    public ReleaseReport releaseTask(long taskAttemptId) {
        return tasks.release(taskAttemptId);
    }

    /**
     * Releases many tasks with one call into Python for those bound there (the plugin's lifecycle
     * thread batches the tasks that ended close together). Returns a report per scope, in order:
     * a scope released already gets its first report, one whose release failed in Python a report
     * whose {@link ReleaseReport#failure()} says why (the others are released all the same).
     */
    public ReleaseReport[] releaseTasks(List<TaskScope> scopes) {
        return tasks.releaseAll(scopes);
    }

    /** Makes the calling thread work for a task bound elsewhere (another thread of the task, or
     *  Python code): its current task becomes {@code taskAttemptId} until the attachment closes. */
    public Attachment attach(long taskAttemptId) {
        return tasks.attach(taskAttemptId);
    }

    /** Marks a task as a retried attempt (Spark's attempt number above 0) before its bind: with
     *  {@code spark.cudabridge.concurrentGpuTasks} set, it is admitted ahead of the first attempts
     *  waiting. The plugin calls it at the start of every retried attempt. */
    public void retriedAttempt(long taskAttemptId) {
        checkRunning("retriedAttempt");
        control().retriedAttempt(taskAttemptId);
    }

    /** Ends the waits of a killed task at once: its allocations waiting for other tasks' memory
     *  and its bind waiting for admission throw {@link UnknownTaskException}, and none of its
     *  allocations waits again (until its release). The plugin calls it when Spark interrupts the
     *  task ({@code org.cudabridge.executor.KillWatch}). */
    public void cancelWaits(long taskAttemptId) {
        checkRunning("cancelWaits");
        control().cancelWaits(taskAttemptId);
    }

    /** Clears the calling thread's current task (does not release it). */
    public void detach() {
        TaskTable.detach();
    }

    /** The calling thread's current task; throws if there is none or it was released. */
    public TaskScope currentTask() {
        return tasks.currentTask();
    }

    /** The thread's live current task, or null (no task bound, or released). */
    TaskScope currentTaskOrNull() {
        return tasks.currentTaskOrNull();
    }

    /** The current task's stream handle, cached per task attempt: never a call into Python. */
    public long stream() {
        return currentTask().stream();
    }

    /** Bound tasks, by id, as this Java API knows them. */
    public int tasksBound() {
        return tasks.size();
    }

    // --- memory (DeviceMemory) ------------------------------------------------------------------

    /** {@code bytes} of device memory for the current task, ordered on its stream. */
    public DeviceBuffer allocate(long bytes) {
        return memory.allocate(bytes);
    }

    /** Frees many buffers in one call into Python (each as {@link DeviceBuffer#close()} would).
     *  Closed and dead buffers are skipped; returns how many were freed. */
    public int free(DeviceBuffer... buffers) {
        return memory.free(buffers);
    }

    /** As {@link #free(DeviceBuffer...)}. */
    public int free(Collection<DeviceBuffer> buffers) {
        Objects.requireNonNull(buffers, "free: buffers");
        return memory.free(buffers.toArray(new DeviceBuffer[0]));
    }

    /** Page-locks {@code bytes} of off-heap memory Java owns at {@code address} ({@code cudaHostRegister})
     *  until the registration is closed: copies from and to it may then be asynchronous
     *  ({@link DeviceBuffer#copyFromAddressAsync}, {@link DeviceBuffer#copyToAddressAsync}). The
     *  address is not checked (a wrong one crashes the JVM); a range overlapping a registered or
     *  pinned one is refused. */
    public HostRegistration registerHost(long address, long bytes) {
        return memory.registerHost(address, bytes);
    }

    /** Page-locked host memory (a direct ByteBuffer in native order) for asynchronous copies
     *  ({@link DeviceBuffer#copyFromAsync}, {@link DeviceBuffer#copyToAsync}). */
    public PinnedBuffer allocatePinned(long bytes) {
        return memory.allocatePinned(bytes);
    }

    /** Blocks until the current task's stream has run everything queued on it. */
    public void synchronize() {
        memory.synchronize();
    }

    // --- user kernels (CudaModule) --------------------------------------------------------------

    /** Loads a module on the current task's GPU (or finds it in the executor's cache: each distinct
     *  source is loaded once per GPU); a compile error is a {@link CudaBridgeException} with the log. */
    public CudaModule loadModule(ModuleSource source) {
        return loadModule(source, currentTask().gpu());
    }

    /** Loads a module on GPU {@code gpu} (a CUDA ordinal this executor owns). */
    public CudaModule loadModule(ModuleSource source, int gpu) {
        java.util.Objects.requireNonNull(source, "loadModule: source");
        checkRunning("loadModule");
        return new CudaModule(this, control().loadModule(source.toJson(gpu), source.binary()), gpu);
    }

    // --- Python functions (PythonFunction) -------------------------------------------------------

    /** The Python function {@code "package.module:function"} names, imported once per executor from
     *  the executor's Python path; see {@link PythonFunction}. */
    public PythonFunction pythonFunction(String reference) {
        return pythonFunction(reference, List.of());
    }

    /** As {@link #pythonFunction(String)}, with folders or zip files added to Python's path first
     *  (the files Spark ships with the job); each must belong to the executor's user (or root) and
     *  be writable by its owner alone. */
    public PythonFunction pythonFunction(String reference, List<String> searchPaths) {
        Objects.requireNonNull(reference, "pythonFunction: reference");
        Objects.requireNonNull(searchPaths, "pythonFunction: searchPaths");
        String key = reference + "\0" + String.join("\0", searchPaths);
        PythonFunction f = functions.get(key);
        if (f == null) {
            checkRunning("pythonFunction");
            long id = control().pythonFunction(reference, searchPaths.toArray(new String[0]));
            PythonFunction made = new PythonFunction(this, id, reference);
            f = functions.putIfAbsent(key, made);
            f = f != null ? f : made;
        }
        return f;
    }

    /** A function pickled on the driver by {@code cudabridge.functions.pickle_function} (PySpark's
     *  {@code map_batches} does), loaded once per distinct bytes; refused when it was pickled by
     *  another Python version. */
    public PythonFunction pythonFunction(byte[] pickled) {
        Objects.requireNonNull(pickled, "pythonFunction: pickled");
        String key;
        try {
            key = "pickle:" + java.util.HexFormat.of().formatHex(
                    java.security.MessageDigest.getInstance("SHA-256").digest(pickled));
        } catch (java.security.NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is missing from this JVM", e);
        }
        PythonFunction f = functions.get(key);
        if (f == null) {
            checkRunning("pythonFunction");
            long id = control().pickledFunction(pickled);
            PythonFunction made = new PythonFunction(this, id, "a pickled function");
            f = functions.putIfAbsent(key, made);
            f = f != null ? f : made;
        }
        return f;
    }

    DeviceMemory memory() {
        return memory;
    }

    // --- statistics and lifetime ----------------------------------------------------------------

    /** Every key {@link #statistics()} holds, known without Python ({@link BridgeStatistics#names()}). */
    public static List<String> statisticsNames() {
        return BridgeStatistics.names();
    }

    /** Executor-level numbers ({@link BridgeStatistics}): one snapshot, for metric gauges (poll it,
     *  say, once a second rather than per gauge). */
    public Map<String, Long> statistics() {
        checkRunning("statistics");
        return BridgeStatistics.snapshot(control().statistics(), tasks.size());
    }

    /** Python thread states: in the interpreter, created by the bridge, deleted by it. */
    public static ThreadStates threadStates() {
        return NativeBridge.threadStates();
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

    /** Closes the service: every task is released, streams drained, memory returned. Python stays
     *  up (it is never finalized in a JVM); the bridge cannot be started again in this JVM. */
    public void shutdown() {
        synchronized (Launcher.lock()) {
            if (shutDown) {
                return;
            }
            shutDown = true;
            tasks.markAllReleased();
            control().shutdown();
        }
    }
}
