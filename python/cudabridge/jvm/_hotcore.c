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
 *
 * Its parts, by concern, each a header of static functions included below (one translation unit,
 * one extension, as setup.py builds it from this file alone; each header says what it holds and
 * its invariants):
 *   hotcore_leases.h    the lease twin: TaskLeases.enter / leave, and the refusal of a task
 *   hotcore_memory.h    stream, allocate, free, free_many: the handle table and the pool
 *   hotcore_kernels.h   the kernel registry (add_kernel) and the launch; synchronize
 *   hotcore_copies.h    copy admission: enter_copy / leave_copy, the page-locked regions
 *   hotcore_exports.h   the exported ABI: the native_api capsule (native_api.h) and each GPU's
 *                       staging slots behind its staging_take / staging_give (staging_pool.h)
 * This file holds HotCore's state and life (the struct, GC, the constructor), the helpers every
 * part uses, and the Python type and module.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#include "cuda_driver.h"
#include "native_api.h"
#include "staging_pool.h"
#include "lease_protocol.h"   /* the lease protocol's join and leave, shared with the other C twins */

#define GPU_BITS 6
#define MAX_GPUS (1 << GPU_BITS)
#define GPU_MASK (MAX_GPUS - 1)
#define SMALL_BATCH 16          /* free_many checks duplicates pairwise up to this many */
#define ALLOCATION_RELEASED 2   /* Allocation._state once its owner's release reclaimed it (allocation.py) */

static PyObject *s_stream, *s_gpu, *s_id, *s_ptr, *s_binding, *s_inside, *s_task_id, *s_get,
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
    /* enable_copies: the service's page-locked regions (RegionTables), as PageLockedRegions.lookup reads them: sorted
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
    /* The driver the C paths call: the installed one (g_driver, resolved at first use) or the
     * table of the constructor's `driver` (backend.native_driver: the emulated device's), whose
     * owner is kept in driver_owner for this HotCore's life, released last (after the contexts
     * and the staging slots, which call it). NULL until resolved. */
    const cb_driver *driver;
    PyObject *driver_owner;
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
    unsigned char kinds[CB_LAUNCH_MAX_ARGS];      /* kind codes (PARAM_KINDS' order; 0 is ptr) */
    unsigned char sizes[CB_LAUNCH_MAX_ARGS];      /* each parameter's bytes (PARAM_KINDS) */
    long long lo[CB_LAUNCH_MAX_ARGS], hi[CB_LAUNCH_MAX_ARGS];   /* the raw values Java may send for it */
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

static cb_driver g_driver;   /* the installed driver's, resolved at first use (under the GIL) */

static void staging_close_all(HotCore *self);

static void hc_dealloc(HotCore *self) {
    PyObject_GC_UnTrack(self);
    hc_clear(self);
    staging_close_all(self);
    for (int i = 0; i < MAX_GPUS; i++) {
        if (self->contexts[i] != NULL) {
            cb_CUdevice dev;
            if (self->driver->cuDeviceGet(&dev, i) == CB_CUDA_SUCCESS) self->driver->cuDevicePrimaryCtxRelease(dev);
        }
    }
    Py_CLEAR(self->driver_owner);
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

/* The constructor's `driver`: None or an object whose `address` is 0 (the installed driver,
 * resolved at first use) or a cb_driver table's, ready, valid while the object lives. */
static int take_driver(HotCore *self, PyObject *driver) {
    if (self->driver != NULL || self->driver_owner != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "HotCore: already initialized");
        return -1;
    }
    if (driver == Py_None) return 0;
    PyObject *a = PyObject_GetAttrString(driver, "address");
    if (a == NULL) return -1;
    unsigned long long address = PyLong_Check(a) ? PyLong_AsUnsignedLongLong(a) : (unsigned long long)-1;
    Py_DECREF(a);
    if (address == (unsigned long long)-1) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "HotCore: driver.address must be an int, got %R", driver);
        return -1;
    }
    if (address == 0) return 0;
    const cb_driver *d = (const cb_driver *)(uintptr_t)address;
    if (!d->ready) {
        PyErr_Format(PyExc_ValueError, "HotCore: the driver table of %R is not ready", driver);
        return -1;
    }
    Py_INCREF(driver);
    self->driver_owner = driver;
    self->driver = d;
    return 0;
}

static int hc_init(HotCore *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"leases", "handles", "allocators", "frees", "set_device", "reference", "launch_log",
                         "launch_failed", "driver", NULL};
    PyObject *leases, *handles, *allocators, *frees, *set_device, *reference, *launch_log = Py_None,
             *launch_failed = Py_None, *driver = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOO!|OOO:HotCore", kw, &leases, &handles, &allocators, &frees,
                                     &set_device, &PyDict_Type, &reference, &launch_log, &launch_failed, &driver))
        return -1;
    if (take_driver(self, driver) < 0) return -1;
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

/* shared by the parts ---------------------------------------------------------------------- */

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

/* raise refuse_unusable(call): the GPU is unusable after a sticky error. NULL always. */
static PyObject *refuse_unusable(HotCore *self, const char *call) {
    PyObject *c = PyUnicode_FromString(call);
    if (c == NULL) return NULL;
    PyObject *exc = PyObject_CallOneArg(self->refuse_unusable, c);
    Py_DECREF(c);
    return raise_exc(exc);
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

/* self->driver, resolving the installed driver's entry points the first time (no table was
 * given). 0, or -1 with RuntimeError raised (no libcuda: the Python paths run instead). */
static int resolve_driver(HotCore *self) {
    if (self->driver != NULL) return 0;
    if (cb_driver_load(&g_driver) < 0) {
        PyErr_Format(PyExc_RuntimeError, "the CUDA driver's entry points: %s", g_driver.failure);
        return -1;
    }
    self->driver = &g_driver;
    return 0;
}

/* GPU gpu's primary context, retained once (released at dealloc); the driver resolved. 0, or -1
 * with RuntimeError raised. */
static int retain_context(HotCore *self, int gpu) {
    if (self->contexts[gpu] != NULL) return 0;
    if (resolve_driver(self) < 0) return -1;
    cb_CUdevice dev;
    cb_CUcontext ctx = NULL;
    cb_CUresult rc = self->driver->cuDeviceGet(&dev, gpu);
    if (rc == CB_CUDA_SUCCESS) rc = self->driver->cuDevicePrimaryCtxRetain(&ctx, dev);
    if (rc != CB_CUDA_SUCCESS) {
        char buf[32];
        PyErr_Format(PyExc_RuntimeError, "retaining GPU %d's primary context failed: %s", gpu,
                     cb_driver_error_name(self->driver, rc, buf, sizeof buf));
        return -1;
    }
    self->contexts[gpu] = ctx;
    return 0;
}

/* the parts, in the order they use each other (see the top) ----------------------------------- */
#include "hotcore_leases.h"
#include "hotcore_memory.h"
#include "hotcore_kernels.h"
#include "hotcore_copies.h"
#include "hotcore_exports.h"

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
    INTERN(s_binding, "binding"); INTERN(s_inside, "inside"); INTERN(s_task_id, "task_id");
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
