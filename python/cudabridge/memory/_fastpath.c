/*
 * The memory pool's fast paths in C: allocate from the requesting stream's own bin, and free
 * into the freeing stream's bin. Semantics are exactly those of the pure-Python paths in
 * python_fast_path.py (`PythonFastPath.allocate` / `.free`), which stay the reference and
 * the fallback; everything else (the slow path, fenced frees, errors) is called back in Python
 * through the pool's FastPathHooks (fast_path_hooks.py).
 *
 * Why C: the Python fast path is about ten container operations and one object of ten slots
 * per pair; the interpreter overhead, not the work, dominates (the two paths' pairs side by side:
 * bench/RESULTS.md, "bench_core, H200 (run 4, current code)").
 * Why it is thread-safe: this code runs with the GIL held and only calls back into Python on
 * the slow, fenced or error paths, after it has finished touching the shared containers, so
 * each fast path is one atomic step (the Python version relies on single container operations
 * being atomic; this is strictly stronger). Free-threaded builds are not supported by this
 * module; the pool falls back to Python there.
 *
 * Its parts, by concern, each a header of static functions included here (one translation unit,
 * one extension, as setup.py builds it from this file alone; each header says what it holds and
 * its invariants):
 *   fastpath_slots.h    the C layouts of Allocation, Block and StreamArena
 *   serial_worker.h     SerialWorker: the locked steps on a thread no interruption reaches
 *   fastpath_arenas.h   the steps on stream arenas: resolve, bin, trim, and steal
 * This file holds FastPath itself: its state, the hooks it is handed, allocate, free and reissue,
 * the usage ledger's counts, and the module (about 700 lines, on purpose: the three calls change
 * the same containers under the same invariants, and read best beside each other).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#include "fastpath_slots.h"
#include "serial_worker.h"

/* ---- FastPath: one per pool ---------------------------------------------------------------
 *
 * It is handed the pool's FastPathHooks (fast_path_hooks.py) and sees nothing else of the pool:
 * the shared containers it changes (each change one step under the GIL) and the pool's steps it
 * calls back, read once here by their public names. */

typedef struct {
    PyObject_HEAD
    PyObject *arenas;      /* hooks.arenas: dict, stream handle -> StreamArena */
    PyObject *live;        /* hooks.live: set of live Allocations */
    PyObject *owners;      /* hooks.owners: dict, owner -> dict of Allocations */
    PyObject *all_arenas;  /* hooks.all_arenas: list of every StreamArena */
    PyTypeObject *alloc_type;
    PyObject *pool;        /* hooks.pool: each Allocation's _pool */
    PyObject *slow, *resolve_arena, *refuse_size, *refuse_free;  /* the pool's steps, from the hooks */
    PyObject *fence_stamps, *place_pending;  /* ... for frees behind events or several streams */
    PyObject *queue_waits, *return_unwaited;  /* ... for blocks the caller's own stream must wait for */
    PyObject *trim_recent;  /* ... to bound an arena's reclaim queue */
    PyObject *out_of_memory, *oom_type;  /* the slow path raised oom_type: ask out_of_memory (retry or not) */
    SerialWorker *worker;  /* runs the locked steps (slow, place_pending, return_unwaited) off this thread */
    PyObject *allocate_normalized, *free_normalized;  /* ... for arguments that are not exact ints */
    PyObject *live_state, *alive, *freed;  /* LIVE (block state), ALIVE / FREED (allocation) */
    PyObject *stream_query;  /* backend.stream_query, or None: no cross-stream step */
    long long next_id;
    long long steals, stream_polls;
    long long in_use, peak;  /* block bytes lent out, exact under the GIL (the ledger's job) */
    int (*cu_stream_query)(void *);  /* the driver's cuStreamQuery, or NULL: call stream_query */
    Py_ssize_t max_request;
} FastPath;

/* Method names, interned once. */
static PyObject *s_append, *s_allocate, *s_free;

