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
 *               pop(handle, default), get(handle), released_with(handle) -> the task whose
 *               release took it, or None; refusal(handle, call) -> InvalidFree,
 *               refusal_many(handles) -> InvalidFree.
 *   allocators, frees   per GPU ordinal: the pool's allocate(size, stream, owner) and free(a); an
 *               allocation's _state reads 2 (RELEASED, memory/allocation.py) once its task's
 *               release reclaimed it.
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
 * A free of a handle its task's release took (released_with) has no effect and counts nothing, as
 * one whose allocation the release reclaimed between the pop and the pool's free: the release
 * freed it and counted it as a leak.
 * Free-threaded builds are not supported (the loader falls back to Python there).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#include "cuda_driver.h"
#include "native_api.h"
#include "staging_pool.h"

#define GPU_BITS 6
#define MAX_GPUS (1 << GPU_BITS)
#define GPU_MASK (MAX_GPUS - 1)
#define SMALL_BATCH 16          /* free_many checks duplicates pairwise up to this many */
#define ALLOCATION_RELEASED 2   /* Allocation._state once its owner's release reclaimed it (allocation.py) */

static PyObject *s_stream, *s_gpu, *s_id, *s_ptr, *s_binding, *s_inside, *s_open, *s_task_id, *s_get,
    *s_refusal, *s_insert, *s_pop, *s_refusal_many, *s_free, *s_allocate, *s_free_many, *s_launch, *s_record, *s_synchronize, *s_clear,
    *s_recent, *s_owner, *s_size, *s_state, *s_limits, *s_max_dynamic_shared, *s_streams, *s_released_with;

typedef struct {
    PyObject_HEAD
    PyObject *lease_get;                /* leases.get(task) -> TaskLease | None */
    PyObject *lease_refusal;            /* leases.refusal(task, lease | None) -> UnknownTask */
    PyObject *h_insert, *h_pop, *h_get; /* the handle table's operations */
    PyObject *h_refusal;                /* handles.refusal(handle, call) -> InvalidFree */
    PyObject *h_refusal_many;           /* handles.refusal_many(handles) -> InvalidFree */
    PyObject *h_released;               /* handles.released_with(handle) -> task | None */
    PyObject *allocators[MAX_GPUS];     /* per GPU ordinal: pool.allocate(size, stream, owner) */
    PyObject *frees[MAX_GPUS];          /* per GPU ordinal: pool.free(allocation) */
    PyObject *set_device;               /* backend.set_device, or NULL with one GPU */
    PyObject *ref_stream, *ref_allocate, *ref_free, *ref_free_many, *ref_synchronize;  /* the Python reference */
    PyObject *ref_launch;               /* the reference launch, or NULL: no native kernels then */
    PyObject *launch_failed;            /* launch_failed(kernel id, CUresult) -> the exception to raise */
    PyObject *log_recent, *log_record, *log_clear;  /* the LaunchLog's dict (stream -> names), record, clear */
    PyObject *refuse_unusable;          /* set_unusable: call name -> DeviceUnusable; NULL while usable */
    PyObject *enter_buffer;             /* enable_copies: JavaHotPath._enter_buffer; NULL: no C copies */
    PyObject *enter_host_copy;          /* enable_copies: JavaHotPath.enter_host_copy, the reference */
    PyObject *copy_failed;              /* enable_copies: (call, CUresult) -> the exception to raise */
    /* enable_copies: the hot path's page-locked regions, as _check_address reads them: sorted
     * bases (list), base -> memory (dict), base -> its user (a pinned block or a registered
     * region: .streams, a set) (dict), task -> its unregistered ranges (sorted bases list,
     * base -> size dict) (dict) */
    PyObject *reg_bases, *reg_memory, *reg_blocks, *reg_unregistered;
    int staging_slots, staging_copy_threads;
    long long staging_slot_bytes, copies_in, copies_out, copies_direct, copies_address, copies_referred;
    struct native_kernel **kernels;     /* by kernel id (add_kernel); NULL: launched by the reference */
    Py_ssize_t nkernels;
    cb_CUcontext contexts[MAX_GPUS];    /* each GPU's primary context, retained at its first kernel */
    cb_staging_gpu *staging[MAX_GPUS];  /* each GPU's staging slots (enable_staging; staging_pool.h) */
    long long allocations, frees_count, batched_frees, batches, launches, launches_referred, synchronizes;
    cb_native_api api;                  /* handed out as the native_api capsule */
} HotCore;

/* A kernel the C launch takes: a CUDA function and everything its checks need, copied at
 * add_kernel (a kernel's function, parameters and limits never change, but for the dynamic
 * shared memory it is opted in to, re-read from the Python kernel after the reference opts in). */
typedef struct native_kernel {
    PyObject *kernel;          /* the Python kernel (its .limits.max_dynamic_shared) */
    PyObject *name;            /* str, recorded in the launch log */
    cb_CUfunction function;
    int gpu;
    int nparams;
    int max_threads;           /* min(the kernel's, the device's) threads per block */
    int max_block[3], max_grid[3];
    long long static_shared, shared_optin, dynamic_shared;   /* dynamic_shared: allowed without opting in */
    unsigned char kinds[CB_LAUNCH_MAX_ARGS];
    unsigned short offsets[CB_LAUNCH_MAX_ARGS];   /* each parameter's place in the parameter buffer */
    int param_bytes;
} native_kernel;

#define HC_FIELDS(X) X(lease_get); X(lease_refusal); X(h_insert); X(h_pop); X(h_get); X(h_refusal); \
    X(h_refusal_many); X(h_released); X(set_device); X(ref_stream); X(ref_allocate); X(ref_free); X(ref_free_many); \
    X(ref_synchronize); X(ref_launch); X(launch_failed); X(log_recent); X(log_record); X(log_clear); \
    X(refuse_unusable); X(enter_buffer); X(enter_host_copy); X(copy_failed); X(reg_bases); X(reg_memory); \
    X(reg_blocks); X(reg_unregistered)

static int hc_traverse(HotCore *self, visitproc visit, void *arg) {
#define V(f) Py_VISIT(self->f)
    HC_FIELDS(V);
#undef V
    for (int i = 0; i < MAX_GPUS; i++) {
        Py_VISIT(self->allocators[i]);
        Py_VISIT(self->frees[i]);
    }
    for (Py_ssize_t i = 0; i < self->nkernels; i++)
        if (self->kernels[i] != NULL) {
            Py_VISIT(self->kernels[i]->kernel);
            Py_VISIT(self->kernels[i]->name);
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
    for (Py_ssize_t i = 0; i < self->nkernels; i++)
        if (self->kernels[i] != NULL) {
            Py_CLEAR(self->kernels[i]->kernel);
            Py_CLEAR(self->kernels[i]->name);
            PyMem_Free(self->kernels[i]);
        }
    PyMem_Free(self->kernels);
    self->kernels = NULL;
    self->nkernels = 0;
    return 0;
}

static cb_driver g_driver;   /* resolved at the first add_kernel (under the GIL) */

static void staging_close_all(HotCore *self);

static void hc_dealloc(HotCore *self) {
    PyObject_GC_UnTrack(self);
    hc_clear(self);
    staging_close_all(self);
    for (int i = 0; i < MAX_GPUS; i++) {
        if (self->contexts[i] != NULL) {
            cb_CUdevice dev;
            if (g_driver.cuDeviceGet(&dev, i) == CB_CUDA_SUCCESS) g_driver.cuDevicePrimaryCtxRelease(dev);
        }
    }
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
    static char *kw[] = {"leases", "handles", "allocators", "frees", "set_device", "reference", "launch_log",
                         "launch_failed", NULL};
    PyObject *leases, *handles, *allocators, *frees, *set_device, *reference, *launch_log = Py_None,
             *launch_failed = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOO!|OO:HotCore", kw, &leases, &handles, &allocators, &frees,
                                     &set_device, &PyDict_Type, &reference, &launch_log, &launch_failed))
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
        take_callable(handles, s_released_with, "handles", &self->h_released) < 0 ||
        take_callable(reference, s_stream, "reference", &self->ref_stream) < 0 ||
        take_callable(reference, s_allocate, "reference", &self->ref_allocate) < 0 ||
        take_callable(reference, s_free, "reference", &self->ref_free) < 0 ||
        take_callable(reference, s_free_many, "reference", &self->ref_free_many) < 0 ||
        take_callable(reference, s_synchronize, "reference", &self->ref_synchronize) < 0)
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
    /* the launch: all three parts, or none (kernels are then launched by the reference alone) */
    if ((launch_log == Py_None) != (launch_failed == Py_None) ||
        (launch_log != Py_None && PyDict_GetItemWithError(reference, s_launch) == NULL)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "HotCore: launch_log, launch_failed and reference['launch'] come together");
        return -1;
    }
    if (launch_log != Py_None) {
        if (take_callable(reference, s_launch, "reference", &self->ref_launch) < 0 ||
            take_callable(launch_log, s_record, "launch_log", &self->log_record) < 0 ||
            take_callable(launch_log, s_clear, "launch_log", &self->log_clear) < 0)
            return -1;
        PyObject *recent = PyObject_GetAttr(launch_log, s_recent);
        if (recent == NULL) return -1;
        if (!PyDict_CheckExact(recent)) {
            PyErr_Format(PyExc_TypeError, "HotCore: launch_log.recent must be a dict, got %R", recent);
            Py_DECREF(recent);
            return -1;
        }
        self->log_recent = recent;
        if (!PyCallable_Check(launch_failed)) {
            PyErr_SetString(PyExc_TypeError, "HotCore: launch_failed must be callable");
            return -1;
        }
        Py_INCREF(launch_failed);
        self->launch_failed = launch_failed;
    }
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

