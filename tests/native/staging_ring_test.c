/* bridge/staging_ring.h against a model device (tests/test_native_copies.py builds and runs it; no
 * GPU, no JVM): the driver table's copies and events go to one in-order queue that a "device"
 * thread runs, each operation after a delay, reading or writing the host memory when it runs, as
 * a DMA does. Checked:
 *  - every byte, both directions, sizes around the slot size (a partial last chunk, one byte,
 *    zero bytes: nothing queued), host offsets, rings of 4 KiB slots and of 1 MiB slots whose host
 *    copy is split over threads;
 *  - chunk order: a copy's DMAs are queued in address order, each right after the previous;
 *  - slot reuse only after its event: a host->device DMA finds its slot as it was when queued
 *    (the model hashes the slot at both moments);
 *  - a failing driver call stops the copy and says which call failed;
 *  - a slot is idle (ring_slot_idle, no wait) only once its DMA has run;
 * and the staging slots a copy takes its ring from (python/cudabridge/jvm/staging_pool.h):
 *  - a slot given back with its DMA pending is not rewritten by the next copy that takes it before
 *    that DMA ran; free slots are taken oldest first; a copy takes at most what it asks;
 *  - with none free a take waits for a give, or returns none after the staging wait (counted);
 *  - a quick take gets a slot only if the oldest free one is idle now;
 *  - a copy that failed drops its slots (counted lost);
 *  - closing the slots is refused while a copy holds some, waits for their last DMAs, destroys every
 *    event made, and no slot is taken after it.
 * Prints "ok <operations run>". */
#include <jni.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "staging_pool.h"
#include "staging_ring.h"

#define DEV_BASE 0x700000000000ULL
#define DEV_BYTES ((size_t)16 << 20)
#define DELAY_US 30
#define MAX_EVENTS 64

typedef struct op {
    struct op *next;
    int to_device;
    unsigned long long dev;
    char *host;
    size_t n;
    unsigned long long hash;   /* of the host bytes when queued (host->device) */
    long seq;
} op;

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
static op *q_head, *q_tail;
static long q_enqueued, q_done;
static int q_hold;   /* the device runs nothing while set (a test needs a DMA still pending) */
static long event_seq[MAX_EVENTS + 1];
static int n_events, n_destroyed, fail_sync;
static char *devmem;
static long reused_early, ops_run, fail_at = -1, copies_seen;
static unsigned long long last_end;   /* where the last queued DMA of the current copy ended */
static long out_of_order;

