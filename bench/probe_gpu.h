/*
 * bench/probe_gpu.h: what the C probes of the staging ring (staging_probe.c, small_copy_probe.c)
 * share: the driver table (cuda_driver.h) and a context, a non-blocking stream and cuMemAlloc on
 * GPU 0 (probe_start), a clock, a median, and exit-on-error checks. No JVM, no Python.
 */
#ifndef CB_PROBE_GPU_H
#define CB_PROBE_GPU_H

#include <jni.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "staging_pool.h"
#include "staging_ring.h"

typedef cb_CUresult (*mem_alloc_t)(unsigned long long *, size_t);
typedef cb_CUresult (*stream_create_t)(cb_CUstream *, unsigned);
typedef cb_CUresult (*stream_sync_t)(cb_CUstream);

static cb_driver drv;
static mem_alloc_t mem_alloc;
static stream_sync_t stream_sync;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* exits naming `what` when rc is not 0 */
static void check(int rc, const char *what) {
    if (rc != 0) {
        fprintf(stderr, "%s failed: %d\n", what, rc);
        exit(1);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* The driver loaded, GPU 0's primary context current, a non-blocking stream in *stream; its context
 * in *ctx. Exits on failure. */
static void probe_start(cb_CUcontext *ctx, cb_CUstream *stream) {
    if (cb_driver_load(&drv) != 0) {
        fprintf(stderr, "driver: %s\n", drv.failure);
        exit(1);
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    mem_alloc = (mem_alloc_t)dlsym(lib, "cuMemAlloc_v2");
    stream_create_t stream_create = (stream_create_t)dlsym(lib, "cuStreamCreate");
    stream_sync = (stream_sync_t)dlsym(lib, "cuStreamSynchronize");
    if (mem_alloc == NULL || stream_create == NULL || stream_sync == NULL) {
        fprintf(stderr, "libcuda.so.1 lacks cuMemAlloc_v2, cuStreamCreate or cuStreamSynchronize\n");
        exit(1);
    }
    cb_CUdevice dev;
    check(drv.cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(drv.cuDevicePrimaryCtxRetain(ctx, dev), "cuDevicePrimaryCtxRetain");
    check(drv.cuCtxSetCurrent(*ctx), "cuCtxSetCurrent");
    check(stream_create(stream, 1 /* non-blocking */), "cuStreamCreate");
}

/* A ring of `slots` slots of `bytes` over base (page-locked): all the slots of a staging pool of
 * its own, as a copy takes them in the bridge (python/cudabridge/jvm/staging_pool.h). */
static cb_ring *probe_ring(int slots, size_t bytes, char *base) {
    cb_staging_gpu *pool = staging_gpu_new(base, slots, bytes, 1.0);
    cb_ring *r = calloc(1, sizeof *r);
    int rc = 0;
    const char *call = NULL;
    if (pool == NULL || r == NULL || staging_take_gpu(&drv, pool, 0, slots, 0, r, &rc, &call) != slots) {
        fprintf(stderr, "staging slots: %s %d\n", call ? call : "out of memory", rc);
        exit(1);
    }
    return r;
}

#endif
