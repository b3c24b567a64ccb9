/*
 * The Java hot path's allocate / free / free_many / stream in C: the same steps as
 * JavaHotPath's Python methods (hot_path.py), which stay the reference and the fallback.
 *
 * Why C: the bridge's JNI natives call these through PyObject_Vectorcall with the Java thread's
 * kept thread state. The crossing itself is cheap; what made a Java allocate+free pair cost a
 * multiple of the pool's own pair was the Python frames around the pool's C fast path: a binding
 * lookup, a handle table insert, counters, each a few bytecodes (bench/RESULTS.md, "JVM bridge on
 * the H200 (issue 3)", and after this twin, "JVM bridge after the C hot core and the gate (issue
 * 3, session 3)"). Here each of those is one C-level call.
 *
 * What this code is handed, and all it depends on (HotCore's constructor):
 *   leases      the registry's TaskLeases: the lease protocol documented in task_registry.py.
 *               Used: leases.get(task) -> TaskLease | None (exact int ids), leases.refusal(task,
 *               lease | None) -> the UnknownTask to raise, and the lease's documented attributes
 *               binding, inside (a list of thread idents) and open.
 *   handles     the hot path's HandleTable (handles.py). Used: insert(handle, allocation),
 *               pop(handle, default), get(handle), refusal(handle, call) -> InvalidFree,
 *               refusal_many(handles) -> InvalidFree.
 *   allocators, frees   per GPU ordinal: the pool's allocate(size, stream, owner) and free(a).
 *   set_device  backend.set_device, or None with one GPU.
 *   reference   {"stream", "allocate", "free", "free_many"} -> the Python reference methods,
 *               called (with the arguments as given) for the forms this code does not take:
 *               keywords, a wrong argument count, a task id that is not an exact int.
 * Errors are worded by the refusal methods only, so both twins raise the same type and words.
 *
 * Thread safety: every method runs with the GIL held. Between the calls above no Python code
 * runs here, but each call may run Python code (and let another thread run), so nothing read
 * before a call is trusted after it except what the contracts guarantee (a lease's inside list
 * is the same object for the lease's life; a closed lease never reopens).
 * allocate runs inside the task's lease with the protocol's steps (TaskLeases.enter / leave):
 * look the lease up, append this thread's ident to lease.inside, then read lease.open; closed:
 * remove the ident and raise leases.refusal(task, lease); on every way out remove the ident.
 * Free-threaded builds are not supported (the loader falls back to Python there).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define GPU_BITS 6
#define MAX_GPUS (1 << GPU_BITS)
#define GPU_MASK (MAX_GPUS - 1)
#define SMALL_BATCH 16          /* free_many checks duplicates pairwise up to this many */

static PyObject *s_stream, *s_gpu, *s_id, *s_ptr, *s_binding, *s_inside, *s_open, *s_task_id, *s_get,
    *s_refusal, *s_insert, *s_pop, *s_refusal_many, *s_free, *s_allocate, *s_free_many;

typedef struct {
    PyObject_HEAD
    PyObject *lease_get;                /* leases.get(task) -> TaskLease | None */
    PyObject *lease_refusal;            /* leases.refusal(task, lease | None) -> UnknownTask */
    PyObject *h_insert, *h_pop, *h_get; /* the handle table's operations */
    PyObject *h_refusal;                /* handles.refusal(handle, call) -> InvalidFree */
    PyObject *h_refusal_many;           /* handles.refusal_many(handles) -> InvalidFree */
    PyObject *allocators[MAX_GPUS];     /* per GPU ordinal: pool.allocate(size, stream, owner) */
    PyObject *frees[MAX_GPUS];          /* per GPU ordinal: pool.free(allocation) */
    PyObject *set_device;               /* backend.set_device, or NULL with one GPU */
    PyObject *ref_stream, *ref_allocate, *ref_free, *ref_free_many;  /* the Python reference */
    long long allocations, frees_count, batched_frees, batches;
} HotCore;

