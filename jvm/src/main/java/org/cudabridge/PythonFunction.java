package org.cudabridge;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;

/**
 * A Python function in the executor's interpreter, called for the current task:
 * {@code bridge.pythonFunction("mypkg.transforms:scale").call(buffer.asArray(DType.FLOAT32), 2.0)}.
 *
 * <p>A call is one JNI call on the calling thread: the function runs inside the task's guard (no
 * call runs once the task's release has begun; a release waits for calls in progress), with the
 * task's stream as CuPy's and PyTorch's current stream and the allocator plug-ins giving its
 * temporaries to the task; the GIL is held only while Python runs. All tasks share one
 * interpreter: functions must be thread-safe, and Python code runs one thread at a time.
 *
 * <p>Arguments: {@code null}, {@link Long}, {@link Integer}, {@link Short}, {@link Byte} (a Python
 * int), {@link Double}, {@link Float} (a float), {@link Boolean}, {@link String}, {@code byte[]}
 * (bytes, copied), a direct {@link ByteBuffer} (a memoryview over its memory, from 0 to its capacity,
 * valid during the call only; read-only if the buffer is), a {@link DeviceArray} of the task's own
 * buffer ({@link DeviceBuffer#asArray}: a CuPy array over the same memory on a GPU, a torch tensor
 * with {@link DeviceArray#asTorch()}, a numpy array on the emulated device), or a
 * {@link DeviceBuffer} (a one-dimensional uint8 array over it).
 *
 * <p>Results: {@code null}, {@link Long}, {@link Double}, {@link Boolean}, {@link String},
 * {@code byte[]}, a {@link DeviceArray} over a new buffer owned by the task (close it when done, or
 * the task's release reclaims it), or a {@link List} of those for a Python list or tuple.
 *
 * <p>A Python exception becomes a {@link FunctionFailedException} with the Python type and
 * traceback; the service's own errors keep their types ({@link GpuOutOfMemoryException},
 * {@link UnknownTaskException}). Bad arguments are refused with {@link IllegalArgumentException}
 * before anything crosses into Python.
 */
public final class PythonFunction {
    // Argument kinds: bridge/function_calls.h's ARG_* codes, same order.
    static final byte ARG_NULL = 0, ARG_LONG = 1, ARG_DOUBLE = 2, ARG_BOOL = 3, ARG_STRING = 4, ARG_BYTES = 5,
            ARG_DIRECT = 6, ARG_ARRAY = 7;
    /** The most arguments one call takes (the native's bound). */
    public static final int MAX_ARGUMENTS = 256;

    private final CudaBridge bridge;
    private final long id;
    private final String name;
    private final Map<String, PythonFunction> overBatches = new ConcurrentHashMap<>();

    PythonFunction(CudaBridge bridge, long id, String name) {
        this.bridge = bridge;
        this.id = id;
        this.name = name;
    }

    /** The reference it was resolved by ({@code "package.module:function"}), or a description. */
    public String name() {
        return name;
    }

    /** Calls the function for the current task, on its thread; returns its result (class comment). */
    public Object call(Object... args) {
        Objects.requireNonNull(args, "call: args (pass no arguments, not null)");
        if (args.length > MAX_ARGUMENTS) {
            throw new IllegalArgumentException("call: at most " + MAX_ARGUMENTS + " arguments, got " + args.length);
        }
        TaskScope task = bridge.currentTask();
        int n = args.length;
        Scratch s = SCRATCH.get().fit(n);
        Object result;
        try {
            for (int i = 0; i < n; i++) {
                encode(i, args[i], task, s.kinds, s.values, s.refs);
            }
            bridge.checkRunning("call");
            s.scalar[0] = -1;
            result = NativeBridge.callFunction(task.taskAttemptId(), id, n, s.kinds, s.values, s.refs, s.scalar);
        } catch (RuntimeException e) {
            throw bridge.shutDownOr("call", e);
        } finally {
            java.util.Arrays.fill(s.refs, 0, n, null);   // keep no argument alive past the call
        }
        if (result == null) {   // a scalar, boxed here
            long bits = s.scalar[1];
            switch ((int) s.scalar[0]) {
                case RES_LONG: return bits;
                case RES_DOUBLE: return Double.longBitsToDouble(bits);
                case RES_BOOL: return bits != 0;
                default: return null;
            }
        }
        return toJava(result, task);
    }

    // Scalar result kinds (bridge/function_calls.h's RES_* codes)
    private static final int RES_LONG = 1, RES_DOUBLE = 2, RES_BOOL = 3;

    /** The calling thread's argument arrays, reused from call to call (no allocation per call). */
    private static final class Scratch {
        byte[] kinds = new byte[8];
        long[] values = new long[8];
        Object[] refs = new Object[8];
        final long[] scalar = new long[2];

        Scratch fit(int n) {
            if (n > kinds.length) {
                kinds = new byte[n];
                values = new long[n];
                refs = new Object[n];
            }
            return this;
        }
    }

