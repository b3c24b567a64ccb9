package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/** The front's lifetime on the real bridge: one start per JVM, and nothing after shutdown. */
@Tag("own-jvm")
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class CudaBridgeTest {
    @Test
    @Order(1)
    void startIsIdempotent() {
        CudaBridge b = CudaBridge.start();
        assertSame(b, CudaBridge.start(new BridgeOptions().set("backend", "emulated")), "running: options ignored");
        assertSame(b, CudaBridge.get());
        assertTrue(CudaBridge.isStarted());
        // the backend the JVM was started with: emulated under dev/junit, cuda on the GPU machine
        String backend = System.getProperty("spark.cudabridge.backend", "emulated");
        assertTrue(b.describe().contains("\"backend\": \"" + backend + "\""), b.describe());
    }

    @Test
    @Order(2)
    void pythonRunsFromTheVenvItWasGiven() {
        String python = System.getProperty("cudabridge.python");
        assertNotNull(python, "run the Java unit tests with dev/junit (it passes -Dcudabridge.python)");
        Path venv = Paths.get(python).toAbsolutePath().getParent().getParent();
        String describe = CudaBridge.get().describe();
        Matcher m = Pattern.compile("\"prefix\":\\s*\"([^\"]*)\"").matcher(describe);
        assertTrue(m.find(), describe);
        assertEquals(venv.toString(), m.group(1), "sys.prefix is the venv of " + python);
    }

    @Test
    @Order(3)
    void aToolCallReachesPython() {
        assertTrue(CudaBridge.get().callTool("interpreter", null).startsWith("{"));
        assertThrows(NullPointerException.class, () -> CudaBridge.get().callTool(null, "{}"));
    }

    @Test
    @Order(4)
    void afterShutdownEveryCallIsRefusedAndTasksAreDead() {
        CudaBridge b = CudaBridge.get();
        TaskScope t = b.bindTask(1);
        DeviceBuffer buf = b.allocate(64);
        b.shutdown();
        b.shutdown();   // idempotent
        assertFalse(CudaBridge.isStarted());
        assertTrue(t.isReleased());
        assertFalse(buf.isAlive());
        for (Runnable call : new Runnable[] {CudaBridge::get, () -> b.bindTask(2), b::statistics, () -> b.allocatePinned(8),
                                             () -> CudaBridge.start()}) {
            IllegalStateException e = assertThrows(IllegalStateException.class, call::run);
            assertTrue(e.getMessage().contains("shut down"), e.getMessage());
        }
        assertEquals(0, b.tasksBound());
    }
}