#define FP_OBJECTS(X) X(arenas) X(live) X(owners) X(all_arenas) X(alloc_type) X(pool) X(slow) \
    X(resolve_arena) X(refuse_size) X(refuse_free) X(fence_stamps) X(place_pending) X(queue_waits) \
    X(return_unwaited) X(trim_recent) X(worker) X(allocate_normalized) X(free_normalized) \
    X(live_state) X(alive) X(freed) X(stream_query) X(out_of_memory) X(oom_type)

static int fp_traverse(FastPath *self, visitproc visit, void *arg) {
#define VISIT(f) Py_VISIT(self->f);
    FP_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int fp_clear(FastPath *self) {
#define CLEAR(f) Py_CLEAR(self->f);
    FP_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void fp_dealloc(FastPath *self) {
    PyObject_GC_UnTrack(self);
    fp_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* hooks.<name> into *slot (new reference), checked to be of `type` (or callable when NULL). */
static int hook(PyObject *hooks, const char *name, PyTypeObject *type, PyObject **slot) {
    PyObject *v = PyObject_GetAttrString(hooks, name);
    if (v == NULL)
        return -1;
    if (type != NULL ? !PyObject_TypeCheck(v, type) : !PyCallable_Check(v)) {
        PyErr_Format(PyExc_TypeError, "FastPath: hooks.%s must be %s, got %R", name,
                     type != NULL ? type->tp_name : "callable", v);
        Py_DECREF(v);
        return -1;
    }
    Py_XSETREF(*slot, v);
    return 0;
}

static int fp_init(FastPath *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"hooks", "worker", "alloc_type", "live_state", "alive", "freed", "first_id",
                         "stream_query", "cu_stream_query", NULL};
    PyObject *hooks, *worker, *alloc_type = NULL, *live_state = NULL, *alive = NULL, *freed = NULL;
    PyObject *stream_query = NULL;
    unsigned long long cu_query = 0;
    long long first_id = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!|$O!OOOLOK", kw, &hooks, &SerialWorkerType, &worker,
                                     &PyType_Type, &alloc_type, &live_state, &alive, &freed, &first_id,
                                     &stream_query, &cu_query))
        return -1;
    if (!live_state || !alive || !freed || !stream_query) {
        PyErr_SetString(PyExc_TypeError, "FastPath needs live_state, alive, freed and stream_query");
        return -1;
    }
    if (alloc_type == NULL || !PyType_IsSubtype((PyTypeObject *)alloc_type, &AllocationBaseType)) {
        PyErr_SetString(PyExc_TypeError, "alloc_type must derive from AllocationBase");
        return -1;
    }
    PyObject *max_request = PyObject_GetAttrString(hooks, "max_request");
    Py_ssize_t max = max_request ? PyLong_AsSsize_t(max_request) : -1;
    Py_XDECREF(max_request);
    if (max == -1 && PyErr_Occurred())
        return -1;
    fp_clear(self);
    if (hook(hooks, "pool", &PyBaseObject_Type, &self->pool) < 0 ||
        hook(hooks, "arenas", &PyDict_Type, &self->arenas) < 0 ||
        hook(hooks, "all_arenas", &PyList_Type, &self->all_arenas) < 0 ||
        hook(hooks, "live", &PySet_Type, &self->live) < 0 ||
        hook(hooks, "owners", &PyDict_Type, &self->owners) < 0 ||
        hook(hooks, "resolve_arena", NULL, &self->resolve_arena) < 0 ||
        hook(hooks, "refuse_size", NULL, &self->refuse_size) < 0 ||
        hook(hooks, "refuse_free", NULL, &self->refuse_free) < 0 ||
        hook(hooks, "allocate_normalized", NULL, &self->allocate_normalized) < 0 ||
        hook(hooks, "free_normalized", NULL, &self->free_normalized) < 0 ||
        hook(hooks, "allocate_slow", NULL, &self->slow) < 0 ||
        hook(hooks, "queue_waits", NULL, &self->queue_waits) < 0 ||
        hook(hooks, "return_unwaited", NULL, &self->return_unwaited) < 0 ||
        hook(hooks, "fence_stamps", NULL, &self->fence_stamps) < 0 ||
        hook(hooks, "place_pending", NULL, &self->place_pending) < 0 ||
        hook(hooks, "trim_recent", NULL, &self->trim_recent) < 0 ||
        hook(hooks, "out_of_memory", NULL, &self->out_of_memory) < 0 ||
        hook(hooks, "out_of_memory_error", &PyType_Type, &self->oom_type) < 0) {
        fp_clear(self);
        return -1;
    }
    Py_INCREF(alloc_type); self->alloc_type = (PyTypeObject *)alloc_type;
    Py_INCREF(live_state); self->live_state = live_state;
    Py_INCREF(alive); self->alive = alive;
    Py_INCREF(freed); self->freed = freed;
    Py_INCREF(worker); self->worker = (SerialWorker *)worker;
    Py_INCREF(stream_query); self->stream_query = stream_query;
    self->max_request = max;
    self->steals = self->stream_polls = 0;
    self->in_use = self->peak = 0;
    self->cu_stream_query = (int (*)(void *))(uintptr_t)cu_query;
    self->next_id = first_id;
    return 0;
}

