package org.cudabridge.executor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.cudabridge.CudaBridgeException;
import org.junit.jupiter.api.Test;

class FailuresTest {
    @Test
    void aMessageThatSaysEnoughIsKeptAsItIs() {
        assertEquals("cudabridge: no Python given", Failures.describe(new IllegalStateException("cudabridge: no Python given")));
        assertEquals("bad", Failures.describe(new CudaBridgeException("bad", "java")));
    }

    @Test
    void otherwiseTheClassIsNamed() {
        assertEquals("java.lang.IllegalArgumentException: x", Failures.describe(new IllegalArgumentException("x")));
        assertEquals("java.lang.NullPointerException", Failures.describe(new NullPointerException()));
        assertEquals("java.lang.IllegalStateException: table unreadable",
                Failures.describe(new ExceptionInInitializerError(new IllegalStateException("table unreadable"))));
    }

    @Test
    void oneLineFlattensAndBoundsTracebacks() {
        assertEquals("a | b | c", Failures.oneLine("a\r\nb\n   c  "));
        String longText = "x".repeat(5000);
        String flat = Failures.oneLine(longText);
        assertEquals(2004, flat.length());
        assertTrue(flat.endsWith(" ..."));
    }

    @Test
    void onlyAFailureThroughTheBridgeOrNamingCudaMayBeTheGpus() {
        assertTrue(Failures.mayBeGpuFault("org.cudabridge.CudaBridgeException", "allocate failed", null));
        assertTrue(Failures.mayBeGpuFault("java.lang.IllegalStateException", "x",
                "at org.cudabridge.DeviceBuffer.copyFrom(DeviceBuffer.java:10)"));
        assertTrue(Failures.mayBeGpuFault(null, "cudaErrorIllegalAddress: an illegal memory access", null));
        assertFalse(Failures.mayBeGpuFault("java.lang.ArithmeticException", "/ by zero",
                "at com.example.Job.map(Job.java:3)"));
        assertFalse(Failures.mayBeGpuFault(null, null, null));
    }
}
