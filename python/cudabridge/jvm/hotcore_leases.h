/*
 * hotcore_leases.h: the lease twin, TaskLeases.enter / leave (task_registry.py) in C: the guard
 * that every call of the hot path's C twin which queues work for a task passes (allocate, the
 * launch, a copy's admission), and the UnknownTask a task not bound, or whose release has begun,
 * gets. Part of _hotcore.c's one translation unit: included by it after HotCore and raise_exc,
 * not a header to include anywhere else.
 *
 * Invariants (the lease protocol, documented in task_registry.py):
 *  - enter: look the lease up, append this thread's ident to lease.inside, then read lease.open;
 *    closed: remove the ident again and raise leases.refusal(task, lease). The release clears
 *    open, then waits until inside is empty, so in any interleaving either the entering thread
 *    sees the lease closed or the release sees it inside and waits;
 *  - every way out of an entered operation removes one occurrence of this thread's ident
 *    (leave_lease), keeping any error already raised;
 *  - a lease's inside list is the same object for the lease's life and a closed lease never
 *    reopens: the only facts trusted here across a call into Python;
 *  - a refusal is worded by leases.refusal only, so both twins raise the same type and words.
 */

#ifndef CB_HOTCORE_LEASES_H
#define CB_HOTCORE_LEASES_H

/* raise leases.refusal(task, lease): lease is a TaskLease or Py_None. NULL always. */
static PyObject *refuse_task(HotCore *self, PyObject *task, PyObject *lease) {
    PyObject *a[2] = {task, lease};
    return raise_exc(PyObject_Vectorcall(self->lease_refusal, a, 2, NULL));
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

/* Leave (TaskLeases.leave): remove one occurrence of this thread's ident from lease.inside,
 * keeping any error already raised (lease_protocol.h's step; a failed removal is dropped: the way
 * out carries its own result). */
static void leave_lease(PyObject *inside, unsigned long ident) {
    int pending = PyErr_Occurred() != NULL;   /* lease_leave keeps it; its own error only raised without one */
    if (lease_leave(inside, ident) < 0 && !pending) PyErr_Clear();
}

/* The lease protocol's enter (TaskLeases.enter), the guard every operation that queues work for
 * a task passes: look the lease up, then join it (lease_protocol.h: append this thread's ident to
 * lease.inside, then read lease.open). Returns 0 inside, with new references in *lease and *inside
 * (leave with leave_lease(*inside, *ident), then drop both); -1 with the error raised and nothing
 * held: not bound (leases.refusal(task, None)), its release begun (leases.refusal(task, lease)),
 * or the protocol's objects not as documented. */
static int enter_lease(HotCore *self, PyObject *task, PyObject **lease, PyObject **inside, unsigned long *ident) {
    PyObject *l = lookup_lease(self, task);
    if (l == NULL) return -1;
    PyObject *in = NULL;
    unsigned long me_id = 0;
    int joined = lease_join(l, &in, &me_id);
    if (joined <= 0) {   /* an error, or the release has begun (the task may be bound again since) */
        if (joined == 0) {
            leave_lease(in, me_id);
            refuse_task(self, task, l);
            Py_DECREF(in);
        }
        Py_DECREF(l);
        return -1;
    }
    *lease = l;
    *inside = in;
    *ident = me_id;
    return 0;
}

#endif /* CB_HOTCORE_LEASES_H */
