/*
 * The Java hot path's allocate / free / free_many / stream in C: the same steps as
 * JavaHotPath's Python methods (hot_path.py), which stay the reference and the fallback.
 *
 * Why C: the bridge's JNI natives call these through PyObject_Vectorcall with the Java thread's
 * kept thread state. The crossing itself is cheap (an empty call is about 0.2 us); what cost a
 * Java allocate+free pair 2x the pool's own pair was the Python frames around the pool's C fast
 * path: a binding lookup, a handle table insert, counters, each a few bytecodes. Here each of
 * those is one C-API call on the same containers the Python side uses (the registry's leases,
 * the hot path's handle table), so Python and C can be mixed freely: forget_task, sweep and the
 * copies stay in Python and see exactly what this code wrote.
 *
 * Thread safety: every method runs with the GIL held and touches the shared containers only in
 * single C-API calls between which no Python code runs, except where it calls back into Python
 * (the pool's slow path, set_device, error messages), after which it re-reads what it needs.
 * allocate runs inside the task's lease exactly as TaskRegistry.enter / leave do
 * (task_registry.py, TaskLease): append this thread's ident to lease.inside, then read
 * lease.open; on the way out remove the ident. A release clears open, then waits for inside to
 * empty, so an allocation either completes before the release reclaims or is refused.
 * Arguments that are not exact ints (a bool, a float, an int subclass) go to the Python
 * reference, which normalizes or refuses them: a dict lookup would take True or 1.0 for 1.
 * Free-threaded builds are not supported (the loader falls back to Python there).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define GPU_BITS 6
#define MAX_GPUS (1 << GPU_BITS)
#define GPU_MASK (MAX_GPUS - 1)
#define SMALL_BATCH 16          /* free_many checks duplicates pairwise up to this many */

static PyObject *s_stream, *s_gpu, *s_id, *s_ptr, *s_binding, *s_inside, *s_open, *s_task_id;

typedef struct {
    PyObject_HEAD
    PyObject *leases;                   /* the registry's task id -> TaskLease mapping (read only) */
    PyObject *live;                     /* handle -> Allocation, shared with JavaHotPath */
    PyObject *allocators[MAX_GPUS];     /* per GPU ordinal: pool.allocate(size, stream, owner) */
    PyObject *frees[MAX_GPUS];          /* per GPU ordinal: pool.free(allocation) */
    PyObject *set_device;               /* backend.set_device, or NULL with one GPU */
    PyObject *unknown_task;             /* registry.binding: raises UnknownTask with its message */
    PyObject *not_live;                 /* JavaHotPath._refuse(handle, call): raises InvalidFree */
    PyObject *refuse_many;              /* JavaHotPath._refuse_many(handles): raises InvalidFree */
    PyObject *enter;                    /* registry.enter(task): the reference's admission, for its errors */
    PyObject *py_allocate;              /* the Python reference allocate(task, size), for odd argument types */
    long long allocations, frees_count, batched_frees, batches;
} HotCore;

static int hc_traverse(HotCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->leases); Py_VISIT(self->live); Py_VISIT(self->set_device);
    Py_VISIT(self->enter); Py_VISIT(self->py_allocate);
    Py_VISIT(self->unknown_task); Py_VISIT(self->not_live); Py_VISIT(self->refuse_many);
    for (int i = 0; i < MAX_GPUS; i++) {
        Py_VISIT(self->allocators[i]);
        Py_VISIT(self->frees[i]);
    }
    return 0;
}

static int hc_clear(HotCore *self) {
    Py_CLEAR(self->leases); Py_CLEAR(self->live); Py_CLEAR(self->set_device);
    Py_CLEAR(self->enter); Py_CLEAR(self->py_allocate);
    Py_CLEAR(self->unknown_task); Py_CLEAR(self->not_live); Py_CLEAR(self->refuse_many);
    for (int i = 0; i < MAX_GPUS; i++) {
        Py_CLEAR(self->allocators[i]);
        Py_CLEAR(self->frees[i]);
    }
    return 0;
}

