/*
 * _library_core.c: the C twin of LibraryAllocator's allocation and frees (library_allocator.py),
 * so that a library's allocation reaches the pool's C fast path with no Python frame between:
 * PyTorch's compiled part calls allocate_pointer and free_pointer here straight from C++, CuPy's
 * callable calls allocate and its owner's finalizer free; drain makes the queued frees.
 *
 * The Python methods are the reference: this twin takes the common case (a thread attached to a
 * bound task, on its GPU, no frees queued, a stream the pool accepts) and hands every other call,
 * as it stands, to the reference, which then does everything (drains, the executor's allocations,
 * refusals, stream registration). A call the twin began and then hands over has changed nothing:
 * the task's lease is left and no allocation was made before it does.
 *
 * Invariants (as the reference's):
 *  - the task's lease is entered as the registry's protocol says (one append of the thread's
 *    ident to lease.inside, then the open check, one remove at the end), and the allocation is
 *    recorded as the task's before the lease is left: a release either sees it or refused it;
 *  - an address the library still holds is never handed out again (allocate_pointer: the
 *    reference's hold-back runs for such an allocation);
 *  - the GIL is held throughout; no lock is taken here.
 *
 * About 650 lines with CuPy's part (cupy_malloc.h), on purpose: allocate, the drain and the
 * reissue of the newest free share the queue and the lease's steps, and each follows its Python
 * reference line by line.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include "lease_protocol.h"
#include "allocation_layout.h"
#include <string.h>

typedef struct {
    PyObject_HEAD
    PyObject *pool_allocate;   /* dict: GPU ordinal -> that pool's bound allocate */
    PyObject *leases;          /* dict: task id -> lease (TaskLeases' table) */
    PyObject *local;           /* the registry's threading.local (attach) */
    PyObject *by_owner;        /* dict: task id -> {allocation: None} */
    PyObject *by_pointer;      /* dict: address -> allocation the library holds */
    PyObject *frees;           /* the deque of queued frees */
    PyObject *allocated;       /* itertools.count of allocations handed out */
    PyObject *allocate_ref;    /* the reference allocate (bound) */
    PyObject *pointer_ref;     /* the reference allocate_pointer (bound) */
    PyObject *hold_back;       /* the reference's _hold_back (bound) */
    PyObject *unknown_stream;  /* errors.UnknownStream: the pool's refusal the reference may answer */
    PyObject *invalid_free;    /* (errors.InvalidFree, errors.PoolClosed): a queued free of memory reclaimed
                                * meanwhile, at its task's release or at the pool's close */
    PyObject *frees_made;      /* itertools.count of frees made */
    PyObject *after_reclaim;   /* itertools.count of frees of reclaimed memory, dropped */
    PyObject *double_frees;    /* itertools.count of frees of a handle freed already, refused */
    PyObject *freed_state;     /* allocation.py's FREED: the state of a handle freed already */
    PyObject *drain_ref;       /* the reference drain (bound): a free that fails otherwise goes there */
    PyObject *set_aside;       /* dict: address -> allocation held back for it (LibraryAllocator._set_aside) */
    PyObject *free_pointer_ref;/* the reference free_pointer (bound): what the twin does not take */
    PyObject *pools;           /* dict: GPU ordinal -> that pool (an allocation taken back must be its) */
    PyObject *pool_reissue;    /* dict: GPU ordinal -> that pool's bound reissue */
    PyObject *frees_pop, *frees_popleft, *frees_append;   /* the queue's bound pop, popleft, append */
    PyObject *allocation_base; /* the C AllocationBase type (its layout: allocation_layout.h), or None */
    int by_stream;             /* a thread attached to no task allocates for the task whose stream it names */
    int closed;
} LibraryCore;

static PyObject *name_dict, *name_task, *name_binding, *name_ptr, *name_owner, *name_pool, *name_free,
    *name_popleft, *name_appendleft, *name_append, *name_pop, *name_state, *name_extra, *name_stream, *name_size, *name_open, *zero;

static int core_traverse(LibraryCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->pool_allocate); Py_VISIT(self->leases); Py_VISIT(self->local); Py_VISIT(self->by_owner);
    Py_VISIT(self->by_pointer); Py_VISIT(self->frees); Py_VISIT(self->allocated); Py_VISIT(self->allocate_ref);
    Py_VISIT(self->pointer_ref); Py_VISIT(self->hold_back); Py_VISIT(self->unknown_stream);
    Py_VISIT(self->invalid_free); Py_VISIT(self->frees_made); Py_VISIT(self->after_reclaim); Py_VISIT(self->drain_ref);
    Py_VISIT(self->double_frees); Py_VISIT(self->freed_state);
    Py_VISIT(self->set_aside); Py_VISIT(self->free_pointer_ref); Py_VISIT(self->pools); Py_VISIT(self->pool_reissue); Py_VISIT(self->frees_pop); Py_VISIT(self->frees_popleft); Py_VISIT(self->frees_append); Py_VISIT(self->allocation_base);
    return 0;
}

