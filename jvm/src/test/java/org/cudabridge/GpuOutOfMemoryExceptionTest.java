package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

class GpuOutOfMemoryExceptionTest {
    private static final String TYPE = "cudabridge.errors.OutOfDeviceMemory";

    /** Distinct numbers, so a getter reading the wrong position is seen. */
    private static long[] numbers() {
        return new long[] {1001, 1002, 1003, 1004, 1005, 1006, 7};
    }

    @Test
    void fieldsAreThePythonOrderInCamelCase() {
        assertEquals(List.of("requestedBytes", "inUseBytes", "reservedBytes", "largestFreeBlockBytes",
                "waitingOnEventsBytes", "limitBytes", "device"), GpuOutOfMemoryException.FIELDS);
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
        assertTrue(shorter.getMessage().contains("expected 7 numbers " + GpuOutOfMemoryException.FIELDS + ", got [1, 2, 3]"),
                shorter.getMessage());
        assertThrows(IllegalArgumentException.class, () -> new GpuOutOfMemoryException("m", TYPE, new long[8]));
        IllegalArgumentException none = assertThrows(IllegalArgumentException.class,
                () -> new GpuOutOfMemoryException("m", TYPE, null));
        assertTrue(none.getMessage().endsWith("got null"), none.getMessage());
    }
}
