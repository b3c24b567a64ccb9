/*
 * staging_pool.h: the executor's pinned staging slots, one set per GPU, shared by every copy
 * that needs staging (Java heap arrays, pageable memory by address or in a direct ByteBuffer).
 * Included by _hotcore.c, which hands take and give to the JNI library (native_api.h); the copy
 * itself runs there (bridge/staging_ring.h).
 *
 * Why a shared set: a ring per copying thread made pinned memory follow the most threads that
 * ever copied (Spark keeps task threads in a cached pool), not the copies in flight, and a thread
 * that found the pinned pool empty paid a cudaHostAlloc of a whole ring. Here a GPU's slots are
 * reserved once, at the start (one page-locked block of stagingCopies x stagingSlotBytes, the hot
 * path's), and a copy takes as many as its chunks need, up to stagingSlots (so a small copy holds
 * one slot, not a ring), and gives them back when its DMAs are queued (host->device) or done
 * (device->host). A copy that finds none free waits for one, up to the staging wait, and then
 * copies through pageable memory instead (counted); nothing is allocated on the copy path.
 *
 * Invariants:
 *  - a slot is written (by the host or a DMA) only once the event recorded after its last DMA has
 *    completed: busy[i] says such an event is pending, whichever copy or stream queued that DMA;
 *    the copy that takes a busy slot waits for its event first (ring_slot_free);
 *  - a free slot is in the FIFO exactly once; a taken one is held by exactly one copy; free slots
 *    are taken oldest first, so that the one most likely idle is reused;
 *  - a slot whose copy met a driver error is not given back (its event's state is unknown): it is
 *    counted lost, and the GPU's sticky error is what follows in practice;
 *  - every field below the mutex changes only with it held; the GIL is not needed (the JNI side
 *    calls take and give without it);
 *  - no driver call is ever made with the mutex held, and the mutex is held only for a few loads
 *    and stores: threads that hold the GIL lock it (a quick copy's take and give, the statistics),
 *    and a driver whose entry points run Python (the emulated device's, device/emulated_driver.py)
 *    may drop the GIL inside any call, so a driver call under the mutex could leave the mutex
 *    held by a thread waiting for the GIL while the GIL's holder waits for the mutex. The events
 *    are all made at enable (staging_gpu_events); the quick take takes its slot out of the FIFO
 *    (counted held) before it queries the slot's event, outside the mutex, and puts it back at the
 *    head if it is busy; close takes the events out under the mutex and waits for and destroys
 *    them after it;
 *  - once closed (at shutdown, with no slot held) a GPU's slots are never taken again, so their
 *    memory may go; the struct itself lives as long as the hot path's C twin (a copy may still be
 *    about to lock it).
 */
#ifndef CB_STAGING_POOL_H
#define CB_STAGING_POOL_H

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "native_api.h"

#define CB_STAGING_POOL_MAX 1024   /* slots of one GPU */

typedef struct {
    char *base;                               /* n x slot_bytes of page-locked memory (the hot path owns it) */
    int n;
    size_t slot_bytes;
    cb_CUevent event[CB_STAGING_POOL_MAX];    /* made at enable (staging_gpu_events), in the GPU's context */
    int busy[CB_STAGING_POOL_MAX];
    int fifo[CB_STAGING_POOL_MAX];            /* the free slots, oldest first, from head */
    int head, nfree;
    pthread_mutex_t mu;
    pthread_cond_t cv;                        /* signalled when slots come back */
    double wait_s;                            /* how long a copy waits for a slot */
    int closed;                               /* takes give none (copies go pageable); events destroyed */
    /* statistics */
    long long copies, quick, waits, timeouts, lost, held, held_peak;
    double waited_s;
} cb_staging_gpu;

static double staging_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A GPU's slots over base (n x slot_bytes, page-locked, owned by the caller); NULL when out of memory. */
static cb_staging_gpu *staging_gpu_new(char *base, int n, size_t slot_bytes, double wait_s) {
    cb_staging_gpu *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) {
        free(s);
        return NULL;
    }
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&s->cv, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0 || pthread_mutex_init(&s->mu, NULL) != 0) {
        if (rc == 0) pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    s->base = base;
    s->n = n;
    s->slot_bytes = slot_bytes;
    s->wait_s = wait_s;
    for (int i = 0; i < n; i++) s->fifo[i] = i;
    s->nfree = n;
    return s;
}

/* Makes every slot's event (at enable, with the GPU's context current, before any copy can take a
 * slot). 0, or a CUresult with *call naming the call (the events made so far stay, for close). */
static int staging_gpu_events(const cb_driver *d, cb_staging_gpu *s, const char **call) {
    for (int i = 0; i < s->n; i++) {
        if (s->event[i] != NULL) continue;
        int rc = d->cuEventCreate(&s->event[i], CB_EVENT_DISABLE_TIMING);
        if (rc != CB_CUDA_SUCCESS) {
            s->event[i] = NULL;
            *call = "cuEventCreate(staging slot)";
            return rc;
        }
    }
    return CB_CUDA_SUCCESS;
}

/* Closes a GPU's slots unless a copy holds some (0, nothing changed): waits for every slot's last
 * DMA (so that the caller may free the memory) and destroys the events; with the GPU's context
 * current. 1 once closed (again: 1). */