static int core_clear(LibraryCore *self) {
    Py_CLEAR(self->pool_allocate); Py_CLEAR(self->leases); Py_CLEAR(self->local); Py_CLEAR(self->by_owner);
    Py_CLEAR(self->by_pointer); Py_CLEAR(self->frees); Py_CLEAR(self->allocated); Py_CLEAR(self->allocate_ref);
    Py_CLEAR(self->pointer_ref); Py_CLEAR(self->hold_back); Py_CLEAR(self->unknown_stream);
    Py_CLEAR(self->invalid_free); Py_CLEAR(self->frees_made); Py_CLEAR(self->after_reclaim); Py_CLEAR(self->drain_ref);
    Py_CLEAR(self->double_frees); Py_CLEAR(self->freed_state);
    Py_CLEAR(self->set_aside); Py_CLEAR(self->free_pointer_ref); Py_CLEAR(self->pools); Py_CLEAR(self->pool_reissue); Py_CLEAR(self->frees_pop); Py_CLEAR(self->frees_popleft); Py_CLEAR(self->frees_append); Py_CLEAR(self->allocation_base);
    return 0;
}

static void core_dealloc(LibraryCore *self) {
    PyObject_GC_UnTrack(self);
    core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int core_init(LibraryCore *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"pool_allocate", "leases", "local", "by_owner", "by_pointer", "frees", "allocated",
                         "allocate_ref", "pointer_ref", "hold_back", "unknown_stream", "invalid_free", "frees_made",
                         "after_reclaim", "drain_ref", "set_aside", "free_pointer_ref", "pools", "pool_reissue", "allocation_base", "by_stream",
                         "double_frees", "freed_state", NULL};
    PyObject *pa, *le, *lo, *bo, *bp, *fr, *al, *ar, *pr, *hb, *us, *inf, *fm, *afr, *dr, *sa, *fpr, *po, *pri, *ab;
    PyObject *dfr, *fst;
    int bs = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OO!O!OOOOOOOOOOO!OO!O!OpOO", kw, &PyDict_Type, &pa, &PyDict_Type,
                                     &le, &lo, &PyDict_Type, &bo, &PyDict_Type, &bp, &fr, &al, &ar, &pr, &hb, &us, &inf,
                                     &fm, &afr, &dr, &PyDict_Type, &sa, &fpr, &PyDict_Type, &po, &PyDict_Type, &pri, &ab,
                                     &bs, &dfr, &fst))
        return -1;
    if (ab != Py_None && !PyType_Check(ab)) {
        PyErr_SetString(PyExc_TypeError, "LibraryCore: allocation_base must be a type or None");
        return -1;
    }
    PyObject *pop = PyObject_GetAttr(fr, name_pop), *popleft = PyObject_GetAttr(fr, name_popleft),
             *append = PyObject_GetAttr(fr, name_append);
    if (pop == NULL || popleft == NULL || append == NULL) {
        Py_XDECREF(pop);
        Py_XDECREF(popleft);
        Py_XDECREF(append);
        return -1;
    }
    Py_XSETREF(self->frees_pop, pop);
    Py_XSETREF(self->frees_popleft, popleft);
    Py_XSETREF(self->frees_append, append);
#define KEEP(field, v) do { Py_INCREF(v); Py_XSETREF(self->field, v); } while (0)
    KEEP(pool_allocate, pa); KEEP(leases, le); KEEP(local, lo); KEEP(by_owner, bo); KEEP(by_pointer, bp);
    KEEP(frees, fr); KEEP(allocated, al); KEEP(allocate_ref, ar); KEEP(pointer_ref, pr); KEEP(hold_back, hb);
    KEEP(unknown_stream, us); KEEP(invalid_free, inf); KEEP(frees_made, fm); KEEP(after_reclaim, afr);
    KEEP(drain_ref, dr); KEEP(set_aside, sa); KEEP(free_pointer_ref, fpr); KEEP(pools, po); KEEP(pool_reissue, pri); KEEP(allocation_base, ab);
    KEEP(double_frees, dfr); KEEP(freed_state, fst);
#undef KEEP
    self->by_stream = bs;
    self->closed = 0;
    return 0;
}

/* The calling thread's task (borrowed; NULL: none, no error set), or NULL with an error. */
static PyObject *attached_task(LibraryCore *self, int *failed) {
    *failed = 0;
    PyObject *d = PyObject_GetAttr(self->local, name_dict);
    if (d == NULL) {
        *failed = 1;
        return NULL;
    }
    PyObject *task = PyDict_GetItemWithError(d, name_task);   /* borrowed: the dict keeps it while we hold d */
    if (task == NULL && PyErr_Occurred()) *failed = 1;
    Py_XINCREF(task);
    Py_DECREF(d);
    if (task == Py_None) {
        Py_DECREF(task);
        return NULL;
    }
    return task;   /* new reference */
}