/* The lease protocol's enter (TaskLeases.enter), the guard every operation that queues work for
 * a task passes: look the lease up, append this thread's ident to lease.inside, then read
 * lease.open. Returns 0 inside, with new references in *lease and *inside (leave with
 * leave_lease(*inside, *ident), then drop both); -1 with the error raised and nothing held: not
 * bound (leases.refusal(task, None)), its release begun (leases.refusal(task, lease)), or the
 * protocol's objects not as documented. */
static int enter_lease(HotCore *self, PyObject *task, PyObject **lease, PyObject **inside, unsigned long *ident) {
    PyObject *l = lookup_lease(self, task);
    if (l == NULL) return -1;
    PyObject *in = PyObject_GetAttr(l, s_inside);
    if (in == NULL || !PyList_CheckExact(in)) {
        if (in != NULL)
            PyErr_Format(PyExc_TypeError, "the lease protocol: lease.inside must be a list, got %R", in);
        Py_XDECREF(in);
        Py_DECREF(l);
        return -1;
    }
    unsigned long me_id = PyThread_get_thread_ident();
    PyObject *me = PyLong_FromUnsignedLong(me_id);
    if (me == NULL || PyList_Append(in, me) < 0) {
        Py_XDECREF(me);
        Py_DECREF(in);
        Py_DECREF(l);
        return -1;
    }
    Py_DECREF(me);
    PyObject *open = PyObject_GetAttr(l, s_open);
    int is_open = open ? PyObject_IsTrue(open) : -1;
    Py_XDECREF(open);
    if (is_open <= 0) {   /* an error, or the release has begun (the task may be bound again since) */
        leave_lease(in, me_id);
        if (is_open == 0) refuse_task(self, task, l);
        Py_DECREF(in);
        Py_DECREF(l);
        return -1;
    }
    *lease = l;
    *inside = in;
    *ident = me_id;
    return 0;
}

/* raise refuse_unusable(call): the GPU is unusable after a sticky error. NULL always. */
static PyObject *refuse_unusable(HotCore *self, const char *call) {
    PyObject *c = PyUnicode_FromString(call);
    if (c == NULL) return NULL;
    PyObject *exc = PyObject_CallOneArg(self->refuse_unusable, c);
    Py_DECREF(c);
    return raise_exc(exc);
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

static long long int_attr(PyObject *obj, PyObject *name, int *ok);

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


/* kernels -------------------------------------------------------------------------------------
 * The launch's C path, for kernels added with add_kernel (CUDA functions): the same checks as the
 * reference (JavaHotPath.launch, then TaskRegistry.launch and CudaKernel.launch), in the same
 * order of effect: every argument and limit is checked before anything is queued, the kernel is
 * queued inside the task's lease (the lease protocol, as allocate), and recorded in the launch
 * log. A launch this path does not take as it stands (a kernel not added, a limit or an argument
 * it would refuse, a larger dynamic shared memory to opt in to, a buffer not the task's own) goes
 * to the reference whole, outside any lease: the reference refuses it with its own words, or
 * launches it (an opt-in), so both paths give the same outcome for the same input. */

#define LOG_KEEP 64   /* LaunchLog.KEEP: past twice this a stream's list is handed to record() */

/* bytes of each kind code (KIND_CODES: ptr i8 i16 i32 i64 f32 f64 bool) */
static const int kind_size[8] = {8, 1, 2, 4, 8, 4, 8, 1};

/* GPU gpu's primary context, retained once (released at dealloc); the driver loaded. 0, or -1
 * with RuntimeError raised. */
static int retain_context(HotCore *self, int gpu) {
    if (self->contexts[gpu] != NULL) return 0;
    if (cb_driver_load(&g_driver) < 0) {
        PyErr_Format(PyExc_RuntimeError, "the CUDA driver's entry points: %s", g_driver.failure);
        return -1;
    }
    cb_CUdevice dev;
    cb_CUcontext ctx = NULL;
    cb_CUresult rc = g_driver.cuDeviceGet(&dev, gpu);
    if (rc == CB_CUDA_SUCCESS) rc = g_driver.cuDevicePrimaryCtxRetain(&ctx, dev);
    if (rc != CB_CUDA_SUCCESS) {
        char buf[32];
        PyErr_Format(PyExc_RuntimeError, "retaining GPU %d's primary context failed: %s", gpu,
                     cb_driver_error_name(&g_driver, rc, buf, sizeof buf));
        return -1;
    }
    self->contexts[gpu] = ctx;
    return 0;
}

/* add_kernel(kernel_id, kernel, name, function, gpu, kinds, device_limits, kernel_max_threads,
 *            static_shared, dynamic_shared)
 * device_limits: (max threads per block, max block x, y, z, max grid x, y, z, shared per block
 * opt-in). Resolves the driver's entry points and retains the GPU's primary context the first
 * time; RuntimeError saying why when it cannot (no libcuda). */
static PyObject *hc_add_kernel(HotCore *self, PyObject *args) {
    long long kid, st, dyn, optin;
    PyObject *kernel, *name, *kinds;
    unsigned long long function;
    int gpu, dmt, kmt, mb[3], mg[3];
    if (!PyArg_ParseTuple(args, "LOUKiO!(iiiiiiiL)iLL:add_kernel", &kid, &kernel, &name, &function, &gpu,
                          &PyBytes_Type, &kinds, &dmt, &mb[0], &mb[1], &mb[2], &mg[0], &mg[1], &mg[2], &optin,
                          &kmt, &st, &dyn))
        return NULL;
    if (self->ref_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "add_kernel: this HotCore was built without the launch's parts");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(kinds);
    const unsigned char *kb = (const unsigned char *)PyBytes_AS_STRING(kinds);
    if (kid < 1 || kid > (1 << 24) || gpu < 0 || gpu >= MAX_GPUS || n > CB_LAUNCH_MAX_ARGS || function == 0) {
        PyErr_Format(PyExc_ValueError, "add_kernel: kernel id %lld, GPU %d, %zd parameters, function %llu", kid, gpu,
                     n, function);
        return NULL;
    }
    native_kernel *k = PyMem_Calloc(1, sizeof *k);
    if (k == NULL) return PyErr_NoMemory();
    int at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kb[i] >= 8) {
            PyMem_Free(k);
            PyErr_Format(PyExc_ValueError, "add_kernel: unknown kind code %d", kb[i]);
            return NULL;
        }
        int size = kind_size[kb[i]];
        at = (at + size - 1) / size * size;   /* natural alignment, as the C compiler lays them out */
        k->kinds[i] = kb[i];
        k->offsets[i] = (unsigned short)at;
        at += size;
    }
    if (retain_context(self, gpu) < 0) {
        PyMem_Free(k);
        return NULL;
    }
    if (kid >= self->nkernels) {
        Py_ssize_t cap = self->nkernels ? self->nkernels : 16;
        while (cap <= kid) cap *= 2;
        native_kernel **grown = PyMem_Realloc(self->kernels, cap * sizeof *grown);
        if (grown == NULL) {
            PyMem_Free(k);
            return PyErr_NoMemory();
        }
        memset(grown + self->nkernels, 0, (cap - self->nkernels) * sizeof *grown);
        self->kernels = grown;
        self->nkernels = cap;
    }
    Py_INCREF(kernel);
    Py_INCREF(name);
    k->kernel = kernel;
    k->name = name;
    k->function = (cb_CUfunction)(uintptr_t)function;
    k->gpu = gpu;
    k->nparams = (int)n;
    k->param_bytes = at;
    k->max_threads = dmt < kmt ? dmt : kmt;
    for (int i = 0; i < 3; i++) {
        k->max_block[i] = mb[i];
        k->max_grid[i] = mg[i];
    }
    k->static_shared = st;
    k->shared_optin = optin;
    k->dynamic_shared = dyn;
    native_kernel *old = self->kernels[kid];
    self->kernels[kid] = k;
    if (old != NULL) {
        Py_DECREF(old->kernel);
        Py_DECREF(old->name);
        PyMem_Free(old);
    }
    Py_RETURN_NONE;
}