/* Call a Python method that must raise (the pool's error reporters); never returns a value. */
static PyObject *raise_via(PyObject *fn, PyObject *arg) {
    PyObject *r = PyObject_CallOneArg(fn, arg);
    if (r != NULL) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_SystemError, "cudabridge fast path: error reporter returned");
    }
    return NULL;
}

/* Arguments of allocate(size, stream, owner=None). */
static int parse_allocate(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **vals) {
    static const char *const names[] = {"size", "stream", "owner"};
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    vals[0] = vals[1] = NULL;
    vals[2] = Py_None;
    if (nargs > 3) {
        PyErr_Format(PyExc_TypeError, "allocate() takes at most 3 arguments (%zd given)", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        vals[i] = args[i];
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int j;
        for (j = 0; j < 3; j++)
            if (PyUnicode_CompareWithASCIIString(key, names[j]) == 0)
                break;
        if (j == 3 || j < nargs) {
            PyErr_Format(PyExc_TypeError, "allocate() got an unexpected or repeated keyword argument %R", key);
            return -1;
        }
        vals[j] = args[nargs + k];
    }
    if (vals[0] == NULL || vals[1] == NULL) {
        PyErr_SetString(PyExc_TypeError, "allocate() needs size and stream");
        return -1;
    }
    return 0;
}

/* the steps on stream arenas (they use FastPath and s_append above) */
#include "fastpath_arenas.h"

static PyObject *fp_allocate(FastPath *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *vals[3];
    if (parse_allocate(args, nargs, kwnames, vals) < 0)
        return NULL;
    PyObject *size = vals[0], *stream = vals[1], *owner = vals[2];
    /* Not exact ints (bool, float, an int subclass, unhashable): the pool's Python side makes
     * them exact or refuses them, then calls this again. A dict would take True or 1.0 for 1. */
    if (!PyLong_CheckExact(size) || !PyLong_CheckExact(stream) || (owner != Py_None && !PyLong_CheckExact(owner)))
        return PyObject_Vectorcall(self->allocate_normalized, vals, 3, NULL);

    /* The size before the stream: a refused request creates no (per-thread) arena. */
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(size, &overflow);
    if (overflow || s <= 0 || s > (long long)self->max_request)
        return raise_via(self->refuse_size, size);
    PyObject *arena = resolve_arena(self, stream, s_allocate);
    if (arena == NULL)
        return NULL;
    PyObject *blk = NULL, *rkey = NULL, *idobj = NULL;
    AllocationBase *a = NULL;
    if (!PyObject_TypeCheck(arena, &ArenaBaseType)) {
        PyErr_SetString(PyExc_SystemError, "cudabridge fast path: arena of a foreign type");
        goto fail;
    }
    rkey = PyLong_FromLongLong((s + 255) & ~255LL);
    if (rkey == NULL)
        goto fail;
    PyObject *bins = ((ArenaBase *)arena)->bins;
    PyObject *lst = (bins != NULL && PyDict_CheckExact(bins)) ? PyDict_GetItemWithError(bins, rkey) : NULL;
    if (lst != NULL && PyList_CheckExact(lst) && PyList_GET_SIZE(lst) > 0) {
        Py_ssize_t n = PyList_GET_SIZE(lst);
        blk = PyList_GET_ITEM(lst, n - 1);
        Py_INCREF(blk);
        if (PyList_SetSlice(lst, n - 1, n, NULL) < 0)
            goto fail_blk;
    } else if (PyErr_Occurred()) {
        goto fail;
    }
    if (blk == NULL) {
        blk = steal(self, arena, rkey);
        if (blk == NULL && PyErr_Occurred())
            goto fail;
    }
    if (blk == NULL) {
        PyObject *sargs = PyTuple_Pack(2, rkey, arena);
        long attempt = 0;
        for (;;) {
            blk = sargs ? sw_run(self->worker, self->slow, sargs) : NULL;
            if (blk != NULL || sargs == NULL || !PyErr_ExceptionMatches(self->oom_type))
                break;
            /* out of memory: on this thread, no lock held, the hook may wait and ask again */
            PyObject *et, *ev, *etb;
            PyErr_Fetch(&et, &ev, &etb);
            PyErr_NormalizeException(&et, &ev, &etb);
            if (etb != NULL) PyException_SetTraceback(ev, etb);
            PyObject *n = PyLong_FromLong(attempt);
            PyObject *again = n == NULL ? NULL : PyObject_CallFunctionObjArgs(self->out_of_memory, rkey, arena, owner,
                                                                              ev ? ev : Py_None, n, NULL);
            Py_XDECREF(n);
            int retry = again == NULL ? -1 : PyObject_IsTrue(again);
            Py_XDECREF(again);
            if (retry == 1) {
                Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
                attempt++;
                continue;
            }
            if (retry == 0) {
                PyErr_Restore(et, ev, etb);   /* the pool's own OutOfDeviceMemory */
            } else {
                Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);   /* the hook's error stands */
            }
            break;
        }
        Py_XDECREF(sargs);
        if (blk == NULL)
            goto fail;
        if (PyTuple_CheckExact(blk) && PyTuple_GET_SIZE(blk) == 2) {
            /* (block, waits): this thread's own stream must wait for them first. If that fails
             * (or is interrupted) the block goes back, fenced by what it was to wait for. */
            PyObject *pair = blk, *waits = PyTuple_GET_ITEM(pair, 1);
            blk = PyTuple_GET_ITEM(pair, 0);
            Py_INCREF(blk);
            PyObject *r = PyObject_CallFunctionObjArgs(self->queue_waits, arena, waits, NULL);
            if (r == NULL) {
                PyObject *et, *ev, *etb;
                PyErr_Fetch(&et, &ev, &etb);
                PyObject *gargs = PyTuple_Pack(3, blk, arena, waits);
                PyObject *g = gargs ? sw_run(self->worker, self->return_unwaited, gargs) : NULL;
                Py_XDECREF(gargs);
                Py_XDECREF(g);
                PyErr_Clear();
                PyErr_Restore(et, ev, etb);
                Py_DECREF(pair);
                goto fail_blk;
            }
            Py_DECREF(r);
            Py_DECREF(pair);
        }
    }
    if (!PyObject_TypeCheck(blk, &BlockBaseType) || ((BlockBase *)blk)->ptr == NULL) {
        PyErr_SetString(PyExc_SystemError, "cudabridge fast path: block of a foreign type");
        goto fail_blk;
    }
    set_slot(&((BlockBase *)blk)->state, self->live_state);
    long long aid = self->next_id++;
    idobj = PyLong_FromLongLong(aid);
    if (idobj == NULL)
        goto fail_blk;
    a = (AllocationBase *)self->alloc_type->tp_alloc(self->alloc_type, 0);
    if (a == NULL)
        goto fail_blk;
    Py_INCREF(((BlockBase *)blk)->ptr); a->ptr = ((BlockBase *)blk)->ptr;
    Py_INCREF(size); a->size = size;
    a->id = idobj; idobj = NULL;
    Py_INCREF(stream); a->stream = stream;
    Py_INCREF(owner); a->owner = owner;
    a->block = blk; blk = NULL;
    a->arena = arena; arena = NULL;
    Py_INCREF(self->pool); a->pool = self->pool;
    Py_INCREF(Py_None); a->extra = Py_None;
    Py_INCREF(self->alive); a->state = self->alive;
    if (PySet_Add(self->live, (PyObject *)a) < 0)
        goto fail_alloc;
    if (owner != Py_None) {
        PyObject *owned = PyDict_GetItemWithError(self->owners, owner);
        if (owned == NULL) {
            if (PyErr_Occurred())
                goto fail_registered;
            PyObject *fresh = PyDict_New();
            if (fresh == NULL)
                goto fail_registered;
            owned = PyDict_SetDefault(self->owners, owner, fresh);
            Py_DECREF(fresh);
            if (owned == NULL)
                goto fail_registered;
        }
        if (PyDict_SetItem(owned, (PyObject *)a, Py_None) < 0)
            goto fail_registered;
    }
    self->in_use += (s + 255) & ~255LL;
    if (self->in_use > self->peak)
        self->peak = self->in_use;
    Py_DECREF(rkey);
    (void)aid;
    return (PyObject *)a;

fail_registered:
    /* Only an interpreter-level failure (memory) gets here; the allocation stays live and
     * findable (statistics, release, close), never silently lost. */
    Py_DECREF(rkey);
    Py_DECREF(a);
    return NULL;
fail_alloc:
    {
        /* Not registered: give the block back to the requesting stream as a free there would. */
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        ArenaBase *ar = (ArenaBase *)a->arena;
        BlockBase *b = (BlockBase *)a->block;
        set_slot(&b->epoch, ar->epoch);
        set_slot(&b->state, (PyObject *)ar);
        if (push_to_bin(ar, (PyObject *)b, rkey) < 0)
            PyErr_Clear();
        PyErr_Restore(exc_type, exc_value, exc_tb);
    }
    Py_DECREF(a);
    Py_DECREF(rkey);
    return NULL;
fail_blk:
    Py_XDECREF(idobj);
    Py_XDECREF(blk);
fail:
    Py_XDECREF(rkey);
    Py_XDECREF(arena);
    return NULL;
}

