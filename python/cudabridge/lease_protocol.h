/*
 * lease_protocol.h: the lease protocol's two steps in C (join and leave a task's lease), shared
 * by the C twins that admit work for a task: the Java hot path's (jvm/hotcore_leases.h), the
 * library allocators' (allocators/_library_core.c) and the Python function calls'
 * (functions/_call_core.c). The protocol and its reference are task_registry.py's (TaskLeases);
 * what a twin does when the lease is closed or not as documented (raise the refusal, or hand the
 * call to its Python reference) stays the twin's own.
 *
 * Invariants:
 *  - join appends this thread's ident to lease.inside *before* it reads lease.open: the release
 *    clears open, then waits until inside is empty, so in any interleaving either the joining
 *    thread sees the lease closed or the release sees it inside and waits;
 *  - every join that returned 0 or 1 is matched by one leave on every way out, which removes one
 *    occurrence of the ident (the last: the most recent join of a nested call). Only exact ints
 *    match (what every join appends, C or Python's threading.get_ident), compared by value with no
 *    Python code run, so a stray item in the list can neither raise nor change it during the scan
 *    (Python's list.remove compares with ==, first match first; for the protocol's items the same);
 *  - the GIL is held throughout; no lock is taken. Each step is one built-in call, so nothing
 *    Python-level runs between the append and the read.
 *
 * Built into each extension that includes it (setup.py and memory/native.py add this directory
 * to the include path and to the extension's inputs).
 */
#ifndef CB_LEASE_PROTOCOL_H
#define CB_LEASE_PROTOCOL_H

#include <Python.h>
#include <pythread.h>

/* Leaves: removes the last occurrence of `ident` from `inside`. Returns 1 removed; 0 not there
 * (someone broke the protocol: the caller decides whether that is an error); -1 the removal failed
 * (out of memory), with its error raised unless one was raised before the call. An error raised
 * before the call is kept as it is, so a way out that carries one can leave without losing it. */
static int lease_leave(PyObject *inside, unsigned long ident) {
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    int rc = 0;
    for (Py_ssize_t i = PyList_GET_SIZE(inside) - 1; i >= 0; i--) {
        PyObject *item = PyList_GET_ITEM(inside, i);
        if (!PyLong_CheckExact(item)) continue;   /* an ident is an exact int */
        unsigned long value = PyLong_AsUnsignedLong(item);
        if (value == (unsigned long)-1 && PyErr_Occurred()) {   /* negative or too large: not an ident */
            PyErr_Clear();
            continue;
        }
        if (value == ident) {
            rc = PyList_SetSlice(inside, i, i + 1, NULL) < 0 ? -1 : 1;
            break;
        }
    }
    if (et != NULL) {
        PyErr_Clear();
        PyErr_Restore(et, ev, etb);
    }
    return rc;
}

/* lease_leave for a way out that reports what went wrong: 0 removed; -1 otherwise, with an error
 * raised when none was (RuntimeError "<who>: the thread's lease entry is gone" when it was not
 * there, else the removal's own). An error raised before the call is kept. */
static int lease_leave_checked(PyObject *inside, unsigned long ident, const char *who) {
    int left = lease_leave(inside, ident);
    if (left == 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "%s: the thread's lease entry is gone", who);
    return left == 1 ? 0 : -1;
}

/* Joins `lease`: appends this thread's ident to lease.inside, then reads lease.open. Returns 1
 * joined and open; 0 joined, but its release has begun (leave it, then refuse or hand over); -1
 * with an error raised and not joined (lease.inside not a list: a TypeError; or the append's or
 * open's own error). On 0 and 1, *inside is a new reference and *ident this thread's ident. */
static int lease_join(PyObject *lease, PyObject **inside, unsigned long *ident) {
    static PyObject *s_inside, *s_open;
    if (s_inside == NULL && (s_inside = PyUnicode_InternFromString("inside")) == NULL) return -1;
    if (s_open == NULL && (s_open = PyUnicode_InternFromString("open")) == NULL) return -1;
    PyObject *in = PyObject_GetAttr(lease, s_inside);
    if (in == NULL) return -1;
    if (!PyList_CheckExact(in)) {
        PyErr_Format(PyExc_TypeError, "the lease protocol: lease.inside must be a list, got %R", in);
        Py_DECREF(in);
        return -1;
    }
    unsigned long me = PyThread_get_thread_ident();
    PyObject *me_obj = PyLong_FromUnsignedLong(me);
    if (me_obj == NULL || PyList_Append(in, me_obj) < 0) {
        Py_XDECREF(me_obj);
        Py_DECREF(in);
        return -1;
    }
    Py_DECREF(me_obj);
    /* joined from here: every way out leaves */
    PyObject *open = PyObject_GetAttr(lease, s_open);
    int is_open = open == NULL ? -1 : PyObject_IsTrue(open);
    Py_XDECREF(open);
    if (is_open < 0) {
        lease_leave(in, me);
        Py_DECREF(in);
        return -1;
    }
    *inside = in;
    *ident = me;
    return is_open;
}

#endif /* CB_LEASE_PROTOCOL_H */
