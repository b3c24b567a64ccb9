/* The task registry's C twin (task_registry.py): bind and release of a task in one C call each.
 *
 * Why C: a bind and a release are a handful of dict steps, and in Python each costs a frame or an
 * attribute chain; per task that came to more than creating a CUDA stream, which the pool exists
 * to avoid. A C call also runs whole under the GIL: no other thread runs between its steps and no
 * asynchronous exception (a signal's KeyboardInterrupt, PyThreadState_SetAsyncExc) lands inside
 * it, so the steps need no lock and cannot be cut in two.
 *
 * The Python methods (TaskRegistry._bind_reference / _release_reference) are the reference: this
 * file takes the common case and hands every other call, whole and before changing anything, to
 * them, so that both twins refuse in the same words (tests/test_registry_twins_differential.py).
 *   bind(task_id, gpu=None, priority="normal"): taken here when task_id is an exact non-negative
 *     int, the GPU is known (gpu None with one GPU, or an exact int ordinal the registry owns), the
 *     priority's streams are handed out round-robin (a cycle the stream pool exposes), the
 *     registry is open, and the id is neither bound nor being released.
 *   release(task_id): taken here when task_id is an exact int whose lease is in the table, no other
 *     release of it runs, and the calling thread is not inside one of its operations. Waiting for
 *     operations in progress, the listeners and reclaiming a task that holds memory call back into
 *     Python (the registry's drain, its listeners, the pool's reclaim_owner), as the reference
 *     does, with the task's release claim held until the end.
 * State shared with the reference: the lease table (id -> lease), the releasing table, the claims
 * table, the thread-local attachment, and the number of binds made here (TaskRegistry adds it to
 * its own count). The lease protocol (task_registry.py's docstring) is the contract with the Java
 * hot path's twin.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* ---- LeaseBase: the slots of a TaskLease (binding, inside, open) -------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *binding, *inside, *open;
} LeaseBase;

static int lease_traverse(LeaseBase *self, visitproc visit, void *arg) {
    Py_VISIT(self->binding); Py_VISIT(self->inside); Py_VISIT(self->open);
    return 0;
}

static int lease_clear(LeaseBase *self) {
    Py_CLEAR(self->binding); Py_CLEAR(self->inside); Py_CLEAR(self->open);
    return 0;
}

static void lease_dealloc(LeaseBase *self) {
    PyObject_GC_UnTrack(self);
    lease_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define LMEMBER(name, field) {name, T_OBJECT_EX, offsetof(LeaseBase, field), 0, NULL}
static PyMemberDef lease_members[] = {
    LMEMBER("binding", binding), LMEMBER("inside", inside), LMEMBER("open", open),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LeaseBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge._registry_core.LeaseBase",
    .tp_basicsize = sizeof(LeaseBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The slots of a TaskLease (see task_registry.py).",
    .tp_traverse = (traverseproc)lease_traverse,
    .tp_clear = (inquiry)lease_clear,
    .tp_dealloc = (destructor)lease_dealloc,
    .tp_members = lease_members,
    .tp_new = PyType_GenericNew,
};

/* ---- RegistryCore -------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *table;          /* task id -> lease (TaskLeases._by_id) */
    PyObject *releasing;      /* task id -> closed lease not yet reclaimed */
    PyObject *claims;         /* task id -> token of the release running */
    PyObject *gpus;           /* ordinal -> (ordinal, address, cycles: priority -> cycle | None,
                                 by_owner: owner -> dict, reclaim_owner) */
    PyObject *sole;           /* that tuple for the only GPU, or None */
    PyObject *binding_type;   /* TaskBinding (a tuple subclass) */
    PyObject *report_type;    /* ReleaseReport (a tuple subclass) */
    PyObject *lease_type;     /* TaskLease (a LeaseBase subclass) */
    int lease_direct;         /* fill its slots here (else call lease_type(binding): a subclass) */
    PyObject *local;          /* the registry's threading.local (attach / current) */
    PyObject *listeners;      /* list of release listeners */
    PyObject *drain;          /* registry._drain(lease) */
    PyObject *bind_ref;       /* the reference bind(task_id, gpu, priority) */
    PyObject *release_ref;    /* the reference release(task_id) */
    PyObject *get_ident;      /* threading.get_ident */
    int closed;
    long long binds;          /* binds made here */
} RegistryCore;

static PyObject *s_normal, *s_task, *s_dict;

