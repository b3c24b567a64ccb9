/*
 * hotcore_exports.h: the exported ABI, what the bridge's JNI library is handed: the native_api
 * capsule (a cb_native_api, native_api.h) that points at the launch (hotcore_kernels.h), copy
 * admission (hotcore_copies.h) and, here, staging_take / staging_give over each GPU's staging
 * slots (staging_pool.h), which HotCore holds and Python enables, closes and reads the statistics
 * of. Part of _hotcore.c's one translation unit: included by it last, not a header to include
 * anywhere else.
 *
 * Invariants:
 *  - the capsule owns a reference to its HotCore, so every pointer in it stays valid while the
 *    JNI library holds the capsule;
 *  - a GPU with no staging slots gives none (its copies take the pageable path);
 *  - a GPU's slots close only when no copy holds any; once closed they are never taken again,
 *    and the struct itself stays until the C twin goes (a copy may be about to lock it);
 *  - staging_take / staging_give run without the GIL (the pool's own mutex guards it); the rest
 *    runs with it.
 */

#ifndef CB_HOTCORE_EXPORTS_H
#define CB_HOTCORE_EXPORTS_H

/* native_api's staging_take and staging_give (staging_pool.h); a GPU with no staging slots gives
 * none (its copies take the pageable path). */
static int staging_take(void *core, int gpu, int want, int quick, cb_staging_slots *out, int *rc, const char **call) {
    HotCore *self = (HotCore *)core;
    cb_staging_gpu *s = gpu >= 0 && gpu < MAX_GPUS ? self->staging[gpu] : NULL;
    if (s == NULL) {
        out->n = 0;
        return 0;
    }
    return staging_take_gpu(self->driver, s, gpu, want, quick, out, rc, call);
}

static void staging_give(void *core, cb_staging_slots *slots, int failed) {
    HotCore *self = (HotCore *)core;
    cb_staging_gpu *s = slots->gpu >= 0 && slots->gpu < MAX_GPUS ? self->staging[slots->gpu] : NULL;
    if (s != NULL && slots->n > 0) staging_give_gpu(s, slots, failed);
}

/* Closes GPU gpu's staging slots (their last DMAs waited for, events destroyed) unless a copy holds
 * some: 1 (also when it has none); 0 when some are held (nothing changed). The GPU's context is made
 * current for it. `free_struct`: the C twin is going; the struct goes too. */
static int staging_close_gpu(HotCore *self, int gpu, int free_struct) {
    cb_staging_gpu *s = self->staging[gpu];
    if (s == NULL) return 1;
    cb_CUcontext prev = NULL;
    int switched = self->driver->cuCtxGetCurrent != NULL && self->contexts[gpu] != NULL &&
                   self->driver->cuCtxGetCurrent(&prev) == CB_CUDA_SUCCESS && prev != self->contexts[gpu] &&
                   self->driver->cuCtxSetCurrent(self->contexts[gpu]) == CB_CUDA_SUCCESS;
    int closed = 1;
    if (free_struct) {
        staging_gpu_free(self->driver, s);
        self->staging[gpu] = NULL;
    } else {
        closed = staging_gpu_close(self->driver, s);
    }
    if (switched) self->driver->cuCtxSetCurrent(prev);
    return closed;
}

static void staging_close_all(HotCore *self) {
    for (int i = 0; i < MAX_GPUS; i++)
        if (self->staging[i] != NULL) staging_close_gpu(self, i, 1);
}

/* enable_staging(gpu, address, slots, slot_bytes, wait_s): GPU gpu's staging slots over the
 * page-locked memory at address (slots x slot_bytes; the caller keeps it until close_staging). */
