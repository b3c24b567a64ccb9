/*
 * _call_core.c: the C twin of a Python function's call from Java (jvm/function_calls.py's
 * JavaFunctions.call over functions/function_calls.py's FunctionCalls.call), so that a call of a
 * plain function costs the function and little else: no Python frame of ours around it.
 *
 * The Python methods are the reference: this twin takes the common case (exact int task and
 * function ids, a tuple of arguments none of which is a device array, a function resolved, the
 * task's lease open, the contexts of its stream known) and hands every other call, as it stands,
 * to the reference, which does everything and says what is wrong. A call handed over has changed
 * nothing: the lease is left and the attachment put back before it is.
 *
 * The steps, in the reference's order: enter the task's lease (one append of the thread's ident to
 * lease.inside, then the open check); attach the thread to the task (its threading.local's "task";
 * set_device where the executor has several GPUs); enter the stream's contexts (CuPy's, PyTorch's
 * current stream); call; exit the contexts in reverse; a raised error that is not the service's
 * own (CudaBridgeError) becomes the reference's failure(function id, exc); a plain result (None,
 * bool, int of 64 bits, float, str, bytes) is returned as it is, any other goes to the reference's
 * result(binding, name, out, finish) (arrays, lists: still inside the lease); put the attachment
 * back; leave the lease (one remove). The GIL is held throughout; no lock is taken here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include "lease_protocol.h"

typedef struct {
    PyObject_HEAD
    PyObject *leases;      /* dict: task id -> lease (TaskLeases' table) */
    PyObject *local;       /* the registry's threading.local (attach) */
    PyObject *callables;   /* dict: function id -> the function (FunctionTable.callables) */
    PyObject *names;       /* dict: function id -> its name (FunctionTable.names) */
    PyObject *contexts;    /* tuple of 4 dicts (FunctionCalls.contexts): stream -> contexts, by libraries imported */
    PyObject *set_device;  /* the backend's set_device, or None (one GPU) */
    PyObject *reference;   /* JavaFunctions.call, bound: every call not taken here */
    PyObject *failure;     /* FunctionCalls.failure, bound */
    PyObject *result;      /* FunctionCalls.result, bound */
    PyObject *finish;      /* what result() passes results through (JavaFunctions._to_java), or None */
    PyObject *service_error;  /* errors.CudaBridgeError: raised as it is */
} CallCore;

static PyObject *name_dict, *name_task, *name_binding, *name_enter, *name_exit, *name_cupy,
    *name_torch;

static int core_traverse(CallCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->leases); Py_VISIT(self->local); Py_VISIT(self->callables); Py_VISIT(self->names);
    Py_VISIT(self->contexts); Py_VISIT(self->set_device); Py_VISIT(self->reference); Py_VISIT(self->failure);
    Py_VISIT(self->result); Py_VISIT(self->finish); Py_VISIT(self->service_error);
    return 0;
}

static int core_clear(CallCore *self) {
    Py_CLEAR(self->leases); Py_CLEAR(self->local); Py_CLEAR(self->callables); Py_CLEAR(self->names);
    Py_CLEAR(self->contexts); Py_CLEAR(self->set_device); Py_CLEAR(self->reference); Py_CLEAR(self->failure);
    Py_CLEAR(self->result); Py_CLEAR(self->finish); Py_CLEAR(self->service_error);
    return 0;
}

static void core_dealloc(CallCore *self) {
    PyObject_GC_UnTrack(self);
    core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int core_init(CallCore *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"leases", "local", "callables", "names", "contexts", "set_device", "reference", "failure",
                         "result", "finish", "service_error", NULL};
    PyObject *le, *lo, *ca, *na, *co, *sd, *re, *fa, *rs, *fi, *se;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!O!O!OOOOOO", kw, &PyDict_Type, &le, &lo, &PyDict_Type, &ca,
                                     &PyDict_Type, &na, &PyTuple_Type, &co, &sd, &re, &fa, &rs, &fi, &se))
        return -1;
    if (PyTuple_GET_SIZE(co) != 4) {
        PyErr_SetString(PyExc_ValueError, "contexts: one dict per libraries-imported state (4)");
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        if (!PyDict_CheckExact(PyTuple_GET_ITEM(co, i))) {
            PyErr_SetString(PyExc_TypeError, "contexts: dicts");
            return -1;
        }
    }
#define NAME_KEEP(field, v) do { Py_INCREF(v); Py_XSETREF(self->field, v); } while (0)
    NAME_KEEP(leases, le); NAME_KEEP(local, lo); NAME_KEEP(callables, ca); NAME_KEEP(names, na); NAME_KEEP(contexts, co);
    NAME_KEEP(set_device, sd); NAME_KEEP(reference, re); NAME_KEEP(failure, fa); NAME_KEEP(result, rs);
    NAME_KEEP(finish, fi); NAME_KEEP(service_error, se);
