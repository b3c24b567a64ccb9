package org.cudabridge.harness;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.lang.reflect.RecordComponent;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.cudabridge.CudaBridge;
import org.cudabridge.Priority;
import org.cudabridge.Settings;
import org.cudabridge.BridgeOptions;

/**
 * What the Java side makes of the settings table, for tests/test_settings_java.py: {@code java
 * -cp cudabridge.jar[:cudabridge-spark.jar]:<classes> org.cudabridge.harness.SettingsProbe <mode>}.
 * Needs no Python and no JPype; the plugin's classes ({@code org.cudabridge.executor.TaskBind},
 * {@code PluginConf}) are reached by reflection, so this compiles against cudabridge.jar alone
 * (as the other harness classes) and reports them only where cudabridge-spark.jar is on the
 * class path. Modes:
 * <ul>
 *   <li>{@code dump}: one JSON document: the settings as the generated {@code SettingsTable}
 *       gives them (every component of each record), the Java enums' wire names, the plugin's
 *       key constants, KEYS and defaults;</li>
 *   <li>{@code check}: stdin lines {@code token(name) token(value)} (a token: 'x' + base64); per line a JSON object
 *       {@code {"ok": .., "message": .., "value": ..}} from {@link Settings#check}, the value as
 *       its type's reader returns it;</li>
 *   <li>{@code checkall} / {@code validate}: stdin lines, each one configuration as
 *       {@code token(key) token(value) ...}; per line the outcome of {@link Settings#checkAll}
 *       / {@code PluginConf.validate()};</li>
 *   <li>{@code checkallenv}: stdin lines {@code token(key) token(value) ... | token(name)
 *       token(value) ...}: a configuration and an environment; per line the outcome of
 *       {@link Settings#checkAll(Map, Map)};</li>
 *   <li>{@code nearest}: stdin lines {@code token(key)}; per line {@link Settings#nearestKey};</li>
 *   <li>{@code start}: stdin line as for checkall: {@code CudaBridge.start} with those service
 *       keys, expecting a refusal before the bridge library is loaded;</li>
 *   <li>{@code streams}: starts the bridge from the system properties (and this process's
 *       environment), prints {@code {"ok": .., "streams": N}} (the service's streams) and shuts
 *       it down.</li>
 * </ul>
 */
public final class SettingsProbe {
    private SettingsProbe() {}

    public static void main(String[] args) throws Exception {
        switch (args.length == 0 ? "" : args[0]) {
            case "dump": System.out.println(dump()); break;
            case "check": perLine(SettingsProbe::check); break;
            case "checkall": perLine(line -> outcome(() -> Settings.checkAll(conf(line)))); break;
            case "checkallenv": perLine(SettingsProbe::checkAllEnv); break;
            case "streams": System.out.println(streams()); break;
            case "validate": perLine(SettingsProbe::validate); break;
            case "nearest": perLine(line -> quote(Settings.nearestKey(decode(line.trim())))); break;
            case "names": names(); break;
            case "start": perLine(SettingsProbe::start); break;
            default:
                System.err.println("usage: SettingsProbe dump|check|checkall|checkallenv|validate|nearest|names|start|streams");
                System.exit(2);
        }
        System.out.flush();
    }

    interface Line {
        String apply(String line) throws Exception;
    }

    interface Body {
        void run() throws Exception;
    }