#define HC_FIELDS(X) X(lease_get); X(lease_refusal); X(h_insert); X(h_pop); X(h_get); X(h_refusal); \
    X(h_refusal_many); X(set_device); X(ref_stream); X(ref_allocate); X(ref_free); X(ref_free_many)

static int hc_traverse(HotCore *self, visitproc visit, void *arg) {
#define V(f) Py_VISIT(self->f)
    HC_FIELDS(V);
#undef V
    for (int i = 0; i < MAX_GPUS; i++) {
        Py_VISIT(self->allocators[i]);
        Py_VISIT(self->frees[i]);
    }
    return 0;
}

static int hc_clear(HotCore *self) {
#define C(f) Py_CLEAR(self->f)
    HC_FIELDS(C);
#undef C
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

/* *slot = a callable attribute `name` of `obj` (from a mapping when `obj` is a dict); -1 if not. */
static int take_callable(PyObject *obj, PyObject *name, const char *what, PyObject **slot) {
    PyObject *f;
    if (PyDict_Check(obj)) {
        f = PyDict_GetItemWithError(obj, name);
        if (f == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "HotCore: %s has no %R", what, name);
            return -1;
        }
        Py_INCREF(f);
    } else {
        f = PyObject_GetAttr(obj, name);
        if (f == NULL) return -1;
    }
    if (!PyCallable_Check(f)) {
        PyErr_Format(PyExc_TypeError, "HotCore: %s.%U must be callable, got %R", what, name, f);
        Py_DECREF(f);
        return -1;
    }
    Py_XSETREF(*slot, f);
    return 0;
}

static int hc_init(HotCore *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"leases", "handles", "allocators", "frees", "set_device", "reference", NULL};
    PyObject *leases, *handles, *allocators, *frees, *set_device, *reference;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOO!:HotCore", kw, &leases, &handles, &allocators, &frees,
                                     &set_device, &PyDict_Type, &reference))
        return -1;
    if (set_device != Py_None && !PyCallable_Check(set_device)) {
        PyErr_SetString(PyExc_TypeError, "HotCore: set_device must be callable or None");
        return -1;
    }
    hc_clear(self);
    if (take_callable(leases, s_get, "leases", &self->lease_get) < 0 ||
        take_callable(leases, s_refusal, "leases", &self->lease_refusal) < 0 ||
        take_callable(handles, s_insert, "handles", &self->h_insert) < 0 ||
        take_callable(handles, s_pop, "handles", &self->h_pop) < 0 ||
        take_callable(handles, s_get, "handles", &self->h_get) < 0 ||
        take_callable(handles, s_refusal, "handles", &self->h_refusal) < 0 ||
        take_callable(handles, s_refusal_many, "handles", &self->h_refusal_many) < 0 ||
        take_callable(reference, s_stream, "reference", &self->ref_stream) < 0 ||
        take_callable(reference, s_allocate, "reference", &self->ref_allocate) < 0 ||
        take_callable(reference, s_free, "reference", &self->ref_free) < 0 ||
        take_callable(reference, s_free_many, "reference", &self->ref_free_many) < 0)
        return -1;
    if (fill_per_gpu(allocators, self->allocators, "allocators") < 0 || fill_per_gpu(frees, self->frees, "frees") < 0)
        return -1;
    for (int i = 0; i < MAX_GPUS; i++) {
        if ((self->allocators[i] == NULL) != (self->frees[i] == NULL)) {
            PyErr_Format(PyExc_ValueError, "HotCore: GPU %d has an allocator without a free or the reverse", i);
            return -1;
        }
    }
    if (set_device != Py_None) { Py_INCREF(set_device); self->set_device = set_device; }
    return 0;
}

/* Raises `exc`, a new reference to the exception instance a refusal method returned. NULL always. */
static PyObject *raise_exc(PyObject *exc) {
    if (exc == NULL) return NULL;
    if (PyExceptionInstance_Check(exc))
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    else
        PyErr_Format(PyExc_TypeError, "cudabridge hot core: a refusal returned %R, not an exception", exc);
    Py_DECREF(exc);
    return NULL;
}