#undef NAME_KEEP
    return 0;
}

/* Which of CuPy (1) and PyTorch (2) are imported: function_calls.contexts_state. */
static int contexts_state(void) {
    PyObject *modules = PyImport_GetModuleDict();   /* borrowed */
    return (PyDict_Contains(modules, name_cupy) == 1) | (PyDict_Contains(modules, name_torch) == 1) << 1;
}

/* Whether `r` goes back as it is (FunctionCalls.call's plain results). */
static int plain(PyObject *r) {
    if (r == Py_None || PyBool_Check(r) || PyFloat_CheckExact(r) || PyUnicode_CheckExact(r) || PyBytes_CheckExact(r))
        return 1;
    if (PyLong_CheckExact(r)) {
        int overflow = 0;
        (void)PyLong_AsLongLongAndOverflow(r, &overflow);
        return overflow == 0 && !PyErr_Occurred();
    }
    return 0;
}

/* Exits contexts[0..n) in reverse, keeping any error already set. -1 if an exit itself failed
 * (its error replaces none already set). */
static int exit_contexts(PyObject *contexts, Py_ssize_t n) {
    int rc = 0;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        PyObject *r = PyObject_CallMethodObjArgs(PyTuple_GET_ITEM(contexts, i), name_exit, Py_None, Py_None, Py_None, NULL);
        if (r == NULL) {
            if (t == NULL && rc == 0) {
                rc = -1;
                PyErr_Fetch(&t, &v, &tb);
            } else {
                PyErr_Clear();
            }
        }
        Py_XDECREF(r);
    }
    PyErr_Restore(t, v, tb);
    return rc;
}

/* The function raised: the service's own errors stay, any other becomes failure(id, exc). */
static void wrap_failure(CallCore *self, PyObject *fid) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v == NULL) {
        PyErr_Restore(t, v, tb);
        return;
    }
    if (tb != NULL) PyException_SetTraceback(v, tb);
    if (PyObject_IsInstance(v, self->service_error) == 1) {
        PyErr_Restore(t, v, tb);
        return;
    }
    PyErr_Clear();
    PyObject *wrapped = PyObject_CallFunctionObjArgs(self->failure, fid, v, NULL);
    if (wrapped != NULL) {
        PyException_SetCause(wrapped, Py_NewRef(v));   /* raise ... from exc */
        PyErr_SetObject((PyObject *)Py_TYPE(wrapped), wrapped);
        Py_DECREF(wrapped);
    }
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
}

#define HAND_OVER ((PyObject *)1)   /* not taken here: the reference does the whole call */