static void hc_dealloc(HotCore *self) {
    PyObject_GC_UnTrack(self);
    hc_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Fills `slots` from a dict {ordinal: callable}; every ordinal in [0, MAX_GPUS). */
static int fill_per_gpu(PyObject *map, PyObject **slots, const char *what) {
    if (!PyDict_Check(map)) {
        PyErr_Format(PyExc_TypeError, "%s must be a dict of GPU ordinal -> callable", what);
        return -1;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(map, &pos, &k, &v)) {
        long o = PyLong_Check(k) ? PyLong_AsLong(k) : -1;
        if (o == -1 && PyErr_Occurred()) return -1;
        if (o < 0 || o >= MAX_GPUS || !PyCallable_Check(v)) {
            PyErr_Format(PyExc_ValueError, "%s: GPU ordinals must be ints in [0, %d) with callables, got %R: %R",
                         what, MAX_GPUS, k, v);
            return -1;
        }
        Py_INCREF(v);
        Py_XSETREF(slots[o], v);
    }
    return 0;
}

static int hc_init(HotCore *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"leases", "live", "allocators", "frees", "set_device", "unknown_task", "not_live",
                         "refuse_many", "enter", "py_allocate", NULL};
    PyObject *leases, *live, *allocators, *frees, *set_device, *unknown_task, *not_live, *refuse_many, *enter,
        *py_allocate;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OOOOOOOO:HotCore", kw, &PyDict_Type, &leases, &PyDict_Type,
                                     &live, &allocators, &frees, &set_device, &unknown_task, &not_live,
                                     &refuse_many, &enter, &py_allocate))
        return -1;
    if (!PyCallable_Check(unknown_task) || !PyCallable_Check(not_live) || !PyCallable_Check(refuse_many) ||
        !PyCallable_Check(enter) || !PyCallable_Check(py_allocate) ||
        (set_device != Py_None && !PyCallable_Check(set_device))) {
        PyErr_SetString(PyExc_TypeError, "HotCore: unknown_task, not_live, refuse_many, enter, py_allocate and "
                                         "set_device (or None) must be callable");
        return -1;
    }
    hc_clear(self);
    if (fill_per_gpu(allocators, self->allocators, "allocators") < 0 || fill_per_gpu(frees, self->frees, "frees") < 0)
        return -1;
    for (int i = 0; i < MAX_GPUS; i++) {
        if ((self->allocators[i] == NULL) != (self->frees[i] == NULL)) {
            PyErr_Format(PyExc_ValueError, "HotCore: GPU %d has an allocator without a free or the reverse", i);
            return -1;
        }
    }
    Py_INCREF(leases); self->leases = leases;
    Py_INCREF(enter); self->enter = enter;
    Py_INCREF(py_allocate); self->py_allocate = py_allocate;
    Py_INCREF(live); self->live = live;
    if (set_device != Py_None) { Py_INCREF(set_device); self->set_device = set_device; }
    Py_INCREF(unknown_task); self->unknown_task = unknown_task;
    Py_INCREF(not_live); self->not_live = not_live;
    Py_INCREF(refuse_many); self->refuse_many = refuse_many;
    return 0;
}

/* Raises what Python would: registry.binding(task) raises UnknownTask. NULL always. */
static PyObject *raise_unknown_task(HotCore *self, PyObject *task) {
    PyObject *r = PyObject_CallOneArg(self->unknown_task, task);
    if (r != NULL) {   /* bound again in between (a callback let another thread run): still refuse */
        Py_DECREF(r);
        PyErr_Format(PyExc_RuntimeError, "task %R was released during the call", task);
    }
    return NULL;
}

static PyObject *raise_not_live(HotCore *self, PyObject *handle, const char *call) {
    PyObject *c = PyUnicode_FromString(call);
    if (c == NULL) return NULL;
    PyObject *args[2] = {handle, c};
    PyObject *r = PyObject_Vectorcall(self->not_live, args, 2, NULL);
    Py_DECREF(c);
    if (r != NULL) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_RuntimeError, "not_live did not raise");
    }
    return NULL;
}