/* raise leases.refusal(task, lease): lease is a TaskLease or Py_None. NULL always. */
static PyObject *refuse_task(HotCore *self, PyObject *task, PyObject *lease) {
    PyObject *a[2] = {task, lease};
    return raise_exc(PyObject_Vectorcall(self->lease_refusal, a, 2, NULL));
}

/* raise handles.refusal(handle, call). NULL always. */
static PyObject *refuse_handle(HotCore *self, PyObject *handle, const char *call) {
    PyObject *c = PyUnicode_FromString(call);
    if (c == NULL) return NULL;
    PyObject *a[2] = {handle, c};
    PyObject *exc = PyObject_Vectorcall(self->h_refusal, a, 2, NULL);
    Py_DECREF(c);
    return raise_exc(exc);
}

/* leases.get(task) for an exact int task: a new reference to its lease, or NULL with
 * leases.refusal(task, None) raised (or the lookup's own error). */
static PyObject *lookup_lease(HotCore *self, PyObject *task) {
    PyObject *lease = PyObject_CallOneArg(self->lease_get, task);
    if (lease == Py_None) {
        Py_DECREF(lease);
        return refuse_task(self, task, Py_None);
    }
    return lease;
}

static PyObject *gpu_key_error(long gpu) {
    PyObject *g = PyLong_FromLong(gpu);
    if (g != NULL) {
        PyErr_SetObject(PyExc_KeyError, g);
        Py_DECREF(g);
    }
    return NULL;
}

/* stream(task) -> (stream, GPU ordinal) */
static PyObject *hc_stream(HotCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != 1 || !PyLong_CheckExact(args[0]))
        return PyObject_Vectorcall(self->ref_stream, args, nargs, kwnames);
    PyObject *lease = lookup_lease(self, args[0]);
    if (lease == NULL) return NULL;
    PyObject *b = PyObject_GetAttr(lease, s_binding);
    Py_DECREF(lease);
    if (b == NULL) return NULL;
    PyObject *stream = PyObject_GetAttr(b, s_stream);
    PyObject *gpu = stream ? PyObject_GetAttr(b, s_gpu) : NULL;
    Py_DECREF(b);
    if (gpu == NULL) {
        Py_XDECREF(stream);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, stream, gpu);
    Py_DECREF(stream);
    Py_DECREF(gpu);
    return out;
}

/* Remove one occurrence of this thread's ident from lease.inside (TaskLeases.leave). Keeps
 * any error already raised. */
static void leave_lease(PyObject *inside, unsigned long ident) {
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    for (Py_ssize_t i = PyList_GET_SIZE(inside) - 1; i >= 0; i--) {
        PyObject *item = PyList_GET_ITEM(inside, i);
        if (PyLong_CheckExact(item) && PyLong_AsUnsignedLong(item) == ident) {
            if (PyList_SetSlice(inside, i, i + 1, NULL) < 0) PyErr_Clear();
            break;
        }
        if (PyErr_Occurred()) PyErr_Clear();
    }
    PyErr_Restore(et, ev, etb);
}