static int count_one(PyObject *counter) {
    PyObject *n = PyIter_Next(counter);
    if (n == NULL) return -1;
    Py_DECREF(n);
    return 0;
}

/* drain() -> int: LibraryAllocator.drain (drain_some: the oldest `limit` of them, all when < 0,
 * LibraryAllocator._drain). Each queued (allocation, counted) is freed in the pool
 * (the pool's free refuses, with InvalidFree, one reclaimed meanwhile: counted when `counted`,
 * dropped); a free that fails otherwise is put back first in the queue and the reference drain
 * takes over from there (it logs it and goes on). */
static PyObject *drain_some(LibraryCore *self, Py_ssize_t limit) {
    long made = 0;
    for (Py_ssize_t taken = 0; limit < 0 || taken < limit; taken++) {
        Py_ssize_t queued = PyObject_Size(self->frees);
        if (queued < 0) return NULL;
        if (queued == 0) break;
        PyObject *item = PyObject_CallNoArgs(self->frees_popleft);
        if (item == NULL) {
            if (PyErr_ExceptionMatches(PyExc_IndexError)) {   /* another thread drained it first */
                PyErr_Clear();
                break;
            }
            return NULL;
        }
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) {
            Py_DECREF(item);
            PyErr_SetString(PyExc_TypeError, "library allocator: a queued free is not (allocation, counted)");
            return NULL;
        }
        PyObject *a = PyTuple_GET_ITEM(item, 0);
        int counted = PyObject_IsTrue(PyTuple_GET_ITEM(item, 1));
        if (counted == 1) {
            PyObject *owner = PyObject_GetAttr(a, name_owner);
            PyObject *owned = owner == NULL ? NULL : PyDict_GetItemWithError(self->by_owner, owner);
            Py_XDECREF(owner);
            if (owned != NULL && PyDict_Check(owned) && PyDict_DelItem(owned, a) < 0) {
                if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
                    Py_DECREF(item);
                    return NULL;
                }
            }
            PyErr_Clear();
        }
        PyObject *pool = PyObject_GetAttr(a, name_pool);
        PyObject *r = pool == NULL ? NULL : PyObject_CallMethodOneArg(pool, name_free, a);
        Py_XDECREF(pool);
        if (r == NULL) {
            if (PyErr_ExceptionMatches(self->invalid_free)) {   /* reclaimed at its task's release, or at close;
                                                                   or freed already (its state says which) */
                PyErr_Clear();
                if (counted == 1) {
                    PyObject *state = PyObject_GetAttrString(a, "_state");
                    int twice = state == NULL ? -1 : PyObject_RichCompareBool(state, self->freed_state, Py_EQ);
                    Py_XDECREF(state);
                    if (twice < 0 || count_one(twice ? self->double_frees : self->after_reclaim) < 0) {
                        Py_DECREF(item);
                        return NULL;
                    }
                }
                Py_DECREF(item);
                continue;
            }
            PyErr_Clear();   /* the reference logs it: back first in line, and the rest is its */
            PyObject *back = PyObject_CallMethodOneArg(self->frees, name_appendleft, item);
            Py_DECREF(item);
            if (back == NULL) return NULL;
            Py_DECREF(back);
            PyObject *rest = PyObject_CallNoArgs(self->drain_ref);
            if (rest == NULL) return NULL;
            long more = PyLong_AsLong(rest);
            Py_DECREF(rest);
            return PyLong_FromLong(made + (more > 0 ? more : 0));
        }
        Py_DECREF(r);
        if (counted == 1) {
            if (count_one(self->frees_made) < 0) {
                Py_DECREF(item);
                return NULL;
            }
            made++;
        }
        Py_DECREF(item);
    }
    return PyLong_FromLong(made);
}

static PyObject *core_drain(LibraryCore *self, PyObject *unused) {
    (void)unused;
    return drain_some(self, -1);
}

#define HAND_OVER 2   /* not taken here: the reference does the whole call */

/* TaskRegistry.task_on_stream(device, stream) over the leases table: the one bound task whose
 * stream on GPU `device` is `stream` (a new reference), or NULL with no error: none, several (a
 * stream pool may deal one stream to two tasks), or a lease not as documented. For the registry's
 * own leases it runs no Python code (C slots, exact ints), so the table cannot change under the
 * scan; a lease type whose binding is Python code could change it, and PyDict_Next stays
 * memory-safe then, the answer possibly stale: the lease protocol that follows rechecks it (the
 * lease must be in the table and open). O(tasks bound). */