/* (stream, gpu) of a binding as new references and the ordinal; -1 with an error. */
static int binding_fields(PyObject *b, PyObject **stream, long *gpu) {
    PyObject *g = PyObject_GetAttr(b, s_gpu);
    if (g == NULL) return -1;
    *gpu = PyLong_AsLong(g);
    Py_DECREF(g);
    if (*gpu == -1 && PyErr_Occurred()) return -1;
    if (*gpu < 0 || *gpu >= MAX_GPUS) {
        PyErr_Format(PyExc_ValueError, "binding's GPU ordinal %ld is outside [0, %d)", *gpu, MAX_GPUS);
        return -1;
    }
    *stream = PyObject_GetAttr(b, s_stream);
    return *stream == NULL ? -1 : 0;
}

/* The lease of an exact-int task (borrowed), or NULL with UnknownTask raised as Python words it. */
static PyObject *lease_of(HotCore *self, PyObject *task) {
    PyObject *lease = PyDict_GetItemWithError(self->leases, task); /* borrowed */
    if (lease == NULL && !PyErr_Occurred()) raise_unknown_task(self, task);
    return lease;
}

static PyObject *hc_stream(HotCore *self, PyObject *task) {
    PyObject *b;
    if (PyLong_CheckExact(task)) {
        PyObject *lease = lease_of(self, task);
        if (lease == NULL) return NULL;
        b = PyObject_GetAttr(lease, s_binding);
    } else {
        b = PyObject_CallOneArg(self->unknown_task, task); /* registry.binding: normalizes or refuses */
    }
    if (b == NULL) return NULL;
    PyObject *stream;
    long gpu;
    int rc = binding_fields(b, &stream, &gpu);
    Py_DECREF(b);
    if (rc < 0) return NULL;
    return Py_BuildValue("(Nl)", stream, gpu);
}

/* Remove one occurrence of this thread's ident from lease.inside (TaskRegistry.leave). */
static void leave_lease(PyObject *inside, unsigned long ident) {
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    for (Py_ssize_t i = PyList_GET_SIZE(inside) - 1; i >= 0; i--) {
        PyObject *item = PyList_GET_ITEM(inside, i);
        if (PyLong_CheckExact(item) && PyLong_AsUnsignedLong(item) == ident) {
            if (PyList_SetSlice(inside, i, i + 1, NULL) < 0) PyErr_Clear();
            break;
        }
    }
    if (PyErr_Occurred()) PyErr_Clear();
    PyErr_Restore(et, ev, etb);
}