/* allocate(task, size) -> (handle, device pointer) */
static PyObject *hc_allocate(HotCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != 2 || !PyLong_CheckExact(args[0]))
        return PyObject_Vectorcall(self->ref_allocate, args, nargs, kwnames);
    PyObject *task = args[0], *size = args[1];
    /* enter: look up, append this thread's ident to inside, then read open */
    PyObject *lease = lookup_lease(self, task);
    if (lease == NULL) return NULL;
    PyObject *inside = PyObject_GetAttr(lease, s_inside);
    if (inside == NULL || !PyList_CheckExact(inside)) {
        if (inside != NULL)
            PyErr_Format(PyExc_TypeError, "the lease protocol: lease.inside must be a list, got %R", inside);
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
    PyObject *b = NULL, *gpu_obj = NULL, *stream = NULL, *owner = NULL, *a = NULL, *id = NULL, *ptr = NULL,
             *handle = NULL, *out = NULL;
    long gpu = -1;
    PyObject *open = PyObject_GetAttr(lease, s_open);
    int is_open = open ? PyObject_IsTrue(open) : -1;
    Py_XDECREF(open);
    if (is_open < 0) goto done;
    if (!is_open) {   /* the release has begun (the task may be bound again since: a new lease) */
        leave_lease(inside, ident);
        refuse_task(self, task, lease);
        goto out_left;
    }
    /* the operation, inside the lease */
    b = PyObject_GetAttr(lease, s_binding);
    if (b == NULL) goto done;
    gpu_obj = PyObject_GetAttr(b, s_gpu);
    if (gpu_obj == NULL) goto done;
    if (self->set_device != NULL) {
        PyObject *r = PyObject_CallOneArg(self->set_device, gpu_obj);
        if (r == NULL) goto done;
        Py_DECREF(r);
    }
    gpu = PyLong_Check(gpu_obj) ? PyLong_AsLong(gpu_obj) : -1;
    if (gpu == -1 && PyErr_Occurred()) PyErr_Clear();
    if (gpu < 0 || gpu >= MAX_GPUS || self->allocators[gpu] == NULL) {   /* as allocators[b.gpu] does */
        PyErr_SetObject(PyExc_KeyError, gpu_obj);
        goto done;
    }
    stream = PyObject_GetAttr(b, s_stream);
    owner = stream ? PyObject_GetAttr(b, s_task_id) : NULL;
    if (owner == NULL) goto done;
    PyObject *call[3] = {size, stream, owner};
    a = PyObject_Vectorcall(self->allocators[gpu], call, 3, NULL);
    if (a == NULL) goto done;
    id = PyObject_GetAttr(a, s_id);
    if (id == NULL) goto done;
    long long idv = PyLong_CheckExact(id) ? PyLong_AsLongLong(id) : -1;
    if (idv == -1 && PyErr_Occurred()) PyErr_Clear();
    if (idv >= 0 && idv <= (LLONG_MAX >> GPU_BITS)) {
        handle = PyLong_FromLongLong(idv << GPU_BITS | gpu);
    } else {   /* Python's int arithmetic, as the reference computes it */
        PyObject *bits = PyLong_FromLong(GPU_BITS);
        PyObject *shifted = bits ? PyNumber_Lshift(id, bits) : NULL;
        handle = shifted ? PyNumber_Or(shifted, gpu_obj) : NULL;
        Py_XDECREF(bits);
        Py_XDECREF(shifted);
    }
    if (handle == NULL) goto done;
    PyObject *ins[2] = {handle, a};
    PyObject *r = PyObject_Vectorcall(self->h_insert, ins, 2, NULL);
    if (r == NULL) goto done;
    Py_DECREF(r);
    ptr = PyObject_GetAttr(a, s_ptr);
done:
    leave_lease(inside, ident);
    if (ptr != NULL) {   /* counted once out of the lease, as the reference counts */
        self->allocations++;
        out = PyTuple_Pack(2, handle, ptr);
    }
out_left:
    Py_XDECREF(handle); Py_XDECREF(id); Py_XDECREF(ptr); Py_XDECREF(a); Py_XDECREF(owner); Py_XDECREF(stream);
    Py_XDECREF(gpu_obj); Py_XDECREF(b); Py_DECREF(inside); Py_DECREF(lease);
    return out;
}

/* handles.pop(handle, None), then the pool's free of what it held; the caller has checked that
 * handle is an exact int. 1 freed, 0 not in the table (nothing raised), -1 error. */