static int core_traverse(RegistryCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->table); Py_VISIT(self->releasing); Py_VISIT(self->claims); Py_VISIT(self->gpus);
    Py_VISIT(self->sole); Py_VISIT(self->binding_type); Py_VISIT(self->report_type);
    Py_VISIT(self->lease_type); Py_VISIT(self->local); Py_VISIT(self->listeners); Py_VISIT(self->drain);
    Py_VISIT(self->bind_ref); Py_VISIT(self->release_ref); Py_VISIT(self->get_ident);
    return 0;
}

static int core_clear(RegistryCore *self) {
    Py_CLEAR(self->table); Py_CLEAR(self->releasing); Py_CLEAR(self->claims); Py_CLEAR(self->gpus);
    Py_CLEAR(self->sole); Py_CLEAR(self->binding_type); Py_CLEAR(self->report_type);
    Py_CLEAR(self->lease_type); Py_CLEAR(self->local); Py_CLEAR(self->listeners); Py_CLEAR(self->drain);
    Py_CLEAR(self->bind_ref); Py_CLEAR(self->release_ref); Py_CLEAR(self->get_ident);
    return 0;
}

static void core_dealloc(RegistryCore *self) {
    PyObject_GC_UnTrack(self);
    core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int core_init(RegistryCore *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"table", "releasing", "claims", "gpus", "binding_type", "report_type", "lease_type",
                         "lease_direct", "local", "listeners", "drain", "bind_ref", "release_ref", "get_ident",
                         NULL};
    PyObject *table, *releasing, *claims, *gpus, *bt, *rt, *lt, *local, *listeners, *drain, *bref, *rref, *gid;
    int direct;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$O!O!O!O!OOOpOO!OOOO:RegistryCore", kw,
                                     &PyDict_Type, &table, &PyDict_Type, &releasing, &PyDict_Type, &claims,
                                     &PyDict_Type, &gpus, &bt, &rt, &lt, &direct, &local, &PyList_Type, &listeners,
                                     &drain, &bref, &rref, &gid))
        return -1;
    if (!PyType_Check(bt) || !PyType_IsSubtype((PyTypeObject *)bt, &PyTuple_Type) ||
        !PyType_Check(rt) || !PyType_IsSubtype((PyTypeObject *)rt, &PyTuple_Type) ||
        !PyType_Check(lt) || !PyType_IsSubtype((PyTypeObject *)lt, &LeaseBaseType)) {
        PyErr_SetString(PyExc_TypeError, "RegistryCore: binding_type and report_type must be tuple subclasses, "
                                         "lease_type a LeaseBase subclass");
        return -1;
    }
    /* Each GPU entry: (ordinal, address, cycles dict or None, by_owner dict, reclaim_owner). */
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(gpus, &pos, &key, &value)) {
        if (!PyTuple_CheckExact(value) || PyTuple_GET_SIZE(value) != 5 || !PyLong_CheckExact(key) ||
            !(PyTuple_GET_ITEM(value, 2) == Py_None || PyDict_CheckExact(PyTuple_GET_ITEM(value, 2))) ||
            !PyDict_CheckExact(PyTuple_GET_ITEM(value, 3))) {
            PyErr_SetString(PyExc_TypeError, "RegistryCore: gpus maps an int ordinal to "
                                             "(ordinal, address, cycles | None, by_owner, reclaim_owner)");
            return -1;
        }
    }
    PyObject *sole = Py_None;
    if (PyDict_GET_SIZE(gpus) == 1) {
        pos = 0;
        PyDict_Next(gpus, &pos, &key, &sole);
    }
#define TAKE(field, v) do { Py_INCREF(v); Py_XSETREF(self->field, v); } while (0)
    TAKE(table, table); TAKE(releasing, releasing); TAKE(claims, claims); TAKE(gpus, gpus); TAKE(sole, sole);
    TAKE(binding_type, bt); TAKE(report_type, rt); TAKE(lease_type, lt); TAKE(local, local);
    TAKE(listeners, listeners); TAKE(drain, drain); TAKE(bind_ref, bref); TAKE(release_ref, rref);
    TAKE(get_ident, gid);
#undef TAKE
    self->lease_direct = direct;
    self->closed = 0;
    self->binds = 0;
    return 0;
}

