package org.cudabridge;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Every setting of spark-cuda-bridge, from the one table {@code python/cudabridge/settings.json}:
 * the jar's build generates {@link SettingsTable} from it (a constant per setting: its key, scope,
 * type, enum values, bounds, default, doc and derived spellings), so the Java side reads no JSON
 * at run time and cannot disagree with the Python service about what a setting is. Spellings: the
 * Spark key ({@link Setting#sparkKey()}, {@code spark.cudabridge.<key>}, scopes service and
 * plugin), the environment variable ({@link Setting#envName()}, {@code poolLimit ->
 * CUDABRIDGE_POOL_LIMIT}), and for scope {@code jvm} the system property, the key as written
 * ({@code -Dcudabridge.gate}).
 *
 * <p>What is written here is what the driver needs without Python: the check of a value, once
 * per type ({@link Setting#parse}), the same rules and messages as {@code
 * cudabridge.config.check_value}; typed readers that return a value parsed once ({@link
 * Setting#intValue}, {@link Setting#bytesValue}, {@link Setting#secondsValue}, {@link
 * Setting#boolValue}, {@link Setting#enumValue}, {@link Setting#listValue}, {@link
 * Setting#limitValue}; the system properties' {@link #property}, {@link #boolProperty}, {@link
 * #intProperty}), as spark-rapids' {@code RapidsConf} entries do; and {@link #checkAll(Map)},
 * which refuses every unknown key under the prefix with the nearest known one and every {@code
 * CUDABRIDGE_*} variable that nothing reads, then checks the values, as {@code
 * cudabridge.config.check_all} does (tests/test_settings_java.py compares the two over every key
 * and a grid of values).
 */
public final class Settings {
    /** The scopes, in the table's order. */
    public static final List<String> SCOPES = SettingsTable.SCOPES;
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

    private static final String PREFIX = SettingsTable.PREFIX;
    private static final List<Setting> ALL = SettingsTable.ALL;
    private static final Map<String, Setting> BY_KEY;    // table key -> setting
    private static final Map<String, Setting> BY_NAME;   // Spark key, property or variable -> setting
    private static final Map<String, Setting> VARIABLES; // CUDABRIDGE_* variable read -> setting

    static {
        // The table was checked when the jar was built (cudabridge.config.load_table): unique keys and
        // spellings, each default accepted by its type.
        Map<String, Setting> byKey = new LinkedHashMap<>();
        Map<String, Setting> byName = new LinkedHashMap<>();
        Map<String, Setting> variables = new TreeMap<>();
        for (Setting s : ALL) {
            byKey.put(s.key(), s);
            byName.put(s.name(), s);
            if (s.envName() != null && s.envRead()) {
                variables.put(s.envName(), s);
            }
        }
        BY_KEY = Collections.unmodifiableMap(byKey);
        BY_NAME = Collections.unmodifiableMap(byName);
        VARIABLES = Collections.unmodifiableMap(variables);
    }

    private Settings() {}

    /**
     * One setting, as the table gives it ({@code values}: empty unless {@code type} is {@code enum};
     * {@code min}/{@code max}: null where the table gives none; {@code defaultValue}: null where the
     * default is computed, {@code defaultDoc} then says how; {@code env}: a plugin key whose
     * environment variable is read too) with the spellings derived from its key
     * ({@code cudabridge.config.Setting}'s): {@code sparkKey}, {@code spark.cudabridge.<key>} for
     * scopes service and plugin, else null; {@code envName}, {@code CUDABRIDGE_} + the key split at
     * capitals and dots, upper case, null for scope jvm; {@code name}, how users write it (the Spark
     * key, the system property, or the variable); {@code envRead}, whether anything reads its
     * variable (scopes service, environment and dev, and plugin keys marked {@code env}: any other
     * {@code CUDABRIDGE_*} name is refused); {@code envChecked}, whether its variable's value is
     * checked where the bridge starts (every variable read, but those of scope dev). The constants
     * are {@link SettingsTable}'s.
     */
    public record Setting(String key, String scope, String type, List<String> values, Long min, Long max,
                          String defaultValue, String defaultDoc, String doc, boolean test, boolean env,
                          String sparkKey, String envName, String name, boolean envRead, boolean envChecked) {
        public Setting {
            Objects.requireNonNull(key, "key");
            Objects.requireNonNull(scope, "scope");
            Objects.requireNonNull(type, "type");
            Objects.requireNonNull(name, "name");
            values = values == null ? List.of() : List.copyOf(values);
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

        /** An {@code int} setting's value ({@code value} null: the default). */
        public long intValue(String value) {
            return (Long) typed("int", value);
        }

        /** A {@code bytes} setting's value, the byte count ({@code value} null: the default). */
        public long bytesValue(String value) {
            return (Long) typed("bytes", value);
        }

        /** A {@code seconds} setting's value ({@code value} null: the default). */
        public double secondsValue(String value) {
            return (Double) typed("seconds", value);
        }

        /** A {@code bool} setting's value ({@code value} null: the default). */
        public boolean boolValue(String value) {
            return (Boolean) typed("bool", value);
        }

        /** An {@code enum} setting's value as one of {@link #values()} ({@code value} null: the default). */
        public String enumValue(String value) {
            return (String) typed("enum", value);
        }

        /** A {@code list} setting's items: split at commas, each trimmed of ASCII blanks; none for an
         *  empty (or blank) value ({@code value} null: the default). */
        @SuppressWarnings("unchecked")
        public List<String> listValue(String value) {
            return (List<String>) typed("list", value);
        }

        /** A {@code limit} setting's value: bytes, or a fraction of free memory ({@code value} null: the default). */
        public Limit limitValue(String value) {
            return (Limit) typed("limit", value);
        }

        private Object typed(String wanted, String value) {
            if (!type.equals(wanted)) {
                throw new IllegalStateException(name + " is of type " + type + ", not " + wanted);
            }
            String v = value != null ? value : defaultValue;
            if (v == null) {
                throw new IllegalStateException(name + " has no default (" + defaultDoc + ") and is not set");
            }
            return parse(v);
        }

        private static IllegalArgumentException refused(String spelling, String value, String why) {
            return new IllegalArgumentException(spelling + "=" + value + ": " + why);
        }

        /** The value parsed: a Long (int, bytes), Boolean, Double (seconds), {@link Limit}, List of
         *  String (list), the table's spelling (enum) or the String itself (string). */
        Object parse(String value) {
            return parse(value, name);
        }

        /** As {@link #parse(String)}, a refusal naming the setting as {@code spelling} (its
         *  environment variable where the value came from there). The check of each type, the
         *  same as {@code cudabridge.config.check_value}'s. */
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
                        return new Limit(null, f);
                    }
                    return new Limit(parseBytes(spelling, value, MIN_LIMIT_BYTES, Long.MAX_VALUE), 1.0);
                }
                case "seconds": {
                    String v = asciiTrim(value);
                    double s = NUMBER.matcher(v).matches() ? Double.parseDouble(v) : Double.NaN;
                    if (!(s > 0.0 && s < Double.POSITIVE_INFINITY)) {
                        throw refused(spelling, value, "expected a positive number of seconds such as 300 or 0.5");
                    }
                    return s;
                }
                case "list": {
                    List<String> items = new ArrayList<>();
                    if (!asciiTrim(value).isEmpty()) {
                        for (String item : value.split(",", -1)) {
                            String it = asciiTrim(item);
                            if (!values.isEmpty() && !values.contains(it)) {   // a list of named values
                                throw refused(spelling, value, "'" + it + "' not among " + String.join(", ", values));
                            }
                            if (!values.isEmpty() && items.contains(it)) {
                                throw refused(spelling, value, "an item named twice");
                            }
                            items.add(it);
                        }
                    }
                    return Collections.unmodifiableList(items);
                }
                case "string":
                    return value;
                default:
                    throw new IllegalStateException(name + ": no check for type " + type + " (org.cudabridge.Settings)");
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

    /**
     * A {@code limit} setting's value ({@code poolLimit}): {@code bytes} (and a fraction of 1.0), or
     * no bytes (null) and a {@code fraction} of the GPU's free memory ({@code cudabridge.config.Limit}).
     */
    public record Limit(Long bytes, double fraction) {}

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

    // --- the table ---------------------------------------------------------------------------------

    /** {@code spark.cudabridge.} */
    public static String prefix() {
        return PREFIX;
    }

    /** Every setting, in the table's order. */
    public static List<Setting> all() {
        return ALL;
    }

    /** The settings of one scope ({@link #SCOPES}), in the table's order. */
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
            throw new IllegalArgumentException("cudabridge: the settings table has no setting " + key);
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

    /** A system property of scope jvm ({@link SettingsTable}'s {@code *_PROPERTY}): its value, or the
     *  table's default where it is unset (null where that is computed); a value its type refuses
     *  throws IllegalArgumentException ({@code -Dcudabridge.gate.holdMicros must be an integer in
     *  [1, 1000000], got 'abc'}). */
    public static String property(Setting s) {
        jvmSetting(s);
        String v = System.getProperty(s.key());
        if (v == null) {
            return s.defaultValue();
        }
        try {
            s.parse(v);
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException("-D" + s.key() + " must be " + s.expected() + ", got '" + v + "'", e);
        }
        return v;
    }

    /** A {@code bool} system property (see {@link #property}). */
    public static boolean boolProperty(Setting s) {
        return s.boolValue(property(s));
    }

    /** An {@code int} system property (see {@link #property}). */
    public static long intProperty(Setting s) {
        return s.intValue(property(s));
    }

    private static void jvmSetting(Setting s) {
        if (!s.scope().equals("jvm")) {
            throw new IllegalArgumentException(s.key() + " is of scope " + s.scope() + ", not a system property");
        }
    }
}