static int pop_and_free(HotCore *self, PyObject *handle) {
    PyObject *pa[2] = {handle, Py_None};
    PyObject *a = PyObject_Vectorcall(self->h_pop, pa, 2, NULL);
    if (a == NULL) return -1;
    if (a == Py_None) {
        Py_DECREF(a);
        return 0;
    }
    long gpu = (long)(PyLong_AsUnsignedLongLongMask(handle) & GPU_MASK);  /* hid & GPU_MASK */
    if (self->frees[gpu] == NULL) {
        Py_DECREF(a);
        gpu_key_error(gpu);
        return -1;
    }
    PyObject *r = PyObject_CallOneArg(self->frees[gpu], a);
    Py_DECREF(a);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 1;
}

/* free(handle) */
static PyObject *hc_free(HotCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != 1) return PyObject_Vectorcall(self->ref_free, args, nargs, kwnames);
    PyObject *handle = args[0];
    if (!PyLong_CheckExact(handle)) return refuse_handle(self, handle, "free"); /* 1.0 would find 1 */
    int rc = pop_and_free(self, handle);
    if (rc <= 0) return rc < 0 ? NULL : refuse_handle(self, handle, "free");
    self->frees_count++;
    Py_RETURN_NONE;
}

/* free_many(handles) -> count. All are checked first: one bad handle (not an exact int, not
 * live, or twice) frees nothing and raises handles.refusal_many(handles). */
static PyObject *hc_free_many(HotCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != 1) return PyObject_Vectorcall(self->ref_free_many, args, nargs, kwnames);
    PyObject *seq, *handles = args[0];
    if (PyList_CheckExact(handles) || PyTuple_CheckExact(handles)) {
        Py_INCREF(handles);
        seq = handles;
    } else {
        PyObject *it = PyObject_GetIter(handles);
        if (it == NULL) {
            if (PyErr_ExceptionMatches(PyExc_TypeError))
                PyErr_SetString(PyExc_TypeError, "free_many: handles must be an iterable of ints");
            return NULL;
        }
        seq = PySequence_List(it);
        Py_DECREF(it);
        if (seq == NULL) return NULL;
    }
    PyObject *result = NULL;
    int ok = 1;
    /* sizes and items are re-read at each step: a call may have run Python code */
    for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *h = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyLong_CheckExact(h)) {
            ok = 0;
            break;
        }
        Py_INCREF(h);
        PyObject *a = PyObject_CallOneArg(self->h_get, h);
        Py_DECREF(h);
        if (a == NULL) goto out;
        ok = a != Py_None;
        Py_DECREF(a);
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (ok && n > 1) {
        /* Distinct: every item is an exact int (compared without running Python code). */
        if (n <= SMALL_BATCH) {
            PyObject **items = PySequence_Fast_ITEMS(seq);
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
        raise_exc(PyObject_CallOneArg(self->h_refusal_many, seq));
        goto out;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *h = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(h);
        int rc = pop_and_free(self, h);
        if (rc == 0) refuse_handle(self, h, "free");  /* freed by another thread meanwhile */
        Py_DECREF(h);
        if (rc <= 0) goto out;
    }
    n = PySequence_Fast_GET_SIZE(seq);
    self->batched_frees += n;
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

#define FASTCALL_KW(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS
static PyMethodDef hc_methods[] = {
    {"allocate", FASTCALL_KW(hc_allocate), "allocate(task, size) -> (handle, device pointer), as JavaHotPath.allocate."},
    {"free", FASTCALL_KW(hc_free), "free(hid), as JavaHotPath.free."},
    {"free_many", FASTCALL_KW(hc_free_many), "free_many(hids) -> count, as JavaHotPath.free_many."},
    {"stream", FASTCALL_KW(hc_stream), "stream(task) -> (stream, GPU ordinal), as JavaHotPath.stream."},
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
    INTERN(s_get, "get"); INTERN(s_refusal, "refusal"); INTERN(s_insert, "insert"); INTERN(s_pop, "pop");
    INTERN(s_refusal_many, "refusal_many"); INTERN(s_free, "free"); INTERN(s_allocate, "allocate");
    INTERN(s_free_many, "free_many");
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
