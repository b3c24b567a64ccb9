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
 * misspelled) returns false from {@link CudaBridge#tryStart}, is recorded, and makes
 * {@link CudaBridge#get()} fail with its reason; a retry with the built library then starts Python
 * and the service on the emulated device. The bridge starts once per JVM and cannot start again
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
    @Order(7)
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
    @Order(8)
    void afterShutdownGetFailsAndTheBridgeCannotStartAgain() {
        CudaBridge bridge = CudaBridge.get();
        bridge.shutdown();
        assertFalse(CudaBridge.isStarted());
        IllegalStateException e = assertThrows(IllegalStateException.class, CudaBridge::get);
        assertTrue(e.getMessage().contains("shut down"), e.getMessage());
        assertThrows(IllegalStateException.class, () -> CudaBridge.start(BridgeOptions.fromSystemProperties()));
    }
}
