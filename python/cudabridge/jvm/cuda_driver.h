/*
 * cuda_driver.h: the CUDA driver entry points the service's native layer calls, resolved at run
 * time with cuGetProcAddress. Included by _hotcore.c (the Java hot path's launch); the copy
 * pipeline and other native calls of later work take their entry points from the same table.
 *
 * Why cuGetProcAddress and not the symbols: cuda.h maps an API name to a versioned symbol
 * (cuLaunchKernel to itself, cuCtxGetCurrent to itself, but cuMemcpyHtoDAsync to _v2, and, with
 * per-thread default streams, to _ptsz variants); linking by name against libcuda picks whatever
 * the header in use said. cuGetProcAddress asks the installed driver for the entry point that
 * matches one API version (CB_CUDA_API_VERSION) with the legacy default stream, the semantics the
 * Python side (cuda.bindings) uses. It also keeps a build free of cuda.h and of libcuda: the
 * machines CI runs on have no GPU, and the table is resolved only when a real kernel is first
 * registered.
 *
 * The types below are the driver's ABI (cuda.h: CUresult is an enum of int size; handles are
 * pointers; CUdevice is an int).
 */
#ifndef CB_CUDA_DRIVER_H
#define CB_CUDA_DRIVER_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define CB_CUDA_API_VERSION 12000   /* the entry points' ABI: CUDA 12.0's */

typedef int cb_CUresult;
typedef int cb_CUdevice;
typedef void *cb_CUcontext;
typedef void *cb_CUfunction;
typedef void *cb_CUstream;
typedef void *cb_CUevent;

#define CB_CUDA_SUCCESS 0
#define CB_CUDA_ERROR_NOT_FOUND 500

typedef struct {
    int ready;                 /* 1 once every entry point below is resolved */
    char failure[256];         /* why resolving failed, if it did */
    cb_CUresult (*cuInit)(unsigned int);
    cb_CUresult (*cuDeviceGet)(cb_CUdevice *, int);
    cb_CUresult (*cuDevicePrimaryCtxRetain)(cb_CUcontext *, cb_CUdevice);
    cb_CUresult (*cuDevicePrimaryCtxRelease)(cb_CUdevice);
    cb_CUresult (*cuCtxGetCurrent)(cb_CUcontext *);
    cb_CUresult (*cuCtxSetCurrent)(cb_CUcontext);
    cb_CUresult (*cuLaunchKernel)(cb_CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, cb_CUstream, void **, void **);
    cb_CUresult (*cuGetErrorName)(cb_CUresult, const char **);
    /* copies through pinned staging (bridge/staging_ring.h) */
    cb_CUresult (*cuMemHostAlloc)(void **, size_t, unsigned int);
    cb_CUresult (*cuMemFreeHost)(void *);
    cb_CUresult (*cuMemcpyHtoDAsync)(unsigned long long, const void *, size_t, cb_CUstream);
    cb_CUresult (*cuMemcpyDtoHAsync)(void *, unsigned long long, size_t, cb_CUstream);
    cb_CUresult (*cuEventCreate)(cb_CUevent *, unsigned int);
    cb_CUresult (*cuEventDestroy)(cb_CUevent);
    cb_CUresult (*cuEventRecord)(cb_CUevent, cb_CUstream);
    cb_CUresult (*cuEventSynchronize)(cb_CUevent);
    cb_CUresult (*cuEventQuery)(cb_CUevent);
    cb_CUresult (*cuStreamSynchronize)(cb_CUstream);
    /* Not the driver's: a model device's alone (the emulated one, device/emulated_driver.py);
     * NULL in the installed driver's table. Called on the launching thread just before
     * cuLaunchKernel with the bytes each parameter may touch (a buffer's rest from the address
     * passed; 0 for a scalar): a raw pointer does not carry its extent, and without it the model's
     * race detector takes a pointer to reach the end of the device allocation it is in, which the
     * pool's allocations share. */
    cb_CUresult (*cbLaunchExtents)(const long long *extents, int n);
} cb_driver;

#define CB_MEMHOSTALLOC_PORTABLE 0x01   /* pinned for every context, not only the allocating one */
#define CB_EVENT_DISABLE_TIMING 0x02

