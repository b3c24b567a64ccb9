package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.regex.Pattern;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;
import org.junit.jupiter.api.io.TempDir;

/**
 * Start-up of the real bridge in this JVM: a start that fails (the library is missing, a key is
 * misspelled, a JVM setting is out of range, the Python executable does not exist or its venv is
 * of another Python version) returns false from {@link CudaBridge#tryStart}, is recorded, and makes
 * {@link CudaBridge#get()} fail with its reason; a retry with the built library then starts Python
 * and the service on the emulated device. (A start on a Python without JPype initializes that
 * interpreter for the JVM's life: {@link BasePythonStartTest}, in a JVM of its own.) The bridge starts once per JVM and cannot start again
 * after {@code shutdown()}, so this class runs in a JVM of its own ({@code own-jvm}) and its
 * methods run in order, each building on the state the one before left.
 */
@Tag("own-jvm")
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class BridgeStartFailureTest {
    @TempDir
    static Path dir;

    private static Path missingLibrary() {
        return dir.resolve("not-built").resolve("libcudabridge_jni.so");
    }

    @AfterAll
    static void shutDown() {
        if (CudaBridge.isStarted()) {
            CudaBridge.get().shutdown();
        }
    }

    @Test
    @Order(1)
    void beforeAnyStartGetSaysItIsNotStarted() {
        assertFalse(CudaBridge.isStarted());
        assertNull(CudaBridge.startFailure());
        IllegalStateException e = assertThrows(IllegalStateException.class, CudaBridge::get);
        assertTrue(e.getMessage().startsWith("cudabridge is not started in this JVM"), e.getMessage());
    }

    @Test
    @Order(2)
    void tryStartWithAMissingLibraryReturnsFalseAndRecordsWhy() {
        assertFalse(Files.exists(missingLibrary()));
        BridgeOptions options = new BridgeOptions().library(missingLibrary().toString()).set("backend", "emulated");
        assertFalse(CudaBridge.tryStart(options));
        assertFalse(CudaBridge.isStarted());
        CudaBridgeException failure = CudaBridge.startFailure();
        assertNotNull(failure, "tryStart failed but recorded no reason");
        assertTrue(failure.getMessage().contains("no bridge library at " + missingLibrary()), failure.getMessage());
        assertTrue(failure.getMessage().contains("python -m cudabridge build"), failure.getMessage());
        assertEquals("java", failure.getPythonType());
    }

    @Test
    @Order(3)
    void getThrowsWithTheRecordedReason() {
        CudaBridgeException recorded = CudaBridge.startFailure();
        assertNotNull(recorded);
        CudaBridgeException e = assertThrows(CudaBridgeException.class, CudaBridge::get);
        assertEquals("cudabridge is not available: its start failed: " + recorded.getMessage(), e.getMessage());
        assertTrue(e.getMessage().contains(missingLibrary().toString()), e.getMessage());
        assertSame(recorded, e.getCause());
        assertEquals(recorded.getPythonType(), e.getPythonType());
    }

    @Test
    @Order(4)
    void startThrowsWhatTryStartRecords() {
        BridgeOptions options = new BridgeOptions().library(missingLibrary().toString());
        CudaBridgeException e = assertThrows(CudaBridgeException.class, () -> CudaBridge.start(options));
        assertSame(e, CudaBridge.startFailure());
        assertTrue(e.getMessage().contains("no bridge library at " + missingLibrary()), e.getMessage());
    }

    @Test
    @Order(5)
    void misspelledKeyFailsBeforeAnythingIsLoaded() {
        // the library is the built one here: the key is refused before it is looked at
        assertFalse(CudaBridge.tryStart(new BridgeOptions().set("poolLimt", "64m")));
        CudaBridgeException failure = CudaBridge.startFailure();
        assertNotNull(failure);
        assertTrue(failure.getMessage().contains("unknown key spark.cudabridge.poolLimt; did you mean "
                + "spark.cudabridge.poolLimit?"), failure.getMessage());
        CudaBridgeException e = assertThrows(CudaBridgeException.class, CudaBridge::get);
        assertTrue(e.getMessage().contains("poolLimt"), e.getMessage());
    }

    @Test
    @Order(6)
    void gateHoldOutOfRangeFailsBeforeTheLibraryIsLoaded() {
        assertNull(NativeBridge.loadedLibrary(), "no start before this one loaded the library");
        for (String value : new String[] {"abc", "0", "2000000"}) {
            System.setProperty(SettingsTable.GATE_HOLD_MICROS_PROPERTY.key(), value);
            try {
                assertFalse(CudaBridge.tryStart(BridgeOptions.fromSystemProperties()), value);
            } finally {
                System.clearProperty(SettingsTable.GATE_HOLD_MICROS_PROPERTY.key());
            }
            CudaBridgeException failure = CudaBridge.startFailure();
            assertNotNull(failure, value);
            assertTrue(failure.getMessage().contains("cudabridge.gate.holdMicros must be"), failure.getMessage());
            assertTrue(failure.getMessage().contains("got '" + value + "'"), failure.getMessage());
            assertEquals("java", failure.getPythonType());
            assertNull(NativeBridge.loadedLibrary(), "refused before anything was loaded");
            assertFalse(CudaBridge.isStarted());
        }
    }

    /** tryStart fails with the failure recorded, of type {@code startup}, and get() carries it. */
    private static CudaBridgeException assertStartFails(BridgeOptions options) {
        assertFalse(CudaBridge.tryStart(options));
        assertFalse(CudaBridge.isStarted());
        CudaBridgeException f = CudaBridge.startFailure();
        assertNotNull(f, "tryStart failed but recorded no reason");
        assertEquals("startup", f.getPythonType());
        CudaBridgeException fast = assertThrows(CudaBridgeException.class, CudaBridge::get);
        assertTrue(fast.getMessage().contains("its start failed"), fast.getMessage());
        assertSame(f, fast.getCause(), "get() carries the recorded failure");
        return f;
    }

    @Test
    @Order(7)
    void aPythonThatDoesNotExistIsRefusedClearly() {
        CudaBridgeException f = assertStartFails(new BridgeOptions().python("/nonexistent/venv/bin/python")
                .set("backend", "emulated"));
        assertTrue(f.getMessage().contains("no such Python executable: /nonexistent/venv/bin/python"), f.getMessage());
    }

    @Test
    @Order(8)
    void aVenvOfAnotherPythonVersionIsRefusedClearly() throws Exception {
        String python = System.getProperty("cudabridge.python");
        assertNotNull(python, "run the Java unit tests with dev/junit (it passes -Dcudabridge.python)");
        String linked = InstallLayout.ofJar().nativeProperties().getProperty("python.version");
        assertNotNull(linked, "the build records python.version beside cudabridge.jar");
        Path venv = dir.resolve("old-venv");
        Files.createDirectories(venv.resolve("bin"));
        Files.createSymbolicLink(venv.resolve("bin").resolve("python"), Paths.get(python).toAbsolutePath());
        Files.writeString(venv.resolve("pyvenv.cfg"),
                "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.9.18\n");
        CudaBridgeException f = assertStartFails(new BridgeOptions().python(venv.resolve("bin").resolve("python").toString())
                .set("backend", "emulated"));
        assertTrue(f.getMessage().contains("is Python 3.9") && f.getMessage().contains("linked to Python " + linked),
                f.getMessage());
    }

    @Test
    @Order(9)
    void retryWithTheBuiltLibraryStartsOnTheEmulatedDevice() {
        // dev/junit passes -Dcudabridge.python, -Dcudabridge.library and -Dspark.cudabridge.backend=emulated
        assertEquals("emulated", System.getProperty("spark.cudabridge.backend"), "run the Java unit tests with dev/junit");
        BridgeOptions options = BridgeOptions.fromSystemProperties();
        boolean started = CudaBridge.tryStart(options);
        CudaBridgeException failure = CudaBridge.startFailure();
        assertTrue(started, () -> "the retry did not start: " + failure);
        assertNull(failure, "a successful start clears the recorded failure");
        assertTrue(CudaBridge.isStarted());
        CudaBridge bridge = CudaBridge.get();
        assertTrue(Pattern.compile("\"backend\":\\s*\"emulated\"").matcher(bridge.describe()).find(), bridge.describe());
        // start is idempotent: later calls return the running bridge, whatever their options
        assertSame(bridge, CudaBridge.start(new BridgeOptions().library(missingLibrary().toString())));
    }

    @Test
    @Order(10)
    void startedBridgeLendsPinnedMemory() {
        CudaBridge bridge = CudaBridge.get();
        PinnedBuffer pinned = bridge.allocatePinned(4096);
        ByteBuffer b = pinned.buffer();
        assertTrue(b.isDirect());
        assertEquals(4096, pinned.size());
        assertEquals(4096, b.capacity());
        b.putLong(0, 0x0123456789abcdefL);
        assertEquals(0x0123456789abcdefL, b.getLong(0));
        pinned.close();
        assertTrue(pinned.isClosed());
        assertThrows(IllegalStateException.class, pinned::buffer);
        pinned.close(); // a second close does nothing
        assertThrows(IllegalArgumentException.class, () -> bridge.allocatePinned(0));
    }

    @Test
    @Order(11)
    void afterShutdownGetFailsAndTheBridgeCannotStartAgain() {
        CudaBridge bridge = CudaBridge.get();
        bridge.shutdown();
        assertFalse(CudaBridge.isStarted());
        IllegalStateException e = assertThrows(IllegalStateException.class, CudaBridge::get);
        assertTrue(e.getMessage().contains("shut down"), e.getMessage());
        assertThrows(IllegalStateException.class, () -> CudaBridge.start(BridgeOptions.fromSystemProperties()));
    }
}
