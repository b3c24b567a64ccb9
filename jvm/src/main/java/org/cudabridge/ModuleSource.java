package org.cudabridge;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * What a {@link CudaModule} is loaded from: CUDA C++ source (compiled at run time with NVRTC),
 * PTX text, or cubin bytes, with compile options, headers given as strings, C++ name expressions
 * (templates: NVRTC must be told before it compiles) and kernel signatures declared at load.
 * Python checks it all before anything loads; the executor loads each distinct source once per GPU.
 */
public final class ModuleSource {
    private final String kind;
    private final String code;
    private final byte[] binary;
    private final List<String> options = new ArrayList<>();
    private final Map<String, String> headers = new LinkedHashMap<>();
    private final List<String> nameExpressions = new ArrayList<>();
    private final Map<String, String> signatures = new LinkedHashMap<>();

    private ModuleSource(String kind, String code, byte[] binary) {
        this.kind = kind;
        this.code = code;
        this.binary = binary;
    }

    /** CUDA C++ source, compiled with NVRTC for the GPU's own architecture. */
    public static ModuleSource cuda(String source) {
        return new ModuleSource("cuda", Objects.requireNonNull(source, "cuda: source"), null);
    }

    /** PTX text, built ahead of time. */
    public static ModuleSource ptx(String ptx) {
        return new ModuleSource("ptx", Objects.requireNonNull(ptx, "ptx: text"), null);
    }

    /** cubin or fatbin bytes, built ahead of time with nvcc; its kernels need declared signatures. */
    public static ModuleSource cubin(byte[] image) {
        return new ModuleSource("cubin", null, Objects.requireNonNull(image, "cubin: image").clone());
    }

    public ModuleSource option(String option) {
        options.add(Objects.requireNonNull(option, "option"));
        return this;
    }

    public ModuleSource header(String includeName, String text) {
        headers.put(Objects.requireNonNull(includeName, "header name"), Objects.requireNonNull(text, "header text"));
        return this;
    }

    public ModuleSource nameExpression(String expression) {
        nameExpressions.add(Objects.requireNonNull(expression, "name expression"));
        return this;
    }

    /** A kernel's parameter kinds, comma-separated ({@code "ptr, ptr, i32, f32"}; see {@link CudaKernel}). */
    public ModuleSource signature(String kernel, String kinds) {
        signatures.put(Objects.requireNonNull(kernel, "kernel"), Objects.requireNonNull(kinds, "kinds"));
        return this;
    }

    byte[] binary() {
        return binary;
    }

    String toJson(int gpu) {
        StringBuilder sb = new StringBuilder("{\"gpu\":").append(gpu).append(",\"kind\":");
        JsonText.quote(sb, kind);
        if (code != null) {
            sb.append(",\"code\":");
            JsonText.quote(sb, code);
        }
        sb.append(",\"options\":");
        list(sb, options);
        sb.append(",\"nameExpressions\":");
        list(sb, nameExpressions);
        sb.append(",\"headers\":").append(JsonText.object(headers));
        sb.append(",\"signatures\":").append(JsonText.object(signatures));
        return sb.append('}').toString();
    }

    private static void list(StringBuilder sb, List<String> items) {
        sb.append('[');
        for (int i = 0; i < items.size(); i++) {
            if (i > 0) {
                sb.append(',');
            }
            JsonText.quote(sb, items.get(i));
        }
        sb.append(']');
    }
}
