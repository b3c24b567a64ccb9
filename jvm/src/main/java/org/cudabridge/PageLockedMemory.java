package org.cudabridge;

import java.util.Map;
import java.util.concurrent.ConcurrentSkipListMap;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The host memory this JVM's bridge page-locked, as Java knows it: the pinned buffers
 * ({@link CudaBridge#allocatePinned}; those that are page-locked) and the host registrations
 * ({@link CudaBridge#registerHost}) that are still live. The asynchronous copies
 * ({@link DeviceBuffer#copyFromAsync}) are admitted here, before any native call: their whole host
 * range must lie inside one live region. Whether a copy was in fact queued as a DMA is the native
 * side's answer (the service's regions, which also hold what Python task code page-locked), and the
 * copies that complete on return ({@link DeviceBuffer#copyFrom(java.nio.ByteBuffer, long)}) wait
 * for the stream on that answer, not on this table.
 *
 * <p>Regions never overlap while live (Python refuses a registration that overlaps a registered
 * range or a pinned buffer, and the pool's buffers are disjoint). A region is live while its
 * holder is: a pinned buffer until it is closed or reclaimed with its task, a registration until
 * it is closed. A region that is no longer live is dropped when a lookup meets it, and by a sweep
 * every {@link #SWEEP_EVERY} additions (a pinned buffer reclaimed with its task is never closed).
 * Lookups take no lock: one {@code floorEntry} of a skip list.
 */
final class PageLockedMemory {
    static final int SWEEP_EVERY = 256;

    /** One region: its size and what keeps it page-locked. */
    private record Region(long bytes, Object holder) {
        boolean live() {
            return holder instanceof PinnedBuffer p ? !p.isClosed() : !((HostRegistration) holder).isClosed();
        }
    }

    private final ConcurrentSkipListMap<Long, Region> regions = new ConcurrentSkipListMap<>();
    private final AtomicInteger added = new AtomicInteger();

    /** A pinned buffer's memory (page-locked) or a registration's range, live from now. */
    void add(long base, long bytes, Object holder) {
        regions.put(base, new Region(bytes, holder));   // replaces a region at this base no longer live
        if (added.incrementAndGet() % SWEEP_EVERY == 0) {
            regions.entrySet().removeIf(e -> !e.getValue().live());
        }
    }

    /** The holder's region is no longer live (it was closed). */
    void remove(long base, Object holder) {
        regions.computeIfPresent(base, (k, r) -> r.holder() == holder ? null : r);
    }

    /** Whether no region was added or all were removed: the copies' fast check before a lookup. */
    boolean isEmpty() {
        return regions.isEmpty();
    }

    /** Whether [address, address + bytes) lies inside one live region (an empty range: at or
     *  inside one), as the Python side's lookup has it. */
    boolean covers(long address, long bytes) {
        for (;;) {
            Map.Entry<Long, Region> e = regions.floorEntry(address);
            if (e == null) {
                return false;
            }
            Region r = e.getValue();
            if (!r.live()) {   // a dead region may overlap a live one below it: drop it and look again
                regions.remove(e.getKey(), r);
                continue;
            }
            long into = address - e.getKey();
            return bytes <= r.bytes() && into <= r.bytes() - bytes;
        }
    }

    /** Live regions now (tests). */
    int live() {
        int n = 0;
        for (Region r : regions.values()) {
            if (r.live()) {
                n++;
            }
        }
        return n;
    }
}
