package org.cudabridge.executor;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.TreeMap;

import org.cudabridge.BridgeOptions;
import org.cudabridge.Priority;
import org.cudabridge.Settings;
import org.cudabridge.SettingsTable;

/**
 * The plugin's own configuration keys (the settings table's plugin scope, all under
 * {@code spark.cudabridge.}) and how a Spark configuration becomes {@link BridgeOptions}.
 * Types, defaults and docs are the table's ({@link SettingsTable}, generated from it): none is
 * written here; the accessors read each value once, by its type.
 *
 * <p>The service keys ({@code backend}, {@code streamsPerGpu}, {@code poolLimit}, ...; the
 * table's service scope, {@code python -m cudabridge config} lists them) are passed to the Python
 * service as they are. No Spark class is used: the Java harness (no Spark) shares this code.
 */
public final class PluginConf {
    public static final String PREFIX = SettingsTable.PREFIX;

    /** The Python executable of the virtual environment each executor starts in-process. */
    public static final String PYTHON = SettingsTable.PYTHON.sparkKey();
    /** Extra {@code sys.path} entries, ':'-separated. */
    public static final String PYTHON_PATH = SettingsTable.PYTHON_PATH.sparkKey();
    /** Path of {@code libcudabridge_jni.so}. */
    public static final String LIBRARY = SettingsTable.LIBRARY.sparkKey();
    /** Spark resource name whose addresses are the executor's and each task's GPUs. */
    public static final String GPU_RESOURCE = SettingsTable.GPU_RESOURCE.sparkKey();
    /** Stream priority of task streams ({@link Priority}). */
    public static final String TASK_PRIORITY = SettingsTable.TASK_PRIORITY.sparkKey();
    /** Release ended tasks on the executor's lifecycle thread (true) or on the task's thread (false). */
    public static final String ASYNC_RELEASE = SettingsTable.ASYNC_RELEASE.sparkKey();
    /** When a starting task is bound in Python ({@link TaskBind}). */
    public static final String TASK_BIND = SettingsTable.TASK_BIND.sparkKey();
    /** Most age (ms) of the statistics snapshot behind the gauges. */
    public static final String METRICS_REFRESH_MS = SettingsTable.METRICS_REFRESH_MS.sparkKey();
    /** Period (ms) of each executor's statistics report to the driver plugin; 0 disables. */
    public static final String REPORT_INTERVAL_MS = SettingsTable.REPORT_INTERVAL_MS.sparkKey();
    /** Rows per batch of {@code GpuPython.mapBatches} (read on the driver when the plan is made). */
    public static final String PYTHON_BATCH_ROWS = SettingsTable.PYTHON_BATCH_ROWS.sparkKey();
    /** The service key {@link #toOptions} sets from the executor's GPU resource addresses unless it is set. */
    public static final String GPU_ADDRESSES = SettingsTable.GPU_ADDRESSES.sparkKey();

    /** The service key {@link #toOptions} sets from the executor's task slots unless it (or its
     *  variable) is set: as many staging slots per GPU as tasks can copy at once. */
    public static final String STAGING_COPIES = SettingsTable.STAGING_COPIES.sparkKey();

    /** Every plugin key (the table's plugin scope, in its order) with its default (or, in
     *  parentheses, how it is computed) and its meaning, for {@code --help} texts. */
    public static final Map<String, String[]> KEYS;

    static {
        Map<String, String[]> m = new LinkedHashMap<>();
        for (Settings.Setting s : Settings.scope("plugin")) {
            String dflt = s.defaultValue() != null ? s.defaultValue() : "(" + s.defaultDoc() + ")";
            m.put(s.sparkKey(), new String[] {dflt, s.doc()});
        }
        KEYS = Collections.unmodifiableMap(m);
    }

    private static final PluginConf DEFAULTS = new PluginConf(Collections.emptyMap());

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

    /** A configuration that sets nothing: every accessor returns the table's default. */
    public static PluginConf defaults() {
        return DEFAULTS;
    }

    public Map<String, String> entries() { return entries; }

    /** The value as set, or null. */
    public String get(String key) { return entries.get(key); }

    private Settings.Setting setting(String sparkKey) {
        Settings.Setting s = Settings.named(sparkKey);
        if (s == null) {
            throw new IllegalArgumentException(Settings.unknownKeyMessage(sparkKey));
        }
        return s;
    }

    /** The value as set (checked by its type), else the table's default (null where that is computed). */
    public String value(String key) {
        return setting(key).valueOr(entries.get(key));
    }

    public String gpuResource() { return SettingsTable.GPU_RESOURCE.valueOr(entries.get(GPU_RESOURCE)); }

    public Priority taskPriority() {
        return Priority.fromWire(SettingsTable.TASK_PRIORITY.enumValue(entries.get(TASK_PRIORITY)));
    }