static PyObject *task_on_stream(LibraryCore *self, PyObject *device, PyObject *stream) {
    if (!PyLong_CheckExact(stream)) return NULL;
    PyObject *found = NULL, *key, *lease;
    Py_ssize_t pos = 0;
    while (PyDict_Next(self->leases, &pos, &key, &lease)) {
        PyObject *b = PyObject_GetAttr(lease, name_binding);
        int same = -1;
        if (b != NULL && PyTuple_Check(b) && PyTuple_GET_SIZE(b) >= 4 && PyLong_CheckExact(PyTuple_GET_ITEM(b, 3)) &&
            PyLong_CheckExact(PyTuple_GET_ITEM(b, 1))) {
            same = PyObject_RichCompareBool(PyTuple_GET_ITEM(b, 3), stream, Py_EQ);
            if (same == 1) same = PyObject_RichCompareBool(PyTuple_GET_ITEM(b, 1), device, Py_EQ);
        }
        if (same == 1 && found == NULL) {
            found = Py_NewRef(PyTuple_GET_ITEM(b, 0));
            same = 0;
        }
        Py_XDECREF(b);
        if (same != 0) {   /* a second task on it, or not as documented: the reference decides */
            PyErr_Clear();
            Py_XDECREF(found);
            return NULL;
        }
    }
    return found;
}

/* The task an allocation on `device` ordered on `stream` (NULL or None: none named) by the calling
 * thread is for (LibraryAllocator._task_for): the thread's, else, with by_stream, the one task whose
 * stream it is. A new reference; NULL with *failed 0: none; NULL with *failed 1: an error set. */
static PyObject *task_for(LibraryCore *self, PyObject *device, PyObject *stream, int *failed) {
    PyObject *task = attached_task(self, failed);
    if (task == NULL && !*failed && self->by_stream && stream != NULL && stream != Py_None)
        task = task_on_stream(self, device, stream);
    return task;
}

/* Whether `v` is an exact int equal to `want` (an int); no Python code runs. */
static int int_is(PyObject *v, PyObject *want) {
    return v != NULL && PyLong_CheckExact(v) && (v == want || PyObject_RichCompareBool(v, want, Py_EQ) == 1);
}

/* Whether allocation `a` can be handed out again as it stands for `size` bytes on `stream` to
 * `task` from `pool` (LibraryAllocator._reusable): live, that pool's, that task's, allocated on that
 * stream with that size, no other stream recorded on it. Its last use was ordered on `stream`, so
 * work queued there from now on runs after it: the reuse the pool's own bin for that stream makes
 * (the block just freed is the one it hands out next), without the free and the allocation.
 * 1 or 0. Reads the slots in place where `a` has the C layout, else by name (an error is cleared:
 * no). */
static int reusable(LibraryCore *self, PyObject *a, PyObject *size, PyObject *stream, PyObject *task, PyObject *pool) {
    if (self->allocation_base != Py_None && PyObject_TypeCheck(a, (PyTypeObject *)self->allocation_base)) {
        AllocationBase *x = (AllocationBase *)a;
        int ok = x->pool == pool && x->extra == Py_None && int_is(x->state, zero) && int_is(x->owner, task) &&
                 int_is(x->stream, stream) && int_is(x->size, size);
        PyErr_Clear();
        return ok;
    }
    PyObject *names[6] = {name_pool, name_extra, name_state, name_owner, name_stream, name_size};
    PyObject *want[6] = {pool, Py_None, zero, task, stream, size};
    int ok = 1;
    for (int i = 0; ok && i < 6; i++) {
        PyObject *v = PyObject_GetAttr(a, names[i]);
        ok = i < 2 ? v == want[i] : int_is(v, want[i]);
        Py_XDECREF(v);
    }
    PyErr_Clear();
    return ok;
}

/* The newest queued free (a new reference to the (allocation, counted) item) when its allocation
 * is reusable (above) for this call, else NULL (no error). Exact ints only: any other size or
 * stream goes through the pool, which checks it. Takes nothing out of the queue. */
static PyObject *newest_reusable(LibraryCore *self, PyObject *size, PyObject *device, PyObject *stream,
                                 PyObject *task) {
    if (!PyLong_CheckExact(size) || stream == NULL || !PyLong_CheckExact(stream)) return NULL;
    PyObject *pool = PyDict_GetItemWithError(self->pools, device);   /* borrowed */
    PyObject *newest = pool == NULL ? NULL : PySequence_GetItem(self->frees, -1);
    if (newest != NULL && !(PyTuple_CheckExact(newest) && PyTuple_GET_SIZE(newest) == 2 &&
                            PyTuple_GET_ITEM(newest, 1) == Py_True &&
                            reusable(self, PyTuple_GET_ITEM(newest, 0), size, stream, task, pool)))
        Py_CLEAR(newest);
    PyErr_Clear();
    return newest;
}

/* newest_reusable's item taken out of the queue: a new reference to its allocation, or NULL (no
 * error). Inside the task's lease only: from there to the leave no release of the task can drain
 * the queue without it, so a free taken out is either handed out again or put back. */
static PyObject *take_newest(LibraryCore *self, PyObject *size, PyObject *device, PyObject *stream, PyObject *task) {
    PyObject *newest = newest_reusable(self, size, device, stream, task);
    if (newest == NULL) return NULL;
    PyObject *kept = NULL, *popped = PyObject_CallNoArgs(self->frees_pop);
    if (popped == newest) {
        kept = Py_NewRef(PyTuple_GET_ITEM(newest, 0));
    } else if (popped != NULL) {   /* another was queued meanwhile: back in line, nothing taken */
        PyObject *r = PyObject_CallOneArg(self->frees_append, popped);
        if (r == NULL) PyErr_WriteUnraisable(self->frees);
        Py_XDECREF(r);
    }
    Py_XDECREF(popped);
    Py_DECREF(newest);
    PyErr_Clear();
    return kept;
}

