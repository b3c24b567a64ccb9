package org.cudabridge;

import java.util.List;

/**
 * A kernel of a {@link CudaModule}, launched on the current task's stream:
 * {@code kernel.launch(LaunchConfig.grid(n / 256).block(256), x, y, n, 2.0f)}.
 *
 * <p>Arguments by parameter kind: {@code ptr} a {@link DeviceBuffer} (its address) or
 * {@code buffer.at(offset)}; {@code i32} an {@link Integer}, {@code i64} a {@link Long},
 * {@code f32} a {@link Float}, {@code f64} a {@link Double}, {@code bool} a {@link Boolean},
 * {@code i16} a {@link Short}, {@code i8} a {@link Byte}. The count and the kinds are checked in
 * Java before anything crosses into Python; the buffers (live, the task's own, on its GPU) and the
 * launch itself are checked there, and the launch is queued under the task guard: no kernel of a
 * task is queued once its release has begun.
 */
public final class CudaKernel {
    /** The parameter kinds, a kind's code its index: device/params.py's PARAM_KINDS, which the build
     *  writes into the jar (BuildTables). */
    static final List<String> KINDS = BuildTables.lines(BuildTables.PARAM_KINDS);

    private final CudaBridge bridge;
    private final String name;
    private final long id;
    private final int gpu;
    private final byte[] kinds;

    CudaKernel(CudaBridge bridge, String name, long id, int gpu, String[] signature) {
        this.bridge = bridge;
        this.name = name;
        this.id = id;
        this.gpu = gpu;
        this.kinds = new byte[signature.length];
        for (int i = 0; i < signature.length; i++) {
            int code = KINDS.indexOf(signature[i].strip());
            if (code < 0) {
                throw new IllegalStateException("kernel " + name + ": unknown parameter kind " + signature[i]);
            }
            kinds[i] = (byte) code;
        }
    }

    public String name() {
        return name;
    }

    /** The parameter kinds, in order. */
    public List<String> signature() {
        String[] out = new String[kinds.length];
        for (int i = 0; i < kinds.length; i++) {
            out[i] = KINDS.get(kinds[i]);
        }
        return List.of(out);
    }

    /** Queues the kernel on the current task's stream; returns once it is queued. */
    public void launch(LaunchConfig config, Object... args) {
        if (config == null || args == null) {
            throw new NullPointerException("launch: config and args are required");
        }
        if (args.length != kinds.length) {
            throw new IllegalArgumentException("launch: kernel " + name + " takes " + kinds.length + " argument(s) "
                    + signature() + ", got " + args.length);
        }
        long[] values = new long[args.length];
        long[] offsets = new long[args.length];
        for (int i = 0; i < args.length; i++) {
            Object a = args[i];
            String kind = KINDS.get(kinds[i]);
            if (a == null) {
                throw new NullPointerException("launch: kernel " + name + " argument " + i + " (" + kind + ") is null");
            }
            switch (kind) {
                case "ptr" -> {
                    DeviceBuffer.Pointer p = a instanceof DeviceBuffer b ? b.at(0) : a instanceof DeviceBuffer.Pointer q ? q : null;
                    if (p == null) {
                        throw refused(i, kind, a);
                    }
                    p.buffer().check("launch");
                    values[i] = p.buffer().handle();
                    offsets[i] = p.offset();
                }
                case "i8" -> values[i] = a instanceof Byte v ? v : refusedLong(i, kind, a);
                case "i16" -> values[i] = a instanceof Short v ? v : refusedLong(i, kind, a);
                case "i32" -> values[i] = a instanceof Integer v ? v : refusedLong(i, kind, a);
                case "i64" -> values[i] = a instanceof Long v ? v : refusedLong(i, kind, a);
                case "f32" -> values[i] = a instanceof Float v ? Float.floatToRawIntBits(v) & 0xFFFFFFFFL : refusedLong(i, kind, a);
                case "f64" -> values[i] = a instanceof Double v ? Double.doubleToRawLongBits(v) : refusedLong(i, kind, a);
                case "bool" -> values[i] = a instanceof Boolean v ? (v ? 1 : 0) : refusedLong(i, kind, a);
                default -> throw new IllegalStateException(kind);
            }
        }
        TaskScope task = bridge.currentTask();
        if (task.gpu() != gpu) {
            throw new IllegalStateException("launch: kernel " + name + " is loaded on GPU " + gpu + ", task "
                    + task.taskAttemptId() + " runs on GPU " + task.gpu());
        }
        bridge.checkRunning("launch");
        NativeBridge.launch(task.taskAttemptId(), id, config.dims(), config.sharedBytes(), values, kinds, offsets);
    }

    private IllegalArgumentException refused(int i, String kind, Object a) {
        return new IllegalArgumentException("launch: kernel " + name + " argument " + i + " (" + kind + ") cannot be a "
                + a.getClass().getSimpleName() + " (" + a + ")");
    }

    private long refusedLong(int i, String kind, Object a) {
        throw refused(i, kind, a);
    }
}
