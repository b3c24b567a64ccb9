/*
 * fastpath_arenas.h: the fast paths' steps on stream arenas: find the requesting stream's arena
 * (StreamTable.resolve, stream_table.py), put a freed block in its bin (StreamArena,
 * stream_arena.py), bound its reclaim queue (trim_recent), and steal an exact-size block that
 * another stream has passed (StreamOrderingCore.steal, stream_ordering.py). Part of _fastpath.c's
 * one translation unit: included by it after FastPath, the interned names and the slot types
 * (fastpath_slots.h), not a header to include anywhere else.
 *
 * Invariants:
 *  - steal stays step for step the same as StreamOrderingCore.steal (docs/architecture.md): a
 *    block of another stream is taken only once its free is known complete there (its epoch
 *    stamp <= the stream's completed epoch), with at most one stream query per steal, and the
 *    epoch is advanced before the query, so every free stamped with the queried epoch was
 *    queued before it;
 *  - steal runs no Python code between reading a bin and taking from it; the one call that may
 *    (the stream query, which may release the GIL) comes after the epoch's advance, and the
 *    candidate's bin is read again after it;
 *  - a trim is a locked step (on the worker); it may raise, the free it follows stands.
 */

#ifndef CB_FASTPATH_ARENAS_H
#define CB_FASTPATH_ARENAS_H

/* The arena of `stream` (new reference), resolved as StreamTable.resolve does. */
static PyObject *resolve_arena(FastPath *self, PyObject *stream, PyObject *call) {
    PyObject *arena = PyDict_GetItemWithError(self->arenas, stream);
    if (arena != NULL) {
        Py_INCREF(arena);
        return arena;
    }
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return NULL;
        PyErr_Clear();  /* unhashable: let resolve_arena say what is wrong */
    }
    PyObject *args[2] = {stream, call};
    return PyObject_Vectorcall(self->resolve_arena, args, 2, NULL);
}

