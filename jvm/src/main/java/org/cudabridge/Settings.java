package org.cudabridge;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Every setting of spark-cuda-bridge, from the one table {@code python/cudabridge/settings.json}
 * (copied into {@code cudabridge.jar} as {@value #RESOURCE} by the build): the Python service
 * reads the same file, so keys, types, defaults and docs are written once.
 *
 * <p>Spellings are derived from a setting's {@code key}: the Spark key
 * ({@link Setting#sparkKey()}, {@code spark.cudabridge.<key>}, scopes service and plugin), the
 * environment variable ({@link Setting#envName()}, {@code poolLimit -> CUDABRIDGE_POOL_LIMIT}), and
 * for scope {@code jvm} the system property, the key as written ({@code -Dcudabridge.gate}).
 *
 * <p>{@link #check(String, String)} checks a value by its type as the Python side
 * ({@code cudabridge.config.check_value}) does; {@link #checkAll(Map)} refuses every unknown key
 * under the prefix with the nearest known one, and every {@code CUDABRIDGE_*} variable that nothing
 * reads, then checks the values, as {@code cudabridge.config.check_all}
 * does (tests/test_settings_java.py compares the two over every key and a grid of values). No JSON
 * library is used (the core jar has none, and the GPU machine has no Spark jars): the table is
 * read by a small strict reader here.
 */
public final class Settings {
    /** Where the table is inside cudabridge.jar. */
    public static final String RESOURCE = "/org/cudabridge/settings.json";

    // The system properties (scope jvm) by name; their types, defaults and docs are in the table,
    // and each name is checked against it when this class loads.
    /** The venv's Python executable the bridge starts in-process. */
    public static final String PYTHON = "cudabridge.python";
    /** Extra {@code sys.path} entries, ':'-separated. */
    public static final String PYTHON_PATH = "cudabridge.pythonPath";
    /** Path of {@code libcudabridge_jni.so}. */
    public static final String LIBRARY = "cudabridge.library";
    /** Whether the short hot calls pass the bridge's gate. */
    public static final String GATE = "cudabridge.gate";
    /** How long (us) the thread that passed the gate last keeps passing it while others wait. */
    public static final String GATE_HOLD_MICROS = "cudabridge.gate.holdMicros";

    /** The scopes, in the table's order. */
    public static final List<String> SCOPES = List.of("service", "plugin", "jvm", "environment", "dev");
    /** The value types. */
    public static final List<String> TYPES = List.of("enum", "int", "bool", "bytes", "limit", "seconds", "list", "string");
    /** Least byte count a {@code limit} accepts (a pool smaller than one 2 MiB chunk holds nothing). */
    public static final long MIN_LIMIT_BYTES = 2L << 20;
    /** Least fraction of free memory a {@code limit} accepts: below it, a GPU with less than 1.9 TiB
     *  free gives a pool under {@link #MIN_LIMIT_BYTES} ({@code cudabridge.config.MIN_LIMIT_FRACTION};
     *  both sides parse the text to the same double and compare it with this one). */
    public static final double MIN_LIMIT_FRACTION = 1e-6;
    /** Prefix of the environment variables ({@code CUDABRIDGE_POOL_LIMIT}). */
    public static final String ENV_PREFIX = "CUDABRIDGE_";
    /** Prefix of the Spark keys that set the executors' environment ({@code spark.executorEnv.<NAME>}). */
    public static final String EXECUTOR_ENV_PREFIX = "spark.executorEnv.";

    private static final String PREFIX;
    private static final List<Setting> ALL;
    private static final Map<String, Setting> BY_KEY;    // table key -> setting
    private static final Map<String, Setting> BY_NAME;   // Spark key, property or variable -> setting
    private static final Map<String, Setting> VARIABLES; // CUDABRIDGE_* variable read -> setting

    private Settings() {}

    private static String readUtf8(InputStream in) throws IOException {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        byte[] buf = new byte[8192];
        for (int n; (n = in.read(buf)) > 0; ) {
            out.write(buf, 0, n);
        }
        return out.toString(StandardCharsets.UTF_8);
    }

    /**
     * One setting of the table, as written there ({@code values}: empty unless {@code type} is
     * {@code enum}; {@code min}/{@code max}: null where the table gives none; {@code defaultValue}:
     * null where the default is computed, {@code defaultDoc} then says how; {@code env}: a plugin key
     * whose environment variable is read too).
     */
    public record Setting(String key, String scope, String type, List<String> values, Long min, Long max,
                          String defaultValue, String defaultDoc, String doc, boolean test, boolean env) {
        public Setting {
            Objects.requireNonNull(key, "key");
            Objects.requireNonNull(scope, "scope");
            Objects.requireNonNull(type, "type");
            values = values == null ? List.of() : List.copyOf(values);
        }

        /** {@code spark.cudabridge.<key>} for scopes service and plugin, else null. */
        public String sparkKey() {
            return scope.equals("service") || scope.equals("plugin") ? PREFIX + key : null;
        }

        /** {@code CUDABRIDGE_} + the key split at capitals and dots, upper case
         *  ({@code metrics.refreshMs -> CUDABRIDGE_METRICS_REFRESH_MS}); null for scope jvm. */
        public String envName() {
            return scope.equals("jvm") ? null : envNameOf(key);
        }

        /** Whether its {@code CUDABRIDGE_*} variable is read by anything: scopes service (the
         *  Python service's configuration), environment and dev (the project's scripts and tests),
         *  and plugin keys marked {@code env}. Any other {@code CUDABRIDGE_*} name is refused. */
        public boolean envRead() {
            return scope.equals("service") || scope.equals("environment") || scope.equals("dev")
                    || (scope.equals("plugin") && env);
        }

        /** Whether its variable's value is checked where the bridge starts: every variable read,
         *  but those of scope dev (only the project's scripts read them). */
        public boolean envChecked() {
            return envRead() && !scope.equals("dev");
        }

        /** How users write it: the Spark key, the system property, or the environment variable. */
        public String name() {
            String spark = sparkKey();
            return spark != null ? spark : scope.equals("jvm") ? key : envName();
        }

        /** What the type accepts, in words ("an integer in [1, 1024]"). */
        public String expected() {
            switch (type) {
                case "enum": return "one of " + String.join(", ", values);
                case "int": return min != null && max != null ? "an integer in [" + min + ", " + max + "]"
                        : min != null ? "an integer of at least " + min : max != null ? "an integer of at most " + max
                        : "an integer";
                case "bool": return "true or false";
                case "bytes": {
                    List<String> bounds = new ArrayList<>();
                    if (min != null && min > 0) {
                        bounds.add("at least " + min + ", " + humanBytes(min));
                    }
                    if (max != null) {
                        bounds.add("at most " + max + ", " + humanBytes(max));
                    }
                    return "bytes such as 1073741824, 512m or 8g" + (bounds.isEmpty() ? "" : " (" + String.join("; ", bounds) + ")");
                }
                case "limit": return "bytes (at least " + humanBytes(MIN_LIMIT_BYTES) + ") or, with a decimal point, "
                        + "a fraction of free memory in [0.000001, 1]";
                case "seconds": return "a positive number of seconds";
                case "list": return "a comma-separated list";
                default: return "a string";
            }
        }

        /** Checks {@code value} by this setting's type; throws IllegalArgumentException naming the
         *  setting and the value. Returns the value. */
        public String check(String value) {
            parse(value);
            return value;
        }

        /** {@code value}, or the default where it is null; checked. Null only where both are. */
        public String valueOr(String value) {
            return value != null ? check(value) : defaultValue;
        }

        /** An {@code int} or {@code bytes} setting's value as a number ({@code value} null: the default). */
        public long longValue(String value) {
            if (!type.equals("int") && !type.equals("bytes")) {
                throw new IllegalStateException(name() + " is of type " + type + ", not a number");
            }
            return (Long) parse(required(value));
        }

        /** A {@code bool} setting's value ({@code value} null: the default). */
        public boolean booleanValue(String value) {
            if (!type.equals("bool")) {
                throw new IllegalStateException(name() + " is of type " + type + ", not bool");
            }
            return (Boolean) parse(required(value));
        }

        /** An {@code enum} setting's value as one of {@link #values()} ({@code value} null: the default). */
        public String enumValue(String value) {
            if (!type.equals("enum")) {
                throw new IllegalStateException(name() + " is of type " + type + ", not enum");
            }
            return (String) parse(required(value));
        }

        private String required(String value) {
            String v = value != null ? value : defaultValue;
            if (v == null) {
                throw new IllegalStateException(name() + " has no default (" + defaultDoc + ") and is not set");
            }
            return v;
        }

        private static IllegalArgumentException refused(String spelling, String value, String why) {
            return new IllegalArgumentException(spelling + "=" + value + ": " + why);
        }

        /** The value parsed: a String (enum: the table's spelling; list, string), Long (int, bytes),
         *  Boolean, Double (seconds; limit as a fraction) or Long (limit as bytes). */
        Object parse(String value) {
            return parse(value, name());
        }

        /** As {@link #parse(String)}, a refusal naming the setting as {@code spelling} (its
         *  environment variable where the value came from there). */
        Object parse(String value, String spelling) {
            if (value == null) {
                throw new IllegalArgumentException(spelling + ": no value (expected " + expected() + ")");
            }
            if (!type.equals("string") && !type.equals("list") && !value.chars().allMatch(c -> c < 128)) {
                throw refused(spelling, value, "expected " + expected() + " (ASCII only)");
            }
            switch (type) {
                case "enum": {
                    // Case matters, except where every value is upper case (logLevel: INFO, info).
                    boolean fold = values.stream().allMatch(x -> x.equals(x.toUpperCase(Locale.ROOT)));
                    for (String x : values) {
                        if (fold ? x.equals(value.toUpperCase(Locale.ROOT)) : x.equals(value)) {
                            return x;
                        }
                    }
                    throw refused(spelling, value, "expected one of " + String.join(", ", values));
                }
                case "int": {
                    String v = asciiTrim(value);
                    if (!INTEGER.matcher(v).matches()) {
                        throw refused(spelling, value, "expected an integer");
                    }
                    BigInteger n = new BigInteger(v.startsWith("+") ? v.substring(1) : v);
                    if ((min != null && n.compareTo(BigInteger.valueOf(min)) < 0)
                            || (max != null && n.compareTo(BigInteger.valueOf(max)) > 0) || n.bitLength() > 63) {
                        throw refused(spelling, value, "expected " + expected());
                    }
                    return n.longValue();
                }
                case "bool": {
                    String v = asciiTrim(value);
                    if (v.equalsIgnoreCase("true") || v.equals("1")) {
                        return Boolean.TRUE;
                    }
                    if (v.equalsIgnoreCase("false") || v.equals("0")) {
                        return Boolean.FALSE;
                    }
                    throw refused(spelling, value, "expected true or false (or 1 or 0)");
                }
                case "bytes":
                    return parseBytes(spelling, value, min == null ? 0 : min, max == null ? Long.MAX_VALUE : max);
                case "limit": {
                    String v = asciiTrim(value);
                    if (v.indexOf('.') >= 0) {
                        if (!DECIMAL.matcher(v).matches()) {
                            throw refused(spelling, value, "expected bytes (1073741824, 512m, 8g) or a fraction of free memory "
                                    + "in [0.000001, 1] such as 0.9");
                        }
                        double f = Double.parseDouble(v);
                        if (!(f >= MIN_LIMIT_FRACTION && f <= 1.0)) {
                            throw refused(spelling, value, "a fraction of free memory must be in [0.000001, 1] (a smaller "
                                    + "one gives a pool under 2 MiB on any GPU)");
                        }
                        return f;
                    }
                    return parseBytes(spelling, value, MIN_LIMIT_BYTES, Long.MAX_VALUE);
                }
                case "seconds": {
                    String v = asciiTrim(value);
                    double s = NUMBER.matcher(v).matches() ? Double.parseDouble(v) : Double.NaN;
                    if (!(s > 0.0 && s < Double.POSITIVE_INFINITY)) {
                        throw refused(spelling, value, "expected a positive number of seconds such as 300 or 0.5");
                    }
                    return s;
                }
                default: // list, string
                    return value;
            }
        }

        /** Blanks trimmed as Python's {@code str.strip(" \t\n\r\f\v")} does: ASCII ones only. */
        private static String asciiTrim(String v) {
            int i = 0;
            int j = v.length();
            while (i < j && " \t\n\r\f\u000B".indexOf(v.charAt(i)) >= 0) {
                i++;
            }
            while (j > i && " \t\n\r\f\u000B".indexOf(v.charAt(j - 1)) >= 0) {
                j--;
            }
            return v.substring(i, j);
        }

        private static Long parseBytes(String spelling, String value, long least, long most) {
            Matcher m = BYTES.matcher(asciiTrim(value).toLowerCase(Locale.ROOT));
            Long unit = m.matches() ? UNITS.get(m.group(2)) : null;
            if (unit == null) {
                throw refused(spelling, value, "expected bytes such as 1073741824, 512m or 8g");
            }
            BigInteger n = new BigInteger(m.group(1)).multiply(BigInteger.valueOf(unit));
            if (n.bitLength() > 63) {
                throw refused(spelling, value, n + " bytes is 2**63 or more");
            }
            if (n.longValue() < least) {
                throw refused(spelling, value, n + " bytes is below the least accepted, " + least + " ("
                        + humanBytes(least) + ")");
            }
            if (n.longValue() > most) {
                throw refused(spelling, value, n + " bytes is above the most accepted, " + most + " ("
                        + humanBytes(most) + ")");
            }
            return n.longValue();
        }
    }

    private static final Pattern INTEGER = Pattern.compile("[+-]?[0-9]+");
    private static final Pattern BYTES = Pattern.compile("\\+?([0-9]+)(|b|k|kb|m|mb|g|gb|t|tb)");
    private static final Pattern DECIMAL = Pattern.compile("[+-]?([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?");
    private static final Pattern NUMBER = Pattern.compile("[+-]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?");
    private static final Map<String, Long> UNITS = Map.of("", 1L, "b", 1L, "k", 1L << 10, "kb", 1L << 10,
            "m", 1L << 20, "mb", 1L << 20, "g", 1L << 30, "gb", 1L << 30, "t", 1L << 40, "tb", 1L << 40);

    static String humanBytes(long n) {
        String[] units = {"TiB", "GiB", "MiB", "KiB"};
        for (int i = 0; i < units.length; i++) {
            long u = 1L << (10 * (4 - i));
            if (n >= u && n % u == 0) {
                return (n / u) + " " + units[i];
            }
        }
        return n + " bytes";
    }

    static String envNameOf(String key) {
        StringBuilder sb = new StringBuilder("CUDABRIDGE_");
        for (int i = 0; i < key.length(); i++) {
            char c = key.charAt(i);
            if (c == '.') {
                sb.append('_');
                continue;
            }
            if (Character.isUpperCase(c) && i > 0) {
                char p = key.charAt(i - 1);
                if (Character.isLowerCase(p) || Character.isDigit(p)) {
                    sb.append('_');
                }
            }
            sb.append(Character.toUpperCase(c));
        }
        return sb.toString();
    }

    // --- the table ---------------------------------------------------------------------------------

    /** {@code spark.cudabridge.} */
    public static String prefix() {
        return PREFIX;
    }

    /** Every setting, in the table's order. */
    public static List<Setting> all() {
        return ALL;
    }

    /** The settings of one scope (service, plugin, jvm, environment), in the table's order. */
    public static List<Setting> scope(String scope) {
        if (!SCOPES.contains(scope)) {
            throw new IllegalArgumentException("no scope " + scope + "; the scopes are " + String.join(", ", SCOPES));
        }
        List<Setting> out = new ArrayList<>();
        for (Setting s : ALL) {
            if (s.scope().equals(scope)) {
                out.add(s);
            }
        }
        return Collections.unmodifiableList(out);
    }

    /** The setting of a table key ({@code poolLimit}, {@code cudabridge.gate}); throws for an unknown one. */
    public static Setting setting(String key) {
        Setting s = BY_KEY.get(key);
        if (s == null) {
            throw new IllegalArgumentException("cudabridge: " + RESOURCE + " has no setting " + key);
        }
        return s;
    }

    /** The setting a Spark key, system property or environment variable names, or null. */
    public static Setting named(String name) {
        return BY_NAME.get(name);
    }

    /**
     * Checks {@code value} for the setting {@code sparkKey} names (a Spark key; also a system
     * property of scope jvm or a variable of scope environment): throws IllegalArgumentException
     * naming the key and the value ({@code spark.cudabridge.poolLimit=255: 255 bytes is below the
     * least accepted, 2097152 (2 MiB)}), or the nearest known key for an unknown one.
     */
    public static void check(String sparkKey, String value) {
        Setting s = BY_NAME.get(sparkKey);
        if (s == null) {
            throw new IllegalArgumentException(unknownKeyMessage(sparkKey));
        }
        s.check(value);
    }

    /**
     * The driver's check of a Spark configuration: {@link #checkAll(Map, Map)} with the executors'
     * environment as the configuration sets it ({@code spark.executorEnv.CUDABRIDGE_*}; variables
     * the executors get from elsewhere are checked where they start).
     */
    public static void checkAll(Map<String, String> conf) {
        checkAll(conf, executorEnvironment(conf));
    }

    /** The {@code CUDABRIDGE_*} variables a Spark configuration sets for its executors
     *  ({@code spark.executorEnv.CUDABRIDGE_*}), by name. */
    public static Map<String, String> executorEnvironment(Map<String, String> conf) {
        Map<String, String> env = new TreeMap<>();
        for (Map.Entry<String, String> e : conf.entrySet()) {
            String k = e.getKey();
            if (k != null && k.startsWith(EXECUTOR_ENV_PREFIX + ENV_PREFIX) && e.getValue() != null) {
                env.put(k.substring(EXECUTOR_ENV_PREFIX.length()), e.getValue());
            }
        }
        return env;
    }

    /**
     * Checks a (Spark) configuration and an environment, as the Python service will use them:
     * every key under {@code spark.cudabridge.} must be a service or plugin key ({@code unknown key
     * spark.cudabridge.poolLimt; did you mean spark.cudabridge.poolLimit?}) and every
     * {@code CUDABRIDGE_*} name in {@code env} a variable that is read ({@link Setting#envRead});
     * once every name is known, every value is checked (variables named as such; no rule ties keys
     * to each other today). Keys outside the prefix and
     * other variables are not looked at. Throws one IllegalArgumentException saying everything
     * wrong at the first of those stages that found something, joined by "; ". The same rules,
     * order and messages as {@code cudabridge.config.check_all}.
     */
    public static void checkAll(Map<String, String> conf, Map<String, String> env) {
        Map<String, String> ours = new TreeMap<>();
        for (Map.Entry<String, String> e : conf.entrySet()) {
            if (e.getKey() != null && e.getKey().startsWith(PREFIX) && e.getValue() != null) {
                ours.put(e.getKey(), e.getValue());
            }
        }
        Map<String, String> vars = new TreeMap<>();
        for (Map.Entry<String, String> e : env.entrySet()) {
            if (e.getKey() != null && e.getKey().startsWith(ENV_PREFIX) && e.getValue() != null) {
                vars.put(e.getKey(), e.getValue());
            }
        }
        List<String> problems = new ArrayList<>();
        for (String k : ours.keySet()) {
            Setting s = BY_NAME.get(k);
            if (s == null || s.sparkKey() == null) {
                problems.add(unknownKeyMessage(k));
            }
        }
        for (String n : vars.keySet()) {
            if (!VARIABLES.containsKey(n)) {
                problems.add(unknownVariableMessage(n));
            }
        }
        if (problems.isEmpty()) {
            for (Map.Entry<String, String> e : ours.entrySet()) {
                try {
                    BY_NAME.get(e.getKey()).check(e.getValue());
                } catch (IllegalArgumentException x) {
                    problems.add(x.getMessage());
                }
            }
            for (Map.Entry<String, String> e : vars.entrySet()) {
                Setting s = VARIABLES.get(e.getKey());
                if (s.envChecked() && !blank(e.getValue())) {
                    try {
                        s.parse(e.getValue(), e.getKey());
                    } catch (IllegalArgumentException x) {
                        problems.add(x.getMessage());
                    }
                }
            }
        }
        if (!problems.isEmpty()) {
            throw new IllegalArgumentException(String.join("; ", problems));
        }
    }

    /** A variable set to nothing (or ASCII blanks) is unset ({@code X= cmd}); its name is still
     *  checked ({@code cudabridge.config._blank}). */
    private static boolean blank(String value) {
        return Setting.asciiTrim(value).isEmpty();
    }

    /**
     * What a {@code CUDABRIDGE_*} variable that nothing reads gets: where its setting is set
     * instead (a plugin key's derived spelling), else {@code unknown environment variable N; did you
     * mean M?} with the nearest variable that is read, or {@code no variable is close}. The same
     * as {@code cudabridge.config.unknown_variable_message}.
     */
    public static String unknownVariableMessage(String name) {
        for (Setting s : ALL) {
            if (name.equals(s.envName()) && !s.envRead()) {
                return name + " is not read from the environment: " + s.sparkKey() + " is a plugin key, set in the "
                        + "Spark configuration (--conf " + s.sparkKey() + "=...)";
            }
        }
        String near = nearest(name, VARIABLES.keySet(), ENV_PREFIX);
        return "unknown environment variable " + name + "; "
                + (near != null ? "did you mean " + near + "?" : "no variable is close (python -m cudabridge config lists them)");
    }

    /** The {@code CUDABRIDGE_*} variables that are read ({@link Setting#envRead}), by name. */
    public static Map<String, Setting> variables() {
        return VARIABLES;
    }

    /** What an unknown key gets: {@code unknown key K; did you mean N?}, or {@code no key is close}. */
    public static String unknownKeyMessage(String key) {
        String spark = key.startsWith(PREFIX) ? key : PREFIX + key;
        String near = nearestKey(spark);
        return "unknown key " + spark + "; "
                + (near != null ? "did you mean " + near + "?" : "no key is close (python -m cudabridge config lists them)");
    }

    /**
     * The known Spark key (scopes service and plugin) nearest to {@code key}: edit distance of the
     * parts after the prefix, lower case, with '.', '_' and '-' left out (so {@code pool_limit}
     * finds {@code poolLimit}); ties go to the key first in alphabetical order. Null unless within
     * max(2, a third of the key's length) edits. The same rule as {@code cudabridge.config.nearest_key}.
     */
    public static String nearestKey(String key) {
        List<String> keys = new ArrayList<>();
        for (Setting s : ALL) {
            if (s.sparkKey() != null) {
                keys.add(s.sparkKey());
            }
        }
        return nearest(key, keys, PREFIX);
    }

    /** The name in {@code known} nearest to {@code name}: the parts after {@code prefix}, lower
     *  case, '.', '_' and '-' left out; ties to the first in alphabetical order; null unless within
     *  max(2, a third of the length) edits ({@code cudabridge.config._nearest}). */
    static String nearest(String name, Iterable<String> known, String prefix) {
        String target = normalized(name, prefix);
        String best = null;
        int bestDistance = Integer.MAX_VALUE;
        for (String k : known) {
            int d = editDistance(normalized(k, prefix), target);
            if (d < bestDistance || (d == bestDistance && k.compareTo(best) < 0)) {
                best = k;
                bestDistance = d;
            }
        }
        return best != null && bestDistance <= Math.max(2, target.length() / 3) ? best : null;
    }

    private static String normalized(String key, String prefix) {
        String k = key.startsWith(prefix) ? key.substring(prefix.length()) : key;
        return k.replaceAll("[._-]", "").toLowerCase(Locale.ROOT);
    }

    static int editDistance(String a, String b) {
        int[] prev = new int[b.length() + 1];
        int[] cur = new int[b.length() + 1];
        for (int j = 0; j <= b.length(); j++) {
            prev[j] = j;
        }
        for (int i = 1; i <= a.length(); i++) {
            cur[0] = i;
            for (int j = 1; j <= b.length(); j++) {
                int sub = prev[j - 1] + (a.charAt(i - 1) == b.charAt(j - 1) ? 0 : 1);
                cur[j] = Math.min(sub, Math.min(prev[j] + 1, cur[j - 1] + 1));
            }
            int[] t = prev;
            prev = cur;
            cur = t;
        }
        return prev[b.length()];
    }

    // --- system properties (scope jvm) ----------------------------------------------------------------

    /** A system property of scope jvm: its value, or the table's default where it is unset (null
     *  where that is computed); a value its type refuses throws IllegalArgumentException
     *  ({@code -Dcudabridge.gate.holdMicros must be an integer in [1, 1000000], got 'abc'}). */
    public static String property(String key) {
        Setting s = jvmSetting(key);
        String v = System.getProperty(key);
        if (v == null) {
            return s.defaultValue();
        }
        try {
            s.parse(v);
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException("-D" + key + " must be " + s.expected() + ", got '" + v + "'", e);
        }
        return v;
    }

    /** A {@code bool} system property (see {@link #property}). */
    public static boolean booleanProperty(String key) {
        return jvmSetting(key).booleanValue(property(key));
    }

    /** An {@code int} system property (see {@link #property}). */
    public static long longProperty(String key) {
        return jvmSetting(key).longValue(property(key));
    }

    private static Setting jvmSetting(String key) {
        Setting s = setting(key);
        if (!s.scope().equals("jvm")) {
            throw new IllegalArgumentException(key + " is of scope " + s.scope() + ", not a system property");
        }
        return s;
    }

    // --- reading the table ------------------------------------------------------------------------------

    /** The table, checked: its form, each entry's fields, unique names, and each default by its type. */
    private static final class Table {
        private static final Set<String> ROOT_FIELDS = Set.of("about", "prefix", "settings");
        private static final Set<String> FIELDS = Set.of("key", "scope", "type", "values", "min", "max", "default",
                "defaultDoc", "doc", "test", "env");
        private static final Pattern KEY = Pattern.compile("[A-Za-z][A-Za-z0-9]*(\\.[A-Za-z][A-Za-z0-9]*)*");

        final String prefix;
        final List<Setting> settings;

        private Table(String prefix, List<Setting> settings) {
            this.prefix = prefix;
            this.settings = settings;
        }

        static Table from(String text, String source) {
            Object root = new Json(text, source).document();
            if (!(root instanceof Map)) {
                throw new IllegalStateException(source + ": expected an object at the top");
            }
            Map<?, ?> m = (Map<?, ?>) root;
            for (Object f : m.keySet()) {
                if (!ROOT_FIELDS.contains(f)) {
                    throw new IllegalStateException(source + ": unknown field '" + f + "' at the top (known: "
                            + String.join(", ", new java.util.TreeSet<>(ROOT_FIELDS)) + ")");
                }
            }
            Object prefix = m.get("prefix");
            if (!(prefix instanceof String) || !((String) prefix).endsWith(".")) {
                throw new IllegalStateException(source + ": 'prefix' must be a string ending with '.', got " + prefix);
            }
            Object list = m.get("settings");
            if (!(list instanceof List)) {
                throw new IllegalStateException(source + ": 'settings' must be an array");
            }
            List<Setting> out = new ArrayList<>();
            Set<String> keys = new LinkedHashSet<>();
            int i = 0;
            for (Object e : (List<?>) list) {
                Setting s = entry(e, source + ": settings[" + i + "]", (String) prefix);
                if (!keys.add(s.key())) {
                    throw new IllegalStateException(source + ": settings[" + i + "]: key " + s.key() + " twice");
                }
                out.add(s);
                i++;
            }
            return new Table((String) prefix, Collections.unmodifiableList(out));
        }

        private static Setting entry(Object e, String where, String prefix) {
            if (!(e instanceof Map)) {
                throw new IllegalStateException(where + ": expected an object");
            }
            Map<?, ?> m = (Map<?, ?>) e;
            Object keyObj = m.get("key");
            if (!(keyObj instanceof String) || !KEY.matcher((String) keyObj).matches()) {
                throw new IllegalStateException(where + ": 'key' must be a string of letters and digits, parts "
                        + "joined by '.', got " + keyObj);
            }
            String key = (String) keyObj;
            where = where + " (" + key + ")";
            for (Object f : m.keySet()) {
                if (!FIELDS.contains(f)) {
                    throw new IllegalStateException(where + ": unknown field '" + f + "' (known: "
                            + String.join(", ", new java.util.TreeSet<>(FIELDS)) + ")");
                }
            }
            String scope = string(m, "scope", where, true);
            if (!SCOPES.contains(scope)) {
                throw new IllegalStateException(where + ": scope " + scope + " is none of " + String.join(", ", SCOPES));
            }
            String type = string(m, "type", where, true);
            if (!TYPES.contains(type)) {
                throw new IllegalStateException(where + ": type " + type + " is none of " + String.join(", ", TYPES));
            }
            List<String> values = new ArrayList<>();
            if (m.containsKey("values")) {
                if (!type.equals("enum") || !(m.get("values") instanceof List)) {
                    throw new IllegalStateException(where + ": 'values' is an array, for type enum only");
                }
                for (Object v : (List<?>) m.get("values")) {
                    if (!(v instanceof String) || ((String) v).isEmpty() || values.contains(v)) {
                        throw new IllegalStateException(where + ": 'values' must be distinct non-empty strings");
                    }
                    values.add((String) v);
                }
            }
            if (type.equals("enum") && values.isEmpty()) {
                throw new IllegalStateException(where + ": an enum needs its 'values'");
            }
            Long min = number(m, "min", where, type);
            Long max = number(m, "max", where, type);
            if (min != null && max != null && min > max) {
                throw new IllegalStateException(where + ": min " + min + " is above max " + max);
            }
            if (!m.containsKey("default")) {
                throw new IllegalStateException(where + ": 'default' is missing (null where it is computed)");
            }
            String dflt = string(m, "default", where, false);
            String defaultDoc = string(m, "defaultDoc", where, false);
            if (dflt == null && defaultDoc == null) {
                throw new IllegalStateException(where + ": a null default needs a 'defaultDoc' saying how it is computed");
            }
            String doc = string(m, "doc", where, true);
            Object test = m.get("test");
            if (test != null && !(test instanceof Boolean)) {
                throw new IllegalStateException(where + ": 'test' must be true or false");
            }
            Object env = m.get("env");
            if (env != null && (!(env instanceof Boolean) || !scope.equals("plugin"))) {
                throw new IllegalStateException(where + ": 'env' is true or false, for scope plugin only");
            }
            return new Setting(key, scope, type, values, min, max, dflt, defaultDoc, doc, Boolean.TRUE.equals(test),
                    Boolean.TRUE.equals(env));
        }

        private static String string(Map<?, ?> m, String field, String where, boolean required) {
            Object v = m.get(field);
            if (v == null && !required) {
                return null;
            }
            if (!(v instanceof String)) {
                throw new IllegalStateException(where + ": '" + field + "' must be a string" + (required ? "" : " or null")
                        + ", got " + v);
            }
            return (String) v;
        }

        private static Long number(Map<?, ?> m, String field, String where, String type) {
            if (!m.containsKey(field)) {
                return null;
            }
            Object v = m.get(field);
            if (!type.equals("int") && !type.equals("bytes")) {
                throw new IllegalStateException(where + ": '" + field + "' is for types int and bytes only");
            }
            if (!(v instanceof Long)) {
                throw new IllegalStateException(where + ": '" + field + "' must be an integer, got " + v);
            }
            return (Long) v;
        }
    }

    /**
     * A small strict JSON reader (RFC 8259): objects (LinkedHashMap, a key twice is an error),
     * arrays (ArrayList), strings with every escape, numbers (Long where the text is an integer
     * that fits, else Double), true, false, null. Nothing may follow the document but whitespace.
     * Errors name the line, column and offset.
     */
    static final class Json {
        private final String s;
        private final String source;
        private int i;

        Json(String text, String source) {
            this.s = text;
            this.source = source;
        }

        Object document() {
            if (s.startsWith("\ufeff")) {
                i = 1;
            }
            Object v = value();
            space();
            if (i < s.length()) {
                throw error("expected the end of the document");
            }
            return v;
        }

        private IllegalStateException error(String what) {
            int line = 1;
            int col = 1;
            for (int k = 0; k < i && k < s.length(); k++) {
                if (s.charAt(k) == '\n') {
                    line++;
                    col = 1;
                } else {
                    col++;
                }
            }
            String found = i < s.length() ? "'" + printable(s.charAt(i)) + "'" : "the end";
            return new IllegalStateException(source + ": line " + line + ", column " + col + " (offset " + i + "): "
                    + what + ", found " + found);
        }

        private static String printable(char c) {
            return c >= 0x20 && c < 0x7f ? String.valueOf(c) : String.format("\\u%04x", (int) c);
        }

        private void space() {
            while (i < s.length()) {
                char c = s.charAt(i);
                if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
                    return;
                }
                i++;
            }
        }

        private Object value() {
            space();
            if (i >= s.length()) {
                throw error("expected a value");
            }
            char c = s.charAt(i);
            switch (c) {
                case '{': return object();
                case '[': return array();
                case '"': return string();
                case 't': return word("true", Boolean.TRUE);
                case 'f': return word("false", Boolean.FALSE);
                case 'n': return word("null", null);
                default:
                    if (c == '-' || (c >= '0' && c <= '9')) {
                        return number();
                    }
                    throw error("expected a value");
            }
        }

        private Object word(String w, Object v) {
            if (!s.startsWith(w, i)) {
                throw error("expected " + w);
            }
            i += w.length();
            return v;
        }

        private Map<String, Object> object() {
            Map<String, Object> m = new LinkedHashMap<>();
            i++; // {
            space();
            if (i < s.length() && s.charAt(i) == '}') {
                i++;
                return m;
            }
            while (true) {
                space();
                if (i >= s.length() || s.charAt(i) != '"') {
                    throw error("expected a string key");
                }
                int at = i;
                String k = string();
                space();
                if (i >= s.length() || s.charAt(i) != ':') {
                    throw error("expected ':'");
                }
                i++;
                Object v = value();
                if (m.containsKey(k)) {
                    i = at;
                    throw error("key \"" + k + "\" appears twice in one object");
                }
                m.put(k, v);
                space();
                if (i < s.length() && s.charAt(i) == ',') {
                    i++;
                    continue;
                }
                if (i < s.length() && s.charAt(i) == '}') {
                    i++;
                    return m;
                }
                throw error("expected ',' or '}'");
            }
        }

        private List<Object> array() {
            List<Object> a = new ArrayList<>();
            i++; // [
            space();
            if (i < s.length() && s.charAt(i) == ']') {
                i++;
                return a;
            }
            while (true) {
                a.add(value());
                space();
                if (i < s.length() && s.charAt(i) == ',') {
                    i++;
                    continue;
                }
                if (i < s.length() && s.charAt(i) == ']') {
                    i++;
                    return a;
                }
                throw error("expected ',' or ']'");
            }
        }

        private String string() {
            i++; // "
            StringBuilder sb = new StringBuilder();
            while (true) {
                if (i >= s.length()) {
                    throw error("unterminated string");
                }
                char c = s.charAt(i);
                if (c == '"') {
                    i++;
                    return sb.toString();
                }
                if (c < 0x20) {
                    throw error("control character in a string (escape it)");
                }
                if (c != '\\') {
                    sb.append(c);
                    i++;
                    continue;
                }
                i++;
                if (i >= s.length()) {
                    throw error("unterminated escape");
                }
                char e = s.charAt(i);
                switch (e) {
                    case '"': sb.append('"'); break;
                    case '\\': sb.append('\\'); break;
                    case '/': sb.append('/'); break;
                    case 'b': sb.append('\b'); break;
                    case 'f': sb.append('\f'); break;
                    case 'n': sb.append('\n'); break;
                    case 'r': sb.append('\r'); break;
                    case 't': sb.append('\t'); break;
                    case 'u': {
                        if (i + 5 > s.length()) {
                            throw error("expected four hex digits after \\u");
                        }
                        int cp = 0;
                        for (int k = 1; k <= 4; k++) {
                            int d = Character.digit(s.charAt(i + k), 16);
                            if (d < 0) {
                                i += k;
                                throw error("expected a hex digit in \\u escape");
                            }
                            cp = cp * 16 + d;
                        }
                        sb.append((char) cp);
                        i += 4;
                        break;
                    }
                    default:
                        throw error("unknown escape \\" + printable(e));
                }
                i++;
            }
        }

        private Object number() {
            int start = i;
            if (s.charAt(i) == '-') {
                i++;
            }
            if (i < s.length() && s.charAt(i) == '0') {
                i++;
            } else if (i < s.length() && s.charAt(i) >= '1' && s.charAt(i) <= '9') {
                digits();
            } else {
                throw error("expected a digit");
            }
            boolean integer = true;
            if (i < s.length() && s.charAt(i) == '.') {
                integer = false;
                i++;
                if (i >= s.length() || s.charAt(i) < '0' || s.charAt(i) > '9') {
                    throw error("expected a digit after '.'");
                }
                digits();
            }
            if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
                integer = false;
                i++;
                if (i < s.length() && (s.charAt(i) == '+' || s.charAt(i) == '-')) {
                    i++;
                }
                if (i >= s.length() || s.charAt(i) < '0' || s.charAt(i) > '9') {
                    throw error("expected a digit in the exponent");
                }
                digits();
            }
            String t = s.substring(start, i);
            if (integer) {
                BigInteger n = new BigInteger(t);
                if (n.bitLength() <= 63) {
                    return n.longValue();
                }
            }
            return Double.parseDouble(t);
        }

        private void digits() {
            while (i < s.length() && s.charAt(i) >= '0' && s.charAt(i) <= '9') {
                i++;
            }
        }
    }

    // Last in the class: the patterns above are set by then (static initializers run in order).
    static {
        String text;
        try (InputStream in = Settings.class.getResourceAsStream(RESOURCE)) {
            if (in == null) {
                throw new IllegalStateException("cudabridge: " + RESOURCE + " is missing from the class path "
                        + "(cudabridge.jar is incomplete: rebuild it with `python -m cudabridge build`)");
            }
            text = readUtf8(in);
        } catch (IOException e) {
            throw new IllegalStateException("cudabridge: cannot read " + RESOURCE + ": " + e, e);
        }
        Table t = Table.from(text, RESOURCE);
        PREFIX = t.prefix;
        ALL = t.settings;
        Map<String, Setting> byKey = new LinkedHashMap<>();
        Map<String, Setting> byName = new LinkedHashMap<>();
        Set<String> spellings = new LinkedHashSet<>();
        for (Setting s : ALL) {
            byKey.put(s.key(), s);
            byName.put(s.name(), s);
            if (!spellings.add(s.name()) || (s.envName() != null && !s.envName().equals(s.name()) && !spellings.add(s.envName()))) {
                throw new IllegalStateException("cudabridge: " + RESOURCE + ": " + s.key() + ": its spelling " + s.name()
                        + " or " + s.envName() + " is another setting's too");
            }
            if (s.defaultValue() != null) {
                try {
                    s.parse(s.defaultValue());
                } catch (IllegalArgumentException x) {
                    throw new IllegalStateException("cudabridge: " + RESOURCE + ": " + s.key()
                            + ": its default is refused by its own type: " + x.getMessage(), x);
                }
            }
        }
        BY_KEY = Collections.unmodifiableMap(byKey);
        BY_NAME = Collections.unmodifiableMap(byName);
        Map<String, Setting> variables = new TreeMap<>();
        for (Setting s : ALL) {
            if (s.envName() != null && s.envRead()) {
                variables.put(s.envName(), s);
            }
        }
        VARIABLES = Collections.unmodifiableMap(variables);
        for (String p : new String[] {PYTHON, PYTHON_PATH, LIBRARY, GATE, GATE_HOLD_MICROS}) {
            Setting s = BY_KEY.get(p);
            if (s == null || !s.scope().equals("jvm")) {
                throw new IllegalStateException("cudabridge: " + RESOURCE + " has no jvm setting " + p
                        + " (org.cudabridge.Settings reads it)");
            }
        }
    }

    /** Parses JSON text strictly (for tests and tools): see {@link Json}. */
    static Object parseJson(String text, String source) {
        return new Json(text, source).document();
    }
}
