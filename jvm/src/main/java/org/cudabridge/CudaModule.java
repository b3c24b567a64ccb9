package org.cudabridge;

import java.util.Objects;

/** A module loaded through the bridge ({@link CudaBridge#loadModule}): cached per executor and GPU. */
public final class CudaModule {
    private final CudaBridge bridge;
    private final long id;
    private final int gpu;

    CudaModule(CudaBridge bridge, long id, int gpu) {
        this.bridge = bridge;
        this.id = id;
        this.gpu = gpu;
    }

    /** The CUDA ordinal of the GPU the module is loaded on. */
    public int gpu() {
        return gpu;
    }

    /** A {@code __constant__} or {@code __device__} variable of the module by name (one call into
     *  Python); a C++ name (not {@code extern "C"}, or in a namespace) needs the name expression
     *  {@code "&name"} at load ({@link ModuleSource#nameExpression}). */
    public DeviceGlobal global(String name) {
        Objects.requireNonNull(name, "global: name");
        if (name.isEmpty()) {
            throw new IllegalArgumentException("global: the name is empty");
        }
        bridge.checkRunning("global");
        long[] reply = bridge.control().globalVariable(id, name);
        return new DeviceGlobal(bridge, id, name, reply[0], reply[1], gpu);
    }

    /** A kernel of the module by name (a C++ name expression for a template); one call into Python. */
    public CudaKernel kernel(String name) {
        Objects.requireNonNull(name, "kernel: name");
        bridge.checkRunning("kernel");
        String reply = bridge.control().kernel(id, name);
        int semi = reply.indexOf(';');
        String kinds = reply.substring(semi + 1);
        return new CudaKernel(bridge, name, Long.parseLong(reply.substring(0, semi)), gpu,
                kinds.isEmpty() ? new String[0] : kinds.split(","));
    }
}