static int queue_free(LibraryCore *self, PyObject *a, PyObject *counted);

/* Puts a taken-back allocation the call did not hand out back in the queue (freed at the next
 * drain, as if never taken); an error keeps the pending one. */
static void put_back(LibraryCore *self, PyObject *a) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    if (queue_free(self, a, Py_True) < 0) PyErr_WriteUnraisable(self->frees);   /* the pool keeps it: reclaimed
                                                                                  * with its task, or at close */
    PyErr_Restore(t, v, tb);
}

/* An allocation made but not handed out (an error after it): freed again at once, the pending
 * error kept; the reference `a` is taken. */
static void drop_made(PyObject *a) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *r = PyObject_CallMethod(a, "free", NULL);
    Py_XDECREF(r);
    PyErr_Clear();
    PyErr_Restore(t, v, tb);
    Py_DECREF(a);
}

/* The common case; 0 with *out set, HAND_OVER (nothing changed), or -1 with an error (the pool's).
 * The library's newest queued free, when reusable for this call (the pair of a library that frees
 * and allocates one size on its stream), is handed out again under a new handle (the pool's
 * reissue) instead of being freed; every other queued free is made first. */
static int allocate_common(LibraryCore *self, PyObject *size, PyObject *device, PyObject *stream, int pointer,
                           PyObject **out) {
    if (self->closed || !PyLong_CheckExact(device)) return HAND_OVER;
    PyObject *pool_allocate = PyDict_GetItemWithError(self->pool_allocate, device);   /* borrowed: a dict of ours */
    if (pool_allocate == NULL) {
        if (PyErr_Occurred()) PyErr_Clear();
        return HAND_OVER;
    }
    int failed;
    PyObject *task = task_for(self, device, stream, &failed);   /* autograd's threads: by the stream they name */
    if (task == NULL) {
        if (failed) PyErr_Clear();
        return HAND_OVER;   /* the executor's allocation (or a stream no one task has): the reference */
    }
    Py_ssize_t queued = PyObject_Size(self->frees);
    if (queued != 0) {   /* the frees to make first: all but a newest this call may hand out again */
        PyObject *newest = queued > 0 ? newest_reusable(self, size, device, stream, task) : NULL;
        Py_ssize_t limit = newest != NULL ? queued - 1 : -1;
        Py_XDECREF(newest);
        PyObject *made = queued < 0 ? NULL : limit != 0 ? drain_some(self, limit) : Py_NewRef(Py_None);
        if (made == NULL) {
            PyErr_Clear();
            Py_DECREF(task);
            return HAND_OVER;   /* the reference drains and says what failed */
        }
        Py_DECREF(made);
    }
    int rc = HAND_OVER, reused = 0;
    PyObject *lease = PyDict_GetItemWithError(self->leases, task);   /* borrowed */
    PyObject *inside = NULL, *binding = NULL, *a = NULL, *kept = NULL;
    unsigned long me = 0;
    if (lease == NULL) {
        if (PyErr_Occurred()) PyErr_Clear();
        goto done;
    }
    Py_INCREF(lease);
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
    int same_gpu = PyObject_RichCompareBool(PyTuple_GET_ITEM(binding, 1), device, Py_EQ);
    if (same_gpu != 1) {
        PyErr_Clear();
        goto leave_lease;
    }
    PyObject *on = stream == NULL || stream == Py_None ? PyTuple_GET_ITEM(binding, 3) : stream;
    /* taken out of the queue only here: no release of the task can now drain the queue without it */
    kept = PyObject_Size(self->frees) > 0 ? take_newest(self, size, device, on, task) : NULL;
    if (kept != NULL) {
        PyObject *reissue = PyDict_GetItemWithError(self->pool_reissue, device);   /* borrowed: a dict of ours */
        PyObject *argv[2] = {kept, on};
        a = reissue == NULL ? NULL : PyObject_Vectorcall(reissue, argv, 2, NULL);
        if (a == NULL) {   /* the pool's error (out of memory), the call's as in the reference: the free queued again */
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "library allocator: a GPU without its pool's reissue");
            put_back(self, kept);
            Py_CLEAR(kept);
            rc = -1;
            goto leave_lease;
        } else if (a == Py_None) {   /* not after all (a per-thread stream): freed first, as the drain would */
            Py_CLEAR(a);
        } else {
            reused = 1;
        }
        if (!reused) {
            put_back(self, kept);
            Py_CLEAR(kept);
            PyObject *made = core_drain(self, NULL);
            if (made == NULL) {
                PyErr_Clear();
                goto leave_lease;   /* HAND_OVER: the reference drains and says what failed */
            }
            Py_DECREF(made);
        }
    }
    if (a == NULL) {
        PyObject *argv[3] = {size, on, task};
        a = PyObject_Vectorcall(pool_allocate, argv, 3, NULL);
        /* an address the library still holds (a reclaimed allocation it has not freed yet): set
         * aside by the reference's _hold_back, here inside the lease (no release reclaims it
         * meanwhile) and before the allocation is counted, and another taken */
        while (a != NULL && PyDict_GET_SIZE(self->by_pointer) > 0) {
            PyObject *ptr = PyObject_GetAttr(a, name_ptr);
            int held = ptr == NULL ? -1 : PyDict_Contains(self->by_pointer, ptr);
            Py_XDECREF(ptr);
            if (held == 0) break;
            PyObject *r = held < 0 ? NULL : PyObject_CallOneArg(self->hold_back, a);
            if (r == NULL) {
                rc = -1;   /* the error is the call's; `a` goes back below */
                goto leave_lease;
            }
            Py_DECREF(r);
            Py_DECREF(a);   /* set aside: the allocator holds it */
            a = PyObject_Vectorcall(pool_allocate, argv, 3, NULL);
        }
    }
    if (a == NULL) {
        /* a stream the pool does not know goes to the reference (which may register it); the
         * pool's other refusals (size, out of memory) are the call's own */
        if (PyErr_ExceptionMatches(self->unknown_stream)) {
            PyErr_Clear();
            rc = HAND_OVER;
        } else {
            rc = -1;
        }
        goto leave_lease;
    }
    PyObject *owned = PyDict_GetItemWithError(self->by_owner, task);   /* borrowed */
    if (owned == NULL && !PyErr_Occurred()) {   /* the task's first: its dict (setdefault: one step) */
        PyObject *fresh = PyDict_New();
        owned = fresh == NULL ? NULL : PyDict_SetDefault(self->by_owner, task, fresh);
        Py_XDECREF(fresh);
    }
    if (owned == NULL || PyDict_SetItem(owned, a, Py_None) < 0) {
        rc = -1;   /* out of memory: the allocation goes back below */
        goto leave_lease;
    }
    if (pointer) {   /* an address the library holds from here, inside the lease: a release meanwhile
                      * reclaims it, and the pool handing it out again then sets it aside */
        PyObject *ptr = PyObject_GetAttr(a, name_ptr);
        int failed = ptr == NULL || PyDict_SetItem(self->by_pointer, ptr, a) < 0;
        Py_XDECREF(ptr);
        if (failed) {
            if (PyDict_DelItem(owned, a) < 0) PyErr_Clear();   /* never handed out */
            rc = -1;
            goto leave_lease;
        }
    }
    if (reused && PyDict_DelItem(owned, kept) < 0) PyErr_Clear();   /* the old handle: freed by the reissue */
    rc = 0;
