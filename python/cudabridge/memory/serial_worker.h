/*
 * serial_worker.h: SerialWorker, a generic serial worker thread: it runs fn(*args) on a thread of
 * its own while the caller waits in C, uninterruptibly. The pool's serialized section (its locked
 * steps) runs on it; nothing here knows the pool. Part of _fastpath.c's one translation unit:
 * included by it after <Python.h>, not a header to include anywhere else.
 *
 * Why: Python code can be interrupted between any two bytecodes: a signal handler
 * (KeyboardInterrupt on the main thread) or PyThreadState_SetAsyncExc raises wherever the thread
 * happens to be. The pool's locked steps (the slow path, growth, coalescing, trims, releases) move
 * blocks between containers in several bytecodes each, so an interruption there loses blocks.
 * CPython offers no way to defer those exceptions, but both only ever reach *the thread they
 * target*, and a thread that is waiting in C runs no bytecode. So on the C path every locked step
 * runs on this worker's own thread (started lazily, gone after IDLE_EXIT_S idle, never seen by
 * threading.enumerate()), while the caller waits here with the GIL released, uninterruptibly; an
 * exception arriving meanwhile is raised in the caller once the step is complete and its result
 * (an allocation, registered with its owner) is back. Exceptions the step raises itself
 * (OutOfDeviceMemory, ...) travel back to the caller. A call made on the worker's own thread, or
 * while the interpreter finalizes, runs inline.
 *
 * Invariants:
 *  - one request at a time (the callers mutex, held from posting a request to taking its answer);
 *  - mu guards the request, the answer and the serving state, and is never held while taking the
 *    GIL;
 *  - at most one serving thread; it holds a reference to the worker while it runs; a request
 *    that finds no thread starts one, and one that cannot start runs inline;
 *  - once stop() returns, no request is in flight and later calls run inline.
 */

#ifndef CB_SERIAL_WORKER_H
#define CB_SERIAL_WORKER_H

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

#endif /* CB_SERIAL_WORKER_H */
