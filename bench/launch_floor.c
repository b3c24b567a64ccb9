/*
 * The C floor of bench/bench_launch.py: cuLaunchKernel called from C in the benchmark's own
 * process, on the task's stream, for the same function the Java launch runs; each launch timed
 * with CLOCK_MONOTONIC, a synchronize after every `batch` launches (untimed), as the other
 * candidates do. Built on the GPU machine: gcc -O2 -shared -fPIC launch_floor.c -o launch_floor.so -ldl
 */
#include <dlfcn.h>
#include <stdint.h>
#include <time.h>

typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);
typedef int (*sync_t)(void *);
typedef int (*getproc_t)(const char *, void **, int, uint64_t, int *);

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* 0, or the first failing CUresult (-1: no driver). */
int cb_floor_launch(void *function, void *stream, unsigned long long ptr, int n, int batch, long long *out_ns) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    getproc_t get = lib ? (getproc_t)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    launch_t launch = NULL;
    sync_t sync = NULL;
    int status = 0;
    if (get == NULL || get("cuLaunchKernel", (void **)&launch, 12000, 0, &status) != 0 ||
        get("cuStreamSynchronize", (void **)&sync, 12000, 0, &status) != 0)
        return -1;
    int count = n;
    float a = 1.0f;
    void *params[3] = {&ptr, &count, &a};
    for (int i = 0; i < n; i++) {
        long long t0 = now_ns();
        int rc = launch(function, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL);
        out_ns[i] = now_ns() - t0;
        if (rc != 0) return rc;
        if ((i + 1) % batch == 0 && (rc = sync(stream)) != 0) return rc;
    }
    return sync(stream);
}
