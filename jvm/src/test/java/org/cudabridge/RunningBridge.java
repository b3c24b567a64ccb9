package org.cudabridge;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;

/**
 * A test class that needs the real bridge (the emulated device under dev/junit): started once
 * before its tests, shut down after them. The bridge cannot start again in a JVM after its
 * shutdown, so every subclass carries {@code @Tag("own-jvm")} and gets a JVM of its own.
 * JUnit runs this class's {@code @BeforeAll} before a subclass's, and its {@code @AfterAll} after.
 */
abstract class RunningBridge {
    static CudaBridge bridge;

    @BeforeAll
    static void startBridge() {
        bridge = CudaBridge.start();
    }

    @AfterAll
    static void shutDownBridge() {
        bridge.shutdown();
    }
}
