/*
 * bench/small_copy_probe.c: where a small staged copy's time goes, from C on raw pageable memory
 * (no JVM, no Python), sizes 4 KiB to 1 MiB. Each candidate is timed as the call plus a stream
 * synchronize, against the same run's anchor, a DMA from/to pinned memory of the same size:
 *   ring              the staging ring as the bridge runs it (staging_ring.h, one thread)
 *   plain + DMA       memcpy into a pinned buffer, then its DMA (no event)
 *   streamed + DMA    the same with streaming stores (host_copy.h's copy_streaming)
 *   N KiB pieces      memcpy of N KiB at a time, each piece's DMA queued as soon as it is there
 *   driver pageable   cuMemcpy*Async from/to pageable memory (the driver's own staging)
 * Out: the DMA into pinned memory, a synchronize, then the memcpy out. Rounds interleave the
 * candidates; the median of the round medians is printed, in us, and the excess over the anchor.
 *
 * On the GPU machine (no JDK there: carry jni.h and jni_md.h, e.g. in bench/out/jni-include):
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -pthread -Ibridge -Ipython/cudabridge/jvm -Ibench/out/jni-include \
 *       bench/small_copy_probe.c -o /tmp/small_copy_probe -ldl && /tmp/small_copy_probe
 */
#include "probe_gpu.h"

#define KiB ((size_t)1 << 10)
#define ROUNDS 7
#define REPS 31

enum { PINNED_IN, RING_IN, PLAIN_IN, STREAMED_IN, PIECES8_IN, PIECES16_IN, PIECES32_IN, PAGEABLE_IN, PINNED_OUT,
       RING_OUT, PLAIN_OUT, PAGEABLE_OUT, KINDS };
static const char *names[KINDS] = {"pinned DMA in (anchor)", "ring in", "plain + DMA in", "streamed + DMA in",
                                   "8 KiB pieces in", "16 KiB pieces in", "32 KiB pieces in",
                                   "driver pageable in", "pinned DMA out (anchor)", "ring out",
                                   "DMA + plain out", "driver pageable out"};

/* memcpy (plain stores) of piece bytes at a time into pinned memory, each piece's DMA queued as
 * soon as it is there: the next piece's copy overlaps the previous one's DMA */
static int pieces_in(char *pinned, const char *src, size_t n, size_t piece, unsigned long long dptr, cb_CUstream s) {
    for (size_t at = 0; at < n; at += piece) {
        size_t len = n - at < piece ? n - at : piece;
        memcpy(pinned + at, src + at, len);
        int rc = drv.cuMemcpyHtoDAsync(dptr + at, pinned + at, len, s);
        if (rc != 0) return rc;
    }
    return 0;
}

int main(void) {
    cb_CUcontext ctx;
    cb_CUstream stream;
    probe_start(&ctx, &stream);
    size_t sizes[] = {4 * KiB, 16 * KiB, 32 * KiB, 64 * KiB, 256 * KiB, 1024 * KiB};
    enum { NSIZES = 6 };
    size_t max = 1024 * KiB;
    unsigned long long dptr;
    check(mem_alloc(&dptr, max), "cuMemAlloc");
    char *src = malloc(max), *dst = malloc(max), *pinned, *base;
    check(drv.cuMemHostAlloc((void **)&pinned, max, CB_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
    check(drv.cuMemHostAlloc((void **)&base, 4 * 4096 * KiB, CB_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc(ring)");
    for (size_t i = 0; i < max; i++) src[i] = (char)(i * 7);
    memset(dst, 1, max);
    memset(pinned, 2, max);
    int rc = 0;
    const char *call = NULL;
    cb_ring *ring = probe_ring(4, 4096 * KiB, base);   /* the default: 4 slots of 4 MiB for one copy */
    static double t[KINDS][NSIZES][ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        for (int z = 0; z < NSIZES; z++) {
            size_t n = sizes[z];
            for (int k = 0; k < KINDS; k++) {
                double v[REPS];
                for (int rep = -3; rep < REPS; rep++) {   /* reps below 0: warm-up */
                    cb_host_side h = {NULL, NULL, k < PINNED_OUT ? src : dst};
                    double t0 = now();
                    switch (k) {
                    case PINNED_IN: rc = drv.cuMemcpyHtoDAsync(dptr, pinned, n, stream); break;
                    case RING_IN: rc = ring_to_device(&drv, ring, &h, 0, (jlong)n, dptr, stream, 1, &call); break;
                    case PLAIN_IN:
                        memcpy(pinned, src, n);
                        rc = drv.cuMemcpyHtoDAsync(dptr, pinned, n, stream);
                        break;
                    case STREAMED_IN:
                        copy_streaming(pinned, src, n);
                        rc = drv.cuMemcpyHtoDAsync(dptr, pinned, n, stream);
                        break;
                    case PIECES8_IN: rc = pieces_in(pinned, src, n, 8 * KiB, dptr, stream); break;
                    case PIECES16_IN: rc = pieces_in(pinned, src, n, 16 * KiB, dptr, stream); break;
                    case PIECES32_IN: rc = pieces_in(pinned, src, n, 32 * KiB, dptr, stream); break;
                    case PAGEABLE_IN: rc = drv.cuMemcpyHtoDAsync(dptr, src, n, stream); break;
                    case PINNED_OUT: rc = drv.cuMemcpyDtoHAsync(pinned, dptr, n, stream); break;
                    case RING_OUT: rc = ring_from_device(&drv, ring, &h, 0, (jlong)n, dptr, stream, 1, &call); break;
                    case PLAIN_OUT:
                        rc = drv.cuMemcpyDtoHAsync(pinned, dptr, n, stream);
                        if (rc == 0) rc = stream_sync(stream);
                        memcpy(dst, pinned, n);
                        break;
                    case PAGEABLE_OUT: rc = drv.cuMemcpyDtoHAsync(dst, dptr, n, stream); break;
                    }
                    check(rc, names[k]);
                    check(stream_sync(stream), "cuStreamSynchronize");
                    if (rep >= 0) v[rep] = now() - t0;
                }
                t[k][z][r] = median(v, REPS);
            }
        }
    }
    printf("%-24s |", "us (excess over anchor)");
    for (int z = 0; z < NSIZES; z++) printf(" %14zu KiB", sizes[z] / KiB);
    printf("\n");
    for (int k = 0; k < KINDS; k++) {
        int anchor = k < PINNED_OUT ? PINNED_IN : PINNED_OUT;
        printf("%-24s |", names[k]);
        for (int z = 0; z < NSIZES; z++) {
            double us = median(t[k][z], ROUNDS) * 1e6, a = median(t[anchor][z], ROUNDS) * 1e6;
            printf(" %7.2f (%+6.2f)", us, us - a);
        }
        printf("\n");
    }
    return 0;
}