/* Resolves every entry point into *d (once; the caller serializes calls, here the GIL). Returns
 * 0, or -1 with d->failure saying why (no libcuda, a driver older than the API version). */
static inline int cb_driver_load(cb_driver *d) {
    if (d->ready) return 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == NULL) {
        snprintf(d->failure, sizeof d->failure, "cannot open libcuda.so.1: %s", dlerror());
        return -1;
    }
    /* CUDA 12's cuGetProcAddress_v2 reports why a symbol is missing; 11.3's has no such argument */
    typedef cb_CUresult (*get_v2_t)(const char *, void **, int, uint64_t, int *);
    typedef cb_CUresult (*get_v1_t)(const char *, void **, int, uint64_t);
    get_v2_t get_v2 = (get_v2_t)dlsym(lib, "cuGetProcAddress_v2");
    get_v1_t get_v1 = get_v2 ? NULL : (get_v1_t)dlsym(lib, "cuGetProcAddress");
    if (get_v2 == NULL && get_v1 == NULL) {
        snprintf(d->failure, sizeof d->failure, "libcuda.so.1 has no cuGetProcAddress (a driver before CUDA 11.3)");
        return -1;
    }
    struct { const char *name; void **slot; } want[] = {
        {"cuInit", (void **)&d->cuInit},
        {"cuDeviceGet", (void **)&d->cuDeviceGet},
        {"cuDevicePrimaryCtxRetain", (void **)&d->cuDevicePrimaryCtxRetain},
        {"cuDevicePrimaryCtxRelease", (void **)&d->cuDevicePrimaryCtxRelease},
        {"cuCtxGetCurrent", (void **)&d->cuCtxGetCurrent},
        {"cuCtxSetCurrent", (void **)&d->cuCtxSetCurrent},
        {"cuLaunchKernel", (void **)&d->cuLaunchKernel},
        {"cuGetErrorName", (void **)&d->cuGetErrorName},
        {"cuMemHostAlloc", (void **)&d->cuMemHostAlloc},
        {"cuMemFreeHost", (void **)&d->cuMemFreeHost},
        {"cuMemcpyHtoDAsync", (void **)&d->cuMemcpyHtoDAsync},
        {"cuMemcpyDtoHAsync", (void **)&d->cuMemcpyDtoHAsync},
        {"cuEventCreate", (void **)&d->cuEventCreate},
        {"cuEventDestroy", (void **)&d->cuEventDestroy},
        {"cuEventRecord", (void **)&d->cuEventRecord},
        {"cuEventSynchronize", (void **)&d->cuEventSynchronize},
        {"cuEventQuery", (void **)&d->cuEventQuery},
        {"cuStreamSynchronize", (void **)&d->cuStreamSynchronize},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        void *fn = NULL;
        int status = 0;
        cb_CUresult rc = get_v2 ? get_v2(want[i].name, &fn, CB_CUDA_API_VERSION, 0 /* CU_GET_PROC_ADDRESS_DEFAULT */,
                                         &status)
                                : get_v1(want[i].name, &fn, CB_CUDA_API_VERSION, 0);
        if (rc != CB_CUDA_SUCCESS || fn == NULL) {
            snprintf(d->failure, sizeof d->failure,
                     "cuGetProcAddress(%s, version %d) failed: CUresult %d, status %d", want[i].name,
                     CB_CUDA_API_VERSION, rc, status);
            return -1;
        }
        *want[i].slot = fn;
    }
    cb_CUresult rc = d->cuInit(0);
    if (rc != CB_CUDA_SUCCESS) {
        snprintf(d->failure, sizeof d->failure, "cuInit failed: CUresult %d", rc);
        return -1;
    }
    d->ready = 1;
    return 0;
}

/* The driver's name for an error code ("CUDA_ERROR_ILLEGAL_ADDRESS"), or "CUresult <n>". */
static inline const char *cb_driver_error_name(const cb_driver *d, cb_CUresult rc, char *buf, size_t n) {
    const char *name = NULL;
    if (d->cuGetErrorName != NULL && d->cuGetErrorName(rc, &name) == CB_CUDA_SUCCESS && name != NULL) return name;
    snprintf(buf, n, "CUresult %d", rc);
    return buf;
}

#endif