static PyObject *fp_free(FastPath *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a, *stream = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs < 1 || nargs + nkw > 2) {
        PyErr_SetString(PyExc_TypeError, "free(allocation, stream=None)");
        return NULL;
    }
    a = args[0];
    if (nargs == 2)
        stream = args[1];
    if (nkw) {
        if (nargs == 2 || PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "stream") != 0) {
            PyErr_Format(PyExc_TypeError, "free() got an unexpected keyword argument %R",
                         PyTuple_GET_ITEM(kwnames, 0));
            return NULL;
        }
        stream = args[nargs];
    }
    PyObject *arena;
    if (stream == Py_None) {
        arena = Py_TYPE(a) == self->alloc_type ? ((AllocationBase *)a)->arena : NULL;
        Py_XINCREF(arena);
    } else if (!PyLong_CheckExact(stream)) {
        PyObject *fargs[2] = {a, stream};
        return PyObject_Vectorcall(self->free_normalized, fargs, 2, NULL);
    } else {
        arena = resolve_arena(self, stream, s_free);
        if (arena == NULL)
            return NULL;
    }
    if (arena != NULL && !PyObject_TypeCheck(arena, &ArenaBaseType)) {
        Py_DECREF(arena);
        PyErr_SetString(PyExc_SystemError, "cudabridge fast path: arena of a foreign type");
        return NULL;
    }
    /* Only exact Allocations ever enter the live set: anything else is refused before its
     * fields are read (an object of another type has no AllocationBase layout). */
    if (arena == NULL || Py_TYPE(a) != self->alloc_type) {
        Py_XDECREF(arena);
        return raise_via(self->refuse_free, a);
    }
    AllocationBase *al = (AllocationBase *)a;
    ArenaBase *ar = (ArenaBase *)arena;
    PyObject *stamps = NULL;
    int fenced = (al->extra != NULL && al->extra != Py_None) || ar->eager == Py_True;
    if (fenced) {
        /* Device work first (a per-thread stream records its event now), before anything changes:
         * if it fails or is interrupted, the allocation is still live and untouched. */
        int has = PySet_Contains(self->live, a);
        if (has < 0) {
            Py_DECREF(arena);
            return NULL;
        }
        if (!has) {
            Py_DECREF(arena);
            return raise_via(self->refuse_free, a);
        }
        stamps = PyObject_CallFunctionObjArgs(self->fence_stamps, a, arena, NULL);
        if (stamps == NULL) {
            Py_DECREF(arena);
            return NULL;
        }
    }
    int removed = PySet_Discard(self->live, a);
    if (removed <= 0) {
        Py_XDECREF(stamps);
        Py_DECREF(arena);
        return removed < 0 ? NULL : raise_via(self->refuse_free, a);
    }
    /* From here on the free completes: the allocation is no longer live, so its block must reach
     * a container whatever fails (an interpreter-level failure is reported after it did). */
    set_slot(&al->state, self->freed);
    if (al->owner != NULL && al->owner != Py_None) {
        PyObject *owned = PyDict_GetItemWithError(self->owners, al->owner);
        if (owned != NULL) {
            if (PyDict_DelItem(owned, a) < 0 && PyErr_ExceptionMatches(PyExc_KeyError))
                PyErr_Clear();
        }
    }
    PyObject *et = NULL, *ev = NULL, *etb = NULL;
    PyErr_Fetch(&et, &ev, &etb);   /* kept for the caller; the block is placed regardless */
    BlockBase *blk = (BlockBase *)al->block;
    Py_INCREF(blk);
    PyObject *size = blk->size;
    Py_INCREF(size);
    int placed = 0;
    PyObject *one = NULL;
    if (fenced && PyDict_CheckExact(stamps) && PyDict_GET_SIZE(stamps) == 1 &&
        (one = PyDict_GetItemWithError(stamps, arena)) != NULL) {
        set_slot(&blk->epoch, one);   /* fenced on this stream only: as a plain free, stamped */
        fenced = 0;
    } else if (!fenced) {
        set_slot(&blk->epoch, ar->epoch);
    }
    if (!fenced) {
        set_slot(&blk->state, arena);
        placed = push_to_bin(ar, (PyObject *)blk, size) == 0;
    } else {
        /* behind several streams: the pending list, a locked step on the worker */
        PyObject *pargs = PyTuple_Pack(3, (PyObject *)blk, arena, stamps);
        PyObject *r = pargs ? sw_run(self->worker, self->place_pending, pargs) : NULL;
        Py_XDECREF(pargs);
        placed = r != NULL;
        Py_XDECREF(r);
    }
    long long nbytes = PyLong_AsLongLong(size);
    if (!(nbytes == -1 && PyErr_Occurred()))
        self->in_use -= nbytes;
    if (placed && et == NULL && !PyErr_Occurred())
        placed = maybe_trim(self, ar) == 0;
    Py_DECREF(size);
    Py_DECREF(blk);
    Py_XDECREF(stamps);
    Py_DECREF(arena);
    if (et != NULL) {           /* the first error wins */
        PyErr_Clear();
        PyErr_Restore(et, ev, etb);
        return NULL;
    }
    if (!placed || PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* reissue(a, stream) -> Allocation | None: PythonFastPath.reissue. The live allocation `a`
 * handed out again under a new handle for work ordered on `stream`, where that needs no ordering:
 * `stream` is the one whose arena `a` was allocated on (not a per-thread stream's, whose handle
 * names another stream on each thread), and no other stream was recorded on `a`. In one step: `a`
 * is claimed out of the live set as a free claims it (its later free or record_stream is refused),
 * and a new allocation of the same block, size, stream and owner takes its place (a new id; the
 * bytes in use unchanged). None, with nothing changed, where it does not apply. The caller keeps
 * the owner's release out meanwhile (a task lease), as for an allocation. */
static PyObject *fp_reissue(FastPath *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "reissue() takes 2 arguments (allocation, stream), %zd given", nargs);
        return NULL;
    }
    PyObject *a = args[0], *stream = args[1];
    if (Py_TYPE(a) != self->alloc_type || !PyLong_CheckExact(stream))
        Py_RETURN_NONE;
    AllocationBase *old = (AllocationBase *)a;
    PyObject *arena = PyDict_GetItemWithError(self->arenas, stream);   /* borrowed */
    if (arena == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    if (arena != old->arena || !PyObject_TypeCheck(arena, &ArenaBaseType) || ((ArenaBase *)arena)->eager == Py_True ||
        (old->extra != NULL && old->extra != Py_None) || old->block == NULL)
        Py_RETURN_NONE;
    /* the new handle first: a failure here changes nothing */
    PyObject *idobj = PyLong_FromLongLong(self->next_id);
    AllocationBase *b = idobj == NULL ? NULL : (AllocationBase *)self->alloc_type->tp_alloc(self->alloc_type, 0);
    if (b == NULL) {
        Py_XDECREF(idobj);
        return NULL;
    }
    int removed = PySet_Discard(self->live, a);
    if (removed <= 0) {   /* not live (freed, reclaimed, closed): nothing to reissue */
        Py_DECREF(idobj);
        Py_DECREF(b);
        if (removed < 0) return NULL;
        Py_RETURN_NONE;
    }
    self->next_id++;
    set_slot(&old->state, self->freed);
    b->ptr = Py_NewRef(old->ptr); b->size = Py_NewRef(old->size); b->id = idobj;
    b->stream = Py_NewRef(old->stream); b->owner = Py_NewRef(old->owner ? old->owner : Py_None);
    b->block = Py_NewRef(old->block); b->arena = Py_NewRef(arena); b->pool = Py_NewRef(self->pool);
    b->extra = Py_NewRef(Py_None); b->state = Py_NewRef(self->alive);
    PyObject *owned = NULL;
    if (b->owner != Py_None) {
        owned = PyDict_GetItemWithError(self->owners, b->owner);   /* borrowed; NULL: none (not expected) */
        if (owned == NULL && PyErr_Occurred()) goto undo;
    }
    if (PySet_Add(self->live, (PyObject *)b) < 0) goto undo;
    if (owned != NULL) {
        if (PyDict_SetItem(owned, (PyObject *)b, Py_None) < 0) {
            PySet_Discard(self->live, (PyObject *)b);
            goto undo;
        }
        if (PyDict_DelItem(owned, a) < 0) PyErr_Clear();   /* not there: nothing to drop */
    }
    return (PyObject *)b;
undo:   /* out of memory: `a` live again, as it was */
    {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        self->next_id--;
        set_slot(&old->state, self->alive);
        if (PySet_Add(self->live, a) < 0) PyErr_Clear();
        PyErr_Restore(et, ev, etb);
    }
    Py_DECREF(b);
    return NULL;
}