/* The launch by the reference, its arguments boxed; after it succeeds, the kernel's dynamic shared
 * memory is re-read (the reference may have opted it in to more). */
static int refer_launch(HotCore *self, native_kernel *k, long long task, long long kid, const int *dims,
                        long long shared, const long long *values, const signed char *kinds,
                        const long long *offsets, int n) {
    PyObject *vals = PyTuple_New(n), *offs = PyTuple_New(n);
    PyObject *a[7] = {PyLong_FromLongLong(task), PyLong_FromLongLong(kid),
                      Py_BuildValue("(iiiiii)", dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]),
                      PyLong_FromLongLong(shared), vals, PyBytes_FromStringAndSize((const char *)kinds, n), offs};
    int ok = vals != NULL && offs != NULL;
    for (int i = 0; ok && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]), *o = PyLong_FromLongLong(offsets[i]);
        if (v == NULL || o == NULL) {
            Py_XDECREF(v);
            Py_XDECREF(o);
            ok = 0;
            break;
        }
        PyTuple_SET_ITEM(vals, i, v);
        PyTuple_SET_ITEM(offs, i, o);
    }
    for (int i = 0; i < 7; i++) ok &= a[i] != NULL;
    PyObject *r = ok ? PyObject_Vectorcall(self->ref_launch, a, 7, NULL) : NULL;
    for (int i = 0; i < 7; i++) Py_XDECREF(a[i]);
    if (r == NULL) return -1;
    Py_DECREF(r);
    self->launches_referred++;
    if (k != NULL && self->kernels[kid] == k) {
        PyObject *limits = PyObject_GetAttr(k->kernel, s_limits);
        PyObject *dyn = limits ? PyObject_GetAttr(limits, s_max_dynamic_shared) : NULL;
        long long d = dyn ? PyLong_AsLongLong(dyn) : -1;
        if (d >= 0) k->dynamic_shared = d;
        PyErr_Clear();   /* the launch is done; a limit not re-read only sends later launches here */
        Py_XDECREF(dyn);
        Py_XDECREF(limits);
    }
    return 0;
}

/* Whether the C path takes this launch before the task is looked up: the count, kinds, scalar
 * ranges, dimensions and shared memory the reference would accept without opting in. */
static int launch_fits(const native_kernel *k, const int *dims, long long shared, const long long *values,
                       const signed char *kinds, const long long *offsets, int n) {
    if (n != k->nparams || shared < 0 || shared > k->dynamic_shared || k->static_shared + shared > k->shared_optin)
        return 0;
    long long threads = 1;
    for (int i = 0; i < 3; i++) {
        if (dims[i] < 1 || dims[i] > k->max_grid[i] || dims[3 + i] < 1 || dims[3 + i] > k->max_block[i]) return 0;
        threads *= dims[3 + i];
    }
    if (threads > k->max_threads) return 0;
    for (int i = 0; i < n; i++) {
        long long v = values[i];
        if ((unsigned char)kinds[i] != k->kinds[i]) return 0;
        switch (k->kinds[i]) {
            case 0: if (offsets[i] < 0) return 0; break;
            case 1: if (v < INT8_MIN || v > INT8_MAX) return 0; break;
            case 2: if (v < INT16_MIN || v > INT16_MAX) return 0; break;
            case 3: if (v < INT32_MIN || v > INT32_MAX) return 0; break;
            case 5: if (v < 0 || v > UINT32_MAX) return 0; break;   /* a float's raw bits */
            case 7: if (v != 0 && v != 1) return 0; break;
            default: break;
        }
    }
    return 1;
}

/* long long value of an exact-int attribute, or -1 with *ok cleared (not an int, or an error). */
static long long int_attr(PyObject *obj, PyObject *name, int *ok) {
    PyObject *v = PyObject_GetAttr(obj, name);
    long long out = -1;
    if (v != NULL && PyLong_CheckExact(v)) out = PyLong_AsLongLong(v);
    if (v == NULL || !PyLong_CheckExact(v) || (out == -1 && PyErr_Occurred())) *ok = 0;
    Py_XDECREF(v);
    return out;
}

