package org.cudabridge;

import java.nio.ByteBuffer;
import java.nio.file.Paths;

/**
 * The JNI natives of {@code libcudabridge_jni.so} (bridge/cudabridge_jni.c), and the slot where
 * the Python bootstrap installs the control plane.
 *
 * <p>Internal: task code uses {@link CudaBridge} and {@link DeviceBuffer}, which check every
 * argument in Java first. These methods check only what the C side must (null arrays, array and
 * ByteBuffer bounds, a started bridge); handles are checked by Python, which refuses any handle
 * that is not live. They are public so that tests can reach Python's own checks, and so that
 * JPype can call {@link #installControl}.
 *
 * <p>Each native takes the calling thread's kept Python thread state (created on the thread's
 * first call, deleted when the thread ends), calls one cached bound method of the Python
 * {@code JavaHotPath} and releases the GIL before throwing anything.
 */
public final class NativeBridge {
    private static volatile String loadedLibrary;
    private static volatile ControlPlane control;

    private NativeBridge() {}

    /** Loads the bridge library (once per JVM; a second call with another path is refused),
     *  after {@link LibraryCheck} found the file sound ({@code recorded}: what the build recorded
     *  for it, or null). */
    static synchronized void load(String path, LibraryCheck.Recorded recorded) {
        if (loadedLibrary != null) {
            if (!loadedLibrary.equals(path)) {
                throw new IllegalStateException("cudabridge: the bridge library " + loadedLibrary
                        + " is loaded already; cannot load " + path + " as well");
            }
            return;
        }
        // Bad values are refused before anything is loaded (types, ranges and defaults: the settings table).
        long holdNanos = Settings.intProperty(SettingsTable.GATE_HOLD_MICROS_PROPERTY) * 1000;
        boolean gate = Settings.boolProperty(SettingsTable.GATE_PROPERTY);
        LibraryCheck.verify(Paths.get(path), recorded);
        System.load(path);
        nativeInit();
        configureGate(gate, holdNanos);
        loadedLibrary = path;
    }

    static String loadedLibrary() {
        return loadedLibrary;
    }

    /** Called by the Python bootstrap (through JPype) with the control plane's proxy. */
    public static void installControl(ControlPlane plane) {
        if (plane == null) {
            throw new NullPointerException("installControl: null control plane");
        }
        synchronized (NativeBridge.class) {
            if (control != null && control != plane) {
                throw new IllegalStateException("cudabridge: a control plane is installed already");
            }
            control = plane;
        }
    }

    static ControlPlane control() {
        return control;
    }

    static native void nativeInit();

    static native void configureGate(boolean enabled, long holdNanos);

    /** {@code out[0..3]} = {gate on (1) or off (0), hold interval in ns, hand-offs, sleeps of waiting threads}. */
    public static native void gateStats(long[] out);

    static native void startPython(String python, String[] pythonPath, String library, String confJson);

    /** Whether Python is up and the hot path's callables are cached. */
    public static native boolean isReady();

    /** Gives the calling thread a kept Python thread state now (JPype proxy calls from it are then
     *  "pinned": JPype no longer makes and drops a thread state per call, which costs several
     *  times the call and leaks native memory each time). */
    public static native void ensureThreadState();

    // The raw natives below fill long[] out-parameters (no object per call); the Java API uses
    // the wrappers after them, which return records.

    /** {@code out[0..2]} = {thread states in the interpreter, created by the bridge, deleted by it}. */
    public static native void threadStates(long[] out);

    /** Binds a task attempt: {@code out[0..1]} = {stream, GPU ordinal}. {@code gpuAddress} may be
     *  null when the executor owns one GPU; {@code priority} is a {@link Priority#wire()} name. */
    public static native void bindTask(long taskAttemptId, String gpuAddress, String priority, long[] out);

    /** Releases a task (frees what it still holds): {@code out[0..1]} = {leaked allocations, leaked bytes}. */
    public static native void releaseTask(long taskAttemptId, long[] out);

    /** Releases {@code n} tasks in one call into Python: {@code out[2i..2i+1]} = task i's
     *  {leaked allocations, leaked bytes}, or {-1, -1} if its release failed. Returns null when
     *  every release succeeded, else {@code n} entries: task i's failure message, or null. */
    public static native String[] releaseTasks(long[] taskAttemptIds, int n, long[] out);

    static ThreadStates threadStates() {
        long[] out = new long[3];
        threadStates(out);
        return new ThreadStates(out[0], out[1], out[2]);
    }

    static StreamBinding bindTask(long taskAttemptId, String gpuAddress, Priority priority) {
        long[] out = new long[2];
        bindTask(taskAttemptId, gpuAddress, priority.wire(), out);
        return new StreamBinding(out[0], (int) out[1]);
    }

    static ReleaseReport releaseTask(long taskAttemptId) {
        long[] out = new long[2];
        releaseTask(taskAttemptId, out);
        return ReleaseReport.of(taskAttemptId, out[0], out[1]);
    }

