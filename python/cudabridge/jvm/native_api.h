/*
 * native_api.h: what the Java hot path's C twin (_hotcore.c) hands the bridge's JNI library, so
 * that a JNI call reaches it with no Python objects built for its arguments. Got from Python as
 * the capsule `JavaHotPath.native_api` (None when the C twin is not built); the capsule owns a
 * reference to its HotCore.
 *
 * Every function is called with the GIL held (the JNI side takes it, behind its gate) and returns
 * 0, or -1 with a Python exception set, which the caller describes to Java. The driver table is
 * used without it.
 */
#ifndef CB_NATIVE_API_H
#define CB_NATIVE_API_H

#define CB_NATIVE_API_CAPSULE "cudabridge.jvm._hotcore.native_api"
#define CB_NATIVE_API_VERSION 6
#define CB_LAUNCH_MAX_ARGS 512
#define CB_STAGING_MAX_SLOTS 16  /* slots one copy pipelines through */   /* a kernel's parameters take at most 4 KiB: 512 of 8 bytes */

#include "cuda_driver.h"

/* The host side of a copy (enter_copy's kind): a Java heap array (always staged: it has no
 * stable address), a direct ByteBuffer's memory, or memory by address (Arrow, Unsafe). */
#define CB_HOST_HEAP 0
#define CB_HOST_DIRECT 1
#define CB_HOST_ADDRESS 2

/* A copy's entry into its buffer's task lease: made by enter_copy (the lease entered, as every
 * operation that queues work for a task), left by leave_copy once the copy's work is queued. */
typedef struct {
    void *lease, *inside;        /* the TaskLease and its inside list (owned references) */
    unsigned long ident;         /* this thread's ident, in inside while the copy runs */
    unsigned long long address;  /* the device address at the copy's offset */
    cb_CUstream stream;          /* the buffer's stream (its task's) */
    cb_CUcontext context;        /* its GPU's primary context */
    int gpu;                     /* its GPU's ordinal */
    int pagelocked;              /* the host range lies in a pinned buffer or a registered region:
                                    one asynchronous DMA from or into it, no staging */
} cb_copy_entry;

/* The staging slots one copy holds (staging_take fills it, staging_give hands them back): slot i
 * of the copy is the GPU's staging slot `slot[i]`, its pinned memory `host[i]` and the event
 * recorded after its last DMA `event[i]`; `busy[i]` says that event is pending (a slot is written,
 * by the host or a DMA, only once it has completed). The copy updates busy[] and cursor; give
 * takes them back. */
typedef struct {
    int gpu, n;
    size_t slot_bytes;
    int slot[CB_STAGING_MAX_SLOTS];
    char *host[CB_STAGING_MAX_SLOTS];
    cb_CUevent event[CB_STAGING_MAX_SLOTS];
    int busy[CB_STAGING_MAX_SLOTS];
    int cursor;                  /* the slot a host->device copy starts at */
} cb_staging_slots;

typedef struct {
    int version;                 /* CB_NATIVE_API_VERSION */
    void *core;                  /* the HotCore the functions take */
    /* JavaHotPath.launch, its arguments unboxed: one kernel on the task's stream. dims are grid x,
     * y, z then block x, y, z; values, kinds and offsets hold n entries (n <= CB_LAUNCH_MAX_ARGS). */
    int (*launch)(void *core, long long task, long long kernel, const int dims[6], long long shared,
                  const long long *values, const signed char *kinds, const long long *offsets, int n);
    /* Copies through pinned staging (bridge/staging_ring.h); driver is NULL where they do not
     * apply (the emulated device): copies then take the Python path. */
    const cb_driver *driver;
    int staging_slots;           /* the most slots one copy pipelines through */
    long long staging_slot_bytes;
    int staging_copy_threads;    /* threads a large chunk's host copy is split over (1: the caller's alone) */
    /* The GPU's staging slots, shared by the executor's copies (jvm/staging_pool.h): take up to
     * `want` of them (at least one) for a copy, waiting up to the staging wait when none is free;
     * `quick` takes one only if one is free and idle now (no wait, no driver wait). Called without
     * the GIL, with the copy entry's context current. Returns the number taken (0: none in time; the
     * caller copies through pageable memory) or -1 (a driver call failed: *rc, *call say which). */
    int (*staging_take)(void *core, int gpu, int want, int quick, cb_staging_slots *out, int *rc, const char **call);
    /* Hands a copy's slots back (their busy flags as the copy left them; `failed`: a driver call
     * failed during the copy, the slots are dropped). Without the GIL. */
    void (*staging_give)(void *core, cb_staging_slots *slots, int failed);
    /* The buffer behind handle, live, with [offset, offset + nbytes) inside it, its task's lease
     * entered; to_device says the direction, kind the host side (CB_HOST_*), host its first byte
     * (outside the heap). Host memory outside the heap is checked as JavaHotPath.enter_host_copy
     * checks it (a range running past a page-locked region, or one the task unregistered, is
     * refused) and out->pagelocked says how to copy it; a pinned buffer's reuse then waits for
     * the buffer's stream, and so does unregistering a registered region, provided the caller
     * queues a page-locked range's DMA with the GIL still held from this return (no Python code
     * in between). The copy is counted under its kind (copies_in / copies_out, copies_direct,
     * copies_address). */
    int (*enter_copy)(void *core, long long handle, long long offset, long long nbytes, int to_device, int kind,
                      unsigned long long host, cb_copy_entry *out);
    void (*leave_copy)(void *core, cb_copy_entry *entry);
    /* Raises the service's error for a driver call's failure (a sticky one marks the GPU
     * unusable); returns -1. */
    int (*driver_failed)(void *core, const char *call, int rc);
} cb_native_api;

#endif
