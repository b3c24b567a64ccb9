/*
 * host_copy.h: a host memcpy split over threads, for the staging ring's copies between a Java
 * array and a pinned slot (staging_ring.h). Included by cudabridge_jni.c only; no CUDA, no JNI,
 * no Python here (tests/native/ builds it on its own).
 *
 * Why: one thread's memcpy bounds a staged copy (on the H200's host 9-12 GB/s from 4 MiB, while
 * the link moves 55 GB/s); the host's memory reaches about 31 GB/s with 8 threads. A large chunk
 * is cut into parts, which the calling thread and a few helper threads claim one at a time.
 *
 * Invariants:
 *  - the helpers are shared by every thread of the process and started lazily, at most
 *    CB_COPY_MAX_THREADS - 1, never ended: the CPU spent on copies is bounded by the helpers
 *    started, however many Java threads copy at once;
 *  - the caller always works on its own job, so a copy never waits for a busy helper: a part is
 *    claimed by whoever is free first, and the caller returns once every part is copied;
 *  - a job lives on its caller's stack: a helper touches it only between taking a reference
 *    under g_copy_lock (while the job is listed) and dropping it, and the caller unlists it and
 *    waits for the references to drop before it returns.
 */
#ifndef CB_HOST_COPY_H
#define CB_HOST_COPY_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

/* Copies into a staging slot the device reads next use streaming (non-temporal) stores: the
 * bytes go to memory without filling the cache with dirty lines that the DMA would then have to
 * snoop out of it, one line at a time (measured on the H200: staged host->device copies ran at
 * 20 GB/s while the same threads' plain copy ran at 33). CB_COPY_NO_STREAMING builds plain
 * memcpy instead (and does where SSE2 is missing). */
#if (defined(__x86_64__) || defined(__SSE2__)) && !defined(CB_COPY_NO_STREAMING)
#include <emmintrin.h>
#include <stdint.h>
static void copy_streaming(char *dst, const char *src, size_t n) {
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;   /* to a 16-byte aligned destination */
    if (head > n) head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    for (; n >= 64; n -= 64, dst += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src), b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32)), d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
    memcpy(dst, src, n);
    _mm_sfence();   /* the streamed bytes are visible before anything this thread stores after */
}
#else
static void copy_streaming(char *dst, const char *src, size_t n) { memcpy(dst, src, n); }
#endif

#define CB_COPY_MAX_THREADS 64
#define CB_COPY_MIN_PART ((size_t)256 << 10)   /* smaller parts cost more in hand-offs than they save */
#define CB_COPY_SPIN 20000                    /* idle polls before a helper sleeps (tens of us) */

typedef struct cb_copy_job {
    struct cb_copy_job *next;   /* in g_copy_jobs while listed */
    char *dst;
    const char *src;
    size_t n, part, parts;
    int streaming;              /* copy_streaming rather than memcpy */
    atomic_size_t next_part;    /* the next part to claim */
    atomic_int users;           /* helpers holding a reference */
} cb_copy_job;

static pthread_mutex_t g_copy_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_copy_wake = PTHREAD_COND_INITIALIZER;
static cb_copy_job *g_copy_jobs;       /* listed jobs, oldest first (under g_copy_lock) */
static atomic_int g_copy_listed;       /* how many are listed: polled by idle helpers without the lock */
static int g_copy_helpers;             /* helpers started (under g_copy_lock) */
static atomic_long g_copies_split, g_copy_parts_by_helpers;

/* Claims and copies parts of j until none is left to claim; returns how many it copied. */
static size_t copy_job_work(cb_copy_job *j) {
    size_t did = 0;
    for (;;) {
        size_t p = atomic_fetch_add_explicit(&j->next_part, 1, memory_order_relaxed);
        if (p >= j->parts) return did;
        size_t at = p * j->part;
        size_t len = j->n - at < j->part ? j->n - at : j->part;
        if (j->streaming) copy_streaming(j->dst + at, j->src + at, len);
        else memcpy(j->dst + at, j->src + at, len);
        did++;
    }
}

/* Unlists j (g_copy_lock held); a no-op when it is not listed. */
static void copy_job_unlist(cb_copy_job *j) {
    for (cb_copy_job **p = &g_copy_jobs; *p != NULL; p = &(*p)->next) {
        if (*p == j) {
            *p = j->next;
            atomic_fetch_sub_explicit(&g_copy_listed, 1, memory_order_relaxed);
            return;
        }
    }
}

