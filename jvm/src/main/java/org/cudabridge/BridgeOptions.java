package org.cudabridge;

import java.io.File;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * Where Python, its path, the library and the service configuration come from. Unset values fall
 * back to system properties ({@link SettingsTable#PYTHON_PROPERTY}, {@link
 * SettingsTable#PYTHON_PATH_PROPERTY}, {@link SettingsTable#LIBRARY_PROPERTY}), the environment ({@code CUDABRIDGE_PYTHON}), and where the package
 * is installed ({@link InstallLayout}; {@link #resolved} gives the order). The
 * service keys are checked against the settings table ({@link Settings#checkAll}) before anything
 * starts, with this process's {@code CUDABRIDGE_*} variables: the Python service reads the variable
 * of every service key not set here (a key set here wins over its variable, the variable over the
 * table's default), and refuses the start on a variable nothing reads, as the check does first.
 */
public final class BridgeOptions {
    /** The environment variable naming the Python executable (the plugin key {@code python}'s). */
    static final String PYTHON_ENV = SettingsTable.PYTHON.envName();

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

    /**
     * These options with every unset value filled from its fallbacks: the library from the option,
     * {@code -Dcudabridge.library}, then the {@link InstallLayout} beside the jar, then the one in
     * the configured Python's environment; the Python from the option, {@code -Dcudabridge.python},
     * {@code CUDABRIDGE_PYTHON}, then the interpreter of the environment the library's package is
     * installed in, then the one a source tree's build recorded; the Python path from the option,
     * {@code -Dcudabridge.pythonpath}, then the directory holding the library's package (so Python
     * imports the package the library was built with).
     */
    BridgeOptions resolved(InstallLayout besideJar) {
        BridgeOptions r = new BridgeOptions();
        String givenPython = absolute(firstNonEmpty(python, Settings.property(SettingsTable.PYTHON_PROPERTY), System.getenv(PYTHON_ENV)));
        String givenLibrary = firstNonEmpty(library, Settings.property(SettingsTable.LIBRARY_PROPERTY));
        InstallLayout layout;
        if (givenLibrary != null) {
            java.nio.file.Path dir = java.nio.file.Paths.get(givenLibrary).toAbsolutePath().getParent();
            layout = InstallLayout.of(dir);
        } else if (besideJar.library() != null) {
            layout = besideJar;
        } else {
            layout = InstallLayout.ofPython(givenPython);
        }
        r.library = firstNonEmpty(givenLibrary, layout.library());
        r.python = firstNonEmpty(givenPython, layout.environmentPython(), layout.nativeProperties().getProperty("python"));
        r.pythonPath.addAll(pythonPath);
        for (String source : new String[] {Settings.property(SettingsTable.PYTHON_PATH_PROPERTY), layout.packageParent()}) {
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

    /** A path to an interpreter made absolute (Spark gives ./env/bin/python, relative to the
     *  executor's directory); a bare name (looked up on PATH) stays as it is. */
    private static String absolute(String python) {
        if (python == null || python.indexOf('/') < 0) {
            return python;
        }
        return java.nio.file.Paths.get(python).toAbsolutePath().normalize().toString();
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