static PyObject *fp_get_issued(FastPath *self, void *closure) {
    return PyLong_FromLongLong(self->next_id - 1);
}

static PyObject *fp_add(FastPath *self, PyObject *delta) {
    long long d = PyLong_AsLongLong(delta);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    self->in_use += d;
    if (self->in_use > self->peak)
        self->peak = self->in_use;
    Py_RETURN_NONE;
}

static PyObject *fp_fold(FastPath *self, PyObject *unused) {
    Py_RETURN_NONE;  /* the counts are exact at all times: nothing to fold */
}

static PyObject *fp_get_in_use(FastPath *self, void *closure) {
    return PyLong_FromLongLong(self->in_use);
}

static PyObject *fp_get_peak(FastPath *self, void *closure) {
    return PyLong_FromLongLong(self->peak);
}

static PyObject *fp_get_steals(FastPath *self, void *closure) {
    return PyLong_FromLongLong(self->steals);
}

static PyObject *fp_get_stream_polls(FastPath *self, void *closure) {
    return PyLong_FromLongLong(self->stream_polls);
}

static PyObject *fp_get_max_request(FastPath *self, void *closure) {
    return PyLong_FromSsize_t(self->max_request);
}

static PyObject *fp_get_worker(FastPath *self, void *closure) {
    return Py_NewRef((PyObject *)self->worker);
}