    /** One report per task, in order; a task whose release failed gets a report that says why. */
    static ReleaseReport[] releaseTasks(long[] taskAttemptIds) {
        int n = taskAttemptIds.length;
        long[] out = new long[2 * n];
        String[] failures = releaseTasks(taskAttemptIds, n, out);
        ReleaseReport[] reports = new ReleaseReport[n];
        for (int i = 0; i < n; i++) {
            long id = taskAttemptIds[i];
            String why = failures == null ? null : failures[i];
            reports[i] = out[2 * i] >= 0 ? ReleaseReport.of(id, out[2 * i], out[2 * i + 1])
                    : ReleaseReport.failed(id, why != null ? why : "release failed");
        }
        return reports;
    }

    /** {@code out[0..1]} = {handle, device pointer}. */
    public static native void allocate(long taskAttemptId, long bytes, long[] out);

    /** {@code out[0..1]} = {stream, GPU ordinal} of a bound task. */
    public static native void taskStream(long taskAttemptId, long[] out);

    public static native void free(long handle);

    /** Frees {@code handles[0..count)} in one call; if any is not live, frees none. */
    public static native void freeMany(long[] handles, int count);

    public static native void memset(long handle, long offset, int value, long bytes);

    public static native void synchronize(long taskAttemptId);

    /** One user kernel on the task's stream ({@link CudaKernel#launch}): {@code dims} = grid then
     *  block (6), {@code values[i]} the argument as marshalled (a buffer's handle, a float's or
     *  double's raw bits), {@code kinds[i]} its kind code, {@code offsets[i]} a buffer argument's
     *  byte offset; all three of one length. */
    public static native void launch(long taskAttemptId, long kernel, int[] dims, long sharedBytes, long[] values,
                                     byte[] kinds, long[] offsets);

    public static native void copyDevice(long dstHandle, long dstOffset, long srcHandle, long srcOffset, long bytes);

    /** Calls Python function {@code function} for the task ({@link PythonFunction#call}) with {@code n}
     *  arguments, the first {@code n} entries of the arrays (longer arrays are reused): {@code kinds[i]}
     *  is argument i's kind (PythonFunction's ARG_* codes), {@code values[i]} its number (a long, a
     *  double's raw bits, a boolean as 0 or 1, a buffer's handle, a ByteBuffer's read-only flag) and
     *  {@code refs[i]} its object (a String, a byte[], a direct ByteBuffer, an array's
     *  {offset, dtype, framework, dims...}); returns the result as PythonFunction reads it, but a
     *  scalar one (null, long, double, boolean) comes back as {@code scalar[0..1]} = {kind (0 null, 1
     *  long, 2 double, 3 boolean), bits} with null returned (no object made in native code). */
    public static native Object callFunction(long taskAttemptId, long function, int n, byte[] kinds, long[] values,
                                             Object[] refs, long[] scalar);

    /** Calls the empty Python method: the bridge's own cost per call. */
    public static native void ping();

    /** Heap array (any primitive type; {@code elemSize} its element size) to device; staged, complete on return. */
    public static native void copyIn(long handle, long devOffset, Object array, long byteOffset, long bytes, int elemSize);

    /** Device to heap array; complete on return. */
    public static native void copyOut(long handle, long devOffset, Object array, long byteOffset, long bytes, int elemSize);

    /** Direct ByteBuffer to device; asynchronous on the buffer's stream when the memory is
     *  page-locked (the service's pinned buffers and host registrations, whichever front made
     *  them): returns true then (the caller waits for the stream, or keeps the memory unchanged
     *  until a synchronize), false when the copy was staged (complete for the host memory). */
    public static native boolean copyInDirect(long handle, long devOffset, ByteBuffer buffer, long bufOffset, long bytes);

    /** The buffer to a direct ByteBuffer; returns true when queued asynchronously, as {@link #copyInDirect}. */
    public static native boolean copyOutDirect(long handle, long devOffset, ByteBuffer buffer, long bufOffset, long bytes);

    /** The address of a direct ByteBuffer's memory (0 for a heap buffer). */
    public static native long address(ByteBuffer buffer);

    /** Off-heap memory at {@code address} (not checked: a wrong address crashes the JVM) to the
     *  buffer; returns true when queued asynchronously, as {@link #copyInDirect}. */
    public static native boolean copyInAddress(long handle, long devOffset, long address, long bytes);

    /** The buffer to off-heap memory at {@code address} (not checked); true when queued asynchronously. */
    public static native boolean copyOutAddress(long handle, long devOffset, long address, long bytes);

    /** Host memory from the pinned pool (or its fallbacks), owned by {@code task} (0: none);
     *  {@code pinnedOut[0]} says whether it is page-locked (false: the pageable fallback). */
    static native ByteBuffer allocPinned(long task, long bytes, boolean[] pinnedOut);

    static native void freePinned(ByteBuffer buffer);
}
