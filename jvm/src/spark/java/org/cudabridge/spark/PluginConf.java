package org.cudabridge.spark;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.TreeMap;

import org.cudabridge.CudaBridge;

/**
 * The plugin's own configuration keys (all under {@code spark.cudabridge.}), with their defaults,
 * and how a Spark configuration becomes {@link CudaBridge.Options}.
 *
 * <p>The service keys ({@code backend}, {@code streams_per_gpu}, {@code stream_policy},
 * {@code pool_limit}, {@code pool_initial}, {@code log_level}, ...) are passed to the Python
 * service as they are; {@code python -m cudabridge config} lists them. The keys here are read by
 * the plugin itself. No Spark class is used: the Java harness (no Spark) shares this code.
 */
public final class PluginConf {
    public static final String PREFIX = "spark.cudabridge.";

    /** The Python executable of the virtual environment the executor starts (default: the one the
     *  bridge library was built for, from {@code cudabridge-native.properties}; then {@code CUDABRIDGE_PYTHON}). */
    public static final String PYTHON = PREFIX + "python";
    /** Extra {@code sys.path} entries, separated by ':' (default: the build's package directory). */
    public static final String PYTHON_PATH = PREFIX + "pythonPath";
    /** Path of {@code libcudabridge_jni.so} (default: beside {@code cudabridge.jar}). */
    public static final String LIBRARY = PREFIX + "library";
    /** Name of the GPU resource in Spark's resource scheduling (default {@code gpu}). */
    public static final String GPU_RESOURCE = PREFIX + "gpuResource";
    /** Stream priority of task streams: {@code normal} or {@code high} (default {@code normal}). */
    public static final String TASK_PRIORITY = PREFIX + "taskPriority";
    /** Release ended tasks on the executor's release thread (true) or on the task's thread (false). */
    public static final String ASYNC_RELEASE = PREFIX + "asyncRelease";
    /** When a starting task is bound in Python: lazy (at its first GPU call), ahead (on the
     *  lifecycle thread, before its first GPU call if it can), eager (in onTaskStart). */
    public static final String TASK_BIND = PREFIX + "taskBind";
    /** How old (ms) a statistics snapshot may be when a metrics sink reads the gauges (default 500). */
    public static final String METRICS_REFRESH_MS = PREFIX + "metrics.refreshMs";
    /** How often (ms) each executor sends its statistics to the driver plugin; 0: never (default 1000). */
    public static final String REPORT_INTERVAL_MS = PREFIX + "reportIntervalMs";

    /** Every plugin key with its default and meaning, for the README and {@code --help} texts. */
    public static final Map<String, String[]> KEYS;

    static {
        Map<String, String[]> m = new LinkedHashMap<>();
        m.put(PYTHON, new String[] {"(build's python)", "Python executable of the venv started inside the executor JVM"});
        m.put(PYTHON_PATH, new String[] {"(build's package dir)", "extra sys.path entries, ':'-separated"});
        m.put(LIBRARY, new String[] {"(beside cudabridge.jar)", "path of libcudabridge_jni.so"});
        m.put(GPU_RESOURCE, new String[] {"gpu", "Spark resource name whose addresses are the executor's and task's GPUs"});
        m.put(TASK_PRIORITY, new String[] {"normal", "stream priority of task streams: normal or high"});
        m.put(ASYNC_RELEASE, new String[] {"true", "release ended tasks on the executor's lifecycle thread (off the task's path); false: on the task's thread"});
        m.put(TASK_BIND, new String[] {"lazy", "when a task is bound to a stream in Python: lazy (at its first GPU call, on its thread; a task that never uses the GPU is never bound), ahead (on the lifecycle thread within 20 ms, ahead of its first GPU call), eager (in onTaskStart, on its thread)"});
        m.put(METRICS_REFRESH_MS, new String[] {"500", "most age (ms) of the statistics snapshot behind the gauges"});
        m.put(REPORT_INTERVAL_MS, new String[] {"1000", "period (ms) of each executor's statistics report to the driver; 0 disables"});
        KEYS = Collections.unmodifiableMap(m);
    }