static PyObject *call_common(CallCore *self, PyObject *task, PyObject *fid, PyObject *args) {
    if (!PyLong_CheckExact(task) || !PyLong_CheckExact(fid) || !PyTuple_CheckExact(args)) return HAND_OVER;
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    for (Py_ssize_t i = 0; i < nargs; i++)
        if (PyTuple_CheckExact(PyTuple_GET_ITEM(args, i))) return HAND_OVER;   /* a device array */
    PyObject *fn = PyDict_GetItemWithError(self->callables, fid);   /* borrowed */
    if (fn == NULL) {
        PyErr_Clear();
        return HAND_OVER;
    }
    PyObject *lease = PyDict_GetItemWithError(self->leases, task);
    if (lease == NULL) {
        PyErr_Clear();
        return HAND_OVER;
    }
    Py_INCREF(fn);
    Py_INCREF(lease);
    PyObject *out = HAND_OVER, *inside = NULL, *binding = NULL, *d = NULL, *previous = NULL;
    unsigned long me = 0;
    int is_open = lease_join(lease, &inside, &me);
    if (is_open < 0) {
        PyErr_Clear();   /* not as documented: the reference says why */
        goto done;
    }
    /* inside the lease from here: every way out leaves it */
    binding = is_open == 1 ? PyObject_GetAttr(lease, name_binding) : NULL;
    if (binding == NULL || !PyTuple_Check(binding) || PyTuple_GET_SIZE(binding) < 4) {
        PyErr_Clear();   /* refused (its release has begun) or not as expected: the reference says why */
        goto leave_lease;
    }
    PyObject *stream = PyTuple_GET_ITEM(binding, 3);
    PyObject *contexts = PyDict_GetItemWithError(PyTuple_GET_ITEM(self->contexts, contexts_state()), stream);
    if (contexts == NULL || !PyTuple_CheckExact(contexts)) {
        PyErr_Clear();   /* the stream's first call under these libraries: the reference makes them */
        goto leave_lease;
    }
    Py_INCREF(contexts);
    d = PyObject_GetAttr(self->local, name_dict);
    if (d == NULL || !PyDict_Check(d)) {
        PyErr_Clear();
        Py_DECREF(contexts);
        goto leave_lease;
    }
    previous = PyDict_GetItemWithError(d, name_task);
    if (previous == NULL && PyErr_Occurred()) {
        PyErr_Clear();
        Py_DECREF(contexts);
        goto leave_lease;
    }
    previous = previous ? Py_NewRef(previous) : Py_NewRef(Py_None);
    if (PyDict_SetItem(d, name_task, PyTuple_GET_ITEM(binding, 0)) < 0) {
        out = NULL;
        Py_DECREF(contexts);
        goto leave_lease;
    }
    /* attached from here: every way out puts the previous attachment back */
    PyObject *r = NULL;
    Py_ssize_t entered = 0, n = PyTuple_GET_SIZE(contexts);
    if (self->set_device != Py_None) {
        PyObject *sd = PyObject_CallOneArg(self->set_device, PyTuple_GET_ITEM(binding, 1));
        if (sd == NULL) goto detach;
        Py_DECREF(sd);
    }
    for (; entered < n; entered++) {
        PyObject *e = PyObject_CallMethodNoArgs(PyTuple_GET_ITEM(contexts, entered), name_enter);
        if (e == NULL) break;
        Py_DECREF(e);
    }
    if (entered == n) {
        r = PyObject_Vectorcall(fn, &PyTuple_GET_ITEM(args, 0), (size_t)nargs, NULL);
        if (r == NULL) wrap_failure(self, fid);
    }
    if (exit_contexts(contexts, entered) < 0) Py_CLEAR(r);
    if (r != NULL && !plain(r)) {
        PyErr_Clear();   /* plain() may leave an overflow error: the reference refuses that int */
        PyObject *name = PyDict_GetItemWithError(self->names, fid);
        PyObject *argv[4] = {binding, name ? name : Py_None, r, self->finish};
        PyObject *taken = name == NULL && PyErr_Occurred() ? NULL : PyObject_Vectorcall(self->result, argv, 4, NULL);
        Py_SETREF(r, taken);
    }
detach:
    Py_DECREF(contexts);
    if (PyDict_SetItem(d, name_task, previous) < 0 && r != NULL) Py_CLEAR(r);
    out = r;
leave_lease:
    if (lease_leave_checked(inside, me, "function call") < 0 && out != NULL) {
        if (out != HAND_OVER) Py_DECREF(out);
        out = NULL;
    }
done:
    Py_XDECREF(previous);
    Py_XDECREF(d);
    Py_XDECREF(binding);
    Py_XDECREF(inside);
    Py_DECREF(lease);
    Py_DECREF(fn);
    return out;
}

/* call(task, function_id, args) -> result: JavaFunctions.call. */
static PyObject *core_call(CallCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL && nargs == 3) {
        PyObject *out = call_common(self, args[0], args[1], args[2]);
        if (out != HAND_OVER) return out;
    }
    return PyObject_Vectorcall(self->reference, args, nargsf, kwnames);
}

static PyMethodDef core_methods[] = {
    {"call", (PyCFunction)(void (*)(void))core_call, METH_FASTCALL | METH_KEYWORDS,
     "call(task, function_id, args) -> result (JavaFunctions.call)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CallCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.functions._call_core.CallCore",
    .tp_basicsize = sizeof(CallCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A Python function's call from Java in C (JavaFunctions.call and FunctionCalls.call are the reference)",
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_init = (initproc)core_init,
    .tp_new = PyType_GenericNew,
    .tp_methods = core_methods,
};

static struct PyModuleDef call_core_module = {PyModuleDef_HEAD_INIT, "_call_core",
                                              "the C twin of a Python function's call from Java", -1, NULL};

PyMODINIT_FUNC PyInit__call_core(void) {
    name_dict = PyUnicode_InternFromString("__dict__");
    name_task = PyUnicode_InternFromString("task");
    name_binding = PyUnicode_InternFromString("binding");
    name_enter = PyUnicode_InternFromString("__enter__");
    name_exit = PyUnicode_InternFromString("__exit__");
    name_cupy = PyUnicode_InternFromString("cupy");
    name_torch = PyUnicode_InternFromString("torch");
    if (!name_dict || !name_task || !name_binding || !name_enter || !name_exit || !name_cupy ||
        !name_torch)
        return NULL;
    if (PyType_Ready(&CallCoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&call_core_module);
    if (m == NULL) return NULL;
    Py_INCREF(&CallCoreType);
    if (PyModule_AddObject(m, "CallCore", (PyObject *)&CallCoreType) < 0) {
        Py_DECREF(&CallCoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
