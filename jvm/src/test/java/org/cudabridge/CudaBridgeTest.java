package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

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
        assertSame(b, CudaBridge.start(new BridgeOptions().set("backend", "emulated")));
        assertSame(b, CudaBridge.get());
        assertTrue(CudaBridge.isStarted());
        assertTrue(b.describe().contains("\"backend\": \"emulated\""), b.describe());
    }

    @Test
    @Order(2)
    void aToolCallReachesPython() {
        assertTrue(CudaBridge.get().callTool("interpreter", null).startsWith("{"));
        assertThrows(NullPointerException.class, () -> CudaBridge.get().callTool(null, "{}"));
    }

    @Test
    @Order(3)
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
