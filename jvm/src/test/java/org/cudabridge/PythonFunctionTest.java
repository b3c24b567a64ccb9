package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Python functions called from Java through the JNI native (issue 27) on the emulated device:
 * tests/python_functions/functions_for_tests.py, found through a search path; arguments, results,
 * errors, direct ByteBuffers, the task guard under a racing release, functions over batches.
 */
@Tag("own-jvm")
@SuppressWarnings("try")   // scopes held for their task binding only
class PythonFunctionTest extends RunningBridge {
    static final List<String> PATH = List.of(Path.of(System.getProperty("user.dir"), "tests", "python_functions").toString());

    static PythonFunction f(String name) {
        return bridge.pythonFunction("functions_for_tests:" + name, PATH);
    }

    @AfterEach
    void released() {
        assertEquals(0, bridge.tasksBound());
    }

    @Test
    void scalarsStringsAndBytesGoInAndComeBack() {
        try (TaskScope t = bridge.bindTask(1)) {
            assertEquals(42L, f("add").call(2, 40L));
            assertEquals(3.5, f("add").call(1.5f, 2.0));
            assertEquals("NoneType,int,float,bool,str,bytes", f("kinds").call(null, (short) 1, 2.5, true, "s", new byte[] {1}));
            assertEquals("ABC \u00e9\uD83D\uDE00", f("text").call("abc"));
            assertArrayEquals(new byte[] {3, 2, 1}, (byte[]) f("reverse_bytes").call((Object) new byte[] {1, 2, 3}));
            assertEquals(Arrays.asList(1L, "x", null, true), f("echo").call(1, "x", null, true));
            assertSame(f("add"), f("add"), "resolved once, cached");
        }
    }

    @Test
    void anArrayArgumentIsTheBufferItself() {
        try (TaskScope t = bridge.bindTask(2); DeviceBuffer b = bridge.allocate(32)) {
            b.copyFrom(new double[] {1, 2, 3, 4});
            assertEquals(10.0, f("total").call(b.asArray(DType.FLOAT64)));
            assertEquals("2,2:float64", f("shape_of").call(b.asArray(DType.FLOAT64, 2, 2)));
            assertEquals("32:uint8", f("shape_of").call(b));
            assertNull(f("scale").call(b.asArrayAt(8, DType.FLOAT64, 2), 10.0));   // in place, elements 1 and 2
            double[] out = new double[4];
            b.copyTo(out);
            assertArrayEquals(new double[] {1, 20, 30, 4}, out);
        }
    }

    @Test
    void arrayResultsAreBuffersOfTheTask() {
        try (TaskScope t = bridge.bindTask(3); DeviceBuffer b = bridge.allocate(24)) {
            b.copyFrom(new double[] {1, 2, 3});
            try (DeviceArray sq = (DeviceArray) f("squares").call(5)) {
                assertEquals(DType.FLOAT64, sq.dtype());
                assertArrayEquals(new long[] {5}, sq.shape());
                assertEquals(3, sq.buffer().taskAttemptId());
                double[] out = new double[5];
                sq.buffer().copyTo(out);
                assertArrayEquals(new double[] {0, 1, 4, 9, 16}, out);
            }
            List<?> two = (List<?>) f("two_arrays").call(b.asArray(DType.FLOAT64));
            DeviceArray plusOne = (DeviceArray) two.get(0);
            DeviceArray sum = (DeviceArray) two.get(1);
            double[] one = new double[1];
            sum.buffer().copyTo(one);
            assertEquals(6.0, one[0]);
            assertEquals(3, plusOne.elements());
            plusOne.close();   // sum is left for the task's release to reclaim
            // a result is an argument like any other buffer of the task
            assertEquals(6.0, f("total").call(sum));
            assertFalse(plusOne.buffer().isAlive());
        }
    }

