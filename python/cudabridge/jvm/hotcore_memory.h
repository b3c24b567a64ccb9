/*
 * hotcore_memory.h: stream, allocate, free and free_many, JavaHotPath's methods (hot_path.py) in
 * C: a task's stream, and device memory through the pool of the task's GPU, known to Java by a
 * handle in the hot path's HandleTable (handles.py). Part of _hotcore.c's one translation unit:
 * included by it after HotCore, the shared helpers and hotcore_leases.h, not a header to include
 * anywhere else.
 *
 * Invariants:
 *  - a handle is the allocation's id << GPU_BITS | its GPU ordinal, as the reference computes it
 *    (Python's int arithmetic past a long long); a free finds the GPU's pool by the low bits;
 *  - allocate runs inside the task's lease (hotcore_leases.h) and is counted once out of it, as
 *    the reference counts;
 *  - a free of a handle its task's release took (released_with) has no effect and counts
 *    nothing, as one whose allocation the release reclaimed between the pop and the pool's free:
 *    the release freed it and counted it as a leak;
 *  - free_many checks every handle (an exact int, live or taken by a release, none twice) before
 *    it frees any: one bad handle frees nothing;
 *  - a form this code does not take (keywords, a wrong argument count, a task id that is not an
 *    exact int) goes to the Python reference as given.
 */

#ifndef CB_HOTCORE_MEMORY_H
#define CB_HOTCORE_MEMORY_H

/* raise handles.refusal(handle, call). NULL always. */
static PyObject *refuse_handle(HotCore *self, PyObject *handle, const char *call) {
    PyObject *c = PyUnicode_FromString(call);
    if (c == NULL) return NULL;
    PyObject *a[2] = {handle, c};
    PyObject *exc = PyObject_Vectorcall(self->h_refusal, a, 2, NULL);
    Py_DECREF(c);
    return raise_exc(exc);
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

/* allocate(task, size) -> (handle, device pointer) */
static PyObject *hc_allocate(HotCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != 2 || !PyLong_CheckExact(args[0]))
        return PyObject_Vectorcall(self->ref_allocate, args, nargs, kwnames);
    if (self->refuse_unusable != NULL) return refuse_unusable(self, "allocate");
    PyObject *task = args[0], *size = args[1];
    PyObject *lease, *inside;
    unsigned long ident;
    if (enter_lease(self, task, &lease, &inside, &ident) < 0) return NULL;
    PyObject *b = NULL, *gpu_obj = NULL, *stream = NULL, *owner = NULL, *a = NULL, *id = NULL, *ptr = NULL,
             *handle = NULL, *out = NULL;
    long gpu = -1;
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
    Py_XDECREF(handle); Py_XDECREF(id); Py_XDECREF(ptr); Py_XDECREF(a); Py_XDECREF(owner); Py_XDECREF(stream);
    Py_XDECREF(gpu_obj); Py_XDECREF(b); Py_DECREF(inside); Py_DECREF(lease);
    return out;
}

/* handles.released_with(handle) is not None: 1 a release took it, 0 not, -1 error. */
static int taken_by_release(HotCore *self, PyObject *handle) {
    PyObject *task = PyObject_CallOneArg(self->h_released, handle);
    if (task == NULL) return -1;
    int taken = task != Py_None;
    Py_DECREF(task);
    return taken;
}

/* handles.pop(handle, None), then the pool's free of what it held; the caller has checked that
 * handle is an exact int. 1 freed, 0 not in the table (nothing raised), 2 not freed: its task's
 * release reclaimed it between the pop and the free (the pool's refusal dropped), -1 error. */
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
    int rc = 1;
    if (r == NULL) {
        rc = -1;
        if (PyErr_ExceptionMatches(PyExc_Exception)) {   /* as the reference's `except Exception` */
            PyObject *et, *ev, *etb;
            PyErr_Fetch(&et, &ev, &etb);
            int ok = 1;
            long long state = int_attr(a, s_state, &ok);
            if (ok && state == ALLOCATION_RELEASED) {
                Py_XDECREF(et);
                Py_XDECREF(ev);
                Py_XDECREF(etb);
                rc = 2;
            } else {
                PyErr_Clear();
                PyErr_Restore(et, ev, etb);
            }
        }
    } else {
        Py_DECREF(r);
    }
    Py_DECREF(a);
    return rc;
}

/* free(handle) */
static PyObject *hc_free(HotCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != 1) return PyObject_Vectorcall(self->ref_free, args, nargs, kwnames);
    PyObject *handle = args[0];
    if (!PyLong_CheckExact(handle)) return refuse_handle(self, handle, "free"); /* 1.0 would find 1 */
    int rc = pop_and_free(self, handle);
    if (rc < 0) return NULL;
    if (rc == 0) {   /* not live: no effect when its task's release took it, else refused */
        int taken = taken_by_release(self, handle);
        if (taken < 0) return NULL;
        if (!taken) return refuse_handle(self, handle, "free");
        Py_RETURN_NONE;
    }
    if (rc == 1) self->frees_count++;
    Py_RETURN_NONE;
}

/* free_many(handles) -> how many it freed. All are checked first: one bad handle (not an exact
 * int, neither live nor taken by its task's release, or twice) frees nothing and raises
 * handles.refusal_many(handles); a handle its task's release took is passed over. */
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
        ok = a != NULL && a != Py_None;
        if (a == Py_None) ok = taken_by_release(self, h);
        Py_XDECREF(a);
        Py_DECREF(h);
        if (a == NULL || ok < 0) goto out;
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
    Py_ssize_t freed = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *h = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(h);
        int rc = pop_and_free(self, h);
        if (rc == 0) {   /* taken by its task's release (passed over), or freed by another thread meanwhile */
            rc = taken_by_release(self, h);
            if (rc == 0) refuse_handle(self, h, "free");
            rc = rc > 0 ? 2 : -1;
        }
        Py_DECREF(h);
        if (rc < 0) goto out;
        if (rc == 1) freed++;
    }
    self->batched_frees += freed;
    self->batches++;
    result = PyLong_FromSsize_t(freed);
out:
    Py_DECREF(seq);
    return result;
}

#endif /* CB_HOTCORE_MEMORY_H */
