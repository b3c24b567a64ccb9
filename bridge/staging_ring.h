/*
 * staging_ring.h: copies through pinned staging, pipelined, in C. Included by cudabridge_jni.c
 * only; the driver's entry points come from the hot path's C twin (native_api.h's driver table,
 * resolved with cuGetProcAddress: python/cudabridge/jvm/cuda_driver.h), and so do the slots: a
 * copy takes them from its GPU's staging slots and gives them back when it ends
 * (python/cudabridge/jvm/staging_pool.h, through native_api's staging_take / staging_give).
 *
 * Why: a Java heap array has no stable address, so it must be copied somewhere first. Copied into
 * pageable memory, the driver copies it again into its own pinned buffer before the DMA, and
 * nothing overlaps: a heap copy ran at a tenth of the link's speed on the H200. Pageable memory
 * Java owns off the heap (copies by address outside any registration) fares the same in the
 * driver's hands, so it is staged here too. A copy holds up to stagingSlots slots (a "ring"):
 * host->device copies chunk k into a free slot while the DMA of chunk k-1 runs from its own;
 * device->host DMAs chunks into slots ahead and copies each out of its slot behind its DMA. A
 * large chunk's memcpy is split over threads (host_copy.h): one thread's memcpy is slower than
 * the link.
 *
 * Invariants:
 *  - a slot is written by the host (a chunk copied in) or by a DMA only once the event recorded
 *    after its last DMA has completed (busy[i] says such an event is pending): never while a DMA
 *    still reads or writes it, whatever copy, thread or stream queued that DMA;
 *  - every DMA of a copy is queued on the buffer's stream, inside its task's lease (the caller
 *    enters it before and leaves it after), so device work queued after on that stream sees the
 *    data, and nothing of a task is queued once its release has begun;
 *  - a copy's slots are its own from staging_take to staging_give: host->device gives them back
 *    with their last DMAs pending (busy), device->host once every chunk is copied out.
 * The GIL is not held here: the caller holds the copy's lease, which a release waits for.
 */
#ifndef CB_STAGING_RING_H
#define CB_STAGING_RING_H

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "host_copy.h"
#include "native_api.h"

typedef cb_staging_slots cb_ring;   /* the slots one copy holds */

static atomic_long g_staged_chunks;

/* Waits until slot i may be touched (its last DMA done). */
static int ring_slot_free(const cb_driver *d, cb_ring *r, int i, const char **call) {
    if (!r->busy[i]) return CB_CUDA_SUCCESS;
    int rc = d->cuEventSynchronize(r->event[i]);
    if (rc != CB_CUDA_SUCCESS) {
        *call = "cuEventSynchronize(staging slot)";
        return rc;
    }
    r->busy[i] = 0;
    return CB_CUDA_SUCCESS;
}

/* Whether slot i may be touched now, without waiting: 1 (its last DMA done), 0 (still running, or
 * the query failed: a caller that then waits with ring_slot_free hears the error). */
static int ring_slot_idle(const cb_driver *d, cb_ring *r, int i) {
    if (!r->busy[i]) return 1;
    if (d->cuEventQuery(r->event[i]) != CB_CUDA_SUCCESS) return 0;
    r->busy[i] = 0;
    return 1;
}

/* Queues a DMA of slot i on stream, then the slot's event after it. */
static int ring_dma(const cb_driver *d, cb_ring *r, int i, int to_device, unsigned long long dev, size_t n,
                    cb_CUstream stream, const char **call) {
    int rc = to_device ? d->cuMemcpyHtoDAsync(dev, r->host[i], n, stream) : d->cuMemcpyDtoHAsync(r->host[i], dev, n, stream);
    if (rc != CB_CUDA_SUCCESS) {
        *call = to_device ? "cuMemcpyHtoDAsync(staged)" : "cuMemcpyDtoHAsync(staged)";
        return rc;
    }
    r->busy[i] = 1;   /* from here the slot waits for the event, even if recording it fails */
    rc = d->cuEventRecord(r->event[i], stream);
    if (rc != CB_CUDA_SUCCESS) *call = "cuEventRecord(staging slot)";
    atomic_fetch_add(&g_staged_chunks, 1);
    return rc;
}

/* The host side of a staged copy: a Java array (reached inside a short critical region per
 * chunk: it has no stable address) or raw memory Java code owns outside the heap (pageable: the
 * driver would stage it itself, one thread's memcpy and no overlap). */
typedef struct {
    JNIEnv *env;
    jarray array;   /* NULL: raw */
    char *raw;
} cb_host_side;

/* The host side's first byte, or NULL with a Java exception pending (the array could not be pinned). */
static char *host_side_enter(cb_host_side *h) {
    return h->array != NULL ? (*h->env)->GetPrimitiveArrayCritical(h->env, h->array, NULL) : h->raw;
}

static void host_side_leave(cb_host_side *h, char *p, int wrote) {
    if (h->array != NULL) (*h->env)->ReleasePrimitiveArrayCritical(h->env, h->array, p, wrote ? 0 : JNI_ABORT);
}

/* A chunk the DMA reads next is copied into its slot with streaming stores (host_copy.h) from this
 * size up, with plain ones below: a small chunk stays in the cache, whose few dirty lines the DMA
 * snoops cheaply, while the streamed stores' drain to memory costs microseconds that a small copy
 * notices (bench/small_copy_probe.c; bench/RESULTS.md). */
