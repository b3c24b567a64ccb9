package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Random;
import java.util.concurrent.atomic.AtomicReference;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The exception's numbers, from the long[] the bridge passes; and an out-of-memory on the real
 * bridge (emulated device, a 64 MiB pool) arriving as one, after which the JVM and the service keep
 * working. The bridge is started only by that test (the others need none), so the class runs in a
 * JVM of its own.
 */
@Tag("own-jvm")
class GpuOutOfMemoryExceptionTest {
    private static final String TYPE = "cudabridge.errors.OutOfDeviceMemory";
    private static final long MIB = 1L << 20;

    @AfterAll
    static void stop() {
        if (CudaBridge.isStarted()) {
            CudaBridge.get().shutdown();
        }
    }

    /** Distinct numbers, so a getter reading the wrong position is seen. */
    private static long[] numbers() {
        return new long[] {1001, 1002, 1003, 1004, 1005, 1006, 7, 2};
    }

    @Test
    void fieldsAreThePythonOrderInCamelCase() {
        assertEquals(List.of("requestedBytes", "inUseBytes", "reservedBytes", "largestFreeBlockBytes",
                "waitingOnEventsBytes", "limitBytes", "device", "reason"), GpuOutOfMemoryException.FIELDS);
        assertThrows(UnsupportedOperationException.class, () -> GpuOutOfMemoryException.FIELDS.add("x"));
    }

    @Test
    void eachGetterReadsItsOwnPosition() {
        GpuOutOfMemoryException e = new GpuOutOfMemoryException("OutOfDeviceMemory: requested 1001 bytes", TYPE, numbers());
        assertEquals(1001, e.requestedBytes());
        assertEquals(1002, e.inUseBytes());
        assertEquals(1003, e.reservedBytes());
        assertEquals(1004, e.largestFreeBlockBytes());
        assertEquals(1005, e.waitingOnEventsBytes());
        assertEquals(1006, e.limitBytes());
        assertEquals(7, e.device());
        assertEquals(GpuOutOfMemoryException.Reason.TOO_LARGE, e.reason());
    }

    @Test
    void theReasonsAreThePythonReasonsInOrder() {
        long[] fields = numbers();
        String[] python = {"NO_WAIT", "BREAKER", "TOO_LARGE", "TIMEOUT"};   // OutOfDeviceMemory.REASONS, upper case
        for (int code = 0; code < python.length; code++) {
            fields[7] = code;
            assertEquals(python[code], new GpuOutOfMemoryException("m", TYPE, fields).reason().name());
        }
        assertEquals(python.length, GpuOutOfMemoryException.Reason.values().length);
    }

    @Test
    void isACudaBridgeExceptionWithMessageAndPythonType() {
        GpuOutOfMemoryException e = new GpuOutOfMemoryException("OutOfDeviceMemory: requested 1001 bytes", TYPE, numbers());
        CudaBridgeException base = assertInstanceOf(CudaBridgeException.class, e);
        assertEquals("OutOfDeviceMemory: requested 1001 bytes", base.getMessage());
        assertEquals(TYPE, base.getPythonType());
        assertNull(base.getCause());
    }

    @Test
    void keepsACopyOfTheNumbers() {
        long[] fields = numbers();
        GpuOutOfMemoryException e = new GpuOutOfMemoryException("m", TYPE, fields);
        fields[0] = -1;
        fields[6] = -1;
        assertEquals(1001, e.requestedBytes());
        assertEquals(7, e.device());
    }

    @Test
    void refusesTheWrongCountOfNumbersNamingTheFields() {
        IllegalArgumentException shorter = assertThrows(IllegalArgumentException.class,
                () -> new GpuOutOfMemoryException("m", TYPE, new long[] {1, 2, 3}));
        assertTrue(shorter.getMessage().contains("expected 8 numbers " + GpuOutOfMemoryException.FIELDS + ", got [1, 2, 3]"),
                shorter.getMessage());
        assertThrows(IllegalArgumentException.class, () -> new GpuOutOfMemoryException("m", TYPE, new long[9]));
        IllegalArgumentException none = assertThrows(IllegalArgumentException.class,
                () -> new GpuOutOfMemoryException("m", TYPE, null));
        assertTrue(none.getMessage().endsWith("got null"), none.getMessage());
    }

    @Test
    void anOutOfMemoryOnTheBridgeCarriesThePoolsNumbersAndTheServiceSurvives() throws Exception {
        CudaBridge b = CudaBridge.start(BridgeOptions.fromSystemProperties().set("poolLimit", "64m"));
        try (TaskScope t = b.bindTask(7)) {
            DeviceBuffer big = b.allocate(40 * MIB);
            GpuOutOfMemoryException oom = assertThrows(GpuOutOfMemoryException.class, () -> b.allocate(40 * MIB));
            String m = oom.getMessage();
            assertTrue(m.contains("OutOfDeviceMemory") && m.contains("out of device memory"), m);
            assertTrue(m.contains("requested 41943040 bytes"), m);
            assertEquals(TYPE, oom.getPythonType());
            assertEquals(40 * MIB, oom.requestedBytes());
            assertTrue(oom.inUseBytes() >= 40 * MIB, "in use " + oom.inUseBytes());
            assertTrue(oom.reservedBytes() > 0 && oom.reservedBytes() <= 64 * MIB, "reserved " + oom.reservedBytes());
            assertTrue(oom.largestFreeBlockBytes() < 40 * MIB, "largest free " + oom.largestFreeBlockBytes());
            assertEquals(64 * MIB, oom.limitBytes());
            // the only task holding memory is the one waiting: the breaker fails it at once
            assertEquals(GpuOutOfMemoryException.Reason.BREAKER, oom.reason());
            big.close();
            // still working: the freed 40 MiB again, a copy in and out
            byte[] data = new byte[1 << 20];
            new Random(3).nextBytes(data);
            byte[] back = new byte[data.length];
            try (DeviceBuffer buf = b.allocate(40 * MIB)) {
                assertEquals(t.stream(), buf.stream());
                buf.copyFrom(data);
                buf.copyTo(back);
            }
            assertArrayEquals(data, back, "the service works after the out-of-memory");
        }
        // another thread, another task, after all that
        AtomicReference<Throwable> failed = new AtomicReference<>();
        Thread other = new Thread(() -> {
            try (TaskScope t = b.bindTask(8); DeviceBuffer buf = b.allocate(100)) {
                buf.memset(1);
                assertEquals(t.stream(), buf.stream());
            } catch (Throwable e) {
                failed.set(e);
            }
        });
        other.start();
        other.join();
        assertNull(failed.get(), () -> String.valueOf(failed.get()));
        assertEquals(0L, b.statistics().get("live_allocations"));
    }
}