/* allocate(task, size) -> (handle, device pointer) */
static PyObject *hc_allocate(HotCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "allocate(task, size) takes 2 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *task = args[0], *size = args[1];
    if (!PyLong_CheckExact(task)) return PyObject_Vectorcall(self->py_allocate, args, 2, NULL);
    PyObject *lease = lease_of(self, task);
    if (lease == NULL) return NULL;
    Py_INCREF(lease);
    PyObject *inside = PyObject_GetAttr(lease, s_inside);
    if (inside == NULL || !PyList_CheckExact(inside)) {
        if (inside != NULL) PyErr_SetString(PyExc_SystemError, "cudabridge hot core: lease.inside is not a list");
        Py_XDECREF(inside);
        Py_DECREF(lease);
        return NULL;
    }
    unsigned long ident = PyThread_get_thread_ident();
    PyObject *me = PyLong_FromUnsignedLong(ident);
    if (me == NULL || PyList_Append(inside, me) < 0) {
        Py_XDECREF(me);
        Py_DECREF(inside);
        Py_DECREF(lease);
        return NULL;
    }
    Py_DECREF(me);
    PyObject *b = NULL, *stream = NULL, *owner = NULL, *a = NULL, *id = NULL, *ptr = NULL, *handle = NULL,
             *out = NULL;
    long gpu = -1;
    PyObject *open = PyObject_GetAttr(lease, s_open);
    int is_open = open ? PyObject_IsTrue(open) : -1;
    Py_XDECREF(open);
    if (is_open < 0) goto done;
    if (!is_open) {
        /* The release has begun: refuse with the reference's words (its enter raises). */
        leave_lease(inside, ident);
        PyObject *r = PyObject_CallOneArg(self->enter, task);
        if (r != NULL) { /* cannot happen: a closed lease never reopens */
            Py_DECREF(r);
            PyErr_Format(PyExc_RuntimeError, "task %R was released during the call", task);
        }
        goto out_left;
    }
    b = PyObject_GetAttr(lease, s_binding);
    if (b == NULL || binding_fields(b, &stream, &gpu) < 0) goto done;
    owner = PyObject_GetAttr(b, s_task_id);
    if (owner == NULL) goto done;
    if (self->allocators[gpu] == NULL) {
        PyErr_Format(PyExc_ValueError, "task %R is bound to GPU %ld, which this hot path has no pool for", task, gpu);
        goto done;
    }
    if (self->set_device != NULL) {
        PyObject *o = PyLong_FromLong(gpu);
        PyObject *r = o ? PyObject_CallOneArg(self->set_device, o) : NULL;
        Py_XDECREF(o);
        if (r == NULL) goto done;
        Py_DECREF(r);
    }
    PyObject *call[3] = {size, stream, owner};
    a = PyObject_Vectorcall(self->allocators[gpu], call, 3, NULL);
    if (a == NULL) goto done;
    id = PyObject_GetAttr(a, s_id);
    ptr = id ? PyObject_GetAttr(a, s_ptr) : NULL;
    if (ptr == NULL) goto fail_free;
    long long idv = PyLong_AsLongLong(id);
    if (idv == -1 && PyErr_Occurred()) goto fail_free;
    if (idv < 0 || idv > (LLONG_MAX >> GPU_BITS)) {
        PyErr_Format(PyExc_OverflowError, "allocation id %lld does not fit a bridge handle", idv);
        goto fail_free;
    }
    handle = PyLong_FromLongLong(idv << GPU_BITS | gpu);
    if (handle == NULL || PyDict_SetItem(self->live, handle, a) < 0) goto fail_free;
    out = PyTuple_Pack(2, handle, ptr);
    if (out == NULL) {
        /* Nothing reaches the caller: undo the handle and the allocation. */
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        if (PyDict_DelItem(self->live, handle) < 0) PyErr_Clear();
        PyErr_Restore(et, ev, etb);
        goto fail_free;
    }
    self->allocations++;
    goto done;

fail_free: {
        /* The pool lent memory that cannot be handed out: return it, keep the first error. */
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyObject *r = PyObject_CallOneArg(self->frees[gpu], a);
        if (r == NULL) PyErr_Clear();
        Py_XDECREF(r);
        PyErr_Restore(et, ev, etb);
    }
done:
    leave_lease(inside, ident);
out_left:
    Py_XDECREF(handle); Py_XDECREF(id); Py_XDECREF(ptr); Py_XDECREF(a); Py_XDECREF(owner); Py_XDECREF(stream);
    Py_XDECREF(b); Py_DECREF(inside); Py_DECREF(lease);
    return out;
}