/* JavaHotPath.launch with its arguments unboxed (cb_native_api.launch). */
static int launch_raw(void *core, long long task, long long kid, const int dims[6], long long shared,
                      const long long *values, const signed char *kinds, const long long *offsets, int n) {
    HotCore *self = (HotCore *)core;
    if (self->refuse_unusable != NULL) {
        refuse_unusable(self, "launch");
        return -1;
    }
    native_kernel *k = kid > 0 && kid < self->nkernels ? self->kernels[kid] : NULL;
    if (k == NULL || n < 0 || !launch_fits(k, dims, shared, values, kinds, offsets, n))
        return refer_launch(self, k, task, kid, dims, shared, values, kinds, offsets, n);
    PyObject *task_obj = PyLong_FromLongLong(task);
    if (task_obj == NULL) return -1;
    PyObject *lease, *inside;
    unsigned long ident;
    if (enter_lease(self, task_obj, &lease, &inside, &ident) < 0) {
        Py_DECREF(task_obj);
        return -1;
    }
    int result = -1, refer = 0;
    cb_CUresult rc = CB_CUDA_SUCCESS;
    PyObject *b = NULL, *stream_obj = NULL;
    b = PyObject_GetAttr(lease, s_binding);
    if (b == NULL) goto left;
    int ok = 1;
    long long gpu = int_attr(b, s_gpu, &ok);
    if (!ok) goto left;
    if (gpu != k->gpu) {
        refer = 1;
        goto left;
    }
    stream_obj = PyObject_GetAttr(b, s_stream);
    if (stream_obj == NULL) goto left;
    unsigned long long stream = PyLong_AsUnsignedLongLong(stream_obj);
    if (stream == (unsigned long long)-1 && PyErr_Occurred()) goto left;
    /* the parameter buffer: each argument at its place, pointers resolved through the handle table */
    _Alignas(16) unsigned char params[CB_LAUNCH_MAX_ARGS * 8];
    void *ptrs[CB_LAUNCH_MAX_ARGS];
    for (int i = 0; i < n; i++) {
        unsigned char *at = params + k->offsets[i];
        ptrs[i] = at;
        long long v = values[i];
        if (k->kinds[i] != 0) {
            switch (kind_size[k->kinds[i]]) {
                case 1: { uint8_t x = (uint8_t)v; memcpy(at, &x, 1); break; }
                case 2: { uint16_t x = (uint16_t)v; memcpy(at, &x, 2); break; }
                case 4: { uint32_t x = (uint32_t)v; memcpy(at, &x, 4); break; }
                default: memcpy(at, &v, 8); break;
            }
            continue;
        }
        /* a buffer: live in the handle table, on this GPU (the handle's low bits), the task's own,
         * the offset inside it; anything else goes to the reference, which says what is wrong */
        if ((v & GPU_MASK) != gpu) {
            refer = 1;
            goto left;
        }
        PyObject *h = PyLong_FromLongLong(v);
        PyObject *a = h ? PyObject_CallOneArg(self->h_get, h) : NULL;
        Py_XDECREF(h);
        if (a == NULL) goto left;
        long long state = a != Py_None ? int_attr(a, s_state, &ok) : -1;
        long long owner = ok && state == 0 ? int_attr(a, s_owner, &ok) : -1;
        long long size = ok && owner == task ? int_attr(a, s_size, &ok) : -1;
        long long ptr = ok && offsets[i] <= size ? int_attr(a, s_ptr, &ok) : -1;
        Py_DECREF(a);
        PyErr_Clear();   /* an attribute that did not read as an int: the reference decides */
        if (!ok || state != 0 || owner != task || offsets[i] > size) {
            refer = 1;
            goto left;
        }
        unsigned long long address = (unsigned long long)ptr + (unsigned long long)offsets[i];
        memcpy(at, &address, 8);
    }
    /* the kernel's GPU's primary context, current for the call. A thread with no context (a
     * Java thread that never touched CUDA) keeps it, as the runtime's first call would have made
     * it current: later launches then cost no switch. A thread that had another GPU's context
     * current gets that one back. */
    cb_CUcontext prev = NULL, ctx = self->contexts[k->gpu];
    rc = g_driver.cuCtxGetCurrent(&prev);
    int switched = rc == CB_CUDA_SUCCESS && prev != ctx;
    if (switched) rc = g_driver.cuCtxSetCurrent(ctx);
    if (prev == NULL) switched = 0;
    if (rc == CB_CUDA_SUCCESS)
        rc = g_driver.cuLaunchKernel(k->function, (unsigned)dims[0], (unsigned)dims[1], (unsigned)dims[2],
                                     (unsigned)dims[3], (unsigned)dims[4], (unsigned)dims[5], (unsigned)shared,
                                     (cb_CUstream)(uintptr_t)stream, n ? ptrs : NULL, NULL);
    if (switched) g_driver.cuCtxSetCurrent(prev);
    if (rc == CB_CUDA_SUCCESS) {
        /* the launch log: appended in place while the list is short, else by its record() */
        PyObject *names = PyDict_GetItemWithError(self->log_recent, stream_obj);
        int logged;
        if (names != NULL && PyList_CheckExact(names) && PyList_GET_SIZE(names) < 2 * LOG_KEEP) {
            logged = PyList_Append(names, k->name);
        } else {
            PyObject *la[2] = {stream_obj, k->name};
            PyObject *r = PyErr_Occurred() ? NULL : PyObject_Vectorcall(self->log_record, la, 2, NULL);
            logged = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
        if (logged < 0) PyErr_WriteUnraisable(self->log_record);   /* the kernel is queued all the same */
        result = 0;
    }
left:
    leave_lease(inside, ident);
    Py_XDECREF(stream_obj);
    Py_XDECREF(b);
    Py_DECREF(inside);
    Py_DECREF(lease);
    Py_DECREF(task_obj);
    if (refer) {
        PyErr_Clear();
        return refer_launch(self, k, task, kid, dims, shared, values, kinds, offsets, n);
    }
    if (rc != CB_CUDA_SUCCESS) {   /* the driver refused the launch: the service words the error */
        PyObject *ka[2] = {PyLong_FromLongLong(kid), PyLong_FromLong(rc)};
        if (ka[0] != NULL && ka[1] != NULL) raise_exc(PyObject_Vectorcall(self->launch_failed, ka, 2, NULL));
        Py_XDECREF(ka[0]);
        Py_XDECREF(ka[1]);
        return -1;
    }
    if (result == 0) self->launches++;
    return result;
}

/* launch(task, kernel_id, dims, shared, values, kinds, offsets): JavaHotPath.launch. Forms other
 * than exact ints, a 6-tuple, tuples of exact ints and bytes go to the reference as given. */
static PyObject *hc_launch(HotCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->ref_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "launch: this HotCore was built without the launch's parts");
        return NULL;
    }
    if (kwnames != NULL || nargs != 7) return PyObject_Vectorcall(self->ref_launch, args, nargs, kwnames);
    PyObject *dims = args[2], *values = args[4], *kinds = args[5], *offsets = args[6];
    int simple = PyLong_CheckExact(args[0]) && PyLong_CheckExact(args[1]) && PyLong_CheckExact(args[3]) &&
                 PyTuple_CheckExact(dims) && PyTuple_GET_SIZE(dims) == 6 && PyTuple_CheckExact(values) &&
                 PyTuple_CheckExact(offsets) && PyBytes_CheckExact(kinds) &&
                 PyTuple_GET_SIZE(values) == PyBytes_GET_SIZE(kinds) &&
                 PyTuple_GET_SIZE(values) == PyTuple_GET_SIZE(offsets) &&
                 PyTuple_GET_SIZE(values) <= CB_LAUNCH_MAX_ARGS;
    int d[6];
    long long vals[CB_LAUNCH_MAX_ARGS], offs[CB_LAUNCH_MAX_ARGS];
    int n = simple ? (int)PyTuple_GET_SIZE(values) : 0;
    for (int i = 0; simple && i < 6; i++) {
        PyObject *x = PyTuple_GET_ITEM(dims, i);
        long v = PyLong_CheckExact(x) ? PyLong_AsLong(x) : -1;
        simple = v >= 1 && v <= INT32_MAX;
        d[i] = (int)v;
    }
    for (int i = 0; simple && i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(values, i), *o = PyTuple_GET_ITEM(offsets, i);
        int of1 = 0, of2 = 0;
        vals[i] = PyLong_CheckExact(v) ? PyLong_AsLongLongAndOverflow(v, &of1) : (of1 = 1, 0);
        offs[i] = PyLong_CheckExact(o) ? PyLong_AsLongLongAndOverflow(o, &of2) : (of2 = 1, 0);
        simple = !of1 && !of2;
    }
    int of = 0;
    long long task = simple ? PyLong_AsLongLongAndOverflow(args[0], &of) : 0;
    long long kid = simple && !of ? PyLong_AsLongLongAndOverflow(args[1], &of) : 0;
    long long shared = simple && !of ? PyLong_AsLongLongAndOverflow(args[3], &of) : 0;
    if (PyErr_Occurred()) PyErr_Clear();
    if (!simple || of) return PyObject_Vectorcall(self->ref_launch, args, nargs, kwnames);
    if (launch_raw(self, task, kid, d, shared, vals, (const signed char *)PyBytes_AS_STRING(kinds), offs, n) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* synchronize(task): waits for the task's stream with the GIL released (cuStreamSynchronize in its
 * GPU's primary context), then clears the stream's launch log, as the reference does after a
 * completed wait. Everything else goes to the reference: no driver (the emulated device, or
 * copies not enabled), no launch log, an unusable GPU, a task it cannot look up (the reference
 * raises the right error), and a wait that failed (a kernel fault: the reference waits again,
 * gets the sticky error, and raises KernelFault naming the candidates). */
static PyObject *hc_synchronize(HotCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->enter_buffer == NULL || self->log_clear == NULL || self->refuse_unusable != NULL || kwnames != NULL ||
        nargs != 1 || !PyLong_CheckExact(args[0]))
        return PyObject_Vectorcall(self->ref_synchronize, args, nargs, kwnames);
    PyObject *lease = lookup_lease(self, args[0]);
    PyObject *b = lease ? PyObject_GetAttr(lease, s_binding) : NULL;
    Py_XDECREF(lease);
    int ok = b != NULL;
    long long gpu = ok ? int_attr(b, s_gpu, &ok) : -1;
    PyObject *stream_obj = ok ? PyObject_GetAttr(b, s_stream) : NULL;
    Py_XDECREF(b);
    unsigned long long stream = stream_obj ? PyLong_AsUnsignedLongLong(stream_obj) : 0;
    if (stream_obj == NULL || PyErr_Occurred() || gpu < 0 || gpu >= MAX_GPUS || retain_context(self, (int)gpu) < 0) {
        PyErr_Clear();
        Py_XDECREF(stream_obj);
        return PyObject_Vectorcall(self->ref_synchronize, args, nargs, kwnames);
    }
    cb_CUcontext prev = NULL, ctx = self->contexts[gpu];
    cb_CUresult rc;
    Py_BEGIN_ALLOW_THREADS
    rc = g_driver.cuCtxGetCurrent(&prev);
    int switched = rc == CB_CUDA_SUCCESS && prev != ctx;   /* as the launch: a thread with none keeps it */
    if (switched) rc = g_driver.cuCtxSetCurrent(ctx);
    if (prev == NULL) switched = 0;
    if (rc == CB_CUDA_SUCCESS) rc = g_driver.cuStreamSynchronize((cb_CUstream)(uintptr_t)stream);
    if (switched) g_driver.cuCtxSetCurrent(prev);
    Py_END_ALLOW_THREADS
    if (rc != CB_CUDA_SUCCESS) {
        Py_DECREF(stream_obj);
        return PyObject_Vectorcall(self->ref_synchronize, args, nargs, kwnames);
    }
    self->synchronizes++;
    int logged = PyDict_Contains(self->log_recent, stream_obj);   /* else the log has nothing of it */
    PyObject *r = logged > 0 ? PyObject_CallOneArg(self->log_clear, stream_obj) : NULL;
    Py_DECREF(stream_obj);
    if (logged < 0 || (logged > 0 && r == NULL)) return NULL;
    Py_XDECREF(r);
    Py_RETURN_NONE;
}