    private static final ThreadLocal<Scratch> SCRATCH = ThreadLocal.withInitial(Scratch::new);

    /**
     * This function over column batches: the returned function takes one array per input column
     * (in {@code inputs} order), calls this one with a dict of them by name, and returns the
     * output columns' arrays in {@code outputs} order, each checked (present, one-dimensional, of
     * its {@link DType}, all of one length). Kept per executor.
     */
    public PythonFunction overBatches(List<String> inputs, List<String> outputs, List<DType> types) {
        Objects.requireNonNull(inputs, "overBatches: inputs");
        Objects.requireNonNull(outputs, "overBatches: outputs");
        Objects.requireNonNull(types, "overBatches: types");
        if (outputs.size() != types.size()) {
            throw new IllegalArgumentException("overBatches: one DType per output column");
        }
        String key = inputs + "->" + outputs + types;
        PythonFunction found = overBatches.get(key);
        if (found != null) {
            return found;
        }
        bridge.checkRunning("overBatches");
        String[] dtypes = types.stream().map(DType::pythonName).toArray(String[]::new);
        long batchId = bridge.control().batchFunction(id, inputs.toArray(new String[0]), outputs.toArray(new String[0]),
                dtypes);
        PythonFunction made = new PythonFunction(bridge, batchId, "batches of " + name);
        found = overBatches.putIfAbsent(key, made);
        return found != null ? found : made;
    }

    private void encode(int i, Object a, TaskScope task, byte[] kinds, long[] values, Object[] refs) {
        if (a == null) {
            kinds[i] = ARG_NULL;
        } else if (a instanceof Long || a instanceof Integer || a instanceof Short || a instanceof Byte) {
            kinds[i] = ARG_LONG;
            values[i] = ((Number) a).longValue();
        } else if (a instanceof Double || a instanceof Float) {
            kinds[i] = ARG_DOUBLE;
            values[i] = Double.doubleToRawLongBits(((Number) a).doubleValue());
        } else if (a instanceof Boolean b) {
            kinds[i] = ARG_BOOL;
            values[i] = b ? 1 : 0;
        } else if (a instanceof String) {
            kinds[i] = ARG_STRING;
            refs[i] = a;
        } else if (a instanceof byte[]) {
            kinds[i] = ARG_BYTES;
            refs[i] = a;
        } else if (a instanceof ByteBuffer b) {
            if (!b.isDirect()) {
                throw new IllegalArgumentException("call: argument " + i + " is a heap ByteBuffer: pass a direct one, or "
                        + "its bytes as a byte[]");
            }
            kinds[i] = ARG_DIRECT;
            values[i] = b.isReadOnly() ? 1 : 0;
            refs[i] = b;
        } else if (a instanceof DeviceArray arr) {
            array(i, arr, task, kinds, values, refs);
        } else if (a instanceof DeviceBuffer buf) {
            array(i, buf.asArray(DType.UINT8), task, kinds, values, refs);
        } else {
            throw new IllegalArgumentException("call: argument " + i + " of " + name + " is a " + a.getClass().getName()
                    + "; a function takes null, a number, a Boolean, a String, a byte[], a direct ByteBuffer, a "
                    + "DeviceArray or a DeviceBuffer");
        }
    }

    private void array(int i, DeviceArray arr, TaskScope task, byte[] kinds, long[] values, Object[] refs) {
        DeviceBuffer buf = arr.buffer();
        buf.check("call");
        if (buf.taskAttemptId() != task.taskAttemptId()) {
            throw new IllegalArgumentException("call: argument " + i + " is a buffer of task " + buf.taskAttemptId()
                    + ", not of the calling task " + task.taskAttemptId());
        }
        long[] shape = arr.shape();
        long[] desc = new long[3 + shape.length];
        desc[0] = arr.offset();
        desc[1] = arr.dtype().code();
        desc[2] = arr.isTorch() ? 1 : 0;
        System.arraycopy(shape, 0, desc, 3, shape.length);
        kinds[i] = ARG_ARRAY;
        values[i] = buf.handle();
        refs[i] = desc;
    }

    private Object toJava(Object r, TaskScope task) {
        if (r instanceof long[] desc) {   // a device array: {handle, pointer, bytes, dtype, dims...}
            DeviceBuffer buffer = bridge.memory().adopt(task, desc[0], desc[1], desc[2]);
            long[] shape = java.util.Arrays.copyOfRange(desc, 4, desc.length);
            return new DeviceArray(buffer, 0, DType.ofCode(desc[3]), shape, false);
        }
        if (r instanceof Object[] many) {
            List<Object> out = new ArrayList<>(many.length);
            for (Object o : many) {
                out.add(toJava(o, task));
            }
            return Collections.unmodifiableList(out);
        }
        return r;
    }

    @Override
    public String toString() {
        return "PythonFunction[" + name + "]";
    }
}
