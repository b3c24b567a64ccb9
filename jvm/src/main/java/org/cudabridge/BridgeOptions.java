package org.cudabridge;

import java.io.File;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Properties;

/**
 * Where Python, its path, the library and the service configuration come from. Unset values fall
 * back to system properties ({@link Settings#PYTHON}, {@link Settings#PYTHON_PATH},
 * {@link Settings#LIBRARY}), the environment ({@code CUDABRIDGE_PYTHON}), and the
 * {@code cudabridge-native.properties} the build wrote beside the jar ({@link InstallLayout}). The
 * service keys are checked against the settings table ({@link Settings#checkAll}) before anything
 * starts, with this process's {@code CUDABRIDGE_*} variables: the Python service reads the variable
 * of every service key not set here (a key set here wins over its variable, the variable over the
 * table's default), and refuses the start on a variable nothing reads, as the check does first.
 */
public final class BridgeOptions {
    /** The environment variable naming the Python executable (the plugin key {@code python}'s). */
    static final String PYTHON_ENV = Settings.setting("python").envName();

    private String python;
    private final List<String> pythonPath = new ArrayList<>();
    private String library;
    private final Map<String, String> conf = new LinkedHashMap<>();

    public BridgeOptions python(String executable) { this.python = executable; return this; }

    public BridgeOptions addPythonPath(String entry) { pythonPath.add(Objects.requireNonNull(entry)); return this; }

    public BridgeOptions library(String path) { this.library = path; return this; }

    /** A service key, with or without the {@code spark.cudabridge.} prefix (e.g. {@code backend});
     *  kept with the prefix. Checked when the bridge starts. */
    public BridgeOptions set(String key, String value) {
        Objects.requireNonNull(key);
        Objects.requireNonNull(value, "value of " + key);
        conf.put(key.startsWith(Settings.prefix()) ? key : Settings.prefix() + key, value);
        return this;
    }

    /** Every {@code spark.cudabridge.*} entry of a (Spark) configuration map. */
    public BridgeOptions setAll(Map<String, String> entries) {
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
    public static BridgeOptions fromSystemProperties() {
        BridgeOptions o = new BridgeOptions();
        for (String name : System.getProperties().stringPropertyNames()) {
            if (name.startsWith(Settings.prefix())) {
                o.conf.put(name, System.getProperty(name));
            }
        }
        return o;
    }

    /** These options with every unset value filled from its fallbacks, in the order above. */
    BridgeOptions resolved(InstallLayout layout) {
        BridgeOptions r = new BridgeOptions();
        Properties built = layout.nativeProperties();
        r.library = firstNonEmpty(library, Settings.property(Settings.LIBRARY), built.getProperty("library"),
                layout.besideJar(InstallLayout.LIBRARY_FILE));
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

    private static String firstNonEmpty(String... values) {
        for (String v : values) {
            if (v != null && !v.isEmpty()) {
                return v;
            }
        }
        return null;
    }
}