/* copies ----------------------------------------------------------------------------------------
 * What the JNI library's copies on a GPU need from here (native_api.h): the buffer, its task's
 * lease entered the way every queued operation enters it, and for host memory outside the heap
 * whether the range is page-locked (one asynchronous DMA) or pageable (its GPU's staging slots,
 * bridge/staging_ring.h); then the service's words for a driver error. The C path below takes a
 * copy whose every check passes as it stands, with no Python frame; anything else (a dead handle,
 * a range outside the buffer or running past a region, a task not open, a range the task
 * unregistered, an object not as documented) goes whole to the reference, JavaHotPath's
 * _enter_buffer (heap arrays) or enter_host_copy, which refuses it in its own words or takes it:
 * both paths give the same outcome for the same input. */

/* The last of the sorted, exact-int `bases` (a list) below `probe`, in *at: 1 found, 0 none, -1
 * error (an item not an int). bisect_left(bases, probe) - 1, as the reference computes it. */
static int last_below(PyObject *bases, unsigned long long probe, PyObject **at) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(bases);
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        unsigned long long v = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(bases, mid));
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        if (v < probe) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return 0;
    *at = PyList_GET_ITEM(bases, lo - 1);
    return 1;
}

/* Whether `task`'s unregistered ranges (a (sorted bases, base -> size) pair in
 * reg_unregistered, or none) touch [address, probe): 1 yes, 0 no, -1 tables not as documented.
 * They never overlap: the last starting before probe ends last of those that do. A writer adds a
 * range's size before its base and removes its base before its size, so a base read here always
 * has its size. */
static int unregistered_touch(HotCore *self, long long task, unsigned long long address, unsigned long long probe) {
    PyObject *key = PyLong_FromLongLong(task);
    if (key == NULL) return -1;
    PyObject *table = PyDict_GetItemWithError(self->reg_unregistered, key);
    Py_DECREF(key);
    if (table == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(table) || PyTuple_GET_SIZE(table) != 2 || !PyList_CheckExact(PyTuple_GET_ITEM(table, 0)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(table, 1)))
        return -1;
    PyObject *base = NULL;
    int found = last_below(PyTuple_GET_ITEM(table, 0), probe, &base);
    if (found <= 0) return found;
    Py_INCREF(base);
    PyObject *size = PyDict_GetItemWithError(PyTuple_GET_ITEM(table, 1), base);
    unsigned long long b = PyLong_AsUnsignedLongLong(base);
    unsigned long long n = size != NULL ? PyLong_AsUnsignedLongLong(size) : 0;
    Py_DECREF(base);
    if (size == NULL || PyErr_Occurred()) return -1;
    return b + n > address;
}

/* The page-locked region [address, address + nbytes) lies in, as JavaHotPath._check_address finds
 * it: 1 inside the region starting at *base (of *size bytes), 0 pageable, -1 for the reference (a
 * range that runs past a region or into one, or one `task` (or no task) unregistered, or tables not
 * as documented). Regions never overlap: the one a range can touch is the last starting before
 * its end; no unregistered range overlaps a region. One bisect per table. No Python code runs
 * here: the tables are read as one state, between two of their writers' steps at worst, as the
 * reference reads them. */