/* A new instance of the tuple subclass `type` holding `n` new references (stolen). */
static PyObject *new_record(PyObject *type, Py_ssize_t n, PyObject **items) {
    PyObject *t = ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, n);
    if (t == NULL) {
        for (Py_ssize_t i = 0; i < n; i++)
            Py_DECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(t, i, items[i]);
    return t;
}

/* bind(task_id, gpu=None, priority="normal") -> TaskBinding */
static PyObject *core_bind(RegistryCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (kwnames != NULL || nargs < 1 || nargs > 3)
        return PyObject_Vectorcall(self->bind_ref, args, nargs, kwnames);
    PyObject *task = args[0];
    PyObject *gpu = nargs > 1 ? args[1] : Py_None;
    PyObject *priority = nargs > 2 ? args[2] : s_normal;
    if (!PyLong_CheckExact(task) || _PyLong_Sign(task) < 0 || self->closed || !PyUnicode_CheckExact(priority))
        return PyObject_Vectorcall(self->bind_ref, args, nargs, NULL);
    PyObject *res;
    if (gpu == Py_None)
        res = self->sole;
    else if (PyLong_CheckExact(gpu))
        res = PyDict_GetItemWithError(self->gpus, gpu);
    else
        res = NULL;
    if (res == NULL || res == Py_None) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_Vectorcall(self->bind_ref, args, nargs, NULL);
    }
    PyObject *cycles = PyTuple_GET_ITEM(res, 2);
    PyObject *cycle = cycles == Py_None ? NULL : PyDict_GetItemWithError(cycles, priority);
    if (cycle == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_Vectorcall(self->bind_ref, args, nargs, NULL);
    }
    int known = PyDict_Contains(self->releasing, task);
    if (known == 0)
        known = PyDict_Contains(self->table, task);
    if (known != 0)
        return known < 0 ? NULL : PyObject_Vectorcall(self->bind_ref, args, nargs, NULL);   /* refused there */
    /* From here on no Python code runs: the steps are one atomic step for every other thread. */
    PyObject *stream = PyIter_Next(cycle);
    if (stream == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "cudabridge registry core: a stream cycle ended");
        return NULL;
    }
    PyObject *items[5] = {task, PyTuple_GET_ITEM(res, 0), PyTuple_GET_ITEM(res, 1), stream, priority};
    Py_INCREF(task); Py_INCREF(items[1]); Py_INCREF(items[2]); Py_INCREF(priority);
    PyObject *binding = new_record(self->binding_type, 5, items);
    if (binding == NULL)
        return NULL;
    LeaseBase *lease;
    if (self->lease_direct) {
        lease = (LeaseBase *)((PyTypeObject *)self->lease_type)->tp_alloc((PyTypeObject *)self->lease_type, 0);
        PyObject *inside = lease ? PyList_New(0) : NULL;
        if (inside == NULL) {
            Py_XDECREF(lease);
            Py_DECREF(binding);
            return NULL;
        }
        Py_INCREF(binding);
        lease->binding = binding;
        lease->inside = inside;
        Py_INCREF(Py_True);
        lease->open = Py_True;
    } else {   /* a subclass (a test's): its __init__ runs; a Python call, before anything changed */
        lease = (LeaseBase *)PyObject_CallOneArg(self->lease_type, binding);
        if (lease == NULL) {
            Py_DECREF(binding);
            return NULL;
        }
        if (PyDict_Contains(self->table, task) != 0) {   /* bound meanwhile: the reference refuses */
            Py_DECREF(lease);
            Py_DECREF(binding);
            return PyErr_Occurred() ? NULL : PyObject_Vectorcall(self->bind_ref, args, nargs, NULL);
        }
    }
    int rc = PyDict_SetItem(self->table, task, (PyObject *)lease);
    Py_DECREF(lease);
    if (rc < 0) {
        Py_DECREF(binding);
        return NULL;
    }
    self->binds++;
    return binding;
}

/* Call the release listeners in order with the binding; stops at the first that raises (-1 with
 * its error set), as the reference's loop does. */
static int call_listeners(RegistryCore *self, PyObject *binding) {
    Py_ssize_t n = PyList_GET_SIZE(self->listeners);
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(self->listeners); i++) {
        PyObject *fn = PyList_GET_ITEM(self->listeners, i);
        Py_INCREF(fn);
        PyObject *r = PyObject_CallOneArg(fn, binding);
        Py_DECREF(fn);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* What the task's pool reclaims: (count, bytes) as two new references, or -1 with an error. An
 * owner holding nothing is two dict steps here; otherwise the pool's reclaim_owner (its locked
 * step, on its worker thread where the C fast path runs). */
