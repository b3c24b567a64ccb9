// bench/host_copy_probe.c: the host side of a staged copy alone on the GPU machine: bridge/host_copy.h
// copying 16 MiB into page-locked (cuMemHostAlloc) and malloc'ed memory with 1-8 threads, best of 30
// (cache-warm). Build and run from the repository root (device tool, nothing carried):
//   gcc -O2 -std=c11 -D_GNU_SOURCE -pthread -Ibridge bench/host_copy_probe.c -o /tmp/host_copy_probe -ldl && /tmp/host_copy_probe
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <dlfcn.h>
#include "host_copy.h"
typedef int (*init_t)(unsigned); typedef int (*ctx_t)(void **, unsigned, int); typedef int (*ha_t)(void **, size_t, unsigned);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double bw(char *dst, char *src, size_t n, int threads) {
    double best = 1e9;
    for (int r = 0; r < 30; r++) { double t0 = now(); cb_host_copy(dst, src, n, threads, 0); double t = now() - t0; if (t < best) best = t; }
    return n / best / 1e9;
}
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    init_t cuInit = (init_t)dlsym(h, "cuInit"); ha_t cuMemHostAlloc = (ha_t)dlsym(h, "cuMemHostAlloc");
    int (*cuDevicePrimaryCtxRetain)(void **, int) = dlsym(h, "cuDevicePrimaryCtxRetain");
    int (*cuCtxSetCurrent)(void *) = dlsym(h, "cuCtxSetCurrent");
    void *ctx; if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) { puts("cuda init failed"); return 1; }
    size_t n = 16 << 20;
    char *heap_a = malloc(n), *heap_b = malloc(n), *pinned;
    if (cuMemHostAlloc((void **)&pinned, n, 1)) { puts("hostalloc failed"); return 1; }
    memset(heap_a, 1, n); memset(heap_b, 2, n); memset(pinned, 3, n);
    for (int threads = 1; threads <= 8; threads *= 2) {
        printf("threads %d: malloc->malloc %.1f GB/s, malloc->pinned %.1f GB/s, pinned->malloc %.1f GB/s\n", threads,
               bw(heap_b, heap_a, n, threads), bw(pinned, heap_a, n, threads), bw(heap_b, pinned, n, threads));
    }
    return 0;
}
