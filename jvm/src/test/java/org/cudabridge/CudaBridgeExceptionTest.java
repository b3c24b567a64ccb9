package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Random;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/**
 * Python exceptions reach Java as {@link CudaBridgeException}s carrying the Python message
 * ({@code "<Type>: <str>"}) and the qualified Python type, from the hot path (the JNI natives) and
 * from the control path (a JPype proxy call); after each the JVM and the service keep working.
 * Out of memory, the subclass with numbers: {@link GpuOutOfMemoryExceptionTest}.
 */
@Tag("own-jvm")
class CudaBridgeExceptionTest extends RunningBridge {
    static TaskScope task;

    @BeforeAll
    static void bindTask() {
        task = bridge.bindTask(7);
    }

    @AfterAll
    static void releaseTask() {
        task.release();
    }

    /** After every error: allocate, copy in and out, compare, free. */
    @AfterEach
    void theServiceStillWorks() {
        byte[] data = new byte[1 << 20];
        new Random(3).nextBytes(data);
        byte[] back = new byte[data.length];
        try (DeviceBuffer buf = bridge.allocate(data.length)) {
            buf.copyFrom(data);
            buf.copyTo(back);
        }
        assertArrayEquals(data, back, "the service works after the error");
        assertSame(task, bridge.currentTask());
    }

    private static CudaBridgeException assertPythonError(Executable call, String pythonType, String... fragments) {
        CudaBridgeException e = assertThrows(CudaBridgeException.class, call);
        for (String f : fragments) {
            assertTrue(String.valueOf(e.getMessage()).contains(f), () -> "message lacks '" + f + "': " + e.getMessage());
        }
        assertEquals(pythonType, e.getPythonType());
        return e;
    }

    @Test
    void aFreeOfABogusHandleIsPythonsInvalidFree() {
        CudaBridgeException e = assertPythonError(() -> NativeBridge.free(0x123456789L), "cudabridge.errors.InvalidFree",
                "InvalidFree", "not live");
        assertInstanceOf(InvalidFreeException.class, e, "the hot path throws the kind's own type");
    }

    @Test
    void anAllocateForAnUnknownTaskIsPythonsUnknownTask() {
        long[] out = new long[2];
        CudaBridgeException e = assertPythonError(() -> NativeBridge.allocate(424242, 64, out),
                "cudabridge.errors.UnknownTask", "UnknownTask", "424242");
        assertInstanceOf(UnknownTaskException.class, e);
    }

    /** Each error task code can act on reaches Java from the control path as its own type. */
    @Test
    void theServicesActionableErrorsHaveTypesOfTheirOwn() {
        Class<?>[][] kinds = {
            {KernelFaultException.class}, {DeviceUnusableException.class}, {HostWaitTimeoutException.class},
            {UnknownTaskException.class}, {InvalidFreeException.class},
        };
        String[] names = {"KernelFault", "DeviceUnusable", "HostWaitTimeout", "UnknownTask", "InvalidFree"};
        for (int i = 0; i < names.length; i++) {
            String kind = names[i];
            CudaBridgeException e = assertPythonError(() -> bridge.callTool("raise_error",
                    "{\"kind\": \"" + kind + "\", \"message\": \"on purpose\"}"), "cudabridge.errors." + kind, kind);
            assertEquals(kinds[i][0], e.getClass(), kind);
        }
        // an error task code cannot act on by its type stays the plain exception
        CudaBridgeException plain = assertPythonError(() -> bridge.callTool("raise_error",
                "{\"kind\": \"InvalidArgument\", \"message\": \"x\"}"), "cudabridge.errors.InvalidArgument");
        assertEquals(CudaBridgeException.class, plain.getClass());
    }

    @Test
    void aKindThisJarDoesNotKnowIsThePlainExceptionWithItsMessage() {
        CudaBridgeException e = CudaBridgeException.of("NewError: x", "cudabridge.errors.NewError", "NewError");
        assertEquals(CudaBridgeException.class, e.getClass());
        assertEquals("cudabridge.errors.NewError", e.getPythonType());
        assertEquals(CudaBridgeException.class, CudaBridgeException.of("m", "ValueError", null).getClass());
    }

    @Test
    void aPlainPythonExceptionOnTheControlPathKeepsItsTypeAndMessage() {
        assertPythonError(() -> bridge.callTool("raise_error", "{\"kind\": \"ValueError\", \"message\": \"boom from python\"}"),
                "ValueError", "ValueError: boom from python");
        assertPythonError(() -> bridge.callTool("raise_error", "{\"kind\": \"ZeroDivisionError\", \"message\": \"zero\"}"),
                "ZeroDivisionError", "ZeroDivisionError: zero");
    }
}
