package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * A start on the base interpreter the build recorded ({@code python.base} in
 * cudabridge-native.properties), which has no JPype: the bootstrap fails with the import error's
 * traceback and how to install JPype, the failure is recorded, and a retry on the same interpreter
 * with the venv's site-packages on the Python path starts the service. The first start initializes
 * that interpreter for the JVM's life (a later start cannot switch to another Python), so this
 * class runs in a JVM of its own; its methods run in order.
 *
 * <p>Starts on a Python without cudabridge itself stay in tests/test_jvm_bridge.py: the build's
 * properties beside the jar on this class path always add the repository's python/ to the path.
 */
@Tag("own-jvm")
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class BasePythonStartTest {
    static String base;
    static String version;

    @BeforeAll
    static void baseInterpreter() {
        java.util.Properties built = InstallLayout.ofJar().nativeProperties();
        base = built.getProperty("python.base");
        version = built.getProperty("python.version");
        assertNotNull(base, "the build records python.base beside cudabridge.jar");
        assertNotNull(version, "the build records python.version beside cudabridge.jar");
        assumeTrue(Files.isExecutable(Paths.get(base)), "no base interpreter at " + base);
    }

    @AfterAll
    static void stop() {
        if (CudaBridge.isStarted()) {
            CudaBridge.get().shutdown();
        }
    }

    @Test
    @Order(1)
    void withoutJPypeTheStartFailsWithTheTracebackAndTheFix() {
        assertFalse(CudaBridge.tryStart(new BridgeOptions().python(base).set("backend", "emulated")));
        assertFalse(CudaBridge.isStarted());
        CudaBridgeException f = CudaBridge.startFailure();
        assertNotNull(f, "tryStart failed but recorded no reason");
        assertEquals("startup", f.getPythonType());
        String msg = f.getMessage();
        assertTrue(msg.contains("JPype is not importable") && msg.contains("Traceback (most recent call last)"), msg);
        assertTrue(msg.contains("pip install JPype1==1.7.1"), msg);
        CudaBridgeException fast = assertThrows(CudaBridgeException.class, CudaBridge::get);
        assertTrue(fast.getMessage().contains("its start failed"), fast.getMessage());
        assertSame(f, fast.getCause());
    }

    @Test
    @Order(2)
    void aRetryOnTheSameInterpreterWithJPypeOnThePathStarts() {
        String python = System.getProperty("cudabridge.python");
        assertNotNull(python, "run the Java unit tests with dev/junit (it passes -Dcudabridge.python)");
        Path site = Paths.get(python).toAbsolutePath().getParent().getParent()
                .resolve("lib").resolve("python" + version).resolve("site-packages");
        assertTrue(Files.isDirectory(site), "no site-packages at " + site);
        CudaBridge b = CudaBridge.start(new BridgeOptions().python(base).addPythonPath(site.toString())
                .set("backend", "emulated"));
        assertNull(CudaBridge.startFailure(), "a successful start clears the recorded failure");
        assertTrue(b.describe().contains("\"python\": \"" + base + "\""), b.describe());
        try (TaskScope t = b.bindTask(1); DeviceBuffer buf = b.allocate(16)) {
            buf.memset(3);
            byte[] back = new byte[16];
            buf.copyTo(back);
            assertEquals(3, back[15], t.toString());
        }
    }
}
