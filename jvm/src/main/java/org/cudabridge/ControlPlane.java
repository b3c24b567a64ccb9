package org.cudabridge;

import java.util.Map;

/**
 * The control path into the Python service, implemented in Python with JPype's
 * {@code @JImplements} (python/cudabridge/jvm/control.py) and installed by the bootstrap through
 * {@link NativeBridge#installControl}. Calls are rare (per metrics poll, per attach); the per-call
 * hot path and the task lifecycle (bind, release) go through {@link NativeBridge}'s JNI natives
 * instead. Every Python error arrives as
 * a {@link CudaBridgeException} (or {@link GpuOutOfMemoryException}) with the Python message.
 *
 * <p>Not for task code: use {@link CudaBridge}.
 */
public interface ControlPlane {
    /** The stream and GPU of a task bound elsewhere (by Python code, say). */
    StreamBinding lookupTask(long taskAttemptId);

    /** Executor-level numbers: pool totals, streams, tasks, and the bridge's own counters. */
    Map<String, Long> statistics();

    /** The sticky CUDA error that made a GPU of this executor unusable, or null (probes each GPU once
     *  with a cheap call until one is found). */
    String deviceError();

    /** Page-locks off-heap memory Java owns ({@code cudaHostRegister}); refused when it overlaps a
     *  registered or pinned range. */
    void registerHost(long address, long bytes);

    /** Undoes {@link #registerHost} of the region starting at {@code address}, on a thread bound to
     *  {@code task} (0: none), whose copies into the range are refused from then on. */
    void unregisterHost(long address, long task);

    /** JSON: the Python, its prefix, the backend and the GPUs. */
    String describe();

    /** Calls {@code cudabridge.jvm.tools.<name>} with JSON keyword arguments; returns JSON. */
    String callTool(String name, String argsJson);

    /** Loads a module (JSON from {@link ModuleSource}; {@code binary}: a cubin's bytes, else null),
     *  or finds it in the executor's cache; returns its id. */
    long loadModule(String specJson, byte[] binary);

    /** {@code "<kernel id>;<kind>,<kind>,..."}: a module's kernel, registered for launches from Java. */
    String kernel(long moduleId, String name);

    /** {@code {address, size}} of a module's {@code __constant__} or {@code __device__} variable. */
    long[] globalVariable(long moduleId, String name);

    /** Copies {@code data} into a module's global from byte {@code offset}, on the task's stream
     *  (staged before it returns). */
    void copyToGlobal(long taskAttemptId, long moduleId, String name, long offset, byte[] data);

    /** {@code length} bytes of a module's global from byte {@code offset}, copied on the task's
     *  stream after its queued work; complete on return. */
    byte[] copyFromGlobal(long taskAttemptId, long moduleId, String name, long offset, int length);

    /** The id of the Python function {@code "package.module:function"} names, imported once per
     *  executor; {@code searchPaths}: folders or zip files added to Python's path first (each must be
     *  the executor user's and writable by that user alone). */
    long pythonFunction(String reference, String[] searchPaths);

    /** The id of a function pickled by {@code cudabridge.functions.pickle_function} (loaded once per bytes). */
    long pickledFunction(byte[] payload);

    /** The id of function {@code functionId} over column batches: it takes a dict of the input
     *  columns' arrays and returns a dict with the output columns (names and element types). */
    long batchFunction(long functionId, String[] inputs, String[] outputs, String[] dtypes);

    /** A task gave back what it held after the deadlock breaker failed it: waiters re-check now. */
    void memoryReturned();

    /** The task is a retried attempt: its admission goes ahead of first attempts waiting. */
    void retriedAttempt(long taskAttemptId);

    /** The task was killed: its waits for memory and for admission end at once (UnknownTask). */
    void cancelWaits(long taskAttemptId);

    /** Closes the service (Python stays up); returns the tasks it released. */
    long shutdown();
}