    private static void perLine(Line f) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = in.readLine()) != null; ) {
            System.out.println(f.apply(line));
        }
    }

    /** A token is 'x' + base64 (so that an empty string is a token too). */
    private static String decode(String token) {
        if (!token.startsWith("x")) {
            throw new IllegalArgumentException("a token is 'x' + base64, got " + token);
        }
        return new String(Base64.getDecoder().decode(token.substring(1)), StandardCharsets.UTF_8);
    }

    private static Map<String, String> conf(String line) {
        Map<String, String> m = new LinkedHashMap<>();
        String[] parts = line.trim().isEmpty() ? new String[0] : line.trim().split(" ");
        for (int i = 0; i + 1 < parts.length; i += 2) {
            m.put(decode(parts[i]), decode(parts[i + 1]));
        }
        return m;
    }

    private static String outcome(Body body) {
        try {
            body.run();
            return "{\"ok\": true, \"message\": null}";
        } catch (IllegalArgumentException e) {
            return "{\"ok\": false, \"type\": " + quote(e.getClass().getName()) + ", \"message\": " + quote(e.getMessage()) + "}";
        } catch (Exception e) {
            Throwable t = e instanceof java.lang.reflect.InvocationTargetException ? e.getCause() : e;
            return "{\"ok\": false, \"type\": " + quote(t.getClass().getName()) + ", \"message\": " + quote(t.getMessage()) + "}";
        }
    }

    private static String check(String line) {
        String[] p = line.trim().split(" ");
        String name = decode(p[0]);
        String value = decode(p[1]);
        String r = outcome(() -> Settings.check(name, value));
        return r.startsWith("{\"ok\": true") ? r.substring(0, r.length() - 1) + ", \"value\": "
                + write(typed(Settings.named(name), value)) + "}" : r;
    }

    /** The value as its type's reader returns it (a limit as [bytes, fraction]). */
    private static Object typed(Settings.Setting s, String value) {
        switch (s.type()) {
            case "int": return s.intValue(value);
            case "bytes": return s.bytesValue(value);
            case "seconds": return s.secondsValue(value);
            case "bool": return s.boolValue(value);
            case "enum": return s.enumValue(value);
            case "list": return s.listValue(value);
            case "limit": return Arrays.asList(s.limitValue(value).bytes(), s.limitValue(value).fraction());
            default: return s.valueOr(value);
        }
    }

    private static String checkAllEnv(String line) {
        int bar = line.indexOf('|');
        Map<String, String> conf = conf(line.substring(0, bar));
        Map<String, String> env = conf(line.substring(bar + 1));
        return outcome(() -> Settings.checkAll(conf, env));
    }

    private static String streams() {
        try {
            CudaBridge bridge = CudaBridge.start();
            try {
                return "{\"ok\": true, \"streams\": " + bridge.statistics().get("streams") + "}";
            } finally {
                bridge.shutdown();
            }
        } catch (RuntimeException e) {
            return "{\"ok\": false, \"type\": " + quote(e.getClass().getName()) + ", \"message\": "
                    + quote(e.getMessage()) + "}";
        }
    }

    private static String validate(String line) throws Exception {
        Class<?> pc = Class.forName("org.cudabridge.executor.PluginConf");
        Object conf = pc.getConstructor(Map.class).newInstance(conf(line));
        Method v = pc.getMethod("validate");
        return outcome(() -> v.invoke(conf));
    }

    private static String start(String line) {
        long t0 = System.nanoTime();
        BridgeOptions o = new BridgeOptions();
        for (Map.Entry<String, String> e : conf(line).entrySet()) {
            o.set(e.getKey(), e.getValue());
        }
        String r = outcome(() -> CudaBridge.start(o));
        return r.substring(0, r.length() - 1) + ", \"ms\": " + (System.nanoTime() - t0) / 1_000_000
                + ", \"startFailure\": " + quote(String.valueOf(CudaBridge.startFailure())) + "}";
    }

    private static String dump() {
        StringBuilder sb = new StringBuilder("{\"prefix\": ").append(quote(Settings.prefix())).append(", \"settings\": [");
        boolean first = true;
        for (Settings.Setting s : Settings.all()) {
            Map<String, Object> m = new LinkedHashMap<>();
            try {
                for (RecordComponent c : Settings.Setting.class.getRecordComponents()) {
                    m.put(c.getName(), c.getAccessor().invoke(s));
                }
            } catch (ReflectiveOperationException e) {
                throw new IllegalStateException(e);
            }
            sb.append(first ? "" : ", ").append(write(m));
            first = false;
        }
        sb.append("], \"enums\": {");
        List<String> prio = new ArrayList<>();
        for (Priority p : Priority.values()) {
            prio.add(p.wire());
        }
        sb.append("\"org.cudabridge.Priority\": ").append(write(prio));
        Map<String, Object> plugin = new LinkedHashMap<>();
        try {
            Class<?> tb = Class.forName("org.cudabridge.executor.TaskBind");
            List<String> wires = new ArrayList<>();
            for (Object c : tb.getEnumConstants()) {
                wires.add((String) tb.getMethod("wire").invoke(c));
            }
            sb.append(", \"org.cudabridge.executor.TaskBind\": ").append(write(wires));
            Class<?> pc = Class.forName("org.cudabridge.executor.PluginConf");
            plugin.put("constants", constants(pc));
            Map<String, Object> keys = new LinkedHashMap<>();
            for (Map.Entry<?, ?> e : ((Map<?, ?>) pc.getField("KEYS").get(null)).entrySet()) {
                keys.put((String) e.getKey(), List.of((Object[]) e.getValue()));
            }
            plugin.put("KEYS", keys);
            Object defaults = pc.getMethod("defaults").invoke(null);
            Map<String, Object> d = new LinkedHashMap<>();
            for (String accessor : new String[] {"gpuResource", "taskPriority", "asyncRelease", "taskBind",
                    "metricsRefreshMs", "reportIntervalMs"}) {
                Object v = pc.getMethod(accessor).invoke(defaults);
                d.put(accessor, v instanceof Enum ? v.toString() : v);
            }
            plugin.put("defaults", d);
        } catch (ClassNotFoundException e) {
            // cudabridge-spark.jar is not on the class path
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException(e);
        }
        sb.append("}, \"plugin\": ").append(plugin.isEmpty() ? "null" : write(plugin));
        return sb.append('}').toString();
    }

    /** The public static final String fields of a class, by name. */
    private static Map<String, Object> constants(Class<?> c) {
        Map<String, Object> m = new TreeMap<>();
        try {
            for (Field f : c.getFields()) {
                int mod = f.getModifiers();
                if (Modifier.isStatic(mod) && Modifier.isFinal(mod) && f.getType() == String.class) {
                    m.put(f.getName(), f.get(null));
                }
            }
        } catch (IllegalAccessException e) {
            throw new IllegalStateException(e);
        }
        return m;
    }

    static String write(Object v) {
        if (v == null) {
            return "null";
        }
        if (v instanceof String) {
            return quote((String) v);
        }
        if (v instanceof Boolean || v instanceof Long || v instanceof Integer) {
            return v.toString();
        }
        if (v instanceof Double) {
            return Double.toString((Double) v);
        }
        if (v instanceof Map) {
            StringBuilder sb = new StringBuilder("{");
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                sb.append(first ? "" : ", ").append(quote(String.valueOf(e.getKey()))).append(": ").append(write(e.getValue()));
                first = false;
            }
            return sb.append('}').toString();
        }
        if (v instanceof List) {
            StringBuilder sb = new StringBuilder("[");
            boolean first = true;
            for (Object x : (List<?>) v) {
                sb.append(first ? "" : ", ").append(write(x));
                first = false;
            }
            return sb.append(']').toString();
        }
        throw new IllegalArgumentException("cannot write " + v.getClass());
    }

    static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder sb = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                sb.append('\\').append(c);
            } else if (c < 0x20 || c > 0x7e) {
                sb.append(String.format("\\u%04x", (int) c));
            } else {
                sb.append(c);
            }
        }
        return sb.append('"').toString();
    }

    /** The names the Java side derives: the OOM fields, the statistics, and the executor metrics
     *  (through reflection: the plugin jar may be absent), one list a line, tab-separated. */
    private static void names() throws Exception {
        System.out.println("oom\t" + String.join("\t", org.cudabridge.GpuOutOfMemoryException.FIELDS));
        System.out.println("statistics\t" + String.join("\t", org.cudabridge.CudaBridge.statisticsNames()));
        try {
            Object names = Class.forName("org.cudabridge.spark.MetricNames").getField("NAMES").get(null);
            System.out.println("metrics\t" + String.join("\t", (java.util.List<String>) names));
        } catch (ClassNotFoundException e) {
            System.out.println("metrics");
        }
    }
}