static int reclaim(RegistryCore *self, PyObject *binding, PyObject *task, PyObject **count, PyObject **nbytes) {
    PyObject *res = PyDict_GetItemWithError(self->gpus, PyTuple_GET_ITEM(binding, 1));
    if (res == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "cudabridge registry core: no GPU %R", PyTuple_GET_ITEM(binding, 1));
        return -1;
    }
    PyObject *by_owner = PyTuple_GET_ITEM(res, 3);
    PyObject *owned = PyDict_GetItemWithError(by_owner, task);
    if (owned == NULL && PyErr_Occurred())
        return -1;
    if (owned == NULL || (PyDict_Check(owned) && PyDict_GET_SIZE(owned) == 0)) {
        if (owned != NULL && PyDict_DelItem(by_owner, task) < 0)
            return -1;
        *count = PyLong_FromLong(0);
        *nbytes = PyLong_FromLong(0);
        if (*count == NULL || *nbytes == NULL) {
            Py_CLEAR(*count);
            Py_CLEAR(*nbytes);
            return -1;
        }
        return 0;
    }
    PyObject *r = PyObject_CallOneArg(PyTuple_GET_ITEM(res, 4), task);
    if (r == NULL)
        return -1;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) {
        PyErr_Format(PyExc_TypeError, "cudabridge registry core: reclaim_owner returned %R", r);
        Py_DECREF(r);
        return -1;
    }
    *count = PyTuple_GET_ITEM(r, 0);
    *nbytes = PyTuple_GET_ITEM(r, 1);
    Py_INCREF(*count);
    Py_INCREF(*nbytes);
    Py_DECREF(r);
    return 0;
}

/* Clear the calling thread's attachment if it names `task` (the reference: local.task = None). */
static int detach_if(RegistryCore *self, PyObject *task) {
    PyObject *d = PyObject_GetAttr(self->local, s_dict);
    if (d == NULL)
        return -1;
    int rc = 0;
    PyObject *cur = PyDict_GetItemWithError(d, s_task);
    if (cur != NULL) {
        int eq = PyObject_RichCompareBool(cur, task, Py_EQ);
        rc = eq < 0 ? -1 : eq ? PyDict_SetItem(d, s_task, Py_None) : 0;
    } else if (PyErr_Occurred()) {
        rc = -1;
    }
    Py_DECREF(d);
    return rc;
}