static void *copy_helper(void *unused) {
    (void)unused;
    pthread_mutex_lock(&g_copy_lock);
    for (;;) {
        if (g_copy_jobs == NULL) {
            pthread_mutex_unlock(&g_copy_lock);
            /* poll a while before sleeping: a large copy posts its next chunk within microseconds */
            for (int i = 0; i < CB_COPY_SPIN && atomic_load_explicit(&g_copy_listed, memory_order_relaxed) == 0; i++) {
                if ((i & 63) == 63) sched_yield();
            }
            pthread_mutex_lock(&g_copy_lock);
            if (g_copy_jobs == NULL) pthread_cond_wait(&g_copy_wake, &g_copy_lock);
            continue;
        }
        cb_copy_job *j = g_copy_jobs;
        atomic_fetch_add_explicit(&j->users, 1, memory_order_relaxed);
        pthread_mutex_unlock(&g_copy_lock);
        size_t did = copy_job_work(j);
        if (did) atomic_fetch_add_explicit(&g_copy_parts_by_helpers, (long)did, memory_order_relaxed);
        pthread_mutex_lock(&g_copy_lock);
        copy_job_unlist(j);   /* every part is claimed: the helpers move on to the next job */
        /* release: the caller reads the bytes this helper wrote once it sees the reference gone;
         * j is not touched after this */
        atomic_fetch_sub_explicit(&j->users, 1, memory_order_release);
    }
    return NULL;
}

/* Starts helpers up to threads - 1 (g_copy_lock held). A helper that cannot be started is not
 * retried: the copies then use fewer threads, never fail. */
static void copy_helpers_start(int threads) {
    static int failed;
    while (!failed && g_copy_helpers < threads - 1 && g_copy_helpers < CB_COPY_MAX_THREADS - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 << 10);
        if (pthread_create(&t, &attr, copy_helper, NULL) != 0) failed = 1;
        else g_copy_helpers++;
        pthread_attr_destroy(&attr);
    }
}

/* memcpy(dst, src, n) with up to `threads` threads (the caller and threads - 1 helpers) when n
 * is large enough to gain from it; with streaming stores when `streaming` (dst is read by a DMA
 * next, not by this host). Returns once every byte is copied and visible. */
static void cb_host_copy(void *dst, const void *src, size_t n, int threads, int streaming) {
    if (threads > CB_COPY_MAX_THREADS) threads = CB_COPY_MAX_THREADS;
    if (threads <= 1 || n < 2 * CB_COPY_MIN_PART) {
        if (streaming) copy_streaming(dst, src, n);
        else memcpy(dst, src, n);
        return;
    }
    size_t part = (n + (size_t)threads - 1) / (size_t)threads;
    if (part < CB_COPY_MIN_PART) part = CB_COPY_MIN_PART;
    part = (part + 4095) & ~(size_t)4095;
    cb_copy_job j = {.next = NULL, .dst = dst, .src = src, .n = n, .part = part, .parts = (n + part - 1) / part,
                     .streaming = streaming};
    atomic_init(&j.next_part, 0);
    atomic_init(&j.users, 0);
    pthread_mutex_lock(&g_copy_lock);
    copy_helpers_start(threads);
    cb_copy_job **tail = &g_copy_jobs;   /* listed last: an earlier copy's parts are claimed first */
    while (*tail != NULL) tail = &(*tail)->next;
    *tail = &j;
    atomic_fetch_add_explicit(&g_copy_listed, 1, memory_order_relaxed);
    pthread_cond_broadcast(&g_copy_wake);
    pthread_mutex_unlock(&g_copy_lock);
    copy_job_work(&j);   /* the caller works on its own job, never waiting for a busy helper */
    pthread_mutex_lock(&g_copy_lock);
    copy_job_unlist(&j);
    pthread_mutex_unlock(&g_copy_lock);
    /* no helper can take a reference now; those that hold one finish the parts they claimed */
    while (atomic_load_explicit(&j.users, memory_order_acquire) != 0) sched_yield();
    atomic_fetch_add_explicit(&g_copies_split, 1, memory_order_relaxed);
}

#endif
