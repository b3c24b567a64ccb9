/*
 * The memory pool's fast paths in C: allocate from the requesting stream's own bin, and free
 * into the freeing stream's bin. Semantics are exactly those of the pure-Python paths in
 * python_fast_path.py (`PythonFastPath.allocate` / `.free`), which stay the reference and
 * the fallback; everything else (the slow path, fenced frees, errors) is called back in Python
 * through the pool's FastPathHooks (fast_path_hooks.py).
 *
 * Why C: the Python fast path is about ten container operations and one object of ten slots
 * per pair; the interpreter overhead, not the work, dominates (the two paths' pairs side by side:
 * bench/RESULTS.md, "bench_core, H200 (run 4, current code)").
 * Why it is thread-safe: this code runs with the GIL held and only calls back into Python on
 * the slow, fenced or error paths, after it has finished touching the shared containers, so
 * each fast path is one atomic step (the Python version relies on single container operations
 * being atomic; this is strictly stronger). Free-threaded builds are not supported by this
 * module; the pool falls back to Python there.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

/* ---- AllocationBase: the fields of an Allocation, as C slots ---------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *ptr, *size, *id, *stream, *owner, *block, *arena, *pool, *extra, *state;
} AllocationBase;

static int alloc_traverse(AllocationBase *self, visitproc visit, void *arg) {
    Py_VISIT(self->ptr); Py_VISIT(self->size); Py_VISIT(self->id); Py_VISIT(self->stream);
    Py_VISIT(self->owner); Py_VISIT(self->block); Py_VISIT(self->arena); Py_VISIT(self->pool);
    Py_VISIT(self->extra); Py_VISIT(self->state);
    return 0;
}

static int alloc_clear(AllocationBase *self) {
    Py_CLEAR(self->ptr); Py_CLEAR(self->size); Py_CLEAR(self->id); Py_CLEAR(self->stream);
    Py_CLEAR(self->owner); Py_CLEAR(self->block); Py_CLEAR(self->arena); Py_CLEAR(self->pool);
    Py_CLEAR(self->extra); Py_CLEAR(self->state);
    return 0;
}

static void alloc_dealloc(AllocationBase *self) {
    /* Instances are of Python subclasses: their subtype_dealloc drops the type's reference. */
    PyObject_GC_UnTrack(self);
    alloc_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define MEMBER(name, field) {name, T_OBJECT_EX, offsetof(AllocationBase, field), 0, NULL}
static PyMemberDef alloc_members[] = {
    MEMBER("ptr", ptr), MEMBER("size", size), MEMBER("id", id), MEMBER("stream", stream),
    MEMBER("owner", owner), MEMBER("_block", block), MEMBER("_arena", arena), MEMBER("_pool", pool),
    MEMBER("_extra", extra), MEMBER("_state", state),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AllocationBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.memory._fastpath.AllocationBase",
    .tp_basicsize = sizeof(AllocationBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The slots of an Allocation (see allocation.py).",
    .tp_traverse = (traverseproc)alloc_traverse,
    .tp_clear = (inquiry)alloc_clear,
    .tp_dealloc = (destructor)alloc_dealloc,
    .tp_members = alloc_members,
    .tp_new = PyType_GenericNew,
};


/* ---- BlockBase and ArenaBase: the slots of Block and StreamArena -------------------------- */
/* The fast paths read and write these on every call; as C slots they cost a load, not an
 * attribute lookup. Python subclasses (block.py, stream_arena.py) add the behaviour. */

typedef struct {
    PyObject_HEAD
    PyObject *ptr, *size, *chunk, *prev, *next, *state, *epoch, *extra;
} BlockBase;

typedef struct {
    PyObject_HEAD
    PyObject *name, *handle, *kind, *eager, *bins, *recent, *epoch, *completed, *fences, *owner, *trim_at;
} ArenaBase;

/* Every field of these structs after the header is a PyObject *. */
#define SLOT_COUNT(T) ((Py_ssize_t)((sizeof(T) - sizeof(PyObject)) / sizeof(PyObject *)))
#define SLOT_ARRAY(o) ((PyObject **)((char *)(o) + sizeof(PyObject)))

#define DEFINE_SLOT_FUNCS(T, prefix)                                                    \
    static int prefix##_traverse(PyObject *self, visitproc visit, void *arg) {          \
        PyObject **f = SLOT_ARRAY(self);                                               \
        for (Py_ssize_t i = 0; i < SLOT_COUNT(T); i++)                                  \
            Py_VISIT(f[i]);                                                             \
        return 0;                                                                       \
    }                                                                                   \
    static int prefix##_clear(PyObject *self) {                                         \
        PyObject **f = SLOT_ARRAY(self);                                               \
        for (Py_ssize_t i = 0; i < SLOT_COUNT(T); i++)                                  \
            Py_CLEAR(f[i]);                                                             \
        return 0;                                                                       \
    }                                                                                   \
    static void prefix##_dealloc(PyObject *self) {                                      \
        PyObject_GC_UnTrack(self);                                                      \
        prefix##_clear(self);                                                           \
        Py_TYPE(self)->tp_free(self);                                                   \
    }

DEFINE_SLOT_FUNCS(BlockBase, block)
DEFINE_SLOT_FUNCS(ArenaBase, arena)

