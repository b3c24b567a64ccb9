package org.cudabridge;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.List;
import java.util.Objects;

/**
 * The memory API behind {@link CudaBridge}: device buffers of the current task, ordered on its
 * stream, page-locked host buffers and host registrations (both kept in {@link PageLockedMemory},
 * which tells the copies that are asynchronous from those that are not). Every argument is checked
 * here, in Java, before the JNI call; Python checks the handles (it refuses any handle that is not
 * live).
 */
final class DeviceMemory {
    private static final ThreadLocal<long[]> SCRATCH = ThreadLocal.withInitial(() -> new long[2]);
    /** The buffers this thread allocates go here too while a {@link GpuRetry} block runs (null: none). */
    private static final ThreadLocal<List<DeviceBuffer>> TRACKED = new ThreadLocal<>();

    /** Makes {@code into} (null: none) the list this thread's new buffers are added to; returns the one before. */
    static List<DeviceBuffer> trackAllocations(List<DeviceBuffer> into) {
        List<DeviceBuffer> before = TRACKED.get();
        TRACKED.set(into);
        return before;
    }

    private static DeviceBuffer tracked(DeviceBuffer b) {
        List<DeviceBuffer> into = TRACKED.get();
        if (into != null) {
            into.add(b);
        }
        return b;
    }

    private final CudaBridge bridge;
    private final TaskTable tasks;
    private final PageLockedMemory pageLocked = new PageLockedMemory();

    DeviceMemory(CudaBridge bridge, TaskTable tasks) {
        this.bridge = bridge;
        this.tasks = tasks;
    }

    DeviceBuffer allocate(long bytes) {
        if (bytes <= 0) {
            throw new IllegalArgumentException("allocate: size must be positive, got " + bytes);
        }
        try {
            bridge.checkRunning("allocate");
            TaskScope task = tasks.currentTask();
            long[] out = SCRATCH.get();   // the hot path: no object per call besides the buffer
            NativeBridge.allocate(task.taskAttemptId(), bytes, out);
            return tracked(new DeviceBuffer(this, task, out[0], out[1], bytes));
        } catch (RuntimeException e) {
            throw bridge.shutDownOr("allocate", e);
        }
    }

    /** A buffer the service made for {@code task} (a Python function's result array), handed to Java. */
    DeviceBuffer adopt(TaskScope task, long handle, long address, long bytes) {
        return tracked(new DeviceBuffer(this, task, handle, address, bytes));
    }

    void checkRunning(String call) {
        bridge.checkRunning(call);
    }

    void free(long handle) {
        bridge.checkRunning("free");
        NativeBridge.free(handle);
    }

    void memset(long handle, long offset, int value, long bytes) {
        bridge.checkRunning("memset");
        NativeBridge.memset(handle, offset, value, bytes);
    }

    /** Frees the buffers not closed yet with one call into Python; returns how many it claimed.
     *  If Python refuses the call, none is freed and every one stays open, unless every buffer
     *  claimed belongs to a task released meanwhile (the release freed them: no effect). */
    int free(DeviceBuffer[] buffers) {
        Objects.requireNonNull(buffers, "free: buffers");
        for (DeviceBuffer b : buffers) {
            if (b == null) {
                throw new NullPointerException("free: a buffer is null");
            }
        }
        bridge.checkRunning("free");
        long[] handles = new long[buffers.length];
        DeviceBuffer[] claimed = new DeviceBuffer[buffers.length];
        int n = 0;
        for (DeviceBuffer b : buffers) {
            if (b.claimForFree()) {
                claimed[n] = b;
                handles[n++] = b.handle();
            }
        }
        if (n == 0) {
            return 0;
        }
        try {
            NativeBridge.freeMany(handles, n);
        } catch (RuntimeException e) {
            boolean allReleased = true;
            for (int i = 0; i < n; i++) {
                allReleased &= claimed[i].taskReleased();
                claimed[i].unclaim(); // Python freed none of them (a no-op for a released task's)
            }
            if (allReleased) {
                return n;   // as DeviceBuffer.close: their release freed them
            }
            throw e;
        }
        return n;
    }

    PinnedBuffer allocatePinned(long bytes) {
        if (bytes <= 0 || bytes > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("allocatePinned: size must be in [1, 2^31-1], got " + bytes);
        }
        bridge.checkRunning("allocatePinned");
        TaskScope owner = tasks.currentTaskOrNull();   // the thread's task owns it: reclaimed at its release
        boolean[] pinned = new boolean[1];   // false: the pageable fallback
        ByteBuffer b = NativeBridge.allocPinned(owner == null ? 0 : owner.taskAttemptId(), bytes, pinned);
        long address = NativeBridge.address(b);
        PinnedBuffer buffer = new PinnedBuffer(b.order(ByteOrder.nativeOrder()), address, bytes, pinned[0], owner,
                pageLocked);
        if (pinned[0]) {
            pageLocked.add(address, bytes, buffer);
        }
        return buffer;
    }

    HostRegistration registerHost(long address, long bytes) {
        if (address == 0 || bytes <= 0) {
            throw new IllegalArgumentException("registerHost: a non-zero address and a positive size, got "
                    + address + ", " + bytes);
        }
        bridge.checkRunning("registerHost");
        bridge.control().registerHost(address, bytes);
        HostRegistration r = new HostRegistration(bridge, pageLocked, address, bytes);
        pageLocked.add(address, bytes, r);
        return r;
    }

    /** Whether [address, address + bytes) lies inside page-locked memory this bridge handed out (a
     *  live pinned buffer, an open registration): what the asynchronous copies accept, checked
     *  before any native call. Whether a copy was in fact queued asynchronously is the native
     *  side's answer (the service's regions, whichever front made them), which the copies that
     *  complete on return wait on. */
    boolean isPageLocked(long address, long bytes) {
        return !pageLocked.isEmpty() && pageLocked.covers(address, bytes);
    }

    /** The page-locked memory this bridge knows (tests). */
    PageLockedMemory pageLocked() {
        return pageLocked;
    }

    /** Waits for what is queued on {@code task}'s stream: after an asynchronous copy, for the copy
     *  (it was queued last by this thread). Reports a kernel fault as {@link #synchronize()} does. */
    void awaitStream(TaskScope task, String call) {
        bridge.checkRunning(call);
        NativeBridge.synchronize(task.taskAttemptId());
    }

    void synchronize() {
        TaskScope task = tasks.currentTask();
        bridge.checkRunning("synchronize");
        NativeBridge.synchronize(task.taskAttemptId());
    }
}