static int push_to_bin(ArenaBase *arena, PyObject *blk, PyObject *size) {
    /* bins.setdefault(size, []).append(blk); recent.append(blk) */
    if (arena->bins == NULL || !PyDict_Check(arena->bins) || arena->recent == NULL) {
        PyErr_SetString(PyExc_SystemError, "stream arena without bins");
        return -1;
    }
    PyObject *lst = PyDict_GetItemWithError(arena->bins, size);
    if (lst == NULL) {
        if (PyErr_Occurred())
            return -1;
        PyObject *fresh = PyList_New(0);
        if (fresh == NULL)
            return -1;
        lst = PyDict_SetDefault(arena->bins, size, fresh);
        Py_DECREF(fresh);
        if (lst == NULL)
            return -1;
    }
    if (PyList_Append(lst, blk) < 0)
        return -1;
    PyObject *r = PyObject_CallMethodOneArg(arena->recent, s_append, blk);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Bound `recent` (see StreamArena.trim_recent): amortized, so rarely taken. Called once a free
 * is complete: the trim (a locked step, on the worker) may raise, the free stands. */
static int maybe_trim(FastPath *self, ArenaBase *arena) {
    Py_ssize_t len = PyObject_Length(arena->recent);
    Py_ssize_t limit = arena->trim_at ? PyLong_AsSsize_t(arena->trim_at) : 0;
    if (len < 0 || (limit == -1 && PyErr_Occurred()))
        return -1;
    if (len > limit) {
        PyObject *r = PyObject_CallOneArg(self->trim_recent, (PyObject *)arena);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* Whether a Python int stamp <= another (both are small ints in practice); -1 on error. */
static int stamp_le(PyObject *a, PyObject *b) {
    if (a == NULL || b == NULL) {
        PyErr_SetString(PyExc_SystemError, "cudabridge fast path: missing epoch stamp");
        return -1;
    }
    return PyObject_RichCompareBool(a, b, Py_LE);
}

/* Take the last block of `lst` whose state is `o` and stamp <= `limit`; new reference or NULL. */
static PyObject *take_passed(PyObject *lst, ArenaBase *o, PyObject *limit, int last_only) {
    Py_ssize_t n = PyList_GET_SIZE(lst);
    for (Py_ssize_t i = n - 1; i >= 0 && (!last_only || i == n - 1); i--) {
        BlockBase *b = (BlockBase *)PyList_GET_ITEM(lst, i);
        if (!PyObject_TypeCheck((PyObject *)b, &BlockBaseType) || b->state != (PyObject *)o)
            continue;
        int le = stamp_le(b->epoch, limit);
        if (le < 0)
            return NULL;
        if (!le)
            continue;
        Py_INCREF(b);
        if (PyList_SetSlice(lst, i, i + 1, NULL) < 0) {
            Py_DECREF(b);
            return NULL;
        }
        return (PyObject *)b;
    }
    return NULL;
}

/* The twin of StreamOrderingCore.steal (stream_ordering.py): a block of exactly `rkey` bytes that
 * another stream has passed, known or seen with at most one stream query. Returns a new
 * reference, or NULL with no error set when there is none. */
static PyObject *steal(FastPath *self, PyObject *req, PyObject *rkey) {
    if (self->stream_query == Py_None)
        return NULL;
    ArenaBase *candidate = NULL;
    PyObject *blk = NULL;
    Py_ssize_t n = PyList_GET_SIZE(self->all_arenas);
    for (Py_ssize_t i = 0; i < n; i++) {
        ArenaBase *o = (ArenaBase *)PyList_GET_ITEM(self->all_arenas, i);
        if ((PyObject *)o == req || !PyObject_TypeCheck((PyObject *)o, &ArenaBaseType) || o->bins == NULL ||
            !PyDict_CheckExact(o->bins) || PyDict_GET_SIZE(o->bins) == 0)
            continue;
        PyObject *lst = PyDict_GetItemWithError(o->bins, rkey);
        if (lst == NULL) {
            if (PyErr_Occurred())
                return NULL;
            continue;
        }
        if (!PyList_CheckExact(lst) || PyList_GET_SIZE(lst) == 0)
            continue;
        BlockBase *last = (BlockBase *)PyList_GET_ITEM(lst, PyList_GET_SIZE(lst) - 1);
        int le = last->state == (PyObject *)o ? stamp_le(last->epoch, o->completed) : 0;
        if (le < 0)
            return NULL;
        if (le) {
            blk = take_passed(lst, o, o->completed, 1);
            if (blk != NULL || PyErr_Occurred()) {
                if (blk != NULL)
                    self->steals++;
                return blk;
            }
        } else if (candidate == NULL && o->eager != Py_True) {
            candidate = o;
        }
    }
    if (candidate == NULL)
        return NULL;
    Py_INCREF(candidate);
    /* Advance, then query: every free stamped with `cur` was queued before the advance. */
    PyObject *cur = candidate->epoch, *one = NULL, *next = NULL, *res = NULL;
    Py_XINCREF(cur);
    if (cur == NULL || (one = PyLong_FromLong(1)) == NULL || (next = PyNumber_Add(cur, one)) == NULL)
        goto done;
    Py_XSETREF(candidate->epoch, next);
    next = NULL;
    self->stream_polls++;
    int idle = -2;
    if (self->cu_stream_query != NULL) {
        /* The driver directly: one C call, where the bindings' query is a Python call around
         * the same one; any answer but "done" or "not ready" goes to the backend, which
         * reports it properly. */
        void *handle = PyLong_AsVoidPtr(candidate->handle);
        if (handle == NULL && PyErr_Occurred())
            goto done;
        int rc = self->cu_stream_query(handle);
        idle = rc == 0 ? 1 : rc == 600 /* CUDA_ERROR_NOT_READY */ ? 0 : -2;
    }
    if (idle == -2) {
        res = PyObject_CallOneArg(self->stream_query, candidate->handle);  /* may release the GIL */
        if (res == NULL)
            goto done;
        idle = PyObject_IsTrue(res);
    }
    if (idle <= 0)
        goto done;
    int known = stamp_le(cur, candidate->completed);
    if (known < 0)
        goto done;
    if (!known)
        set_slot(&candidate->completed, cur);
    PyObject *lst = candidate->bins ? PyDict_GetItemWithError(candidate->bins, rkey) : NULL;
    if (lst != NULL && PyList_CheckExact(lst)) {
        blk = take_passed(lst, candidate, cur, 0);
        if (blk != NULL)
            self->steals++;
    }
done:
    Py_XDECREF(res);
    Py_XDECREF(one);
    Py_XDECREF(cur);
    Py_DECREF(candidate);
    return blk;
}

#endif /* CB_FASTPATH_ARENAS_H */