#define BMEMBER(name, field) {name, T_OBJECT_EX, offsetof(BlockBase, field), 0, NULL}
static PyMemberDef block_members[] = {
    BMEMBER("ptr", ptr), BMEMBER("size", size), BMEMBER("chunk", chunk), BMEMBER("prev", prev),
    BMEMBER("next", next), BMEMBER("state", state), BMEMBER("epoch", epoch), BMEMBER("extra", extra),
    {NULL, 0, 0, 0, NULL},
};
#define AMEMBER(name, field) {name, T_OBJECT_EX, offsetof(ArenaBase, field), 0, NULL}
static PyMemberDef arena_members[] = {
    AMEMBER("name", name), AMEMBER("handle", handle), AMEMBER("kind", kind), AMEMBER("eager", eager),
    AMEMBER("bins", bins), AMEMBER("recent", recent), AMEMBER("epoch", epoch),
    AMEMBER("completed", completed), AMEMBER("fences", fences), AMEMBER("_owner", owner),
    AMEMBER("trim_at", trim_at),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BlockBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.memory._fastpath.BlockBase",
    .tp_basicsize = sizeof(BlockBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The slots of a Block (see block.py).",
    .tp_traverse = block_traverse,
    .tp_clear = block_clear,
    .tp_dealloc = block_dealloc,
    .tp_members = block_members,
    .tp_new = PyType_GenericNew,
};

static PyTypeObject ArenaBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.memory._fastpath.ArenaBase",
    .tp_basicsize = sizeof(ArenaBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The slots of a StreamArena (see stream_arena.py).",
    .tp_traverse = arena_traverse,
    .tp_clear = arena_clear,
    .tp_dealloc = arena_dealloc,
    .tp_members = arena_members,
    .tp_new = PyType_GenericNew,
};

/* Replace a slot's value (a new reference is taken). */
static inline void set_slot(PyObject **slot, PyObject *value) {
    Py_INCREF(value);
    Py_XSETREF(*slot, value);
}

/* ---- SerialWorker: the pool's serialized section, on a thread of its own ---------------------
 *
 * Python code can be interrupted between any two bytecodes: a signal handler (KeyboardInterrupt
 * on the main thread) or PyThreadState_SetAsyncExc raises wherever the thread happens to be. The
 * pool's locked steps (the slow path, growth, coalescing, trims, releases) move blocks between
 * containers in several bytecodes each, so an interruption there loses blocks. CPython offers
 * no way to defer those exceptions, but both only ever reach *the thread they target*, and a
 * thread that is waiting in C runs no bytecode. So on the C path every locked step runs on this
 * worker's own thread (started lazily, gone after IDLE_EXIT_S idle, never seen by
 * threading.enumerate()), while the caller waits here with the GIL released, uninterruptibly;
 * an exception arriving meanwhile is raised in the caller once the step is complete and its
 * result (an allocation, registered with its owner) is back. Exceptions the step raises itself
 * (OutOfDeviceMemory, ...) travel back to the caller. A call made on the worker's own thread,
 * or while the interpreter finalizes, runs inline.
 */
#include <pthread.h>
#include <time.h>
#include <errno.h>

#define IDLE_EXIT_S 2

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;            /* guards every field below; never held while taking the GIL */
    pthread_cond_t wake;           /* a request arrived, or stop */
    pthread_cond_t done_cv;        /* the request was answered */
    pthread_mutex_t callers;       /* one request at a time */
    PyObject *fn, *args;           /* the request (references owned by the waiting caller) */
    PyObject *result, *et, *ev, *etb;  /* the answer: a result or a fetched exception */
    int has_request, done, serving, stopping;
    unsigned long ident;           /* the serving thread, 0 when none */
    long long calls;               /* requests served on the worker's thread */
} SerialWorker;

static int sw_init(SerialWorker *self, PyObject *args, PyObject *kwds) {
    if (!PyArg_ParseTuple(args, ":SerialWorker"))
        return -1;
    return 0;
}

static PyObject *sw_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    SerialWorker *self = (SerialWorker *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    pthread_mutex_init(&self->mu, NULL);
    pthread_mutex_init(&self->callers, NULL);
    pthread_cond_init(&self->wake, NULL);
    pthread_cond_init(&self->done_cv, NULL);
    return (PyObject *)self;
}

static void sw_dealloc(SerialWorker *self) {
    /* The serving thread holds a reference while it runs, so none is left here. */
    pthread_mutex_destroy(&self->mu);
    pthread_mutex_destroy(&self->callers);
    pthread_cond_destroy(&self->wake);
    pthread_cond_destroy(&self->done_cv);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* serve(): the worker thread's body; returns after IDLE_EXIT_S idle or stop(). */
static PyObject *sw_serve(SerialWorker *self, PyObject *unused) {
    unsigned long me = PyThread_get_thread_ident();
    pthread_mutex_lock(&self->mu);
    self->ident = me;
    pthread_mutex_unlock(&self->mu);
    for (;;) {
        PyObject *fn = NULL, *args = NULL;
        int quit = 0;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mu);
        while (!self->has_request && !self->stopping) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += IDLE_EXIT_S;
            if (pthread_cond_timedwait(&self->wake, &self->mu, &until) == ETIMEDOUT && !self->has_request)
                break;
        }
        if (self->has_request) {
            fn = self->fn;
            args = self->args;
            self->has_request = 0;
        } else {
            /* Idle or stopping: leave; a later request starts a new thread. */
            self->serving = 0;
            self->ident = 0;
            quit = 1;
        }
        pthread_mutex_unlock(&self->mu);
        Py_END_ALLOW_THREADS
        if (quit)
            Py_RETURN_NONE;
        PyObject *r = PyObject_Call(fn, args, NULL);
        PyObject *et = NULL, *ev = NULL, *etb = NULL;
        if (r == NULL) {
            PyErr_Fetch(&et, &ev, &etb);
            PyErr_NormalizeException(&et, &ev, &etb);
            if (etb != NULL && ev != NULL)
                PyException_SetTraceback(ev, etb);
        }
        self->calls++;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mu);
        self->result = r;
        self->et = et; self->ev = ev; self->etb = etb;
        self->done = 1;
        pthread_cond_broadcast(&self->done_cv);
        pthread_mutex_unlock(&self->mu);
        Py_END_ALLOW_THREADS
    }
}