static int find_region(HotCore *self, unsigned long long address, unsigned long long nbytes, long long task,
                       unsigned long long *base, unsigned long long *size) {
    PyObject *bases = self->reg_bases;
    if (!PyList_CheckExact(bases) || !PyDict_CheckExact(self->reg_memory) || !PyDict_CheckExact(self->reg_unregistered))
        return -1;
    unsigned long long end = address + nbytes, probe = address + (nbytes > 0 ? nbytes : 1);
    PyObject *key = NULL;
    int below = last_below(bases, probe, &key);
    if (below < 0) return -1;
    if (below) {
        Py_INCREF(key);
        unsigned long long b = PyLong_AsUnsignedLongLong(key);
        PyObject *mem = b == (unsigned long long)-1 && PyErr_Occurred() ? NULL : PyDict_GetItemWithError(self->reg_memory, key);
        Py_ssize_t n = mem != NULL ? PyObject_Size(mem) : -1;   /* a ctypes array or a memoryview: no frame */
        Py_DECREF(key);
        if (PyErr_Occurred()) return -1;
        if (n >= 0) {   /* else removed meanwhile: pageable, as the reference finds it */
            if (b <= address && end <= b + (unsigned long long)n) {
                *base = b;
                *size = (unsigned long long)n;
                return 1;
            }
            if (nbytes > 0 && address < b + (unsigned long long)n)
                return -1;   /* runs past the region: the reference refuses it */
        }
    }
    if (PyDict_GET_SIZE(self->reg_unregistered) == 0) return 0;
    int touch = unregistered_touch(self, 0, address, probe);
    if (touch == 0 && task != 0) touch = unregistered_touch(self, task, address, probe);
    if (touch != 0) {   /* one the task or the executor unregistered, or an error: the reference decides */
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* The stream of a DMA from or into the page-locked region at `base` goes into its user's streams
 * (reg_blocks[base].streams: a pinned buffer's reuse, a registration's unregister wait for it).
 * 0, or -1 (error raised, or a user not as documented). */
static int record_region_stream(HotCore *self, unsigned long long base, PyObject *stream) {
    if (!PyDict_CheckExact(self->reg_blocks)) return -1;
    PyObject *key = PyLong_FromUnsignedLongLong(base);
    PyObject *user = key != NULL ? PyDict_GetItemWithError(self->reg_blocks, key) : NULL;
    Py_XDECREF(key);
    if (user == NULL) return -1;
    Py_INCREF(user);
    PyObject *streams = PyObject_GetAttr(user, s_streams);
    Py_DECREF(user);
    int rc = streams != NULL && PySet_CheckExact(streams) && PySet_Add(streams, stream) == 0 ? 0 : -1;
    Py_XDECREF(streams);
    return rc;
}

/* The C path of enter_copy: 1 entered (out filled), 0 not taken (nothing held, no error: the
 * reference decides), -1 an error (nothing held). A page-locked range's stream is recorded in its
 * region's user here; the caller queues the DMA with the GIL still held and no Python code run in
 * between (the invariant at JavaHotPath._pinned: unregister_host waits for the streams recorded). */
static int fast_enter_copy(HotCore *self, long long handle, long long offset, long long nbytes, int kind,
                           unsigned long long host, cb_copy_lease *out) {
    if (offset < 0 || nbytes < 0) return 0;
    PyObject *h = PyLong_FromLongLong(handle);
    PyObject *a = h != NULL ? PyObject_CallOneArg(self->h_get, h) : NULL;
    Py_XDECREF(h);
    if (a == NULL) return -1;
    if (a == Py_None) {
        Py_DECREF(a);
        return 0;
    }
    int ok = 1;
    PyObject *owner = int_attr(a, s_state, &ok) == 0 && ok ? PyObject_GetAttr(a, s_owner) : NULL;
    if (owner == NULL || !PyLong_CheckExact(owner)) {
        Py_XDECREF(owner);
        Py_DECREF(a);
        PyErr_Clear();
        return 0;
    }
    PyObject *lease, *inside;
    unsigned long ident;
    if (enter_lease(self, owner, &lease, &inside, &ident) < 0) {   /* not bound, or its release begun */
        Py_DECREF(owner);
        Py_DECREF(a);
        PyErr_Clear();
        return 0;
    }
    /* inside the lease: the allocation read again (a free on another thread may have run) */
    long long task = PyLong_AsLongLong(owner);
    long long state = int_attr(a, s_state, &ok);
    long long size = ok ? int_attr(a, s_size, &ok) : 0;
    long long ptr = ok ? int_attr(a, s_ptr, &ok) : 0;
    PyObject *stream = ok ? PyObject_GetAttr(a, s_stream) : NULL;
    unsigned long long st = stream != NULL ? PyLong_AsUnsignedLongLong(stream) : 0;
    int taken = stream != NULL && !PyErr_Occurred() && state == 0 && offset <= size && nbytes <= size - offset;
    int pagelocked = 0;
    if (taken && kind != CB_HOST_HEAP) {
        unsigned long long base = 0, rsize = 0;
        int found = find_region(self, host, (unsigned long long)nbytes, task, &base, &rsize);
        taken = found >= 0;
        pagelocked = found == 1;
        if (pagelocked && record_region_stream(self, base, stream) < 0) taken = 0;
        if (PyErr_Occurred()) taken = 0;
    }
    Py_XDECREF(stream);
    Py_DECREF(owner);
    Py_DECREF(a);
    if (!taken) {
        PyErr_Clear();
        leave_lease(inside, ident);
        Py_DECREF(inside);
        Py_DECREF(lease);
        return 0;
    }
    out->lease = lease;
    out->inside = inside;
    out->ident = ident;
    out->address = (unsigned long long)ptr + (unsigned long long)offset;
    out->stream = (cb_CUstream)(uintptr_t)st;
    out->pagelocked = pagelocked;
    return 1;
}

/* The reference: _enter_buffer (a heap array) or enter_host_copy, whose (allocation, lease[,
 * page-locked]) is unpacked into out; -1 with its refusal raised. The reference may have let other
 * threads run after it looked the region up (an unregister_host among them), so a page-locked
 * range is looked up again here, with the GIL held from now until its DMA is queued, and its
 * stream recorded again: a region gone meanwhile is staged instead (out->pagelocked 0). */
static int refer_enter_copy(HotCore *self, long long handle, long long offset, long long nbytes, int to_device,
                            int kind, unsigned long long host, cb_copy_lease *out) {
    PyObject *r = NULL;
    if (kind == CB_HOST_HEAP) {
        PyObject *a[4] = {PyLong_FromLongLong(handle), PyUnicode_FromString(to_device ? "copy_in" : "copy_out"),
                          PyLong_FromLongLong(offset), PyLong_FromLongLong(nbytes)};
        if (a[0] && a[1] && a[2] && a[3]) r = PyObject_Vectorcall(self->enter_buffer, a, 4, NULL);
        for (int i = 0; i < 4; i++) Py_XDECREF(a[i]);
    } else {
        PyObject *a[6] = {PyLong_FromLongLong(handle), PyLong_FromLongLong(offset), PyLong_FromUnsignedLongLong(host),
                          PyLong_FromLongLong(nbytes), PyBool_FromLong(to_device), PyBool_FromLong(kind == CB_HOST_DIRECT)};
        if (a[0] && a[1] && a[2] && a[3] && a[4] && a[5]) r = PyObject_Vectorcall(self->enter_host_copy, a, 6, NULL);
        for (int i = 0; i < 6; i++) Py_XDECREF(a[i]);
    }
    if (r == NULL) return -1;
    /* (allocation, lease[, page-locked]), the lease entered on this thread: left on every way out from here */
    Py_ssize_t want = kind == CB_HOST_HEAP ? 2 : 3;
    PyObject *alloc = PyTuple_CheckExact(r) && PyTuple_GET_SIZE(r) == want ? PyTuple_GET_ITEM(r, 0) : NULL;
    PyObject *lease = alloc ? PyTuple_GET_ITEM(r, 1) : NULL;
    PyObject *inside = lease ? PyObject_GetAttr(lease, s_inside) : NULL;
    if (inside == NULL || !PyList_CheckExact(inside)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "enter_copy: the reference's result is not as documented");
        Py_XDECREF(inside);
        Py_DECREF(r);
        return -1;
    }
    int ok = 1;
    long long ptr = int_attr(alloc, s_ptr, &ok);
    long long stream = ok ? int_attr(alloc, s_stream, &ok) : 0;
    int pagelocked = ok && want == 3 ? PyObject_IsTrue(PyTuple_GET_ITEM(r, 2)) : 0;
    unsigned long ident = PyThread_get_thread_ident();
    if (!ok || pagelocked < 0) {
        leave_lease(inside, ident);
        Py_DECREF(inside);
        Py_DECREF(r);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "enter_copy: an allocation's ptr and stream are ints");
        return -1;
    }
    if (pagelocked) {
        unsigned long long base = 0, rsize = 0;
        PyObject *st = PyLong_FromLongLong(stream);
        if (st == NULL || find_region(self, host, (unsigned long long)nbytes, 0, &base, &rsize) != 1 ||
            record_region_stream(self, base, st) < 0) {
            pagelocked = 0;
            PyErr_Clear();
        }
        Py_XDECREF(st);
    }
    Py_INCREF(lease);
    out->lease = lease;
    out->inside = inside;
    out->ident = ident;
    out->address = (unsigned long long)ptr + (unsigned long long)offset;
    out->stream = (cb_CUstream)(uintptr_t)(unsigned long long)stream;
    out->pagelocked = pagelocked;
    Py_DECREF(r);
    return 0;
}