leave_lease:
    if (lease_leave_checked(inside, me, "library allocator") < 0) rc = -1;
    if (rc == 0) {
        PyObject *n = PyIter_Next(self->allocated);
        if (n == NULL || (reused && count_one(self->frees_made) < 0)) {   /* a reissue: the library's free is made */
            rc = -1;
        } else {
            *out = a;
            a = NULL;
        }
        Py_XDECREF(n);
    }
    if (a != NULL) drop_made(a);   /* made but not handed out (an error after it) */
done:
    Py_XDECREF(kept);   /* reissued (its handle freed) or put back */
    Py_XDECREF(binding);
    Py_XDECREF(inside);
    Py_XDECREF(lease);
    Py_DECREF(task);
    return rc;
}

static int parse(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **size, PyObject **device,
                 PyObject **stream) {
    if (kwnames != NULL || nargs < 2 || nargs > 3) return 0;
    *size = args[0];
    *device = args[1];
    *stream = nargs == 3 ? args[2] : NULL;
    return 1;
}

/* allocate(size, device, stream=None) -> Allocation: LibraryAllocator.allocate. */
static PyObject *core_allocate(LibraryCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *size, *device, *stream, *a = NULL;
    if (parse(args, nargs, kwnames, &size, &device, &stream)) {
        int rc = allocate_common(self, size, device, stream, 0, &a);
        if (rc == 0) return a;
        if (rc < 0) return NULL;
    }
    return PyObject_Vectorcall(self->allocate_ref, args, nargsf, kwnames);
}

/* The owner of the allocation the library holds at address `ptr` (a new reference), or NULL with an
 * error. */
static PyObject *held_owner(LibraryCore *self, PyObject *ptr) {
    PyObject *held = PyDict_GetItemWithError(self->by_pointer, ptr);   /* borrowed */
    if (held == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "library allocator: an address it does not hold");
        return NULL;
    }
    return PyObject_GetAttr(held, name_owner);
}

/* The reference's allocate_pointer: the address, and where `owner` is not NULL its owner (new
 * references), or NULL with an error (an address without its owner stays with the library,
 * reclaimed with its owner). */