/* Start a serving thread (GIL held): _thread.start_new_thread(self.serve, ()). */
static int sw_start(SerialWorker *self) {
    PyObject *mod = PyImport_ImportModule("_thread");
    if (mod == NULL)
        return -1;
    PyObject *serve = PyObject_GetAttrString((PyObject *)self, "serve");
    PyObject *empty = PyTuple_New(0);
    PyObject *r = (serve && empty) ? PyObject_CallMethod(mod, "start_new_thread", "OO", serve, empty) : NULL;
    Py_XDECREF(serve);
    Py_XDECREF(empty);
    Py_DECREF(mod);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* The core of call(): run fn(*args) on the worker's thread and return its result (new reference)
 * or NULL with its exception set. */
static PyObject *sw_run(SerialWorker *self, PyObject *fn, PyObject *args) {
    unsigned long me = PyThread_get_thread_ident();
    int inline_call;
    pthread_mutex_lock(&self->mu);
    inline_call = self->ident == me || self->stopping;
    pthread_mutex_unlock(&self->mu);
    if (inline_call || _Py_IsFinalizing())
        return PyObject_Call(fn, args, NULL);
    Py_INCREF(fn);
    Py_INCREF(args);
    int need_start = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->callers);
    pthread_mutex_lock(&self->mu);
    self->fn = fn;
    self->args = args;
    self->done = 0;
    self->has_request = 1;
    if (!self->serving) {
        self->serving = 1;
        need_start = 1;
    } else {
        pthread_cond_signal(&self->wake);
    }
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    if (need_start && sw_start(self) < 0) {
        /* No thread: withdraw the request and run it here (it is still unanswered). */
        PyErr_Clear();
        pthread_mutex_lock(&self->mu);
        self->has_request = 0;
        self->serving = 0;
        pthread_mutex_unlock(&self->mu);
        pthread_mutex_unlock(&self->callers);
        PyObject *r = PyObject_Call(fn, args, NULL);
        Py_DECREF(fn);
        Py_DECREF(args);
        return r;
    }
    PyObject *r, *et, *ev, *etb;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    while (!self->done)
        pthread_cond_wait(&self->done_cv, &self->mu);
    r = self->result; et = self->et; ev = self->ev; etb = self->etb;
    self->result = self->et = self->ev = self->etb = NULL;
    self->done = 0;
    self->fn = self->args = NULL;
    pthread_mutex_unlock(&self->mu);
    pthread_mutex_unlock(&self->callers);
    Py_END_ALLOW_THREADS
    Py_DECREF(fn);
    Py_DECREF(args);
    if (r == NULL)
        PyErr_Restore(et, ev, etb);
    return r;
}

static PyObject *sw_call(SerialWorker *self, PyObject *args) {
    if (PyTuple_GET_SIZE(args) < 1) {
        PyErr_SetString(PyExc_TypeError, "call(fn, *args) needs fn");
        return NULL;
    }
    PyObject *fn = PyTuple_GET_ITEM(args, 0);
    PyObject *rest = PyTuple_GetSlice(args, 1, PyTuple_GET_SIZE(args));
    if (rest == NULL)
        return NULL;
    PyObject *r = sw_run(self, fn, rest);
    Py_DECREF(rest);
    return r;
}

static PyObject *sw_stop(SerialWorker *self, PyObject *unused) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->callers);   /* after any request in flight */
    pthread_mutex_lock(&self->mu);
    self->stopping = 1;
    pthread_cond_broadcast(&self->wake);
    pthread_mutex_unlock(&self->mu);
    pthread_mutex_unlock(&self->callers);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *sw_get_thread(SerialWorker *self, void *closure) {
    unsigned long ident;
    pthread_mutex_lock(&self->mu);
    ident = self->ident;
    pthread_mutex_unlock(&self->mu);
    if (ident == 0)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(ident);
}

static PyObject *sw_get_calls(SerialWorker *self, void *closure) {
    return PyLong_FromLongLong(self->calls);
}