static int enter_copy(void *core, long long handle, long long offset, long long nbytes, int to_device, int kind,
                      unsigned long long host, cb_copy_lease *out) {
    HotCore *self = (HotCore *)core;
    if (self->refuse_unusable != NULL) {
        refuse_unusable(self, to_device ? "copy_in" : "copy_out");
        return -1;
    }
    if (kind != CB_HOST_HEAP && kind != CB_HOST_DIRECT && kind != CB_HOST_ADDRESS) {
        PyErr_Format(PyExc_ValueError, "enter_copy: host memory kind %d", kind);
        return -1;
    }
    long gpu = (long)((unsigned long long)handle & GPU_MASK);
    if (retain_context(self, (int)gpu) < 0) return -1;
    int taken = fast_enter_copy(self, handle, offset, nbytes, kind, host, out);
    if (taken < 0) return -1;
    if (!taken) {
        if (refer_enter_copy(self, handle, offset, nbytes, to_device, kind, host, out) < 0) return -1;
        self->copies_referred++;
    }
    out->context = self->contexts[gpu];
    out->gpu = (int)gpu;
    /* counted here but for what the reference counts itself (enter_host_copy) */
    if (kind == CB_HOST_HEAP) {
        if (to_device) self->copies_in++;
        else self->copies_out++;
    } else if (taken) {
        if (kind == CB_HOST_DIRECT) self->copies_direct++;
        else self->copies_address++;
    }
    return 0;
}

static void leave_copy(void *core, cb_copy_lease *l) {
    (void)core;
    if (l->inside == NULL) return;
    leave_lease((PyObject *)l->inside, l->ident);
    Py_DECREF((PyObject *)l->inside);
    Py_DECREF((PyObject *)l->lease);
    l->inside = l->lease = NULL;
}

static int driver_failed(void *core, const char *call, int rc) {
    HotCore *self = (HotCore *)core;
    PyObject *a[2] = {PyUnicode_FromString(call), PyLong_FromLong(rc)};
    if (a[0] && a[1]) raise_exc(PyObject_Vectorcall(self->copy_failed, a, 2, NULL));
    Py_XDECREF(a[0]);
    Py_XDECREF(a[1]);
    return -1;
}

/* native_api's staging_take and staging_give (staging_pool.h); a GPU with no staging slots gives
 * none (its copies take the pageable path). */
static int staging_take(void *core, int gpu, int want, int quick, cb_staging_lease *out, int *rc, const char **call) {
    HotCore *self = (HotCore *)core;
    cb_staging_gpu *s = gpu >= 0 && gpu < MAX_GPUS ? self->staging[gpu] : NULL;
    if (s == NULL) {
        out->n = 0;
        return 0;
    }
    return staging_take_gpu(&g_driver, s, gpu, want, quick, out, rc, call);
}

static void staging_give(void *core, cb_staging_lease *lease, int failed) {
    HotCore *self = (HotCore *)core;
    cb_staging_gpu *s = lease->gpu >= 0 && lease->gpu < MAX_GPUS ? self->staging[lease->gpu] : NULL;
    if (s != NULL && lease->n > 0) staging_give_gpu(s, lease, failed);
}

/* Closes GPU gpu's staging slots (their last DMAs waited for, events destroyed) unless a copy holds
 * some: 1 (also when it has none); 0 when some are held (nothing changed). The GPU's context is made
 * current for it. `free_struct`: the C twin is going; the struct goes too. */
static int staging_close_gpu(HotCore *self, int gpu, int free_struct) {
    cb_staging_gpu *s = self->staging[gpu];
    if (s == NULL) return 1;
    cb_CUcontext prev = NULL;
    int switched = g_driver.cuCtxGetCurrent != NULL && self->contexts[gpu] != NULL &&
                   g_driver.cuCtxGetCurrent(&prev) == CB_CUDA_SUCCESS && prev != self->contexts[gpu] &&
                   g_driver.cuCtxSetCurrent(self->contexts[gpu]) == CB_CUDA_SUCCESS;
    int closed = 1;
    if (free_struct) {
        staging_gpu_free(&g_driver, s);
        self->staging[gpu] = NULL;
    } else {
        closed = staging_gpu_close(&g_driver, s);
    }
    if (switched) g_driver.cuCtxSetCurrent(prev);
    return closed;
}

static void staging_close_all(HotCore *self) {
    for (int i = 0; i < MAX_GPUS; i++)
        if (self->staging[i] != NULL) staging_close_gpu(self, i, 1);
}

/* enable_staging(gpu, address, slots, slot_bytes, wait_s): GPU gpu's staging slots over the
 * page-locked memory at address (slots x slot_bytes; the caller keeps it until close_staging). */
static PyObject *hc_enable_staging(HotCore *self, PyObject *args) {
    int gpu, slots;
    unsigned long long address;
    long long slot_bytes;
    double wait_s;
    if (!PyArg_ParseTuple(args, "iKiLd:enable_staging", &gpu, &address, &slots, &slot_bytes, &wait_s)) return NULL;
    if (gpu < 0 || gpu >= MAX_GPUS || slots < 1 || slots > CB_STAGING_POOL_MAX || slot_bytes < 4096 ||
        slot_bytes > (1LL << 30) || address == 0 || !(wait_s >= 0)) {
        PyErr_Format(PyExc_ValueError, "enable_staging: GPU %d, %d slots (1 to %d) of %lld bytes (4 KiB to 1 GiB) "
                     "at %#llx, wait %g s", gpu, slots, CB_STAGING_POOL_MAX, slot_bytes, address, wait_s);
        return NULL;
    }
    if (self->staging[gpu] != NULL) {
        PyErr_Format(PyExc_ValueError, "enable_staging: GPU %d has staging slots already", gpu);
        return NULL;
    }
    if (retain_context(self, gpu) < 0) return NULL;
    self->staging[gpu] = staging_gpu_new((char *)(uintptr_t)address, slots, (size_t)slot_bytes, wait_s);
    if (self->staging[gpu] == NULL) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* close_staging(gpu) -> bool: closes the GPU's staging slots unless a copy holds some (False); once
 * closed, copies that need staging go through pageable memory and the memory may be freed. */
static PyObject *hc_close_staging(HotCore *self, PyObject *arg) {
    long gpu = PyLong_AsLong(arg);
    if (gpu == -1 && PyErr_Occurred()) return NULL;
    if (gpu < 0 || gpu >= MAX_GPUS) {
        PyErr_Format(PyExc_ValueError, "close_staging: GPU %ld", gpu);
        return NULL;
    }
    return PyBool_FromLong(staging_close_gpu(self, (int)gpu, 0));
}

/* staging_statistics() -> dict, summed over the GPUs (docs/glossary.md, staging_*). */
static PyObject *hc_staging_statistics(HotCore *self, PyObject *unused) {
    long long reserved = 0, slots = 0, held = 0, peak = 0, copies = 0, quick = 0, waits = 0, timeouts = 0, lost = 0;
    double waited = 0;
    for (int i = 0; i < MAX_GPUS; i++) {
        cb_staging_gpu *s = self->staging[i];
        if (s == NULL) continue;
        pthread_mutex_lock(&s->mu);
        reserved += (long long)s->n * (long long)s->slot_bytes;
        slots += s->n;
        held += s->held;
        peak += s->held_peak;
        copies += s->copies;
        quick += s->quick;
        waits += s->waits;
        timeouts += s->timeouts;
        lost += s->lost;
        waited += s->waited_s;
        pthread_mutex_unlock(&s->mu);
    }
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L}", "staging_reserved_bytes", reserved,
                         "staging_slots", slots, "staging_slots_held", held, "staging_slots_held_peak", peak,
                         "staging_copies", copies, "staging_quick_copies", quick, "staging_waits", waits,
                         "staging_wait_us_total", (long long)(waited * 1e6), "staging_fallbacks_pageable", timeouts,
                         "staging_slots_lost", lost);
}

/* enable_copies(enter_buffer, copy_failed, slots, slot_bytes, copy_threads): the JNI library's
 * heap-array copies go through pinned staging from now on (a CUDA device: the driver loads here). */