static int staging_gpu_close(const cb_driver *d, cb_staging_gpu *s) {
    pthread_mutex_lock(&s->mu);
    if (s->held > 0) {
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    cb_CUevent events[CB_STAGING_POOL_MAX];
    int busy[CB_STAGING_POOL_MAX];
    int n = 0;
    if (!s->closed) {   /* the events out under the mutex; their waits and destruction after it */
        s->closed = 1;
        for (int i = 0; i < s->n; i++) {
            if (s->event[i] == NULL) continue;
            events[n] = s->event[i];
            busy[n++] = s->busy[i];
            s->event[i] = NULL;
            s->busy[i] = 0;
        }
    }
    pthread_cond_broadcast(&s->cv);   /* waiters give up: closed */
    pthread_mutex_unlock(&s->mu);
    for (int k = 0; k < n; k++) {
        if (busy[k]) d->cuEventSynchronize(events[k]);
        d->cuEventDestroy(events[k]);
    }
    return 1;
}

/* Frees the struct (its slots closed first where they can be): when the hot path's C twin goes. */
static void staging_gpu_free(const cb_driver *d, cb_staging_gpu *s) {
    staging_gpu_close(d, s);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static int staging_pop(cb_staging_gpu *s) {
    int i = s->fifo[s->head];
    s->head = (s->head + 1) % s->n;
    s->nfree--;
    return i;
}

static void staging_push(cb_staging_gpu *s, int i) {
    s->fifo[(s->head + s->nfree) % s->n] = i;
    s->nfree++;
}

/* Puts slot i back first in line (it was taken from the head and is wanted again at once). */
static void staging_push_head(cb_staging_gpu *s, int i) {
    s->head = (s->head + s->n - 1) % s->n;
    s->fifo[s->head] = i;
    s->nfree++;
}

/* Up to `want` slots (at least one) into out, mutex held (no driver call: the events were made at
 * enable). Returns the number taken. */
static int staging_fill(cb_staging_gpu *s, int gpu, int want, cb_staging_slots *out) {
    int k = want < s->nfree ? want : s->nfree;
    out->gpu = gpu;
    out->n = k;
    out->slot_bytes = s->slot_bytes;
    out->cursor = 0;
    for (int j = 0; j < k; j++) {
        int i = staging_pop(s);
        out->slot[j] = i;
        out->host[j] = s->base + (size_t)i * s->slot_bytes;
        out->event[j] = s->event[i];
        out->busy[j] = s->busy[i];
    }
    s->copies++;
    s->held += k;
    if (s->held > s->held_peak) s->held_peak = s->held;
    return k;
}

/* native_api's staging_take for GPU s (see there). */
static int staging_take_gpu(const cb_driver *d, cb_staging_gpu *s, int gpu, int want, int quick,
                            cb_staging_slots *out, int *rc, const char **call) {
    if (want < 1) want = 1;
    if (want > CB_STAGING_MAX_SLOTS) want = CB_STAGING_MAX_SLOTS;
    pthread_mutex_lock(&s->mu);
    if (s->closed) {
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    if (quick) {   /* one slot, free and idle now, its event made already: else the caller's other path */
        if (s->nfree == 0 || s->event[s->fifo[s->head]] == NULL) {
            pthread_mutex_unlock(&s->mu);
            return 0;
        }
        int i = staging_pop(s);   /* out of the FIFO and counted held (close waits) while its event is asked */
        s->held++;
        cb_CUevent ev = s->event[i];
        int busy = s->busy[i];
        pthread_mutex_unlock(&s->mu);
        int idle = !busy || d->cuEventQuery(ev) == CB_CUDA_SUCCESS;
        pthread_mutex_lock(&s->mu);
        s->held--;
        if (!idle) {   /* back where it was, the oldest */
            staging_push_head(s, i);
            pthread_cond_broadcast(&s->cv);   /* a waiter that found none meanwhile: there is one again */
            pthread_mutex_unlock(&s->mu);
            return 0;
        }
        s->busy[i] = 0;
        staging_push_head(s, i);
        int taken = staging_fill(s, gpu, 1, out);   /* takes the head: slot i */
        if (taken == 1) s->quick++;
        pthread_mutex_unlock(&s->mu);
        return taken;
    }
    if (s->nfree == 0) {
        double start = staging_now(), deadline = start + s->wait_s;
        struct timespec until;
        until.tv_sec = (time_t)deadline;
        until.tv_nsec = (long)((deadline - (double)until.tv_sec) * 1e9);
        s->waits++;
        int w = 0;
        while (s->nfree == 0 && !s->closed && w != ETIMEDOUT) w = pthread_cond_timedwait(&s->cv, &s->mu, &until);
        s->waited_s += staging_now() - start;
        if (s->nfree == 0 || s->closed) {
            s->timeouts++;
            pthread_mutex_unlock(&s->mu);
            return 0;
        }
    }
    int taken = staging_fill(s, gpu, want, out);
    pthread_mutex_unlock(&s->mu);
    (void)rc;
    (void)call;
    return taken;
}

/* native_api's staging_give for GPU s: the copy's slots back, with the busy flags the copy left;
 * `failed`: a driver call failed during the copy, the slots are dropped (counted lost). */
static void staging_give_gpu(cb_staging_gpu *s, cb_staging_slots *slots, int failed) {
    pthread_mutex_lock(&s->mu);
    for (int j = 0; j < slots->n; j++) {
        int i = slots->slot[j];
        if (failed) {
            s->lost++;
            continue;
        }
        s->busy[i] = slots->busy[j];
        staging_push(s, i);
    }
    s->held -= slots->n;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    slots->n = 0;
}

#endif
