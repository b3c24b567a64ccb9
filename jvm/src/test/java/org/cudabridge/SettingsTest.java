package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertAll;
import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/** Settings over the table the build generated into cudabridge.jar ({@link SettingsTable}, from
 *  python/cudabridge/settings.json): the checks by type, the typed readers, unknown names. */
class SettingsTest {

    private static void refused(String sparkKey, String value, String expectedMessage) {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Settings.check(sparkKey, value),
                sparkKey + "=" + value + " was accepted");
        assertEquals(expectedMessage, e.getMessage());
    }

    private static Executable accepted(String sparkKey, String value) {
        return () -> assertDoesNotThrow(() -> Settings.check(sparkKey, value), sparkKey + "=" + value + " was refused");
    }

    private static String spark(String key) {
        return "spark.cudabridge." + key;
    }

    // --- the table and its spellings ---------------------------------------------------------------

    @Test
    void tableIsReadWithItsPrefixAndEveryScope() {
        assertEquals("spark.cudabridge.", Settings.prefix());
        assertFalse(Settings.all().isEmpty());
        for (String scope : Settings.SCOPES) {
            assertFalse(Settings.scope(scope).isEmpty(), "no setting of scope " + scope);
            assertTrue(Settings.scope(scope).stream().allMatch(s -> s.scope().equals(scope)));
        }
        assertThrows(UnsupportedOperationException.class, () -> Settings.all().clear());
    }

    @Test
    void theSystemPropertiesAreTheJvmScopesConstants() {
        assertEquals(List.of(SettingsTable.PYTHON_PROPERTY, SettingsTable.PYTHON_PATH_PROPERTY,
                SettingsTable.LIBRARY_PROPERTY, SettingsTable.GATE_PROPERTY, SettingsTable.GATE_HOLD_MICROS_PROPERTY),
                Settings.scope("jvm"));
        assertEquals("cudabridge.gate.holdMicros", SettingsTable.GATE_HOLD_MICROS_PROPERTY.key());
        assertSame(SettingsTable.POOL_LIMIT, Settings.setting("poolLimit"));
        assertEquals(Settings.all(), SettingsTable.ALL);
    }

    @Test
    void unknownScopeAndUnknownKeyAreRefused() {
        IllegalArgumentException scope = assertThrows(IllegalArgumentException.class, () -> Settings.scope("executor"));
        assertEquals("no scope executor; the scopes are service, plugin, jvm, environment, dev", scope.getMessage());
        IllegalArgumentException key = assertThrows(IllegalArgumentException.class, () -> Settings.setting("poolLimt"));
        assertTrue(key.getMessage().endsWith("has no setting poolLimt"), key.getMessage());
    }

    @Test
    void spellingsDerivedFromTheKey() {
        Settings.Setting pool = Settings.setting("poolLimit");
        assertEquals("spark.cudabridge.poolLimit", pool.sparkKey());
        assertEquals("CUDABRIDGE_POOL_LIMIT", pool.envName());
        assertEquals("spark.cudabridge.poolLimit", pool.name());

        Settings.Setting refresh = Settings.setting("metrics.refreshMs");   // scope plugin, a dotted key
        assertEquals("spark.cudabridge.metrics.refreshMs", refresh.sparkKey());
        assertEquals("CUDABRIDGE_METRICS_REFRESH_MS", refresh.envName());

        Settings.Setting gate = SettingsTable.GATE_HOLD_MICROS_PROPERTY;  // scope jvm: the key is the property
        assertNull(gate.sparkKey());
        assertNull(gate.envName());
        assertEquals("cudabridge.gate.holdMicros", gate.name());

        Settings.Setting fast = Settings.setting("nativeFastPath");        // scope environment: only a variable
        assertNull(fast.sparkKey());
        assertEquals("CUDABRIDGE_NATIVE_FAST_PATH", fast.name());
    }

    @Test
    void namedFindsEachSpellingUsersWrite() {
        assertSame(Settings.setting("poolLimit"), Settings.named("spark.cudabridge.poolLimit"));
        assertSame(SettingsTable.GATE_PROPERTY, Settings.named("cudabridge.gate"));
        assertSame(Settings.setting("nativeFastPath"), Settings.named("CUDABRIDGE_NATIVE_FAST_PATH"));
        assertNull(Settings.named("poolLimit"));      // a bare service key is not a spelling users write
        assertNull(Settings.named("spark.cudabridge.nope"));
    }

    // --- values by type ----------------------------------------------------------------------------

    @Test
    void intValuesWithinTheirRange() {
        String key = spark("streamsPerGpu"); // int in [1, 1024]
        assertAll(accepted(key, "1"), accepted(key, "1024"), accepted(key, "+7"), accepted(key, " 12\t"));
        refused(key, "0", key + "=0: expected an integer in [1, 1024]");
        refused(key, "1025", key + "=1025: expected an integer in [1, 1024]");
        refused(key, "1.0", key + "=1.0: expected an integer");
        refused(key, "", key + "=: expected an integer");
        refused(key, "99999999999999999999999", key + "=99999999999999999999999: expected an integer in [1, 1024]");
        assertEquals(12L, SettingsTable.STREAMS_PER_GPU.intValue(" 12 "));
        assertEquals(32L, SettingsTable.STREAMS_PER_GPU.intValue(null)); // the table's default
    }

    @Test
    void nonAsciiDigitsAreRefused() {
        String key = spark("streamsPerGpu");
        refused(key, "\uff11\uff12", key + "=\uff11\uff12: expected an integer in [1, 1024] (ASCII only)");
    }

    @Test
    void byteValuesWithUnits() {
        Settings.Setting memory = Settings.setting("emulatedMemory"); // bytes, at least 2 MiB
        assertEquals(512L << 20, memory.bytesValue("512m"));
        assertEquals(3L << 30, memory.bytesValue("3GB"));
        assertEquals(1L << 40, memory.bytesValue(" 1t "));
        assertEquals(16L << 30, memory.bytesValue(null));
        String key = spark("emulatedMemory");
        refused(key, "1m", key + "=1m: 1048576 bytes is below the least accepted, 2097152 (2 MiB)");
        refused(key, "5x", key + "=5x: expected bytes such as 1073741824, 512m or 8g");
        refused(key, "-5m", key + "=-5m: expected bytes such as 1073741824, 512m or 8g");
        refused(key, "9000000000000t", key + "=9000000000000t: 9895604649984000000000000 bytes is 2**63 or more");
        // at most the emulated backend's address window of one GPU
        assertEquals(1L << 40, memory.bytesValue("1t"));
        refused(key, "2t", key + "=2t: 2199023255552 bytes is above the most accepted, 1099511627776 (1 TiB)");
        String slot = spark("stagingSlotBytes");
        refused(slot, "16g", slot + "=16g: 17179869184 bytes is above the most accepted, 1073741824 (1 GiB)");
    }

    @Test
    void limitIsBytesOrAFractionOfFreeMemory() {
        String key = spark("poolLimit");
        assertAll(accepted(key, "0.9"), accepted(key, "1.0"), accepted(key, ".5"), accepted(key, "2m"),
                accepted(key, "8g"));
        refused(key, "255", key + "=255: 255 bytes is below the least accepted, 2097152 (2 MiB)");
        refused(key, "1", key + "=1: 1 bytes is below the least accepted, 2097152 (2 MiB)"); // a bare 1 is one byte
        String fraction = ": a fraction of free memory must be in [0.000001, 1] (a smaller one gives a pool under "
                + "2 MiB on any GPU)";
        refused(key, "1.5", key + "=1.5" + fraction);
        refused(key, "0.0", key + "=0.0" + fraction);
        refused(key, "0.0000001", key + "=0.0000001" + fraction); // a 256-byte pool on a 2.5 GB GPU
        assertAll(accepted(key, "0.000001"), accepted(key, "0.1e-5"));
        refused(key, "0.5g", key + "=0.5g: expected bytes (1073741824, 512m, 8g) or a fraction of free memory "
                + "in [0.000001, 1] such as 0.9");
        assertEquals(new Settings.Limit(null, 0.9), SettingsTable.POOL_LIMIT.limitValue(null)); // the default
        assertEquals(new Settings.Limit(8L << 30, 1.0), SettingsTable.POOL_LIMIT.limitValue("8g"));
        assertEquals(new Settings.Limit(null, 0.5), SettingsTable.POOL_LIMIT.limitValue(".5"));
    }

    @Test
    void boolValues() {
        Settings.Setting race = Settings.setting("emulatedRaceCheck");
        assertTrue(race.boolValue("TRUE"));
        assertTrue(race.boolValue("1"));
        assertFalse(race.boolValue(" false "));
        assertFalse(race.boolValue("0"));
        assertFalse(race.boolValue(null)); // default false
        String key = spark("emulatedRaceCheck");
        refused(key, "yes", key + "=yes: expected true or false (or 1 or 0)");
    }

    @Test
    void enumCaseMattersUnlessEveryValueIsUpperCase() {
        assertEquals("emulated", Settings.setting("backend").enumValue("emulated"));
        String backend = spark("backend");
        refused(backend, "Emulated", backend + "=Emulated: expected one of auto, cuda, emulated");
        // logLevel's values are all upper case: any case is read, the table's spelling comes back
        assertEquals("DEBUG", Settings.setting("logLevel").enumValue("debug"));
        assertEquals("INFO", Settings.setting("logLevel").enumValue(null));
    }

    @Test
    void secondsArePositiveAndFinite() {
        String key = spark("hostWaitTimeout");
        assertAll(accepted(key, "300"), accepted(key, "0.5"), accepted(key, "1e3"));
        for (String bad : List.of("0", "-1", "inf", "NaN", "1e999", "5s")) {
            refused(key, bad, key + "=" + bad + ": expected a positive number of seconds such as 300 or 0.5");
        }
        assertEquals(0.5, SettingsTable.HOST_WAIT_TIMEOUT.secondsValue(" .5 "));
        assertEquals(300.0, SettingsTable.HOST_WAIT_TIMEOUT.secondsValue(null)); // the table's default
    }

    @Test
    void listsAreSplitAtCommas() {
        Settings.Setting addresses = SettingsTable.GPU_ADDRESSES;
        assertEquals(List.of("0", "1"), addresses.listValue("0, 1"));
        assertEquals(List.of("GPU-1a", "", "2"), addresses.listValue("GPU-1a,,2 "));
        assertEquals(List.of(), addresses.listValue(" "));
        // no default (every visible GPU, computed): nothing to read when it is not set
        IllegalStateException unset = assertThrows(IllegalStateException.class, () -> addresses.listValue(null));
        assertEquals("spark.cudabridge.gpuAddresses has no default (every visible GPU) and is not set", unset.getMessage());
    }

    @Test
    void typedReadersRefuseOtherTypesAndMissingDefaults() {
        IllegalStateException notInt = assertThrows(IllegalStateException.class,
                () -> SettingsTable.BACKEND.intValue("1"));
        assertEquals("spark.cudabridge.backend is of type enum, not int", notInt.getMessage());
        assertThrows(IllegalStateException.class, () -> SettingsTable.STREAMS_PER_GPU.boolValue("1"));
        assertThrows(IllegalStateException.class, () -> SettingsTable.STREAMS_PER_GPU.enumValue("1"));
        assertThrows(IllegalStateException.class, () -> SettingsTable.STREAMS_PER_GPU.bytesValue("1"));
        assertThrows(IllegalStateException.class, () -> SettingsTable.POOL_INITIAL.intValue("1"));
        // a string setting has no typed reader; valueOr gives the value or the (possibly null) default
        Settings.Setting addresses = SettingsTable.GPU_ADDRESS_MAP;
        assertNull(addresses.valueOr(null));
        assertEquals("0:1,1:0", addresses.valueOr("0:1,1:0"));
        assertEquals("1", Settings.setting("emulatedDevices").valueOr(null));
        assertThrows(IllegalArgumentException.class, () -> Settings.setting("emulatedDevices").valueOr("0"));
    }

    @Test
    void expectedDescribesEachType() {
        assertEquals("an integer in [1, 1024]", Settings.setting("streamsPerGpu").expected());
        assertEquals("an integer in [0, 86400000]", Settings.setting("metrics.refreshMs").expected());
        assertEquals("one of normal, high", Settings.setting("taskPriority").expected());
        assertEquals("true or false", Settings.setting("asyncRelease").expected());
        assertEquals("bytes such as 1073741824, 512m or 8g (at least 2097152, 2 MiB; at most 1099511627776, 1 TiB)",
                Settings.setting("emulatedMemory").expected());
        assertEquals("bytes such as 1073741824, 512m or 8g", Settings.setting("pinnedPool").expected());
    }

    // --- unknown keys -------------------------------------------------------------------------------

    @Test
    void unknownKeyGetsTheNearestKnownOne() {
        refused("spark.cudabridge.poolLimt", "1g", "unknown key spark.cudabridge.poolLimt; did you mean "
                + "spark.cudabridge.poolLimit?");
        assertEquals("spark.cudabridge.poolLimit", Settings.nearestKey("spark.cudabridge.pool_limit"));
        assertEquals("spark.cudabridge.streamsPerGpu", Settings.nearestKey("STREAMS-PER-GPU"));
        assertNull(Settings.nearestKey("spark.cudabridge.somethingElseEntirely"));
        assertEquals("unknown key spark.cudabridge.somethingElseEntirely; no key is close (python -m cudabridge "
                + "config lists them)", Settings.unknownKeyMessage("somethingElseEntirely"));
    }

    @Test
    void nearestKeyIsOnlyASparkKey() {
        // cudabridge.gate is a system property (scope jvm): never suggested for a Spark key
        String near = Settings.nearestKey("spark.cudabridge.cudabridge.gate");
        assertTrue(near == null || near.startsWith("spark.cudabridge."), near);
    }

    @Test
    void editDistance() {
        assertEquals(3, Settings.editDistance("kitten", "sitting"));
        assertEquals(0, Settings.editDistance("", ""));
        assertEquals(4, Settings.editDistance("", "abcd"));
        assertEquals(1, Settings.editDistance("poollimit", "poollimt"));
    }

    @Test
    void humanBytesUsesTheLargestExactUnit() {
        assertEquals("2 MiB", Settings.humanBytes(2L << 20));
        assertEquals("1536 KiB", Settings.humanBytes(1536L << 10));
        assertEquals("3 TiB", Settings.humanBytes(3L << 40));
        assertEquals("1000 bytes", Settings.humanBytes(1000));
    }

    @Test
    void checkAllReportsEveryUnknownKeyBeforeAnyValue() {
        Map<String, String> conf = new LinkedHashMap<>();
        conf.put("spark.cudabridge.streamsPerGpu", "0");      // bad value: not reported while keys are unknown
        conf.put("spark.cudabridge.poolLimt", "1g");
        conf.put("spark.cudabridge.backnd", "emulated");
        conf.put("spark.executor.memory", "bogus");            // outside the prefix: not looked at
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Settings.checkAll(conf));
        assertEquals("unknown key spark.cudabridge.backnd; did you mean spark.cudabridge.backend?; "
                + "unknown key spark.cudabridge.poolLimt; did you mean spark.cudabridge.poolLimit?", e.getMessage());
    }

    @Test
    void checkAllReportsEveryBadValueOnceKeysAreKnown() {
        Map<String, String> conf = new LinkedHashMap<>();
        conf.put("spark.cudabridge.streamsPerGpu", "0");
        conf.put("spark.cudabridge.backend", "gpu");
        conf.put("spark.cudabridge.poolLimit", "0.5");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Settings.checkAll(conf));
        assertEquals("spark.cudabridge.backend=gpu: expected one of auto, cuda, emulated; "
                + "spark.cudabridge.streamsPerGpu=0: expected an integer in [1, 1024]", e.getMessage());
        conf.put("spark.cudabridge.streamsPerGpu", "8");
        conf.put("spark.cudabridge.backend", "emulated");
        conf.put("spark.cudabridge.taskBind", "eager"); // a plugin key is a Spark key too
        assertDoesNotThrow(() -> Settings.checkAll(conf));
    }

    @Test
    void thePinnedPoolAndStagingAreSizedApart() {
        // staging has its own reservation (stagingCopies x stagingSlotBytes per GPU): a pinned pool
        // smaller than what one copy stages through is fine, on the driver as on the executors
        for (String pool : List.of("0", "1m", "2m", "8m", "15m")) {
            assertDoesNotThrow(() -> Settings.checkAll(Map.of(spark("pinnedPool"), pool)), pool);
        }
        assertDoesNotThrow(() -> Settings.checkAll(Map.of(spark("stagingSlots"), "16"),
                Map.of("CUDABRIDGE_STAGING_SLOT_BYTES", "8m", "CUDABRIDGE_STAGING_COPIES", "32")));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> Settings.checkAll(Map.of(spark("stagingCopies"), "0")));
        assertTrue(e.getMessage().startsWith(spark("stagingCopies") + "=0: "), e.getMessage());
        e = assertThrows(IllegalArgumentException.class, () -> Settings.checkAll(Map.of(spark("stagingWait"), "-1")));
        assertTrue(e.getMessage().startsWith(spark("stagingWait") + "=-1: "), e.getMessage());
    }

    @Test
    void checkAllRefusesAVariableNothingReadsWithTheNearest() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Settings.checkAll(Map.of(),
                Map.of("CUDABRIDGE_STREAMS_PER_GPUS", "3", "CUDABRIDGE_TASK_BIND", "eager", "PATH", "/bin")));
        assertEquals("unknown environment variable CUDABRIDGE_STREAMS_PER_GPUS; did you mean CUDABRIDGE_STREAMS_PER_GPU?; "
                + "CUDABRIDGE_TASK_BIND is not read from the environment: spark.cudabridge.taskBind is a plugin key, "
                + "set in the Spark configuration (--conf spark.cudabridge.taskBind=...)", e.getMessage());
        IllegalArgumentException value = assertThrows(IllegalArgumentException.class,
                () -> Settings.checkAll(Map.of(), Map.of("CUDABRIDGE_STREAMS_PER_GPU", "0")));
        assertEquals("CUDABRIDGE_STREAMS_PER_GPU=0: expected an integer in [1, 1024]", value.getMessage());
        assertDoesNotThrow(() -> Settings.checkAll(Map.of(), Map.of("CUDABRIDGE_STREAMS_PER_GPU", " ")));  // unset
        // the scripts' variables are known, their values left to the scripts; CUDABRIDGE_PYTHON is read
        assertDoesNotThrow(() -> Settings.checkAll(Map.of(), Map.of("CUDABRIDGE_SKIP_JVM_TESTS", "whatever",
                "CUDABRIDGE_PYTHON", "/venv/bin/python", "CUDABRIDGE_EMULATED_RACE_CHECK", "1")));
        // the driver: the executors' variables as the Spark configuration sets them
        IllegalArgumentException driver = assertThrows(IllegalArgumentException.class, () -> Settings.checkAll(
                Map.of("spark.executorEnv.CUDABRIDGE_POOL_LIMT", "1g")));
        assertEquals("unknown environment variable CUDABRIDGE_POOL_LIMT; did you mean CUDABRIDGE_POOL_LIMIT?",
                driver.getMessage());
        assertTrue(Settings.variables().containsKey("CUDABRIDGE_PYTHON"));
        assertFalse(Settings.variables().containsKey("CUDABRIDGE_TASK_BIND"));
    }

    @Test
    void checkAllRefusesAJvmPropertyWrittenAsASparkKey() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> Settings.checkAll(Map.of("spark.cudabridge.cudabridge.gate", "true")));
        assertTrue(e.getMessage().startsWith("unknown key spark.cudabridge.cudabridge.gate; "), e.getMessage());
    }

    // --- system properties (scope jvm) ---------------------------------------------------------------

    /** Runs {@code body} with the system property {@code key} set to {@code value} (null: cleared). */
    private static void withProperty(String key, String value, Runnable body) {
        String before = System.getProperty(key);
        try {
            if (value == null) {
                System.clearProperty(key);
            } else {
                System.setProperty(key, value);
            }
            body.run();
        } finally {
            if (before == null) {
                System.clearProperty(key);
            } else {
                System.setProperty(key, before);
            }
        }
    }

    private static final Settings.Setting HOLD = SettingsTable.GATE_HOLD_MICROS_PROPERTY;
    private static final Settings.Setting GATE = SettingsTable.GATE_PROPERTY;

    @Test
    void propertyFallsBackToTheTablesDefault() {
        withProperty(HOLD.key(), null, () -> {
            assertEquals("1000", Settings.property(HOLD));
            assertEquals(1000L, Settings.intProperty(HOLD));
        });
        withProperty(GATE.key(), null, () -> assertTrue(Settings.boolProperty(GATE)));
    }

    @Test
    void propertyIsReadAndChecked() {
        withProperty(HOLD.key(), "250", () -> assertEquals(250L, Settings.intProperty(HOLD)));
        withProperty(GATE.key(), "0", () -> assertFalse(Settings.boolProperty(GATE)));
        withProperty(HOLD.key(), "abc", () -> {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Settings.property(HOLD));
            assertEquals("-Dcudabridge.gate.holdMicros must be an integer in [1, 1000000], got 'abc'", e.getMessage());
        });
        withProperty(HOLD.key(), "2000000",
                () -> assertThrows(IllegalArgumentException.class, () -> Settings.intProperty(HOLD)));
    }

    @Test
    void propertyOnlyForJvmScope() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> Settings.property(SettingsTable.POOL_LIMIT));
        assertEquals("poolLimit is of scope service, not a system property", e.getMessage());
    }
}