static PyObject *hc_enable_copies(HotCore *self, PyObject *args) {
    PyObject *enter, *enter_host, *failed, *regions;
    int slots, copy_threads;
    long long slot_bytes;
    if (!PyArg_ParseTuple(args, "OOOO!iLi:enable_copies", &enter, &enter_host, &failed, &PyTuple_Type, &regions,
                          &slots, &slot_bytes, &copy_threads))
        return NULL;
    if (copy_threads < 1 || copy_threads > 64) {
        PyErr_Format(PyExc_ValueError, "enable_copies: 1 to 64 copy threads, got %d", copy_threads);
        return NULL;
    }
    if (!PyCallable_Check(enter) || !PyCallable_Check(enter_host) || !PyCallable_Check(failed)) {
        PyErr_SetString(PyExc_TypeError, "enable_copies: enter_buffer, enter_host_copy and copy_failed must be callable");
        return NULL;
    }
    if (PyTuple_GET_SIZE(regions) != 4 || !PyList_CheckExact(PyTuple_GET_ITEM(regions, 0)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(regions, 1)) || !PyDict_CheckExact(PyTuple_GET_ITEM(regions, 2)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(regions, 3))) {
        PyErr_SetString(PyExc_TypeError, "enable_copies: regions is (bases list, memory dict, blocks dict, "
                                         "unregistered dict)");
        return NULL;
    }
    if (slots < 1 || slots > CB_STAGING_MAX_SLOTS || slot_bytes < 4096 || slot_bytes > (1LL << 30)) {
        PyErr_Format(PyExc_ValueError, "enable_copies: 1 to %d slots of 4 KiB to 1 GiB, got %d of %lld bytes",
                     CB_STAGING_MAX_SLOTS, slots, slot_bytes);
        return NULL;
    }
    if (cb_driver_load(&g_driver) < 0) {
        PyErr_Format(PyExc_RuntimeError, "the CUDA driver's entry points: %s", g_driver.failure);
        return NULL;
    }
#define TAKE(field, obj) do { PyObject *o_ = (obj); Py_INCREF(o_); Py_XSETREF(self->field, o_); } while (0)
    TAKE(enter_buffer, enter);
    TAKE(enter_host_copy, enter_host);
    TAKE(copy_failed, failed);
    TAKE(reg_bases, PyTuple_GET_ITEM(regions, 0));
    TAKE(reg_memory, PyTuple_GET_ITEM(regions, 1));
    TAKE(reg_blocks, PyTuple_GET_ITEM(regions, 2));
    TAKE(reg_unregistered, PyTuple_GET_ITEM(regions, 3));
#undef TAKE
    self->staging_slots = slots;
    self->staging_slot_bytes = slot_bytes;
    self->staging_copy_threads = copy_threads;
    Py_RETURN_NONE;
}

static void api_capsule_free(PyObject *capsule) {
    Py_XDECREF((PyObject *)PyCapsule_GetContext(capsule));
}

/* native_api() -> the capsule cb_native_api (native_api.h) for the bridge's JNI library. */
static PyObject *hc_native_api(HotCore *self, PyObject *unused) {
    if (self->ref_launch == NULL) Py_RETURN_NONE;
    self->api.version = CB_NATIVE_API_VERSION;
    self->api.core = self;
    self->api.launch = launch_raw;
    self->api.driver = self->enter_buffer != NULL ? &g_driver : NULL;
    self->api.staging_slots = self->staging_slots;
    self->api.staging_slot_bytes = self->staging_slot_bytes;
    self->api.staging_copy_threads = self->staging_copy_threads;
    self->api.staging_take = staging_take;
    self->api.staging_give = staging_give;
    self->api.enter_copy = enter_copy;
    self->api.leave_copy = leave_copy;
    self->api.driver_failed = driver_failed;
    PyObject *c = PyCapsule_New(&self->api, CB_NATIVE_API_CAPSULE, api_capsule_free);
    if (c == NULL) return NULL;
    Py_INCREF(self);
    if (PyCapsule_SetContext(c, self) < 0) {
        Py_DECREF(self);
        Py_DECREF(c);
        return NULL;
    }
    return c;
}

/* set_unusable(refusal): from now on allocate and launch raise refusal(call) (a sticky error). */
static PyObject *hc_set_unusable(HotCore *self, PyObject *refusal) {
    if (!PyCallable_Check(refusal)) {
        PyErr_SetString(PyExc_TypeError, "set_unusable: refusal must be callable");
        return NULL;
    }
    Py_INCREF(refusal);
    Py_XSETREF(self->refuse_unusable, refusal);
    Py_RETURN_NONE;
}

static PyObject *hc_counts(HotCore *self, PyObject *unused) {
    return Py_BuildValue("{sLsLsLsLsLsLsLsLsLsLsLsL}", "synchronizes", self->synchronizes, "allocations",
                         self->allocations, "frees", self->frees_count, "batched_frees", self->batched_frees,
                         "batches", self->batches, "launches", self->launches, "launches_referred",
                         self->launches_referred, "copies_in", self->copies_in, "copies_out", self->copies_out,
                         "copies_direct", self->copies_direct, "copies_address", self->copies_address,
                         "copies_referred", self->copies_referred);
}

#define FASTCALL_KW(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS
static PyMethodDef hc_methods[] = {
    {"allocate", FASTCALL_KW(hc_allocate), "allocate(task, size) -> (handle, device pointer), as JavaHotPath.allocate."},
    {"free", FASTCALL_KW(hc_free), "free(hid), as JavaHotPath.free."},
    {"free_many", FASTCALL_KW(hc_free_many), "free_many(hids) -> count, as JavaHotPath.free_many."},
    {"stream", FASTCALL_KW(hc_stream), "stream(task) -> (stream, GPU ordinal), as JavaHotPath.stream."},
    {"synchronize", FASTCALL_KW(hc_synchronize), "synchronize(task), as JavaHotPath.synchronize (the wait "
     "without the GIL)."},
    {"launch", FASTCALL_KW(hc_launch), "launch(task, kernel_id, dims, shared, values, kinds, offsets), as "
     "JavaHotPath.launch."},
    {"add_kernel", (PyCFunction)hc_add_kernel, METH_VARARGS, "add_kernel(kernel_id, kernel, name, function, gpu, "
     "kinds, device_limits, kernel_max_threads, static_shared, dynamic_shared): launch it here."},
    {"native_api", (PyCFunction)hc_native_api, METH_NOARGS, "the cb_native_api capsule (native_api.h), or None."},
    {"enable_copies", (PyCFunction)hc_enable_copies, METH_VARARGS, "enable_copies(enter_buffer, copy_failed, "
     "slots, slot_bytes, copy_threads): heap-array copies from Java through pinned staging."},
    {"enable_staging", (PyCFunction)hc_enable_staging, METH_VARARGS, "enable_staging(gpu, address, slots, "
     "slot_bytes, wait_s): the GPU's staging slots over that page-locked memory."},
    {"close_staging", (PyCFunction)hc_close_staging, METH_O, "close_staging(gpu) -> bool: end the GPU's staging "
     "slots unless a copy holds some."},
    {"staging_statistics", (PyCFunction)hc_staging_statistics, METH_NOARGS, "the staging slots' statistics."},
    {"set_unusable", (PyCFunction)hc_set_unusable, METH_O, "set_unusable(refusal): allocate and launch raise "
     "refusal(call) from now on."},
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
    INTERN(s_free_many, "free_many"); INTERN(s_launch, "launch"); INTERN(s_record, "record");
    INTERN(s_synchronize, "synchronize"); INTERN(s_clear, "clear");
    INTERN(s_recent, "recent"); INTERN(s_owner, "owner"); INTERN(s_size, "size"); INTERN(s_state, "_state");
    INTERN(s_limits, "limits"); INTERN(s_max_dynamic_shared, "max_dynamic_shared"); INTERN(s_streams, "streams");
    INTERN(s_released_with, "released_with");
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