static unsigned long long hash(const char *p, size_t n) {
    unsigned long long h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

static void *device(void *unused) {
    (void)unused;
    for (;;) {
        pthread_mutex_lock(&q_lock);
        while (q_head == NULL || q_hold) pthread_cond_wait(&q_cond, &q_lock);
        op *o = q_head;
        pthread_mutex_unlock(&q_lock);
        usleep(DELAY_US);
        char *d = devmem + (o->dev - DEV_BASE);
        if (o->to_device) {
            if (hash(o->host, o->n) != o->hash) reused_early++;   /* the slot changed under its DMA */
            memcpy(d, o->host, o->n);
        } else {
            memcpy(o->host, d, o->n);
        }
        pthread_mutex_lock(&q_lock);
        q_head = o->next;
        if (q_head == NULL) q_tail = NULL;
        q_done = o->seq;
        ops_run++;
        pthread_cond_broadcast(&q_cond);
        pthread_mutex_unlock(&q_lock);
        free(o);
    }
    return NULL;
}

static cb_CUresult enqueue(int to_device, unsigned long long dev, void *host, size_t n) {
    if (fail_at >= 0 && copies_seen++ == fail_at) return 700;   /* CUDA_ERROR_ILLEGAL_ADDRESS */
    if (dev < DEV_BASE || dev + n > DEV_BASE + DEV_BYTES) return 1;
    if (dev != last_end) out_of_order++;
    last_end = dev + n;
    op *o = calloc(1, sizeof *o);
    o->to_device = to_device;
    o->dev = dev;
    o->host = host;
    o->n = n;
    if (to_device) o->hash = hash(host, n);
    pthread_mutex_lock(&q_lock);
    o->seq = ++q_enqueued;
    if (q_tail) q_tail->next = o;
    else q_head = o;
    q_tail = o;
    pthread_cond_broadcast(&q_cond);
    pthread_mutex_unlock(&q_lock);
    return 0;
}

static cb_CUresult htod(unsigned long long dst, const void *src, size_t n, cb_CUstream s) {
    (void)s;
    return enqueue(1, dst, (void *)src, n);
}
static cb_CUresult dtoh(void *dst, unsigned long long src, size_t n, cb_CUstream s) {
    (void)s;
    return enqueue(0, src, dst, n);
}
static cb_CUresult ev_create(cb_CUevent *e, unsigned flags) {
    (void)flags;
    if (n_events == MAX_EVENTS) return 2;
    *e = (cb_CUevent)(intptr_t)(++n_events);
    return 0;
}
static cb_CUresult ev_destroy(cb_CUevent e) {
    (void)e;
    n_destroyed++;
    return 0;
}
static cb_CUresult ev_record(cb_CUevent e, cb_CUstream s) {
    (void)s;
    pthread_mutex_lock(&q_lock);
    event_seq[(intptr_t)e] = q_enqueued;   /* completes once the device passed what is queued now */
    pthread_mutex_unlock(&q_lock);
    return 0;
}
static cb_CUresult ev_sync(cb_CUevent e) {
    if (fail_sync) return 700;
    pthread_mutex_lock(&q_lock);
    while (q_done < event_seq[(intptr_t)e]) pthread_cond_wait(&q_cond, &q_lock);
    pthread_mutex_unlock(&q_lock);
    return 0;
}

static cb_CUresult ev_query(cb_CUevent e) {
    pthread_mutex_lock(&q_lock);
    int done = q_done >= event_seq[(intptr_t)e];
    pthread_mutex_unlock(&q_lock);
    return done ? 0 : 600;   /* CUDA_ERROR_NOT_READY */
}

static void hold_device(int on) {
    pthread_mutex_lock(&q_lock);
    q_hold = on;
    pthread_cond_broadcast(&q_cond);
    pthread_mutex_unlock(&q_lock);
}

static void drain(void) {
    pthread_mutex_lock(&q_lock);
    while (q_done < q_enqueued) pthread_cond_wait(&q_cond, &q_lock);
    pthread_mutex_unlock(&q_lock);
}

static int failures;
#define CHECK(cond, ...)                   \
    do {                                   \
        if (!(cond)) {                     \
            fprintf(stderr, __VA_ARGS__);  \
            fprintf(stderr, "\n");         \
            failures++;                    \
        }                                  \
    } while (0)

/* A copy's ring: all n slots of a fresh staging pool of its own (the pool in *pool). */
static cb_ring *make_in(cb_driver *d, int n, size_t slot, cb_staging_gpu **pool) {
    int rc = 0;
    const char *call = NULL;
    *pool = staging_gpu_new(malloc((size_t)n * slot), n, slot, 0.05);
    cb_ring *r = calloc(1, sizeof *r);
    if (*pool == NULL || (rc = staging_gpu_events(d, *pool, &call)) != 0 ||
        staging_take_gpu(d, *pool, 0, n, 0, r, &rc, &call) != n) {
        fprintf(stderr, "staging_take_gpu: %s %d\n", call ? call : "", rc);
        exit(1);
    }
    return r;
}

static cb_ring *make(cb_driver *d, int n, size_t slot) {
    cb_staging_gpu *pool;
    return make_in(d, n, slot, &pool);
}

static void round_trip(cb_driver *d, cb_ring *r, size_t n, size_t off, int threads) {
    static unsigned seed = 12345;
    char *src = malloc(n + off + 1), *back = malloc(n + off + 1);
    for (size_t i = 0; i < n + off + 1; i++) src[i] = (char)rand_r(&seed);
    memset(back, 0x5a, n + off + 1);
    memset(devmem, 0, DEV_BYTES);
    const char *call = NULL;
    unsigned long long dst = DEV_BASE + 64;
    long before = q_enqueued;
    cb_host_side in = {NULL, NULL, src};
    last_end = dst;
    int rc = ring_to_device(d, r, &in, (jlong)off, (jlong)n, dst, NULL, threads, &call);
    CHECK(rc == 0, "to device, %zu bytes: rc %d (%s)", n, rc, call ? call : "");
    drain();
    CHECK(memcmp(devmem + 64, src + off, n) == 0, "to device, %zu bytes at offset %zu over %d threads: device bytes differ",
          n, off, threads);
    CHECK(n > 0 || q_enqueued == before, "a zero-length copy queued work");
    cb_host_side out = {NULL, NULL, back};
    last_end = dst;
    rc = ring_from_device(d, r, &out, (jlong)off, (jlong)n, dst, NULL, threads, &call);
    CHECK(rc == 0, "from device, %zu bytes: rc %d (%s)", n, rc, call ? call : "");
    CHECK(memcmp(back + off, src + off, n) == 0, "from device, %zu bytes at offset %zu over %d threads: host bytes differ",
          n, off, threads);
    CHECK(back[off + n] == 0x5a && (off == 0 || back[off - 1] == 0x5a), "from device, %zu bytes: wrote outside the range", n);
    drain();
    free(src);
    free(back);
}

int main(void) {
    devmem = calloc(1, DEV_BYTES);
    pthread_t dev;
    pthread_create(&dev, NULL, device, NULL);
    cb_driver d = {0};
    d.ready = 1;
    d.cuMemcpyHtoDAsync = htod;
    d.cuMemcpyDtoHAsync = dtoh;
    d.cuEventCreate = ev_create;
    d.cuEventDestroy = ev_destroy;
    d.cuEventRecord = ev_record;
    d.cuEventSynchronize = ev_sync;
    d.cuEventQuery = ev_query;

    size_t k4 = 4096;
    cb_ring *tiny = make(&d, 2, k4);
    size_t tiny_sizes[] = {0, 1, k4 - 1, k4, k4 + 1, 2 * k4, 3 * k4 + 17, 10 * k4 + 5};
    for (size_t i = 0; i < sizeof tiny_sizes / sizeof *tiny_sizes; i++) {
        round_trip(&d, tiny, tiny_sizes[i], 0, 1);
        round_trip(&d, tiny, tiny_sizes[i], 7, 1);
    }
    cb_ring *big = make(&d, 3, (size_t)1 << 20);   /* 1 MiB slots: chunks split over threads */
    size_t big_sizes[] = {((size_t)1 << 20) - 3, (size_t)5 << 20, ((size_t)7 << 20) + 123};
    for (size_t i = 0; i < sizeof big_sizes / sizeof *big_sizes; i++) round_trip(&d, big, big_sizes[i], 3, 4);
    CHECK(reused_early == 0, "%ld host->device DMAs found their slot rewritten before they ran", reused_early);
    CHECK(out_of_order == 0, "%ld DMAs were not queued right after the previous chunk", out_of_order);

    /* a failing driver call: the copy stops there and names it */
    char *src = calloc(1, 8 * k4);
    cb_host_side in = {NULL, NULL, src};
    const char *call = NULL;
    copies_seen = 0;
    fail_at = 2;
    last_end = DEV_BASE;
    int rc = ring_to_device(&d, tiny, &in, 0, (jlong)(8 * k4), DEV_BASE, NULL, 1, &call);
    CHECK(rc == 700 && call != NULL && strstr(call, "cuMemcpyHtoDAsync") != NULL, "a failed DMA: rc %d, call %s", rc,
          call ? call : "(none)");
    CHECK(copies_seen == 3, "the copy went on after its DMA failed (%ld DMA calls)", copies_seen);
    drain();

    /* a slot is idle (usable without waiting) only once its DMA has run */
    cb_ring *probe = make(&d, 2, k4);
    last_end = DEV_BASE;
    fail_at = -1;
    rc = ring_to_device(&d, probe, &in, 0, (jlong)k4, DEV_BASE, NULL, 1, &call);
    CHECK(rc == 0 && !ring_slot_idle(&d, probe, 0), "slot 0 idle while its DMA is queued (rc %d)", rc);
    CHECK(ring_slot_idle(&d, probe, 1), "slot 1, never used, not idle");
    drain();
    CHECK(ring_slot_idle(&d, probe, 0) && probe->busy[0] == 0, "slot 0 not idle after its DMA ran");

    /* staging slots shared by copies: a slot given back busy is waited for by the next copy */
    const char *c2 = NULL;
    int rc2 = 0;
    cb_staging_gpu *pool = staging_gpu_new(malloc(2 * k4), 2, k4, 0.05);
    CHECK(pool != NULL && staging_gpu_events(&d, pool, &c2) == 0, "the pool's events: %s", c2 ? c2 : "");
    cb_ring a = {0}, b = {0};
    CHECK(staging_take_gpu(&d, pool, 0, 4, 0, &a, &rc2, &c2) == 2 && a.slot[0] == 0 && a.slot[1] == 1,
          "a take of 4 from 2 free slots got %d (slots %d, %d)", a.n, a.slot[0], a.slot[1]);
    char *src2 = calloc(1, 2 * k4);
    memset(src2, 0x11, 2 * k4);
    cb_host_side in2 = {NULL, NULL, src2};
    last_end = DEV_BASE;
    hold_device(1);   /* the DMAs stay pending until the next copy has to wait for them */
    rc = ring_to_device(&d, &a, &in2, 0, (jlong)(2 * k4), DEV_BASE, NULL, 1, &call);
    staging_give_gpu(pool, &a, rc != 0);
    CHECK(pool->nfree == 2 && pool->busy[0] && pool->busy[1], "given back: %d free, busy %d %d", pool->nfree,
          pool->busy[0], pool->busy[1]);
    CHECK(staging_take_gpu(&d, pool, 0, 1, 1, &b, &rc2, &c2) == 0, "a quick take got a slot whose DMA is pending");
    hold_device(0);
    memset(src2, 0x22, 2 * k4);
    CHECK(staging_take_gpu(&d, pool, 0, 2, 0, &b, &rc2, &c2) == 2, "the next copy could not take the 2 slots");
    last_end = DEV_BASE + 2 * k4;
    rc = ring_to_device(&d, &b, &in2, 0, (jlong)(2 * k4), DEV_BASE + 2 * k4, NULL, 1, &call);
    drain();
    CHECK(rc == 0 && reused_early == 0, "the second copy rewrote a slot under the first's DMA (%ld early)", reused_early);
    CHECK(devmem[0] == 0x11 && devmem[k4] == 0x11 && devmem[2 * k4] == 0x22, "the copies' bytes on the device differ");
    staging_give_gpu(pool, &b, 0);
    cb_ring q = {0};
    CHECK(staging_take_gpu(&d, pool, 0, 1, 1, &q, &rc2, &c2) == 1 && q.busy[0] == 0,
          "a quick take of an idle slot failed");
    staging_give_gpu(pool, &q, 0);
    /* oldest free first */
    cb_ring o1 = {0}, o2 = {0};
    staging_take_gpu(&d, pool, 0, 1, 0, &o1, &rc2, &c2);
    staging_give_gpu(pool, &o1, 0);
    staging_take_gpu(&d, pool, 0, 1, 0, &o2, &rc2, &c2);
    CHECK(o2.slot[0] != o1.slot[0], "the slot just given back was taken again before the older free one");
    staging_give_gpu(pool, &o2, 0);
    /* none free: a take waits for the staging wait (0.05 s here), then gets none, counted */
    cb_ring all = {0}, none = {0};
    staging_take_gpu(&d, pool, 0, 2, 0, &all, &rc2, &c2);
    double t0 = staging_now();
    int got = staging_take_gpu(&d, pool, 0, 1, 0, &none, &rc2, &c2);
    double waited = staging_now() - t0;
    CHECK(got == 0 && waited >= 0.045 && pool->timeouts == 1 && pool->waits == 1,
          "a take with none free: got %d after %.3f s (timeouts %lld, waits %lld)", got, waited, pool->timeouts,
          pool->waits);
    /* a copy that failed drops its slots */
    staging_give_gpu(pool, &all, 1);
    CHECK(pool->lost == 2 && pool->nfree == 0 && pool->held == 0, "a failed copy's slots: lost %lld, free %d, held %lld",
          pool->lost, pool->nfree, pool->held);
    free(src2);
    /* ending the slots waits for their last DMAs and destroys their events */
    cb_staging_gpu *endp = staging_gpu_new(malloc(4 * k4), 4, k4, 0.05);
    CHECK(endp != NULL && staging_gpu_events(&d, endp, &c2) == 0, "the pool's events: %s", c2 ? c2 : "");
    cb_ring e = {0};
    staging_take_gpu(&d, endp, 0, 4, 0, &e, &rc2, &c2);
    last_end = DEV_BASE;
    hold_device(1);
    rc = ring_to_device(&d, &e, &in, 0, (jlong)(4 * k4), DEV_BASE, NULL, 1, &call);
    CHECK(staging_gpu_close(&d, endp) == 0 && !endp->closed, "closed while a copy holds its slots");
    staging_give_gpu(endp, &e, rc != 0);
    pthread_mutex_lock(&q_lock);
    long queued = q_enqueued, done_before = q_done;
    pthread_mutex_unlock(&q_lock);
    CHECK(done_before < queued, "the model ran the DMAs while held");
    hold_device(0);
    int destroyed = n_destroyed;
    CHECK(staging_gpu_close(&d, endp) == 1, "the slots did not close with none held");
    pthread_mutex_lock(&q_lock);
    long done_after = q_done;
    pthread_mutex_unlock(&q_lock);
    CHECK(done_after >= queued, "closing the slots returned with %ld of their DMAs not run", queued - done_after);
    CHECK(n_destroyed - destroyed == 4, "closing the slots destroyed %d events, not 4", n_destroyed - destroyed);
    cb_ring after = {0};
    CHECK(staging_take_gpu(&d, endp, 0, 1, 0, &after, &rc2, &c2) == 0, "a take after close got a slot");
    staging_gpu_free(&d, endp);
    CHECK(n_destroyed - destroyed == 4, "freeing closed slots destroyed their events again");
    drain();
    if (failures) return 1;
    printf("ok %ld\n", ops_run);
    return 0;
}