    public boolean asyncRelease() { return SettingsTable.ASYNC_RELEASE.boolValue(entries.get(ASYNC_RELEASE)); }

    public TaskBind taskBind() {
        return TaskBind.fromWire(SettingsTable.TASK_BIND.enumValue(entries.get(TASK_BIND)));
    }

    public long metricsRefreshMs() { return SettingsTable.METRICS_REFRESH_MS.intValue(entries.get(METRICS_REFRESH_MS)); }

    public long reportIntervalMs() { return SettingsTable.REPORT_INTERVAL_MS.intValue(entries.get(REPORT_INTERVAL_MS)); }

    /** Checks every {@code spark.cudabridge.*} key, service keys included ({@link Settings#checkAll}):
     *  an unknown key (with the nearest known one) or a value its type refuses throws
     *  IllegalArgumentException naming the key and the value. */
    public void validate() {
        Settings.checkAll(entries);
        long places = SettingsTable.CONCURRENT_GPU_TASKS.intValue(entries.get(SettingsTable.CONCURRENT_GPU_TASKS.sparkKey()));
        if (places > 0 && taskBind() == TaskBind.AHEAD) {
            // the lifecycle thread applies binds ahead and releases tasks: waiting there for a place
            // would hold up the very releases that free one
            throw new IllegalArgumentException(TASK_BIND + "=ahead binds tasks on the executor's lifecycle thread, "
                    + "which must never wait; it does not go with " + SettingsTable.CONCURRENT_GPU_TASKS.sparkKey()
                    + "=" + places + " (a bind waits there for admission): use " + TASK_BIND + "=lazy (the default) "
                    + "or eager");
        }
    }

    /**
     * The bridge's start options: the Python environment and library from the plugin keys, and
     * every other {@code spark.cudabridge.*} entry (the service keys, camelCase as they are) for
     * the service. {@code gpuAddresses} (the executor's GPU resource addresses, may be null) becomes
     * {@link #GPU_ADDRESSES} unless that key is set.
     */
    public BridgeOptions toOptions(String[] gpuAddresses) {
        return toOptions(gpuAddresses, 0);
    }

    /**
     * The executor's task slots from its Spark configuration: {@code spark.executor.cores} (else
     * the cores of a {@code local[N]}, {@code local[N,F]}, {@code local[*]} or
     * {@code local-cluster[n,cores,mem]} master) over {@code spark.task.cpus}; 0 where they cannot
     * be told (a value that is not a number, or nothing set).
     */
    public static int taskSlots(Map<String, String> sparkConf) {
        int cores = 0;
        try {
            String c = sparkConf.get("spark.executor.cores");
            if (c != null) {
                cores = Integer.parseInt(c.trim());
            } else {
                String master = sparkConf.getOrDefault("spark.master", "").trim();
                java.util.regex.Matcher m = java.util.regex.Pattern
                        .compile("local\\[(\\*|\\d+)(?:,\\s*\\d+)?\\]").matcher(master);
                java.util.regex.Matcher lc = java.util.regex.Pattern
                        .compile("local-cluster\\[\\s*\\d+\\s*,\\s*(\\d+)\\s*,.*\\]").matcher(master);
                if (m.matches()) {
                    cores = m.group(1).equals("*") ? Runtime.getRuntime().availableProcessors() : Integer.parseInt(m.group(1));
                } else if (lc.matches()) {
                    cores = Integer.parseInt(lc.group(1));
                }
            }
            int cpus = Integer.parseInt(sparkConf.getOrDefault("spark.task.cpus", "1").trim());
            return cores > 0 && cpus > 0 ? Math.max(1, Math.min(1024, cores / cpus)) : 0;
        } catch (NumberFormatException e) {
            return 0;
        }
    }

    /**
     * As {@link #toOptions(String[])}, and with {@code taskSlots > 0} {@link #STAGING_COPIES} set to
     * it where neither the key nor its variable is.
     */
    public BridgeOptions toOptions(String[] gpuAddresses, int taskSlots) {
        BridgeOptions o = new BridgeOptions();
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
            Settings.Setting s = Settings.named(e.getKey());
            if (s == null || !s.scope().equals("plugin")) {
                service.put(e.getKey(), e.getValue()); // an unknown key is refused when the bridge starts
            }
        }
        if (gpuAddresses != null && gpuAddresses.length > 0 && !service.containsKey(GPU_ADDRESSES)) {
            service.put(GPU_ADDRESSES, String.join(",", gpuAddresses));
        }
        String stagingVar = SettingsTable.STAGING_COPIES.envName();
        if (taskSlots > 0 && !service.containsKey(STAGING_COPIES)
                && (System.getenv(stagingVar) == null || System.getenv(stagingVar).isBlank())) {
            service.put(STAGING_COPIES, Integer.toString(taskSlots));
        }
        o.setAll(service);
        return o;
    }
}
