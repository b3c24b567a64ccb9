package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInfo;
import org.junit.jupiter.api.function.Executable;

/**
 * A test class that needs the real bridge (the emulated device under dev/junit): started once
 * before its tests, shut down after them. The bridge cannot start again in a JVM after its
 * shutdown, so every subclass carries {@code @Tag("own-jvm")} and gets a JVM of its own.
 * JUnit runs this class's {@code @BeforeAll} before a subclass's, and its {@code @AfterAll} after.
 * A subclass marked {@link EmulatedKernels} gets a bridge whose kernels have host kernels.
 */
abstract class RunningBridge {
    static CudaBridge bridge;

    @BeforeAll
    static void startBridge(TestInfo info) {
        BridgeOptions options = BridgeOptions.fromSystemProperties();
        EmulatedKernels twins = info.getTestClass().map(c -> c.getAnnotation(EmulatedKernels.class)).orElse(null);
        if (twins != null) {
            options = options.addPythonPath(Path.of(System.getProperty("user.dir"), "tests").toString())
                    .set("emulatedKernels", twins.value());
        }
        bridge = CudaBridge.start(options);
    }

    @AfterAll
    static void shutDownBridge() {
        bridge.shutdown();
    }

    /** One of the service's statistics now; a name it does not have fails the test. */
    static long stat(String key) {
        Long v = bridge.statistics().get(key);
        if (v == null) {
            throw new AssertionError("no statistic " + key);
        }
        return v;
    }

    /** {@code call} throws {@code type} with every fragment in its message. */
    static <T extends Throwable> void assertRefused(Class<T> type, Executable call, String... fragments) {
        T e = assertThrows(type, call);
        for (String f : fragments) {
            assertTrue(String.valueOf(e.getMessage()).contains(f), () -> "message lacks '" + f + "': " + e.getMessage());
        }
    }
}