    private final Map<String, String> entries;

    /** @param entries a Spark configuration's entries (only {@code spark.cudabridge.*} are kept) */
    public PluginConf(Map<String, String> entries) {
        TreeMap<String, String> m = new TreeMap<>();
        for (Map.Entry<String, String> e : entries.entrySet()) {
            if (e.getKey().startsWith(PREFIX) && e.getValue() != null) {
                m.put(e.getKey(), e.getValue());
            }
        }
        this.entries = Collections.unmodifiableMap(m);
    }

    public Map<String, String> entries() { return entries; }

    public String get(String key) { return entries.get(key); }

    public String get(String key, String dflt) {
        String v = entries.get(key);
        return v == null || v.isEmpty() ? dflt : v;
    }

    public long getLong(String key, long dflt) {
        String v = get(key, null);
        if (v == null) {
            return dflt;
        }
        try {
            long x = Long.parseLong(v.trim());
            if (x < 0) {
                throw new NumberFormatException("negative");
            }
            return x;
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(key + "=" + v + ": expected a non-negative integer");
        }
    }

    public String gpuResource() { return get(GPU_RESOURCE, "gpu"); }

    public String taskPriority() {
        String p = get(TASK_PRIORITY, "normal");
        if (!p.equals("normal") && !p.equals("high")) {
            throw new IllegalArgumentException(TASK_PRIORITY + "=" + p + ": expected normal or high");
        }
        return p;
    }

    public boolean asyncRelease() { return getBoolean(ASYNC_RELEASE, true); }

    public String taskBind() {
        String v = get(TASK_BIND, "lazy").trim();
        if (!v.equals("lazy") && !v.equals("ahead") && !v.equals("eager")) {
            throw new IllegalArgumentException(TASK_BIND + "=" + v + ": expected lazy, ahead or eager");
        }
        return v;
    }

    private boolean getBoolean(String key, boolean dflt) {
        String v = get(key, Boolean.toString(dflt)).trim();
        if (!v.equalsIgnoreCase("true") && !v.equalsIgnoreCase("false")) {
            throw new IllegalArgumentException(key + "=" + v + ": expected true or false");
        }
        return Boolean.parseBoolean(v);
    }

    public long metricsRefreshMs() { return getLong(METRICS_REFRESH_MS, 500); }

    public long reportIntervalMs() { return getLong(REPORT_INTERVAL_MS, 1000); }

    /** Checks every plugin key that has a fixed form; throws IllegalArgumentException naming the key. */
    public void validate() {
        taskPriority();
        asyncRelease();
        taskBind();
        metricsRefreshMs();
        reportIntervalMs();
    }

    /**
     * The bridge's start options: the Python environment and library from the plugin keys, and
     * every {@code spark.cudabridge.*} entry for the service. {@code gpuAddresses} (the
     * executor's GPU resource addresses, may be null) becomes {@code gpu_addresses} unless that
     * key is set explicitly.
     */
    public CudaBridge.Options toOptions(String[] gpuAddresses) {
        CudaBridge.Options o = new CudaBridge.Options();
        String python = get(PYTHON);
        if (python != null && !python.isEmpty()) {
            o.python(python);
        }
        String library = get(LIBRARY);
        if (library != null && !library.isEmpty()) {
            o.library(library);
        }
        String path = get(PYTHON_PATH);
        if (path != null) {
            for (String entry : path.split(":")) {
                if (!entry.isEmpty()) {
                    o.addPythonPath(entry);
                }
            }
        }
        Map<String, String> service = new TreeMap<>();
        for (Map.Entry<String, String> e : entries.entrySet()) {
            String k = e.getKey();
            if (!KEYS.containsKey(k)) {
                service.put(k, e.getValue());
            }
        }
        if (gpuAddresses != null && gpuAddresses.length > 0 && !service.containsKey(PREFIX + "gpu_addresses")
                && !service.containsKey(PREFIX + "gpuAddresses")) {
            service.put(PREFIX + "gpu_addresses", String.join(",", gpuAddresses));
        }
        o.setAll(service);
        return o;
    }
}