#define CB_STREAM_MIN_BYTES ((size_t)32 << 10)

/* Host -> device: bytes [off, off + nbytes) of the host side to device address dst, chunk by
 * chunk through the ring. Returns once every chunk is copied into a slot and its DMA queued: the
 * array may change from then on; work queued on stream later sees the data. 0, a CUresult (*call
 * says which call), or -1 with a Java exception pending (the array could not be pinned). */
static int ring_to_device(const cb_driver *d, cb_ring *r, cb_host_side *h, jlong off, jlong nbytes,
                          unsigned long long dst, cb_CUstream stream, int threads, const char **call) {
    jlong done = 0;
    for (int k = r->cursor; done < nbytes; k = (k + 1) % r->n) {
        r->cursor = (k + 1) % r->n;
        size_t n = (size_t)(nbytes - done) < r->slot_bytes ? (size_t)(nbytes - done) : r->slot_bytes;
        int rc = ring_slot_free(d, r, k, call);
        if (rc != CB_CUDA_SUCCESS) return rc;
        /* a short critical region: one memcpy (split over `threads` threads for a large chunk: the
         * helpers are native threads, not Java ones), no JNI call, no other wait inside it */
        char *src = host_side_enter(h);
        if (src == NULL) return -1;
        cb_host_copy(r->host[k], src + off + done, n, threads, n >= CB_STREAM_MIN_BYTES);
        host_side_leave(h, src, 0);
        rc = ring_dma(d, r, k, 1, dst + (unsigned long long)done, n, stream, call);
        if (rc != CB_CUDA_SUCCESS) return rc;
        done += (jlong)n;
    }
    return CB_CUDA_SUCCESS;
}

/* Device -> host, in two steps: ring_from_device_queue queues a ring's worth of DMAs ahead (slots
 * from 0; *issued says how many); ring_from_device_drain copies each chunk out of its slot once its
 * event completes, queuing the next DMA into the slot it freed, until every byte is in the host
 * memory. Once every DMA is queued (*issued equals the chunks: at most a ring's worth of bytes)
 * the drain queues nothing, so the copy's lease may be left before it. 0, a CUresult, or -1 with
 * a Java exception pending. */
static int ring_from_device_queue(const cb_driver *d, cb_ring *r, jlong nbytes, unsigned long long src,
                                  cb_CUstream stream, jlong *issued, const char **call) {
    jlong chunks = (nbytes + (jlong)r->slot_bytes - 1) / (jlong)r->slot_bytes;
    int rc;
    for (*issued = 0; *issued < chunks && *issued < r->n; (*issued)++) {
        jlong at = *issued * (jlong)r->slot_bytes;
        size_t n = (size_t)(nbytes - at) < r->slot_bytes ? (size_t)(nbytes - at) : r->slot_bytes;
        int i = (int)(*issued % r->n);
        if ((rc = ring_slot_free(d, r, i, call)) != CB_CUDA_SUCCESS) return rc;
        if ((rc = ring_dma(d, r, i, 0, src + (unsigned long long)at, n, stream, call)) != CB_CUDA_SUCCESS) return rc;
    }
    return CB_CUDA_SUCCESS;
}

static int ring_from_device_drain(const cb_driver *d, cb_ring *r, cb_host_side *h, jlong off, jlong nbytes,
                                  unsigned long long src, cb_CUstream stream, int threads, jlong issued,
                                  const char **call) {
    jlong chunks = (nbytes + (jlong)r->slot_bytes - 1) / (jlong)r->slot_bytes;
    int rc;
    for (jlong k = 0; k < chunks; k++) {
        int i = (int)(k % r->n);
        jlong at = k * (jlong)r->slot_bytes;
        size_t n = (size_t)(nbytes - at) < r->slot_bytes ? (size_t)(nbytes - at) : r->slot_bytes;
        if ((rc = ring_slot_free(d, r, i, call)) != CB_CUDA_SUCCESS) return rc;
        char *dst = host_side_enter(h);
        if (dst == NULL) return -1;
        cb_host_copy(dst + off + at, r->host[i], n, threads, 0);
        host_side_leave(h, dst, 1);
        if (issued < chunks) {   /* the slot is free again: the next DMA into it */
            jlong nat = issued * (jlong)r->slot_bytes;
            size_t nn = (size_t)(nbytes - nat) < r->slot_bytes ? (size_t)(nbytes - nat) : r->slot_bytes;
            if ((rc = ring_dma(d, r, i, 0, src + (unsigned long long)nat, nn, stream, call)) != CB_CUDA_SUCCESS)
                return rc;
            issued++;
        }
    }
    return CB_CUDA_SUCCESS;
}

/* Device -> host: nbytes from device address src into the host side from byte off, both steps.
 * Returns once every byte is in the host memory. */
static int ring_from_device(const cb_driver *d, cb_ring *r, cb_host_side *h, jlong off, jlong nbytes,
                            unsigned long long src, cb_CUstream stream, int threads, const char **call) {
    jlong issued = 0;
    int rc = ring_from_device_queue(d, r, nbytes, src, stream, &issued, call);
    return rc != CB_CUDA_SUCCESS ? rc : ring_from_device_drain(d, r, h, off, nbytes, src, stream, threads, issued, call);
}

#endif