static PyObject *pointer_ref(LibraryCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames,
                             PyObject **owner) {
    PyObject *ptr = PyObject_Vectorcall(self->pointer_ref, args, nargsf, kwnames);
    if (ptr == NULL || owner == NULL) return ptr;
    if ((*owner = held_owner(self, ptr)) == NULL) Py_CLEAR(ptr);
    return ptr;
}

/* allocate_pointer: the address (a new reference), and where `owner` is not NULL the owner the
 * allocation was made for (a new reference), or NULL with an error. */
static PyObject *pointer_of(LibraryCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames,
                            PyObject **owner) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *size, *device, *stream, *a = NULL;
    int rc = parse(args, nargs, kwnames, &size, &device, &stream) ? allocate_common(self, size, device, stream, 1, &a)
                                                                  : HAND_OVER;
    if (rc < 0) return NULL;
    if (rc == HAND_OVER) return pointer_ref(self, args, nargsf, kwnames, owner);
    if (owner != NULL && (*owner = PyObject_GetAttr(a, name_owner)) == NULL) {
        drop_made(a);
        return NULL;
    }
    PyObject *ptr = PyObject_GetAttr(a, name_ptr);   /* recorded in by_pointer by allocate_common */
    Py_DECREF(a);
    if (ptr == NULL && owner != NULL) Py_CLEAR(*owner);
    return ptr;
}

/* allocate_pointer(size, device, stream=None) -> int: LibraryAllocator.allocate_pointer. */
static PyObject *core_allocate_pointer(LibraryCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return pointer_of(self, args, nargsf, kwnames, NULL);
}

/* allocate_pointer_owned(size, device, stream=None) -> (int, owner): LibraryAllocator.allocate_pointer_owned. */
static PyObject *core_allocate_pointer_owned(LibraryCore *self, PyObject *const *args, size_t nargsf,
                                             PyObject *kwnames) {
    PyObject *owner = NULL;
    PyObject *ptr = pointer_of(self, args, nargsf, kwnames, &owner);
    if (ptr == NULL) return NULL;
    PyObject *pair = PyTuple_Pack(2, ptr, owner);
    Py_DECREF(ptr);
    Py_DECREF(owner);
    return pair;   /* NULL (out of memory): the allocation stays with the library, reclaimed with its owner */
}

/* owner_for(device, stream) -> int | None: LibraryAllocator.owner_for (the same rules as
 * allocate_common's; -1 where it would refuse or hand the call to the reference). Runs no Python code
 * for the registry's own leases and thread-local. */
static PyObject *core_owner_for(LibraryCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "owner_for(device, stream)");
        return NULL;
    }
    PyObject *device = args[0], *stream = args[1];
    if (self->closed || !PyLong_CheckExact(device)) return PyLong_FromLong(-1);
    PyObject *pool = PyDict_GetItemWithError(self->pools, device);   /* borrowed */
    if (pool == NULL) return PyErr_Occurred() ? NULL : PyLong_FromLong(-1);
    int failed;
    PyObject *task = task_for(self, device, stream, &failed);
    if (failed) return NULL;
    if (task == NULL) Py_RETURN_NONE;
    PyObject *lease = PyDict_GetItemWithError(self->leases, task);   /* borrowed */
    PyObject *open = lease == NULL ? NULL : PyObject_GetAttr(lease, name_open);
    PyObject *binding = lease == NULL ? NULL : PyObject_GetAttr(lease, name_binding);
    int ok = open != NULL && binding != NULL && PyObject_IsTrue(open) == 1 && PyTuple_Check(binding) &&
             PyTuple_GET_SIZE(binding) >= 4 && PyObject_RichCompareBool(PyTuple_GET_ITEM(binding, 1), device, Py_EQ) == 1;
    Py_XDECREF(open);
    Py_XDECREF(binding);
    PyErr_Clear();   /* a lease not as documented: not reused */
    if (!ok) {
        Py_DECREF(task);
        return PyLong_FromLong(-1);
    }
    return task;
}

/* Queues (a, counted) for the next drain: one deque append, no lock (safe in a finalizer, on any
 * thread, inside the pool's own calls). 0, or -1 with an error. */