    @Test
    void aFailingFunctionIsATypedErrorWithItsTracebackAndTheExecutorGoesOn() {
        try (TaskScope t = bridge.bindTask(4)) {
            FunctionFailedException e = assertThrows(FunctionFailedException.class, () -> f("fail").call("no luck"));
            assertEquals("ValueError", e.getPythonType());
            assertTrue(e.getMessage().startsWith("functions_for_tests:fail: ValueError: no luck\n"), e.getMessage());
            assertTrue(e.pythonTraceback().contains("raise ValueError(message)"), e.pythonTraceback());
            assertThrows(FunctionFailedException.class, () -> f("exits").call());
            assertRefused(CudaBridgeException.class, () -> f("returns_a_set").call(), "cannot be returned to Java");
            assertRefused(CudaBridgeException.class, () -> f("huge_int").call(), "does not fit a Java long");
            assertRefused(CudaBridgeException.class, () -> bridge.pythonFunction("no_such_module_xyz:f"), "cannot be imported");
            assertRefused(CudaBridgeException.class, () -> bridge.pythonFunction("not a reference"), "not a function reference");
            assertRefused(CudaBridgeException.class, () -> f("not_a_function"), "not a function");
            assertRefused(CudaBridgeException.class, () -> bridge.pythonFunction(new byte[] {1, 2}), "not a pickled function");
            assertEquals(5L, f("add").call(2, 3));   // and the executor goes on
        }
    }

    @Test
    void badArgumentsAreRefusedInJavaBeforeAnythingRuns() {
        long before;
        try (TaskScope t = bridge.bindTask(5); DeviceBuffer b = bridge.allocate(16)) {
            before = (Long) f("count_calls").call();
            assertRefused(IllegalArgumentException.class, () -> f("count_calls").call(new Object()), "argument 0");
            assertRefused(IllegalArgumentException.class, () -> f("count_calls").call(ByteBuffer.allocate(4)), "heap ByteBuffer");
            assertRefused(IllegalArgumentException.class, () -> b.asArray(DType.FLOAT64, 3), "needs 24 bytes");
            assertRefused(IllegalArgumentException.class, () -> b.asArrayAt(4, DType.FLOAT64, 1), "multiple");
            assertRefused(IllegalArgumentException.class, () -> b.asArray(DType.FLOAT64, -1), "negative");
            assertRefused(IllegalArgumentException.class, () -> b.asArray(DType.FLOAT64, 1L << 40, 1L << 40), "overflows");
            DeviceBuffer odd = bridge.allocate(10);
            assertRefused(IllegalArgumentException.class, () -> odd.asArray(DType.INT32), "whole number");
            odd.close();
            assertRefused(IllegalStateException.class, () -> f("total").call(odd.asArray(DType.UINT8)), "closed");
            assertEquals(before + 1, (Long) f("count_calls").call());
        }
        // no bound task on this thread
        assertRefused(IllegalStateException.class, () -> f("count_calls").call(), "no task is bound");
        // another task's buffer
        try (TaskScope a = bridge.bindTask(6)) {
            DeviceBuffer other;
            try (Attachment x = bridge.attach(6)) {
                other = bridge.allocate(8);
            }
            try (TaskScope b = bridge.bindTask(7)) {
                assertRefused(IllegalArgumentException.class, () -> f("total").call(other.asArray(DType.FLOAT64)),
                        "not of the calling task");
            }
        }
    }

    @Test
    void theRawNativeRefusesABadArgumentWhereverItStandsAndFreesWhatItRead() {
        try (TaskScope t = bridge.bindTask(12)) {
            long fn = 0;
            long[] scalar = new long[2];
            // the stack below a native call filled with pointer-like garbage first (launch's arguments,
            // refused), so that entries the failing call never read are not zeros by luck
            long[] garbage = new long[512];
            java.util.Arrays.fill(garbage, 0x00007fdeadbeef00L);
            assertThrows(RuntimeException.class, () -> NativeBridge.launch(12, 987654321L, new int[] {1, 1, 1, 1, 1, 1},
                    0, garbage, new byte[512], garbage));
            // a String, then a byte[] whose reference is missing: the first's copy is freed, nothing else touched
            byte[] kinds = {PythonFunction.ARG_STRING, PythonFunction.ARG_BYTES, PythonFunction.ARG_BYTES};
            Object[] refs = {"read first", null, new byte[] {1}};
            assertRefused(NullPointerException.class,
                    () -> NativeBridge.callFunction(12, fn, 3, kinds, new long[3], refs, scalar), "reference is null");
            assertRefused(IllegalArgumentException.class, () -> NativeBridge.callFunction(12, fn, 1,
                    new byte[] {PythonFunction.ARG_DIRECT}, new long[1], new Object[] {java.nio.ByteBuffer.allocate(4)},
                    scalar), "not direct");
            assertRefused(IllegalArgumentException.class, () -> NativeBridge.callFunction(12, fn, 1, new byte[] {99},
                    new long[1], new Object[] {"x"}, scalar), "unknown argument kind");
            assertEquals(5L, f("add").call(2, 3));   // and the bridge goes on
        }
    }

