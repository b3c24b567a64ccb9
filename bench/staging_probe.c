/*
 * bench/staging_probe.c: the staging ring (bridge/staging_ring.h) driven from C on raw pageable
 * memory, no JVM and no Python, against the same run's anchors: a DMA from/to pinned memory of the
 * same size, and the host copy alone (host_copy.h) into pageable and into pinned memory. Each
 * candidate is timed as the call plus a stream synchronize; for the ring also the time until the
 * call returned. Rounds interleave the candidates; the median of the round medians is printed.
 *
 * On the GPU machine (no JDK there: carry jni.h and jni_md.h, e.g. in bench/out/jni-include):
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -pthread -Ibridge -Ipython/cudabridge/jvm -Ibench/out/jni-include \
 *       bench/staging_probe.c -o /tmp/staging_probe -ldl && /tmp/staging_probe
 */
#include "probe_gpu.h"

#define MiB ((size_t)1 << 20)
#define ROUNDS 5
#define REPS 9

enum { RING_IN, RING_OUT, PINNED_IN, PINNED_OUT, COPY_PAGEABLE, COPY_TO_PINNED, KINDS };
static const char *kind_names[KINDS] = {"ring in", "ring out", "pinned DMA in", "pinned DMA out",
                                        "host copy -> pageable", "host copy -> pinned (streamed)"};

typedef struct {
    int kind, threads, slots;
    size_t slot_bytes;
    cb_ring *ring;
    double total[ROUNDS], staged[ROUNDS];
} cand;

int main(void) {
    cb_CUcontext ctx;
    cb_CUstream stream;
    probe_start(&ctx, &stream);
    size_t sizes[] = {1 * MiB, 16 * MiB, 256 * MiB};
    int nsizes = 3;
    size_t max = 256 * MiB;
    unsigned long long dptr;
    check(mem_alloc(&dptr, max), "cuMemAlloc");
    char *src = malloc(max), *dst = malloc(max), *pinned;
    check(drv.cuMemHostAlloc((void **)&pinned, max, CB_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
    for (size_t i = 0; i < max; i++) src[i] = (char)(i * 7);
    memset(dst, 1, max);
    memset(pinned, 2, max);

    cand c[64];
    int n = 0;
    struct { int slots; size_t bytes; } shapes[] = {{4, 4 * MiB}, {8, 2 * MiB}, {4, 8 * MiB}, {16, 1 * MiB}};
    int threads[] = {1, 4, 8, 16};
    for (int s = 0; s < 4; s++) {
        for (int t = 0; t < 4; t++) {
            if (s > 0 && threads[t] != 8) continue;   /* other shapes at the default thread count */
            for (int k = RING_IN; k <= RING_OUT; k++) {
                c[n] = (cand){.kind = k, .threads = threads[t], .slots = shapes[s].slots, .slot_bytes = shapes[s].bytes};
                char *base = NULL;   /* the bridge reserves its staging slots at its start; here, its own */
                check(drv.cuMemHostAlloc((void **)&base, (size_t)shapes[s].slots * shapes[s].bytes,
                                         CB_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc(ring)");
                c[n].ring = probe_ring(shapes[s].slots, shapes[s].bytes, base);
                n++;
            }
        }
    }
    c[n++] = (cand){.kind = PINNED_IN};
    c[n++] = (cand){.kind = PINNED_OUT};
    for (int t = 0; t < 4; t++) {
        c[n++] = (cand){.kind = COPY_PAGEABLE, .threads = threads[t]};
        c[n++] = (cand){.kind = COPY_TO_PINNED, .threads = threads[t]};
    }
    static double totals[64][3][ROUNDS], stageds[64][3][ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        for (int z = 0; z < nsizes; z++) {
            size_t bytes = sizes[z];
            for (int i = 0; i < n; i++) {
                double tot[REPS], stg[REPS];
                for (int rep = -1; rep < REPS; rep++) {   /* rep -1: warm-up */
                    const char *call = NULL;
                    cb_host_side h = {NULL, NULL, c[i].kind == RING_IN ? src : dst};
                    double t0 = now(), t1;
                    int rc = 0;
                    switch (c[i].kind) {
                    case RING_IN:
                        rc = ring_to_device(&drv, c[i].ring, &h, 0, (jlong)bytes, dptr, stream, c[i].threads, &call);
                        break;
                    case RING_OUT:
                        rc = ring_from_device(&drv, c[i].ring, &h, 0, (jlong)bytes, dptr, stream, c[i].threads, &call);
                        break;
                    case PINNED_IN:
                        rc = drv.cuMemcpyHtoDAsync(dptr, pinned, bytes, stream);
                        break;
                    case PINNED_OUT:
                        rc = drv.cuMemcpyDtoHAsync(pinned, dptr, bytes, stream);
                        break;
                    case COPY_PAGEABLE:
                        cb_host_copy(dst, src, bytes, c[i].threads, 0);
                        break;
                    case COPY_TO_PINNED:
                        cb_host_copy(pinned, src, bytes, c[i].threads, 1);
                        break;
                    }
                    t1 = now();
                    check(rc, call ? call : "copy");
                    check(stream_sync(stream), "cuStreamSynchronize");
                    if (rep >= 0) {
                        tot[rep] = now() - t0;
                        stg[rep] = t1 - t0;
                    }
                }
                totals[i][z][r] = median(tot, REPS);
                stageds[i][z][r] = median(stg, REPS);
            }
        }
    }
    printf("%-26s %7s %7s %6s | %s\n", "candidate", "threads", "slots", "MiB", "GB/s at 1 / 16 / 256 MiB (returned after, us)");
    for (int i = 0; i < n; i++) {
        printf("%-26s %7d %7d %6zu |", kind_names[c[i].kind], c[i].threads, c[i].slots, c[i].slot_bytes / MiB);
        for (int z = 0; z < nsizes; z++) {
            double t = median(totals[i][z], ROUNDS), s = median(stageds[i][z], ROUNDS);
            printf(" %6.1f (%8.0f)", (double)sizes[z] / t / 1e9, s * 1e6);
        }
        printf("\n");
    }
    printf("copies split %ld, parts by helpers %ld, helpers %d\n", atomic_load(&g_copies_split),
           atomic_load(&g_copy_parts_by_helpers), g_copy_helpers);
    return 0;
}