/* free(handle) */
static PyObject *hc_free(HotCore *self, PyObject *handle) {
    if (!PyLong_CheckExact(handle)) return raise_not_live(self, handle, "free"); /* 1.0 would find 1 */
    PyObject *a = PyDict_GetItemWithError(self->live, handle);
    if (a == NULL) return PyErr_Occurred() ? NULL : raise_not_live(self, handle, "free");
    long long h = PyLong_AsLongLong(handle); /* a key of live: an int */
    if (h == -1 && PyErr_Occurred()) return NULL;
    Py_INCREF(a);
    if (PyDict_DelItem(self->live, handle) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    PyObject *r = PyObject_CallOneArg(self->frees[h & GPU_MASK], a);
    Py_DECREF(a);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    self->frees_count++;
    Py_RETURN_NONE;
}

/* free_many(handles) -> count. All are checked first: one bad handle (not live, or twice)
 * frees nothing; the error is worded by Python (refuse_many), as the reference words it. */
static PyObject *hc_free_many(HotCore *self, PyObject *handles) {
    PyObject *seq = PySequence_Fast(handles, "free_many: handles must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *result = NULL;
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        if (!PyLong_CheckExact(items[i])) { ok = 0; break; }  /* refuse_many says why */
        int has = PyDict_Contains(self->live, items[i]);
        if (has < 0) goto out;
        ok = has;
    }
    if (ok && n > 1) {
        /* Distinct: every item is a key of live (so an int, or equal to one): compare values. */
        if (n <= SMALL_BATCH) {
            for (Py_ssize_t i = 1; i < n && ok; i++)
                for (Py_ssize_t j = 0; j < i && ok; j++) {
                    int eq = PyObject_RichCompareBool(items[i], items[j], Py_EQ);
                    if (eq < 0) goto out;
                    ok = !eq;
                }
        } else {
            PyObject *set = PySet_New(seq);
            if (set == NULL) goto out;
            ok = PySet_GET_SIZE(set) == n;
            Py_DECREF(set);
        }
    }
    if (!ok) {
        PyObject *r = PyObject_CallOneArg(self->refuse_many, seq);
        if (r != NULL) {
            Py_DECREF(r);
            PyErr_SetString(PyExc_RuntimeError, "free_many: refuse_many did not raise");
        }
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyDict_GetItemWithError(self->live, items[i]);
        if (a == NULL) {
            /* Only Python code run by an earlier free (the pool's slow path) can have removed it. */
            if (!PyErr_Occurred()) raise_not_live(self, items[i], "free");
            goto out;
        }
        long long h = PyLong_AsLongLong(items[i]);
        if (h == -1 && PyErr_Occurred()) goto out;
        Py_INCREF(a);
        if (PyDict_DelItem(self->live, items[i]) < 0) {
            Py_DECREF(a);
            goto out;
        }
        PyObject *r = PyObject_CallOneArg(self->frees[h & GPU_MASK], a);
        Py_DECREF(a);
        if (r == NULL) goto out;
        Py_DECREF(r);
        self->batched_frees++;
    }
    self->batches++;
    result = PyLong_FromSsize_t(n);
out:
    Py_DECREF(seq);
    return result;
}

static PyObject *hc_counts(HotCore *self, PyObject *unused) {
    return Py_BuildValue("{sLsLsLsL}", "allocations", self->allocations, "frees", self->frees_count,
                         "batched_frees", self->batched_frees, "batches", self->batches);
}

static PyMethodDef hc_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))hc_allocate, METH_FASTCALL,
     "allocate(task, size) -> (handle, device pointer), as JavaHotPath.allocate."},
    {"free", (PyCFunction)hc_free, METH_O, "free(handle), as JavaHotPath.free."},
    {"free_many", (PyCFunction)hc_free_many, METH_O, "free_many(handles) -> count, as JavaHotPath.free_many."},
    {"stream", (PyCFunction)hc_stream, METH_O, "stream(task) -> (stream, GPU ordinal)."},
    {"counts", (PyCFunction)hc_counts, METH_NOARGS, "the calls counted here, by kind."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HotCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.jvm._hotcore.HotCore",
    .tp_basicsize = sizeof(HotCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The Java hot path's allocate/free in C (see hot_path.py).",
    .tp_traverse = (traverseproc)hc_traverse,
    .tp_clear = (inquiry)hc_clear,
    .tp_dealloc = (destructor)hc_dealloc,
    .tp_methods = hc_methods,
    .tp_init = (initproc)hc_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef hotcore_module = {
    PyModuleDef_HEAD_INIT, "cudabridge.jvm._hotcore",
    "The Java hot path's allocate/free in C.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hotcore(void) {
#define INTERN(var, text) if (((var) = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_stream, "stream"); INTERN(s_gpu, "gpu"); INTERN(s_id, "id"); INTERN(s_ptr, "ptr");
    INTERN(s_binding, "binding"); INTERN(s_inside, "inside"); INTERN(s_open, "open"); INTERN(s_task_id, "task_id");
#undef INTERN
    if (PyType_Ready(&HotCoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&hotcore_module);
    if (m == NULL) return NULL;
    if (PyModule_AddType(m, &HotCoreType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
