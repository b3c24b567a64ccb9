package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.util.Arrays;
import java.util.Map;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Off-heap memory by address (issue 16 item 3): copies from and to memory Java code owns outside
 * the heap (here Unsafe's, as Arrow's and Spark's off-heap vectors are), pageable and registered
 * with {@link CudaBridge#registerHost}; copyFromAddress / copyToAddress complete on return for both,
 * the asynchronous forms take registered memory only; every bad input refused before it reaches the GPU.
 */
@Tag("own-jvm")
class HostRegistrationTest extends RunningBridge {
    static Object unsafe;
    static Method allocate, free, putByte, getByte, setMemory;

    @BeforeAll
    static void start() throws Exception {
        Class<?> c = Class.forName("sun.misc.Unsafe");   // by reflection: no compile-time use of it
        Field f = c.getDeclaredField("theUnsafe");
        f.setAccessible(true);
        unsafe = f.get(null);
        allocate = c.getMethod("allocateMemory", long.class);
        free = c.getMethod("freeMemory", long.class);
        putByte = c.getMethod("putByte", long.class, byte.class);
        getByte = c.getMethod("getByte", long.class);
        setMemory = c.getMethod("setMemory", long.class, long.class, byte.class);
    }

    @AfterEach
    void released() {
        assertEquals(0, bridge.tasksBound());
    }

    static long offHeap(int n) throws Exception {
        return (long) allocate.invoke(unsafe, (long) n);
    }

    @Test
    void offHeapBytesRoundTripPageableAndRegistered() throws Exception {
        int n = 1 << 16;
        long src = offHeap(n);
        long dst = offHeap(n);
        try (TaskScope t = bridge.bindTask(7701); DeviceBuffer buf = bridge.allocate(n)) {
            for (int i = 0; i < n; i++) putByte.invoke(unsafe, src + i, (byte) (i * 7));
            buf.copyFromAddress(src, n, 0);                     // pageable: staged before returning
            buf.copyToAddress(dst, n, 0);
            assertArrayEquals(read(src, n), read(dst, n));
            try (HostRegistration in = bridge.registerHost(src, n); HostRegistration out = bridge.registerHost(dst, n)) {
                putByte.invoke(unsafe, src, (byte) 99);
                buf.copyFromAddressAsync(src, 1024, 0);         // registered: asynchronous
                buf.copyToAddressAsync(dst + 16, 512, 0);       // an interior range
                bridge.synchronize();
                byte[] want = new byte[512];
                System.arraycopy(read(src, 1024), 0, want, 0, 512);
                assertArrayEquals(want, read(dst + 16, 512));
                assertEquals(n, in.bytes());
                assertTrue(out.address() == dst);
            }
            assertEquals(7701, t.taskAttemptId());
        } finally {
            free.invoke(unsafe, src);
            free.invoke(unsafe, dst);
        }
    }

    @Test
    void badAddressesRegistrationsAndRangesAreRefused() throws Exception {
        long mem = offHeap(8192);
        try (TaskScope t = bridge.bindTask(7702); DeviceBuffer buf = bridge.allocate(4096)) {
            assertThrows(IllegalArgumentException.class, () -> buf.copyFromAddress(0, 16, 0));
            assertThrows(IllegalArgumentException.class, () -> buf.copyToAddress(mem, -1, 0));
            assertThrows(IndexOutOfBoundsException.class, () -> buf.copyFromAddress(mem, 4097, 0));
            assertThrows(IllegalArgumentException.class, () -> bridge.registerHost(0, 16));
            assertThrows(IllegalArgumentException.class, () -> bridge.registerHost(mem, 0));
            HostRegistration r = bridge.registerHost(mem, 4096);
            CudaBridgeException overlap = assertThrows(CudaBridgeException.class, () -> bridge.registerHost(mem + 8, 16));
            assertTrue(overlap.getMessage().contains("overlaps"), overlap.getMessage());
            CudaBridgeException past = assertThrows(CudaBridgeException.class,   // half in the region, half past it
                    () -> buf.copyFromAddress(mem + 4000, 200, 0));
            assertTrue(past.getMessage().contains("runs past the page-locked"), past.getMessage());
            r.close();
            r.close();                                          // again: a no-op
            CudaBridgeException gone = assertThrows(CudaBridgeException.class, () -> buf.copyFromAddress(mem, 64, 0));
            assertTrue(gone.getMessage().contains("unregistered"), gone.getMessage());
            buf.copyFromAddress(mem + 4096, 64, 0);             // outside the unregistered range: fine
            assertEquals(7702, t.taskAttemptId());
        } finally {
            free.invoke(unsafe, mem);
        }
    }

    @Test
    void closeWaitsForTheCopiesQueuedFromTheRegionBeforeItsMemoryIsFreed() throws Exception {
        // Issue 23 item 6.1, the Javadoc's sequence: close the registration, then free the memory.
        // close() returned at once while a copy from the region was still queued (behind a kernel
        // here): the copy then read memory written after close() (0x77 reached the device), or
        // freed (SIGSEGV in memcpy on a native thread).
        int n = 8 << 20;                                        // malloc maps it: unmapped by free
        long mem = offHeap(n);
        try (TaskScope t = bridge.bindTask(7703); DeviceBuffer buf = bridge.allocate(n)) {
            setMemory.invoke(unsafe, mem, (long) n, (byte) 0x11);
            HostRegistration r = bridge.registerHost(mem, n);
            bridge.callTool("spin", "{\"task\": 7703, \"seconds\": 0.5}");   // a long kernel ahead of the copy
            buf.copyFromAddressAsync(mem, n, 0);                // registered: queued, asynchronous
            r.close();
            setMemory.invoke(unsafe, mem, (long) n, (byte) 0x77);
            free.invoke(unsafe, mem);
            mem = 0;
            bridge.synchronize();
            byte[] back = new byte[4096];
            buf.copyTo(back, 0, (long) n - back.length, back.length);
            byte[] want = new byte[4096];
            Arrays.fill(want, (byte) 0x11);
            assertArrayEquals(want, back, "data written to the region after close() reached the device");
            assertEquals(7703, t.taskAttemptId());
        } finally {
            if (mem != 0) free.invoke(unsafe, mem);
        }
    }

    @Test
    void registeredMemoryCopiedByAddressIsCompleteOnReturn() throws Exception {
        // Issue 25 item 7: copyFromAddress / copyToAddress complete on return for registered memory
        // too (a DMA, then a wait for the stream); a long kernel ahead of each copy would show one
        // that only queued its DMA.
        int n = 1 << 16;
        long mem = offHeap(n);
        try (TaskScope t = bridge.bindTask(7704); DeviceBuffer buf = bridge.allocate(n);
             HostRegistration r = bridge.registerHost(mem, n)) {
            setMemory.invoke(unsafe, mem, (long) n, (byte) 0x21);
            long syncs = stat("bridge_synchronizes");
            bridge.callTool("spin", "{\"task\": 7704, \"seconds\": 0.3}");
            buf.copyFromAddress(mem, n, 0);
            setMemory.invoke(unsafe, mem, (long) n, (byte) 0x77);   // at once: the copy has read it
            byte[] back = new byte[n];
            buf.copyTo(back);
            byte[] want = new byte[n];
            Arrays.fill(want, (byte) 0x21);
            assertArrayEquals(want, back, "copyFromAddress read the registered memory before it returned");
            bridge.callTool("spin", "{\"task\": 7704, \"seconds\": 0.3}");
            buf.copyToAddress(mem, n, 0);                       // no synchronize after it
            assertArrayEquals(want, read(mem, n), "copyToAddress wrote the registered memory before it returned");
            assertEquals(syncs + 2, stat("bridge_synchronizes"), "one wait for the stream per registered copy");
            assertTrue(r.address() == mem && t.taskAttemptId() == 7704);
        } finally {
            free.invoke(unsafe, mem);
        }
    }

    @Test
    void memoryPythonRegisteredIsCopiedCompleteOnReturnToo() throws Exception {
        // The copies that complete on return wait for the stream whenever the native side queued
        // an asynchronous DMA, whichever front page-locked the memory: here Python task code in
        // the executor (the service's regions), which Java's own table never saw. Without the
        // native side's answer the copy would return with its DMA still behind the kernel.
        int n = 1 << 16;
        long mem = offHeap(n);
        try (TaskScope t = bridge.bindTask(7706); DeviceBuffer buf = bridge.allocate(n)) {
            bridge.callTool("register_host", "{\"address\": " + mem + ", \"nbytes\": " + n + "}");
            try {
                setMemory.invoke(unsafe, mem, (long) n, (byte) 0x31);
                long syncs = stat("bridge_synchronizes");
                bridge.callTool("spin", "{\"task\": 7706, \"seconds\": 0.3}");
                buf.copyFromAddress(mem, n, 0);
                setMemory.invoke(unsafe, mem, (long) n, (byte) 0x66);   // at once: the copy has read it
                byte[] back = new byte[n];
                buf.copyTo(back);
                byte[] want = new byte[n];
                Arrays.fill(want, (byte) 0x31);
                assertArrayEquals(want, back, "copyFromAddress read Python's registered memory before it returned");
                bridge.callTool("spin", "{\"task\": 7706, \"seconds\": 0.3}");
                buf.copyToAddress(mem, n, 0);
                assertArrayEquals(want, read(mem, n), "copyToAddress wrote Python's registered memory after it returned");
                assertEquals(syncs + 2, stat("bridge_synchronizes"), "one wait for the stream per page-locked copy");
            } finally {
                bridge.callTool("unregister_host", "{\"address\": " + mem + ", \"task\": 7706}");
            }
            assertEquals(7706, t.taskAttemptId());
        } finally {
            free.invoke(unsafe, mem);
        }
    }

    @Test
    void asyncCopiesByAddressRefuseMemoryThatIsNotPageLockedAndChangeNothing() throws Exception {
        int n = 4096;
        long mem = offHeap(2 * n);
        try (TaskScope t = bridge.bindTask(7705); DeviceBuffer buf = bridge.allocate(n)) {
            byte[] data = new byte[n];
            Arrays.fill(data, (byte) 5);
            buf.copyFrom(data);
            HostRegistration closed = bridge.registerHost(mem + n, n);
            closed.close();
            try (HostRegistration r = bridge.registerHost(mem, n)) {
                Map<String, Long> before = bridge.statistics();
                assertRefused(IllegalArgumentException.class, () -> buf.copyFromAddressAsync(mem + n, 64, 0),
                        "copyFromAddressAsync: the host memory [0x" + Long.toHexString(mem + n), "is not page-locked",
                        "use copyFromAddress");
                assertRefused(IllegalArgumentException.class, () -> buf.copyToAddressAsync(mem + n, 64, 0),
                        "is not page-locked", "use copyToAddress");
                assertRefused(IllegalArgumentException.class,   // runs past the registration
                        () -> buf.copyFromAddressAsync(mem + n - 8, 16, 0), "is not page-locked");
                assertRefused(IllegalArgumentException.class, () -> buf.copyFromAddressAsync(0, 16, 0),
                        "the host address is 0");
                assertRefused(IndexOutOfBoundsException.class,
                        () -> buf.copyToAddressAsync(mem, n + 1, 0), "outside");
                Map<String, Long> after = bridge.statistics();
                for (String key : new String[] {"bridge_calls_total", "bridge_copies_address", "bridge_synchronizes"}) {
                    assertEquals(before.get(key), after.get(key), key + ": nothing reached Python");
                }
                buf.copyToAddressAsync(mem + 100, 200, 0);      // inside the registration: queued
                bridge.synchronize();
                byte[] want = new byte[200];
                Arrays.fill(want, (byte) 5);
                assertArrayEquals(want, read(mem + 100, 200));
                assertEquals(n, r.bytes());
            }
            byte[] back = new byte[n];
            buf.copyTo(back);
            assertArrayEquals(data, back, "the buffer holds its bytes after the refused copies");
            assertEquals(7705, t.taskAttemptId());
        } finally {
            free.invoke(unsafe, mem);
        }
    }

    static byte[] read(long address, int n) throws Exception {
        byte[] out = new byte[n];
        for (int i = 0; i < n; i++) out[i] = (byte) getByte.invoke(unsafe, address + i);
        return out;
    }
}