static PyMethodDef fp_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))fp_allocate, METH_FASTCALL | METH_KEYWORDS,
     "allocate(size, stream, owner=None): the pool's allocate, fast path in C."},
    {"free", (PyCFunction)(void (*)(void))fp_free, METH_FASTCALL | METH_KEYWORDS,
     "free(allocation, stream=None): the pool's free, fast path in C."},
    {"reissue", (PyCFunction)(void (*)(void))fp_reissue, METH_FASTCALL,
     "reissue(allocation, stream) -> Allocation | None: a live allocation under a new handle (python_fast_path.py)."},
    {"add", (PyCFunction)fp_add, METH_O, "add(delta): change bytes in use (the UsageLedger interface)."},
    {"fold", (PyCFunction)fp_fold, METH_NOARGS, "no-op: in_use and peak are always exact."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fp_getset[] = {
    {"issued", (getter)fp_get_issued, NULL, "allocation ids handed out so far", NULL},
    {"in_use", (getter)fp_get_in_use, NULL, "block bytes lent out", NULL},
    {"peak", (getter)fp_get_peak, NULL, "most block bytes lent out at once", NULL},
    {"steals", (getter)fp_get_steals, NULL, "cross-stream reuses served by the fast path", NULL},
    {"stream_polls", (getter)fp_get_stream_polls, NULL, "stream queries made by the fast path", NULL},
    {"max_request", (getter)fp_get_max_request, NULL, "largest request", NULL},
    {"worker", (getter)fp_get_worker, NULL, "the SerialWorker that runs the pool's locked steps", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.memory._fastpath.FastPath",
    .tp_basicsize = sizeof(FastPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "FastPath(hooks, worker, *, alloc_type, live_state, alive, freed, first_id, stream_query, "
              "cu_stream_query=0): a pool's allocate/free fast paths (python_fast_path.py is the reference).",
    .tp_traverse = (traverseproc)fp_traverse,
    .tp_clear = (inquiry)fp_clear,
    .tp_dealloc = (destructor)fp_dealloc,
    .tp_methods = fp_methods,
    .tp_getset = fp_getset,
    .tp_init = (initproc)fp_init,
    .tp_new = PyType_GenericNew,
};


static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "cudabridge.memory._fastpath",
    "C fast paths of the stream-ordered memory pool.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
#define INTERN(var, text) if (((var) = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_append, "append");
    INTERN(s_allocate, "allocate"); INTERN(s_free, "free");
#undef INTERN
    if (PyType_Ready(&AllocationBaseType) < 0 || PyType_Ready(&FastPathType) < 0 ||
        PyType_Ready(&BlockBaseType) < 0 || PyType_Ready(&ArenaBaseType) < 0 ||
        PyType_Ready(&SerialWorkerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&fastpath_module);
    if (m == NULL)
        return NULL;
    /* PyModule_AddType (3.10+) takes its own reference and names the type by tp_name's tail. */
    if (PyModule_AddType(m, &AllocationBaseType) < 0 || PyModule_AddType(m, &BlockBaseType) < 0 ||
        PyModule_AddType(m, &ArenaBaseType) < 0 || PyModule_AddType(m, &FastPathType) < 0 ||
        PyModule_AddType(m, &SerialWorkerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