    @Test
    void aDirectByteBufferIsAViewDuringTheCallOnly() {
        try (TaskScope t = bridge.bindTask(8)) {
            ByteBuffer direct = ByteBuffer.allocateDirect(3).order(ByteOrder.nativeOrder());
            direct.put(0, (byte) 1).put(1, (byte) 2).put(2, (byte) 3);
            assertEquals(6L, f("view_sum").call(direct));
            f("write_view").call(direct);
            assertEquals(42, direct.get(0));
            FunctionFailedException ro = assertThrows(FunctionFailedException.class,
                    () -> f("write_view").call(direct.asReadOnlyBuffer()));
            assertEquals("TypeError", ro.getPythonType());
            // a function that keeps a numpy array over it: refused, since Java may free that memory now
            assertRefused(CudaBridgeException.class, () -> f("keep_view").call(direct), "kept a view or an array");
            assertEquals(6L - 1 + 42, f("view_sum").call(direct));   // still works afterwards
        }
    }

    @Test
    void aCallNeverRunsAfterItsTaskReleaseBegan() throws Exception {
        PythonFunction count = f("count_calls");
        for (int round = 0; round < 5; round++) {
            long id = 100 + round;
            TaskScope task = bridge.bindTask(id);
            AtomicBoolean released = new AtomicBoolean();
            AtomicInteger after = new AtomicInteger();
            AtomicInteger refused = new AtomicInteger();
            CountDownLatch go = new CountDownLatch(1);
            List<Thread> threads = new ArrayList<>();
            for (int i = 0; i < 8; i++) {
                Thread th = new Thread(() -> {
                    try (Attachment a = bridge.attach(id)) {
                        go.await();
                        for (int k = 0; k < 50; k++) {
                            // a call that starts once the release has returned must be refused; one
                            // that returns after it may have run before it (its return races the flag)
                            boolean startedAfter = released.get();
                            count.call(0.001);
                            if (startedAfter) {
                                after.incrementAndGet();
                            }
                        }
                    } catch (UnknownTaskException | IllegalStateException e) {
                        refused.incrementAndGet();
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                });
                th.start();
                threads.add(th);
            }
            go.countDown();
            Thread.sleep(5);
            task.close();
            released.set(true);
            for (Thread th : threads) {
                th.join();
            }
            assertEquals(0, after.get(), "a call that started after its task's release had returned ran");
            assertTrue(refused.get() > 0);
        }
    }

    @Test
    void aFunctionOverBatchesTakesAndReturnsColumns() {
        try (TaskScope t = bridge.bindTask(9); DeviceBuffer id = bridge.allocate(24); DeviceBuffer x = bridge.allocate(24)) {
            id.copyFrom(new long[] {7, 8, 9});
            x.copyFrom(new double[] {-1, 0, 2});
            PythonFunction perRow = f("per_row").overBatches(List.of("id", "x"), List.of("id", "y", "positive"),
                    List.of(DType.INT64, DType.FLOAT64, DType.BOOL));
            assertSame(perRow, f("per_row").overBatches(List.of("id", "x"), List.of("id", "y", "positive"),
                    List.of(DType.INT64, DType.FLOAT64, DType.BOOL)));
            List<?> out = (List<?>) perRow.call(id.asArray(DType.INT64), x.asArray(DType.FLOAT64));
            double[] y = new double[3];
            ((DeviceArray) out.get(1)).buffer().copyTo(y);
            assertArrayEquals(new double[] {-1, 1, 5}, y);
            byte[] positive = new byte[3];
            ((DeviceArray) out.get(2)).buffer().copyTo(positive);
            assertArrayEquals(new byte[] {0, 0, 1}, positive);
            assertEquals(DType.BOOL, ((DeviceArray) out.get(2)).dtype());
            PythonFunction wrong = f("wrong_type").overBatches(List.of("x"), List.of("y"), List.of(DType.FLOAT64));
            assertRefused(CudaBridgeException.class, () -> wrong.call(x.asArray(DType.FLOAT64)),
                    "output column 'y' is int32; the output schema says float64");
            assertFalse(out.isEmpty());
        }
    }
}