static PyObject *hc_enable_staging(HotCore *self, PyObject *args) {
    int gpu, slots;
    unsigned long long address;
    long long slot_bytes;
    double wait_s;
    if (!PyArg_ParseTuple(args, "iKiLd:enable_staging", &gpu, &address, &slots, &slot_bytes, &wait_s)) return NULL;
    if (gpu < 0 || gpu >= MAX_GPUS || slots < 1 || slots > CB_STAGING_POOL_MAX || slot_bytes < 4096 ||
        slot_bytes > (1LL << 30) || address == 0 || !(wait_s >= 0)) {
        PyErr_Format(PyExc_ValueError, "enable_staging: GPU %d, %d slots (1 to %d) of %lld bytes (4 KiB to 1 GiB) "
                     "at %#llx, wait %g s", gpu, slots, CB_STAGING_POOL_MAX, slot_bytes, address, wait_s);
        return NULL;
    }
    if (self->staging[gpu] != NULL) {
        PyErr_Format(PyExc_ValueError, "enable_staging: GPU %d has staging slots already", gpu);
        return NULL;
    }
    if (retain_context(self, gpu) < 0) return NULL;
    cb_staging_gpu *sg = staging_gpu_new((char *)(uintptr_t)address, slots, (size_t)slot_bytes, wait_s);
    if (sg == NULL) return PyErr_NoMemory();
    /* every slot's event now, in the GPU's context: no copy makes one with the pool's mutex held */
    const cb_driver *d = self->driver;
    const char *call = "cuCtxGetCurrent";
    cb_CUcontext prev = NULL;
    int rc = d->cuCtxGetCurrent(&prev);
    int switched = rc == CB_CUDA_SUCCESS && prev != self->contexts[gpu];
    if (switched && (rc = d->cuCtxSetCurrent(self->contexts[gpu])) != CB_CUDA_SUCCESS) call = "cuCtxSetCurrent";
    if (rc == CB_CUDA_SUCCESS) rc = staging_gpu_events(d, sg, &call);
    if (rc != CB_CUDA_SUCCESS) staging_gpu_free(d, sg);   /* destroys the events made */
    if (switched && prev != NULL) d->cuCtxSetCurrent(prev);
    if (rc != CB_CUDA_SUCCESS) {
        char buf[32];
        PyErr_Format(PyExc_RuntimeError, "enable_staging: GPU %d: %s failed: %s", gpu, call,
                     cb_driver_error_name(d, rc, buf, sizeof buf));
        return NULL;
    }
    self->staging[gpu] = sg;
    Py_RETURN_NONE;
}

/* close_staging(gpu) -> bool: closes the GPU's staging slots unless a copy holds some (False); once
 * closed, copies that need staging go through pageable memory and the memory may be freed. */
static PyObject *hc_close_staging(HotCore *self, PyObject *arg) {
    long gpu = PyLong_AsLong(arg);
    if (gpu == -1 && PyErr_Occurred()) return NULL;
    if (gpu < 0 || gpu >= MAX_GPUS) {
        PyErr_Format(PyExc_ValueError, "close_staging: GPU %ld", gpu);
        return NULL;
    }
    return PyBool_FromLong(staging_close_gpu(self, (int)gpu, 0));
}

/* staging_statistics() -> dict, summed over the GPUs (docs/glossary.md, staging_*). */
static PyObject *hc_staging_statistics(HotCore *self, PyObject *unused) {
    long long reserved = 0, slots = 0, held = 0, peak = 0, copies = 0, quick = 0, waits = 0, timeouts = 0, lost = 0;
    double waited = 0;
    for (int i = 0; i < MAX_GPUS; i++) {
        cb_staging_gpu *s = self->staging[i];
        if (s == NULL) continue;
        pthread_mutex_lock(&s->mu);
        reserved += (long long)s->n * (long long)s->slot_bytes;
        slots += s->n;
        held += s->held;
        peak += s->held_peak;
        copies += s->copies;
        quick += s->quick;
        waits += s->waits;
        timeouts += s->timeouts;
        lost += s->lost;
        waited += s->waited_s;
        pthread_mutex_unlock(&s->mu);
    }
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L}", "staging_reserved_bytes", reserved,
                         "staging_slots", slots, "staging_slots_held", held, "staging_slots_held_peak", peak,
                         "staging_copies", copies, "staging_quick_copies", quick, "staging_waits", waits,
                         "staging_wait_us_total", (long long)(waited * 1e6), "staging_fallbacks_pageable", timeouts,
                         "staging_slots_lost", lost);
}

static void api_capsule_free(PyObject *capsule) {
    Py_XDECREF((PyObject *)PyCapsule_GetContext(capsule));
}

/* native_api() -> the capsule cb_native_api (native_api.h) for the bridge's JNI library. */
static PyObject *hc_native_api(HotCore *self, PyObject *unused) {
    if (self->ref_launch == NULL) Py_RETURN_NONE;
    self->api.version = CB_NATIVE_API_VERSION;
    self->api.core = self;
    self->api.launch = launch_raw;
    self->api.driver = self->enter_buffer != NULL ? self->driver : NULL;
    self->api.staging_slots = self->staging_slots;
    self->api.staging_slot_bytes = self->staging_slot_bytes;
    self->api.staging_copy_threads = self->staging_copy_threads;
    self->api.staging_take = staging_take;
    self->api.staging_give = staging_give;
    self->api.enter_copy = enter_copy;
    self->api.leave_copy = leave_copy;
    self->api.driver_failed = driver_failed;
    PyObject *c = PyCapsule_New(&self->api, CB_NATIVE_API_CAPSULE, api_capsule_free);
    if (c == NULL) return NULL;
    Py_INCREF(self);
    if (PyCapsule_SetContext(c, self) < 0) {
        Py_DECREF(self);
        Py_DECREF(c);
        return NULL;
    }
    return c;
}

#endif /* CB_HOTCORE_EXPORTS_H */