static int queue_free(LibraryCore *self, PyObject *a, PyObject *counted) {
    PyObject *item = PyTuple_Pack(2, a, counted);
    PyObject *r = item == NULL ? NULL : PyObject_CallOneArg(self->frees_append, item);
    Py_XDECREF(item);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* free(a): LibraryAllocator.free. */
static PyObject *core_free(LibraryCore *self, PyObject *a) {
    if (queue_free(self, a, Py_True) < 0) return NULL;
    Py_RETURN_NONE;
}

/* free_pointer(ptr): LibraryAllocator.free_pointer. An address it does not hold goes to the
 * reference, which raises InvalidFree and changes nothing. */
static PyObject *core_free_pointer(LibraryCore *self, PyObject *ptr) {
    PyObject *a = PyDict_GetItemWithError(self->by_pointer, ptr);   /* borrowed */
    if (a == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_CallOneArg(self->free_pointer_ref, ptr);
    }
    Py_INCREF(a);
    if (PyDict_DelItem(self->by_pointer, ptr) < 0 || queue_free(self, a, Py_True) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    Py_DECREF(a);
    PyObject *held = PyDict_GetItemWithError(self->set_aside, ptr);   /* borrowed */
    if (held == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    /* the late free of a reclaimed one: what was held back for it goes back */
    Py_INCREF(held);
    int rc = PyDict_DelItem(self->set_aside, ptr) < 0 ? -1 : queue_free(self, held, Py_False);
    Py_DECREF(held);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

#include "cupy_malloc.h"   /* CuPy's malloc and its allocations' owner: over allocate_common and queue_free */

static PyObject *core_close(LibraryCore *self, PyObject *unused) {
    (void)unused;
    self->closed = 1;   /* every later call goes to the reference, which refuses it */
    Py_RETURN_NONE;
}

static PyMethodDef core_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))core_allocate, METH_FASTCALL | METH_KEYWORDS,
     "allocate(size, device, stream=None) -> Allocation (LibraryAllocator.allocate)"},
    {"allocate_pointer", (PyCFunction)(void (*)(void))core_allocate_pointer, METH_FASTCALL | METH_KEYWORDS,
     "allocate_pointer(size, device, stream=None) -> int (LibraryAllocator.allocate_pointer)"},
    {"allocate_pointer_owned", (PyCFunction)(void (*)(void))core_allocate_pointer_owned, METH_FASTCALL | METH_KEYWORDS,
     "allocate_pointer_owned(size, device, stream=None) -> (int, owner) (LibraryAllocator.allocate_pointer_owned)"},
    {"owner_for", (PyCFunction)(void (*)(void))core_owner_for, METH_FASTCALL,
     "owner_for(device, stream) -> int | None (LibraryAllocator.owner_for)"},
    {"drain", (PyCFunction)core_drain, METH_NOARGS, "drain() -> int (LibraryAllocator.drain)"},
    {"free", (PyCFunction)core_free, METH_O, "free(allocation): queued (LibraryAllocator.free)"},
    {"free_pointer", (PyCFunction)core_free_pointer, METH_O, "free_pointer(ptr): queued (LibraryAllocator.free_pointer)"},
    {"cupy_malloc", (PyCFunction)core_cupy_malloc, METH_VARARGS,
     "cupy_malloc(allocator, unowned, pointer, get_device, current_stream, reference) -> CuPy's malloc (cupy.py)"},
    {"close", (PyCFunction)core_close, METH_NOARGS, "close(): every later call goes to the reference"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LibraryCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.allocators._library_core.LibraryCore",
    .tp_basicsize = sizeof(LibraryCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "LibraryAllocator's allocation in C (its Python methods are the reference)",
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_init = (initproc)core_init,
    .tp_new = PyType_GenericNew,
    .tp_methods = core_methods,
};

static struct PyModuleDef library_core_module = {PyModuleDef_HEAD_INIT, "_library_core",
                                    "the C twin of cudabridge.allocators' LibraryAllocator allocation", -1, NULL};

PyMODINIT_FUNC PyInit__library_core(void) {
    name_dict = PyUnicode_InternFromString("__dict__");
    name_task = PyUnicode_InternFromString("task");
    name_binding = PyUnicode_InternFromString("binding");
    name_ptr = PyUnicode_InternFromString("ptr");
    name_owner = PyUnicode_InternFromString("owner");
    name_pool = PyUnicode_InternFromString("_pool");
    name_free = PyUnicode_InternFromString("free");
    name_popleft = PyUnicode_InternFromString("popleft");
    name_appendleft = PyUnicode_InternFromString("appendleft");
    name_append = PyUnicode_InternFromString("append");
    name_pop = PyUnicode_InternFromString("pop");
    name_state = PyUnicode_InternFromString("_state");
    name_extra = PyUnicode_InternFromString("_extra");
    name_stream = PyUnicode_InternFromString("stream");
    name_size = PyUnicode_InternFromString("size");
    name_open = PyUnicode_InternFromString("open");
    zero = PyLong_FromLong(0);
    if (!name_dict || !name_task || !name_binding || !name_ptr || !name_owner || !name_pool || !name_free ||
        !name_popleft || !name_appendleft || !name_append || !name_pop || !name_state || !name_extra || !name_stream ||
        !name_size || !name_open || !zero)
        return NULL;
    if (PyType_Ready(&LibraryCoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&library_core_module);
    if (m == NULL) return NULL;
    Py_INCREF(&LibraryCoreType);
    if (PyModule_AddObject(m, "LibraryCore", (PyObject *)&LibraryCoreType) < 0) {
        Py_DECREF(&LibraryCoreType);
        Py_DECREF(m);
        return NULL;
    }
    if (cupy_malloc_ready(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