/* release(task_id) -> ReleaseReport */
static PyObject *core_release(RegistryCore *self, PyObject *task) {
    if (!PyLong_CheckExact(task) || _PyLong_Sign(task) < 0)
        return PyObject_CallOneArg(self->release_ref, task);
    PyObject *lease_obj = PyDict_GetItemWithError(self->table, task);
    if (lease_obj == NULL || !self->lease_direct || Py_TYPE(lease_obj) != (PyTypeObject *)self->lease_type) {
        if (PyErr_Occurred())
            return NULL;
        /* unknown, a release to finish, or a lease of a subclass (whose attributes may not be
         * its slots): the reference */
        return PyObject_CallOneArg(self->release_ref, task);
    }
    int claimed = PyDict_Contains(self->claims, task);
    if (claimed != 0)
        return claimed < 0 ? NULL : PyObject_CallOneArg(self->release_ref, task);
    LeaseBase *lease = (LeaseBase *)lease_obj;
    if (PyList_GET_SIZE(lease->inside) > 0) {   /* maybe this thread is inside: the reference says */
        PyObject *me = PyObject_CallNoArgs(self->get_ident);
        if (me == NULL)
            return NULL;
        int mine = PySequence_Contains(lease->inside, me);
        Py_DECREF(me);
        if (mine != 0)
            return mine < 0 ? NULL : PyObject_CallOneArg(self->release_ref, task);
    }
    /* Claim, move the lease to the releasing table, take it out of the table, close it: one
     * atomic step (no Python code runs in between). */
    PyObject *claim = PyBaseObject_Type.tp_alloc(&PyBaseObject_Type, 0);
    if (claim == NULL)
        return NULL;
    Py_INCREF(lease);
    Py_INCREF(task);
    PyObject *result = NULL, *count = NULL, *nbytes = NULL, *binding = lease->binding;
    Py_INCREF(binding);
    if (PyDict_SetItem(self->claims, task, claim) < 0)
        goto done;
    if (PyDict_SetItem(self->releasing, task, (PyObject *)lease) < 0 || PyDict_DelItem(self->table, task) < 0) {
        /* cannot happen short of memory exhaustion; the claim goes, what was moved stays for the
         * next release to finish */
        goto unclaim;
    }
    Py_INCREF(Py_False);
    Py_SETREF(lease->open, Py_False);
    /* Operations of the task still in progress: the registry's drain (sleeps, GIL released). */
    if (PyList_GET_SIZE(lease->inside) > 0) {
        PyObject *r = PyObject_CallOneArg(self->drain, (PyObject *)lease);
        if (r == NULL)
            goto unclaim;
        Py_DECREF(r);
    }
    {
        int failed = PyList_GET_SIZE(self->listeners) ? call_listeners(self, binding) : 0;
        PyObject *et = NULL, *ev = NULL, *etb = NULL;
        if (failed)
            PyErr_Fetch(&et, &ev, &etb);
        /* the memory is reclaimed whatever a listener did */
        int rc = reclaim(self, binding, task, &count, &nbytes);
        if (failed) {
            if (rc == 0) {
                PyErr_Restore(et, ev, etb);
            } else {   /* the reclaim's error is raised: the later one, as in the reference */
                Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
            }
            goto unclaim;
        }
        if (rc < 0)
            goto unclaim;
    }
    if (PyDict_DelItem(self->releasing, task) < 0)
        goto unclaim;
    if (PyDict_DelItem(self->claims, task) < 0)
        goto done;
    if (detach_if(self, task) < 0)
        goto done;
    {
        PyObject *items[3] = {task, count, nbytes};
        Py_INCREF(task);
        count = nbytes = NULL;
        result = new_record(self->report_type, 3, items);
    }
    goto done;
unclaim:
    {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        if (PyDict_DelItem(self->claims, task) < 0)
            PyErr_Clear();
        PyErr_Restore(et, ev, etb);
    }
done:
    Py_XDECREF(count);
    Py_XDECREF(nbytes);
    Py_DECREF(binding);
    Py_DECREF(claim);
    Py_DECREF(task);
    Py_DECREF(lease);
    return result;
}

static PyObject *core_get_binds(RegistryCore *self, void *closure) {
    return PyLong_FromLongLong(self->binds);
}

static PyObject *core_get_closed(RegistryCore *self, void *closure) {
    return PyBool_FromLong(self->closed);
}

static int core_set_closed(RegistryCore *self, PyObject *value, void *closure) {
    int v = value ? PyObject_IsTrue(value) : -1;
    if (v < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "closed cannot be deleted");
        return -1;
    }
    self->closed = v;
    return 0;
}

static PyMethodDef core_methods[] = {
    {"bind", (PyCFunction)(void (*)(void))core_bind, METH_FASTCALL | METH_KEYWORDS,
     "bind(task_id, gpu=None, priority='normal') -> TaskBinding"},
    {"release", (PyCFunction)core_release, METH_O, "release(task_id) -> ReleaseReport"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef core_getset[] = {
    {"binds", (getter)core_get_binds, NULL, "binds made by this twin", NULL},
    {"closed", (getter)core_get_closed, (setter)core_set_closed, "refuse binds (the reference says why)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RegistryCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge._registry_core.RegistryCore",
    .tp_basicsize = sizeof(RegistryCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The task registry's bind and release in C (see task_registry.py).",
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_init = (initproc)core_init,
    .tp_new = PyType_GenericNew,
    .tp_methods = core_methods,
    .tp_getset = core_getset,
};

static struct PyModuleDef registry_core_module = {
    PyModuleDef_HEAD_INIT, "_registry_core", "The task registry's C twin (task_registry.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__registry_core(void) {
    s_normal = PyUnicode_InternFromString("normal");
    s_task = PyUnicode_InternFromString("task");
    s_dict = PyUnicode_InternFromString("__dict__");
    if (s_normal == NULL || s_task == NULL || s_dict == NULL)
        return NULL;
    if (PyType_Ready(&LeaseBaseType) < 0 || PyType_Ready(&RegistryCoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&registry_core_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "LeaseBase", (PyObject *)&LeaseBaseType) < 0 ||
        PyModule_AddObjectRef(m, "RegistryCore", (PyObject *)&RegistryCoreType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