static PyMethodDef sw_methods[] = {
    {"call", (PyCFunction)sw_call, METH_VARARGS,
     "call(fn, *args): fn(*args) on the worker's thread; the caller waits uninterruptibly."},
    {"serve", (PyCFunction)sw_serve, METH_NOARGS, "the worker thread's body (started by call)."},
    {"stop", (PyCFunction)sw_stop, METH_NOARGS, "end the worker thread; later calls run inline."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef sw_getset[] = {
    {"thread", (getter)sw_get_thread, NULL, "ident of the serving thread, or None", NULL},
    {"calls", (getter)sw_get_calls, NULL, "requests served on the worker's thread", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SerialWorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.memory._fastpath.SerialWorker",
    .tp_basicsize = sizeof(SerialWorker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Runs a pool's locked steps on a thread that no signal or async exception reaches.",
    .tp_dealloc = (destructor)sw_dealloc,
    .tp_methods = sw_methods,
    .tp_getset = sw_getset,
    .tp_init = (initproc)sw_init,
    .tp_new = sw_new,
};

/* ---- FastPath: one per pool ---------------------------------------------------------------
 *
 * It is handed the pool's FastPathHooks (fast_path_hooks.py) and sees nothing else of the pool:
 * the shared containers it changes (each change one step under the GIL) and the pool's steps it
 * calls back, read once here by their public names. */

typedef struct {
    PyObject_HEAD
    PyObject *arenas;      /* hooks.arenas: dict, stream handle -> StreamArena */
    PyObject *live;        /* hooks.live: set of live Allocations */
    PyObject *owners;      /* hooks.owners: dict, owner -> dict of Allocations */
    PyObject *all_arenas;  /* hooks.all_arenas: list of every StreamArena */
    PyTypeObject *alloc_type;
    PyObject *pool;        /* hooks.pool: each Allocation's _pool */
    PyObject *slow, *resolve_arena, *refuse_size, *refuse_free;  /* the pool's steps, from the hooks */
    PyObject *fence_stamps, *place_pending;  /* ... for frees behind events or several streams */
    PyObject *queue_waits, *return_unwaited;  /* ... for blocks the caller's own stream must wait for */
    PyObject *trim_recent;  /* ... to bound an arena's reclaim queue */
    SerialWorker *worker;  /* runs the locked steps (slow, place_pending, return_unwaited) off this thread */
    PyObject *allocate_normalized, *free_normalized;  /* ... for arguments that are not exact ints */
    PyObject *live_state, *alive, *freed;  /* LIVE (block state), ALIVE / FREED (allocation) */
    PyObject *stream_query;  /* backend.stream_query, or None: no cross-stream step */
    long long next_id;
    long long steals, stream_polls;
    long long in_use, peak;  /* block bytes lent out, exact under the GIL (the ledger's job) */
    int (*cu_stream_query)(void *);  /* the driver's cuStreamQuery, or NULL: call stream_query */
    Py_ssize_t max_request;
} FastPath;

/* Method names, interned once. */
static PyObject *s_append, *s_allocate, *s_free;

#define FP_OBJECTS(X) X(arenas) X(live) X(owners) X(all_arenas) X(alloc_type) X(pool) X(slow) \
    X(resolve_arena) X(refuse_size) X(refuse_free) X(fence_stamps) X(place_pending) X(queue_waits) \
    X(return_unwaited) X(trim_recent) X(worker) X(allocate_normalized) X(free_normalized) \
    X(live_state) X(alive) X(freed) X(stream_query)

static int fp_traverse(FastPath *self, visitproc visit, void *arg) {
#define VISIT(f) Py_VISIT(self->f);
    FP_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int fp_clear(FastPath *self) {
#define CLEAR(f) Py_CLEAR(self->f);
    FP_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void fp_dealloc(FastPath *self) {
    PyObject_GC_UnTrack(self);
    fp_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* hooks.<name> into *slot (new reference), checked to be of `type` (or callable when NULL). */
static int hook(PyObject *hooks, const char *name, PyTypeObject *type, PyObject **slot) {
    PyObject *v = PyObject_GetAttrString(hooks, name);
    if (v == NULL)
        return -1;
    if (type != NULL ? !PyObject_TypeCheck(v, type) : !PyCallable_Check(v)) {
        PyErr_Format(PyExc_TypeError, "FastPath: hooks.%s must be %s, got %R", name,
                     type != NULL ? type->tp_name : "callable", v);
        Py_DECREF(v);
        return -1;
    }
    Py_XSETREF(*slot, v);
    return 0;
}

static int fp_init(FastPath *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"hooks", "worker", "alloc_type", "live_state", "alive", "freed", "first_id",
                         "stream_query", "cu_stream_query", NULL};
    PyObject *hooks, *worker, *alloc_type = NULL, *live_state = NULL, *alive = NULL, *freed = NULL;
    PyObject *stream_query = NULL;
    unsigned long long cu_query = 0;
    long long first_id = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!|$O!OOOLOK", kw, &hooks, &SerialWorkerType, &worker,
                                     &PyType_Type, &alloc_type, &live_state, &alive, &freed, &first_id,
                                     &stream_query, &cu_query))
        return -1;
    if (!live_state || !alive || !freed || !stream_query) {
        PyErr_SetString(PyExc_TypeError, "FastPath needs live_state, alive, freed and stream_query");
        return -1;
    }
    if (alloc_type == NULL || !PyType_IsSubtype((PyTypeObject *)alloc_type, &AllocationBaseType)) {
        PyErr_SetString(PyExc_TypeError, "alloc_type must derive from AllocationBase");
        return -1;
    }
    PyObject *max_request = PyObject_GetAttrString(hooks, "max_request");
    Py_ssize_t max = max_request ? PyLong_AsSsize_t(max_request) : -1;
    Py_XDECREF(max_request);
    if (max == -1 && PyErr_Occurred())
        return -1;
    fp_clear(self);
    if (hook(hooks, "pool", &PyBaseObject_Type, &self->pool) < 0 ||
        hook(hooks, "arenas", &PyDict_Type, &self->arenas) < 0 ||
        hook(hooks, "all_arenas", &PyList_Type, &self->all_arenas) < 0 ||
        hook(hooks, "live", &PySet_Type, &self->live) < 0 ||
        hook(hooks, "owners", &PyDict_Type, &self->owners) < 0 ||
        hook(hooks, "resolve_arena", NULL, &self->resolve_arena) < 0 ||
        hook(hooks, "refuse_size", NULL, &self->refuse_size) < 0 ||
        hook(hooks, "refuse_free", NULL, &self->refuse_free) < 0 ||
        hook(hooks, "allocate_normalized", NULL, &self->allocate_normalized) < 0 ||
        hook(hooks, "free_normalized", NULL, &self->free_normalized) < 0 ||
        hook(hooks, "allocate_slow", NULL, &self->slow) < 0 ||
        hook(hooks, "queue_waits", NULL, &self->queue_waits) < 0 ||
        hook(hooks, "return_unwaited", NULL, &self->return_unwaited) < 0 ||
        hook(hooks, "fence_stamps", NULL, &self->fence_stamps) < 0 ||
        hook(hooks, "place_pending", NULL, &self->place_pending) < 0 ||
        hook(hooks, "trim_recent", NULL, &self->trim_recent) < 0) {
        fp_clear(self);
        return -1;
    }
    Py_INCREF(alloc_type); self->alloc_type = (PyTypeObject *)alloc_type;
    Py_INCREF(live_state); self->live_state = live_state;
    Py_INCREF(alive); self->alive = alive;
    Py_INCREF(freed); self->freed = freed;
    Py_INCREF(worker); self->worker = (SerialWorker *)worker;
    Py_INCREF(stream_query); self->stream_query = stream_query;
    self->max_request = max;
    self->steals = self->stream_polls = 0;
    self->in_use = self->peak = 0;
    self->cu_stream_query = (int (*)(void *))(uintptr_t)cu_query;
    self->next_id = first_id;
    return 0;
}

/* Call a Python method that must raise (the pool's error reporters); never returns a value. */
static PyObject *raise_via(PyObject *fn, PyObject *arg) {
    PyObject *r = PyObject_CallOneArg(fn, arg);
    if (r != NULL) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_SystemError, "cudabridge fast path: error reporter returned");
    }
    return NULL;
}

/* The arena of `stream` (new reference), resolved as StreamTable.resolve does. */
static PyObject *resolve_arena(FastPath *self, PyObject *stream, PyObject *call) {
    PyObject *arena = PyDict_GetItemWithError(self->arenas, stream);
    if (arena != NULL) {
        Py_INCREF(arena);
        return arena;
    }
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return NULL;
        PyErr_Clear();  /* unhashable: let resolve_arena say what is wrong */
    }
    PyObject *args[2] = {stream, call};
    return PyObject_Vectorcall(self->resolve_arena, args, 2, NULL);
}

static int push_to_bin(ArenaBase *arena, PyObject *blk, PyObject *size) {
    /* bins.setdefault(size, []).append(blk); recent.append(blk) */
    if (arena->bins == NULL || !PyDict_Check(arena->bins) || arena->recent == NULL) {
        PyErr_SetString(PyExc_SystemError, "stream arena without bins");
        return -1;
    }
    PyObject *lst = PyDict_GetItemWithError(arena->bins, size);
    if (lst == NULL) {
        if (PyErr_Occurred())
            return -1;
        PyObject *fresh = PyList_New(0);
        if (fresh == NULL)
            return -1;
        lst = PyDict_SetDefault(arena->bins, size, fresh);
        Py_DECREF(fresh);
        if (lst == NULL)
            return -1;
    }
    if (PyList_Append(lst, blk) < 0)
        return -1;
    PyObject *r = PyObject_CallMethodOneArg(arena->recent, s_append, blk);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Bound `recent` (see StreamArena.trim_recent): amortized, so rarely taken. Called once a free
 * is complete: the trim (a locked step, on the worker) may raise, the free stands. */
static int maybe_trim(FastPath *self, ArenaBase *arena) {
    Py_ssize_t len = PyObject_Length(arena->recent);
    Py_ssize_t limit = arena->trim_at ? PyLong_AsSsize_t(arena->trim_at) : 0;
    if (len < 0 || (limit == -1 && PyErr_Occurred()))
        return -1;
    if (len > limit) {
        PyObject *r = PyObject_CallOneArg(self->trim_recent, (PyObject *)arena);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* Arguments of allocate(size, stream, owner=None). */
static int parse_allocate(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **vals) {
    static const char *const names[] = {"size", "stream", "owner"};
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    vals[0] = vals[1] = NULL;
    vals[2] = Py_None;
    if (nargs > 3) {
        PyErr_Format(PyExc_TypeError, "allocate() takes at most 3 arguments (%zd given)", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        vals[i] = args[i];
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int j;
        for (j = 0; j < 3; j++)
            if (PyUnicode_CompareWithASCIIString(key, names[j]) == 0)
                break;
        if (j == 3 || j < nargs) {
            PyErr_Format(PyExc_TypeError, "allocate() got an unexpected or repeated keyword argument %R", key);
            return -1;
        }
        vals[j] = args[nargs + k];
    }
    if (vals[0] == NULL || vals[1] == NULL) {
        PyErr_SetString(PyExc_TypeError, "allocate() needs size and stream");
        return -1;
    }
    return 0;
}


/* Whether a Python int stamp <= another (both are small ints in practice); -1 on error. */
static int stamp_le(PyObject *a, PyObject *b) {
    if (a == NULL || b == NULL) {
        PyErr_SetString(PyExc_SystemError, "cudabridge fast path: missing epoch stamp");
        return -1;
    }
    return PyObject_RichCompareBool(a, b, Py_LE);
}

/* Take the last block of `lst` whose state is `o` and stamp <= `limit`; new reference or NULL. */
static PyObject *take_passed(PyObject *lst, ArenaBase *o, PyObject *limit, int last_only) {
    Py_ssize_t n = PyList_GET_SIZE(lst);
    for (Py_ssize_t i = n - 1; i >= 0 && (!last_only || i == n - 1); i--) {
        BlockBase *b = (BlockBase *)PyList_GET_ITEM(lst, i);
        if (!PyObject_TypeCheck((PyObject *)b, &BlockBaseType) || b->state != (PyObject *)o)
            continue;
        int le = stamp_le(b->epoch, limit);
        if (le < 0)
            return NULL;
        if (!le)
            continue;
        Py_INCREF(b);
        if (PyList_SetSlice(lst, i, i + 1, NULL) < 0) {
            Py_DECREF(b);
            return NULL;
        }
        return (PyObject *)b;
    }
    return NULL;
}

/* The twin of StreamOrderingCore.steal (stream_ordering.py): a block of exactly `rkey` bytes that
 * another stream has passed, known or seen with at most one stream query. Returns a new
 * reference, or NULL with no error set when there is none. */
static PyObject *steal(FastPath *self, PyObject *req, PyObject *rkey) {
    if (self->stream_query == Py_None)
        return NULL;
    ArenaBase *candidate = NULL;
    PyObject *blk = NULL;
    Py_ssize_t n = PyList_GET_SIZE(self->all_arenas);
    for (Py_ssize_t i = 0; i < n; i++) {
        ArenaBase *o = (ArenaBase *)PyList_GET_ITEM(self->all_arenas, i);
        if ((PyObject *)o == req || !PyObject_TypeCheck((PyObject *)o, &ArenaBaseType) || o->bins == NULL ||
            !PyDict_CheckExact(o->bins) || PyDict_GET_SIZE(o->bins) == 0)
            continue;
        PyObject *lst = PyDict_GetItemWithError(o->bins, rkey);
        if (lst == NULL) {
            if (PyErr_Occurred())
                return NULL;
            continue;
        }
        if (!PyList_CheckExact(lst) || PyList_GET_SIZE(lst) == 0)
            continue;
        BlockBase *last = (BlockBase *)PyList_GET_ITEM(lst, PyList_GET_SIZE(lst) - 1);
        int le = last->state == (PyObject *)o ? stamp_le(last->epoch, o->completed) : 0;
        if (le < 0)
            return NULL;
        if (le) {
            blk = take_passed(lst, o, o->completed, 1);
            if (blk != NULL || PyErr_Occurred()) {
                if (blk != NULL)
                    self->steals++;
                return blk;
            }
        } else if (candidate == NULL && o->eager != Py_True) {
            candidate = o;
        }
    }
    if (candidate == NULL)
        return NULL;
    Py_INCREF(candidate);
    /* Advance, then query: every free stamped with `cur` was queued before the advance. */
    PyObject *cur = candidate->epoch, *one = NULL, *next = NULL, *res = NULL;
    Py_XINCREF(cur);
    if (cur == NULL || (one = PyLong_FromLong(1)) == NULL || (next = PyNumber_Add(cur, one)) == NULL)
        goto done;
    Py_XSETREF(candidate->epoch, next);
    next = NULL;
    self->stream_polls++;
    int idle = -2;
    if (self->cu_stream_query != NULL) {
        /* The driver directly: one C call, where the bindings' query is a Python call around
         * the same one; any answer but "done" or "not ready" goes to the backend, which
         * reports it properly. */
        void *handle = PyLong_AsVoidPtr(candidate->handle);
        if (handle == NULL && PyErr_Occurred())
            goto done;
        int rc = self->cu_stream_query(handle);
        idle = rc == 0 ? 1 : rc == 600 /* CUDA_ERROR_NOT_READY */ ? 0 : -2;
    }
    if (idle == -2) {
        res = PyObject_CallOneArg(self->stream_query, candidate->handle);  /* may release the GIL */
        if (res == NULL)
            goto done;
        idle = PyObject_IsTrue(res);
    }
    if (idle <= 0)
        goto done;
    int known = stamp_le(cur, candidate->completed);
    if (known < 0)
        goto done;
    if (!known)
        set_slot(&candidate->completed, cur);
    PyObject *lst = candidate->bins ? PyDict_GetItemWithError(candidate->bins, rkey) : NULL;
    if (lst != NULL && PyList_CheckExact(lst)) {
        blk = take_passed(lst, candidate, cur, 0);
        if (blk != NULL)
            self->steals++;
    }
done:
    Py_XDECREF(res);
    Py_XDECREF(one);
    Py_XDECREF(cur);
    Py_DECREF(candidate);
    return blk;
}

static PyObject *fp_allocate(FastPath *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *vals[3];
    if (parse_allocate(args, nargs, kwnames, vals) < 0)
        return NULL;
    PyObject *size = vals[0], *stream = vals[1], *owner = vals[2];
    /* Not exact ints (bool, float, an int subclass, unhashable): the pool's Python side makes
     * them exact or refuses them, then calls this again. A dict would take True or 1.0 for 1. */
    if (!PyLong_CheckExact(size) || !PyLong_CheckExact(stream) || (owner != Py_None && !PyLong_CheckExact(owner)))
        return PyObject_Vectorcall(self->allocate_normalized, vals, 3, NULL);

    /* The size before the stream: a refused request creates no (per-thread) arena. */
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(size, &overflow);
    if (overflow || s <= 0 || s > (long long)self->max_request)
        return raise_via(self->refuse_size, size);
    PyObject *arena = resolve_arena(self, stream, s_allocate);
    if (arena == NULL)
        return NULL;
    PyObject *blk = NULL, *rkey = NULL, *idobj = NULL;
    AllocationBase *a = NULL;
    if (!PyObject_TypeCheck(arena, &ArenaBaseType)) {
        PyErr_SetString(PyExc_SystemError, "cudabridge fast path: arena of a foreign type");
        goto fail;
    }
    rkey = PyLong_FromLongLong((s + 255) & ~255LL);
    if (rkey == NULL)
        goto fail;
    PyObject *bins = ((ArenaBase *)arena)->bins;
    PyObject *lst = (bins != NULL && PyDict_CheckExact(bins)) ? PyDict_GetItemWithError(bins, rkey) : NULL;
    if (lst != NULL && PyList_CheckExact(lst) && PyList_GET_SIZE(lst) > 0) {
        Py_ssize_t n = PyList_GET_SIZE(lst);
        blk = PyList_GET_ITEM(lst, n - 1);
        Py_INCREF(blk);
        if (PyList_SetSlice(lst, n - 1, n, NULL) < 0)
            goto fail_blk;
    } else if (PyErr_Occurred()) {
        goto fail;
    }
    if (blk == NULL) {
        blk = steal(self, arena, rkey);
        if (blk == NULL && PyErr_Occurred())
            goto fail;
    }
    if (blk == NULL) {
        PyObject *sargs = PyTuple_Pack(2, rkey, arena);
        blk = sargs ? sw_run(self->worker, self->slow, sargs) : NULL;
        Py_XDECREF(sargs);
        if (blk == NULL)
            goto fail;
        if (PyTuple_CheckExact(blk) && PyTuple_GET_SIZE(blk) == 2) {
            /* (block, waits): this thread's own stream must wait for them first. If that fails
             * (or is interrupted) the block goes back, fenced by what it was to wait for. */
            PyObject *pair = blk, *waits = PyTuple_GET_ITEM(pair, 1);
            blk = PyTuple_GET_ITEM(pair, 0);
            Py_INCREF(blk);
            PyObject *r = PyObject_CallFunctionObjArgs(self->queue_waits, arena, waits, NULL);
            if (r == NULL) {
                PyObject *et, *ev, *etb;
                PyErr_Fetch(&et, &ev, &etb);
                PyObject *gargs = PyTuple_Pack(3, blk, arena, waits);
                PyObject *g = gargs ? sw_run(self->worker, self->return_unwaited, gargs) : NULL;
                Py_XDECREF(gargs);
                Py_XDECREF(g);
                PyErr_Clear();
                PyErr_Restore(et, ev, etb);
                Py_DECREF(pair);
                goto fail_blk;
            }
            Py_DECREF(r);
            Py_DECREF(pair);
        }
    }
    if (!PyObject_TypeCheck(blk, &BlockBaseType) || ((BlockBase *)blk)->ptr == NULL) {
        PyErr_SetString(PyExc_SystemError, "cudabridge fast path: block of a foreign type");
        goto fail_blk;
    }
    set_slot(&((BlockBase *)blk)->state, self->live_state);
    long long aid = self->next_id++;
    idobj = PyLong_FromLongLong(aid);
    if (idobj == NULL)
        goto fail_blk;
    a = (AllocationBase *)self->alloc_type->tp_alloc(self->alloc_type, 0);
    if (a == NULL)
        goto fail_blk;
    Py_INCREF(((BlockBase *)blk)->ptr); a->ptr = ((BlockBase *)blk)->ptr;
    Py_INCREF(size); a->size = size;
    a->id = idobj; idobj = NULL;
    Py_INCREF(stream); a->stream = stream;
    Py_INCREF(owner); a->owner = owner;
    a->block = blk; blk = NULL;
    a->arena = arena; arena = NULL;
    Py_INCREF(self->pool); a->pool = self->pool;
    Py_INCREF(Py_None); a->extra = Py_None;
    Py_INCREF(self->alive); a->state = self->alive;
    if (PySet_Add(self->live, (PyObject *)a) < 0)
        goto fail_alloc;
    if (owner != Py_None) {
        PyObject *owned = PyDict_GetItemWithError(self->owners, owner);
        if (owned == NULL) {
            if (PyErr_Occurred())
                goto fail_registered;
            PyObject *fresh = PyDict_New();
            if (fresh == NULL)
                goto fail_registered;
            owned = PyDict_SetDefault(self->owners, owner, fresh);
            Py_DECREF(fresh);
            if (owned == NULL)
                goto fail_registered;
        }
        if (PyDict_SetItem(owned, (PyObject *)a, Py_None) < 0)
            goto fail_registered;
    }
    self->in_use += (s + 255) & ~255LL;
    if (self->in_use > self->peak)
        self->peak = self->in_use;
    Py_DECREF(rkey);
    (void)aid;
    return (PyObject *)a;

fail_registered:
    /* Only an interpreter-level failure (memory) gets here; the allocation stays live and
     * findable (statistics, release, close), never silently lost. */
    Py_DECREF(rkey);
    Py_DECREF(a);
    return NULL;
fail_alloc:
    {
        /* Not registered: give the block back to the requesting stream as a free there would. */
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        ArenaBase *ar = (ArenaBase *)a->arena;
        BlockBase *b = (BlockBase *)a->block;
        set_slot(&b->epoch, ar->epoch);
        set_slot(&b->state, (PyObject *)ar);
        if (push_to_bin(ar, (PyObject *)b, rkey) < 0)
            PyErr_Clear();
        PyErr_Restore(exc_type, exc_value, exc_tb);
    }
    Py_DECREF(a);
    Py_DECREF(rkey);
    return NULL;
fail_blk:
    Py_XDECREF(idobj);
    Py_XDECREF(blk);
fail:
    Py_XDECREF(rkey);
    Py_XDECREF(arena);
    return NULL;
}

static PyObject *fp_free(FastPath *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a, *stream = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs < 1 || nargs + nkw > 2) {
        PyErr_SetString(PyExc_TypeError, "free(allocation, stream=None)");
        return NULL;
    }
    a = args[0];
    if (nargs == 2)
        stream = args[1];
    if (nkw) {
        if (nargs == 2 || PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "stream") != 0) {
            PyErr_Format(PyExc_TypeError, "free() got an unexpected keyword argument %R",
                         PyTuple_GET_ITEM(kwnames, 0));
            return NULL;
        }
        stream = args[nargs];
    }
    PyObject *arena;
    if (stream == Py_None) {
        arena = Py_TYPE(a) == self->alloc_type ? ((AllocationBase *)a)->arena : NULL;
        Py_XINCREF(arena);
    } else if (!PyLong_CheckExact(stream)) {
        PyObject *fargs[2] = {a, stream};
        return PyObject_Vectorcall(self->free_normalized, fargs, 2, NULL);
    } else {
        arena = resolve_arena(self, stream, s_free);
        if (arena == NULL)
            return NULL;
    }
    if (arena != NULL && !PyObject_TypeCheck(arena, &ArenaBaseType)) {
        Py_DECREF(arena);
        PyErr_SetString(PyExc_SystemError, "cudabridge fast path: arena of a foreign type");
        return NULL;
    }
    /* Only exact Allocations ever enter the live set: anything else is refused before its
     * fields are read (an object of another type has no AllocationBase layout). */
    if (arena == NULL || Py_TYPE(a) != self->alloc_type) {
        Py_XDECREF(arena);
        return raise_via(self->refuse_free, a);
    }
    AllocationBase *al = (AllocationBase *)a;
    ArenaBase *ar = (ArenaBase *)arena;
    PyObject *stamps = NULL;
    int fenced = (al->extra != NULL && al->extra != Py_None) || ar->eager == Py_True;
    if (fenced) {
        /* Device work first (a per-thread stream records its event now), before anything changes:
         * if it fails or is interrupted, the allocation is still live and untouched. */
        int has = PySet_Contains(self->live, a);
        if (has < 0) {
            Py_DECREF(arena);
            return NULL;
        }
        if (!has) {
            Py_DECREF(arena);
            return raise_via(self->refuse_free, a);
        }
        stamps = PyObject_CallFunctionObjArgs(self->fence_stamps, a, arena, NULL);
        if (stamps == NULL) {
            Py_DECREF(arena);
            return NULL;
        }
    }
    int removed = PySet_Discard(self->live, a);
    if (removed <= 0) {
        Py_XDECREF(stamps);
        Py_DECREF(arena);
        return removed < 0 ? NULL : raise_via(self->refuse_free, a);
    }
    /* From here on the free completes: the allocation is no longer live, so its block must reach
     * a container whatever fails (an interpreter-level failure is reported after it did). */
    set_slot(&al->state, self->freed);
    if (al->owner != NULL && al->owner != Py_None) {
        PyObject *owned = PyDict_GetItemWithError(self->owners, al->owner);
        if (owned != NULL) {
            if (PyDict_DelItem(owned, a) < 0 && PyErr_ExceptionMatches(PyExc_KeyError))
                PyErr_Clear();
        }
    }
    PyObject *et = NULL, *ev = NULL, *etb = NULL;
    PyErr_Fetch(&et, &ev, &etb);   /* kept for the caller; the block is placed regardless */
    BlockBase *blk = (BlockBase *)al->block;
    Py_INCREF(blk);
    PyObject *size = blk->size;
    Py_INCREF(size);
    int placed = 0;
    PyObject *one = NULL;
    if (fenced && PyDict_CheckExact(stamps) && PyDict_GET_SIZE(stamps) == 1 &&
        (one = PyDict_GetItemWithError(stamps, arena)) != NULL) {
        set_slot(&blk->epoch, one);   /* fenced on this stream only: as a plain free, stamped */
        fenced = 0;
    } else if (!fenced) {
        set_slot(&blk->epoch, ar->epoch);
    }
    if (!fenced) {
        set_slot(&blk->state, arena);
        placed = push_to_bin(ar, (PyObject *)blk, size) == 0;
    } else {
        /* behind several streams: the pending list, a locked step on the worker */
        PyObject *pargs = PyTuple_Pack(3, (PyObject *)blk, arena, stamps);
        PyObject *r = pargs ? sw_run(self->worker, self->place_pending, pargs) : NULL;
        Py_XDECREF(pargs);
        placed = r != NULL;
        Py_XDECREF(r);
    }
    long long nbytes = PyLong_AsLongLong(size);
    if (!(nbytes == -1 && PyErr_Occurred()))
        self->in_use -= nbytes;
    if (placed && et == NULL && !PyErr_Occurred())
        placed = maybe_trim(self, ar) == 0;
    Py_DECREF(size);
    Py_DECREF(blk);
    Py_XDECREF(stamps);
    Py_DECREF(arena);
    if (et != NULL) {           /* the first error wins */
        PyErr_Clear();
        PyErr_Restore(et, ev, etb);
        return NULL;
    }
    if (!placed || PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *fp_get_issued(FastPath *self, void *closure) {
    return PyLong_FromLongLong(self->next_id - 1);
}

static PyObject *fp_add(FastPath *self, PyObject *delta) {
    long long d = PyLong_AsLongLong(delta);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    self->in_use += d;
    if (self->in_use > self->peak)
        self->peak = self->in_use;
    Py_RETURN_NONE;
}

static PyObject *fp_fold(FastPath *self, PyObject *unused) {
    Py_RETURN_NONE;  /* the counts are exact at all times: nothing to fold */
}

static PyObject *fp_get_in_use(FastPath *self, void *closure) {
    return PyLong_FromLongLong(self->in_use);
}

static PyObject *fp_get_peak(FastPath *self, void *closure) {
    return PyLong_FromLongLong(self->peak);
}

static PyObject *fp_get_steals(FastPath *self, void *closure) {
    return PyLong_FromLongLong(self->steals);
}

static PyObject *fp_get_stream_polls(FastPath *self, void *closure) {
    return PyLong_FromLongLong(self->stream_polls);
}

static PyObject *fp_get_max_request(FastPath *self, void *closure) {
    return PyLong_FromSsize_t(self->max_request);
}

static PyObject *fp_get_worker(FastPath *self, void *closure) {
    return Py_NewRef((PyObject *)self->worker);
}

static PyMethodDef fp_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))fp_allocate, METH_FASTCALL | METH_KEYWORDS,
     "allocate(size, stream, owner=None): the pool's allocate, fast path in C."},
    {"free", (PyCFunction)(void (*)(void))fp_free, METH_FASTCALL | METH_KEYWORDS,
     "free(allocation, stream=None): the pool's free, fast path in C."},
    {"add", (PyCFunction)fp_add, METH_O, "add(delta): change bytes in use (the UsageLedger interface)."},
    {"fold", (PyCFunction)fp_fold, METH_NOARGS, "no-op: in_use and peak are always exact."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fp_getset[] = {
    {"issued", (getter)fp_get_issued, NULL, "allocation ids handed out so far", NULL},
    {"in_use", (getter)fp_get_in_use, NULL, "block bytes lent out", NULL},
    {"peak", (getter)fp_get_peak, NULL, "most block bytes lent out at once", NULL},
    {"steals", (getter)fp_get_steals, NULL, "cross-stream reuses served by the fast path", NULL},
    {"stream_polls", (getter)fp_get_stream_polls, NULL, "stream queries made by the fast path", NULL},
    {"max_request", (getter)fp_get_max_request, NULL, "largest request", NULL},
    {"worker", (getter)fp_get_worker, NULL, "the SerialWorker that runs the pool's locked steps", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudabridge.memory._fastpath.FastPath",
    .tp_basicsize = sizeof(FastPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "FastPath(hooks, worker, *, alloc_type, live_state, alive, freed, first_id, stream_query, "
              "cu_stream_query=0): a pool's allocate/free fast paths (python_fast_path.py is the reference).",
    .tp_traverse = (traverseproc)fp_traverse,
    .tp_clear = (inquiry)fp_clear,
    .tp_dealloc = (destructor)fp_dealloc,
    .tp_methods = fp_methods,
    .tp_getset = fp_getset,
    .tp_init = (initproc)fp_init,
    .tp_new = PyType_GenericNew,
};


static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "cudabridge.memory._fastpath",
    "C fast paths of the stream-ordered memory pool.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
#define INTERN(var, text) if (((var) = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_append, "append");
    INTERN(s_allocate, "allocate"); INTERN(s_free, "free");
#undef INTERN
    if (PyType_Ready(&AllocationBaseType) < 0 || PyType_Ready(&FastPathType) < 0 ||
        PyType_Ready(&BlockBaseType) < 0 || PyType_Ready(&ArenaBaseType) < 0 ||
        PyType_Ready(&SerialWorkerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&fastpath_module);
    if (m == NULL)
        return NULL;
    /* PyModule_AddType (3.10+) takes its own reference and names the type by tp_name's tail. */
    if (PyModule_AddType(m, &AllocationBaseType) < 0 || PyModule_AddType(m, &BlockBaseType) < 0 ||
        PyModule_AddType(m, &ArenaBaseType) < 0 || PyModule_AddType(m, &FastPathType) < 0 ||
        PyModule_AddType(m, &SerialWorkerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
