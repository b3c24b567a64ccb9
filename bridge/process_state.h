/*
 * process_state.h: what the bridge keeps for the whole process: the JVM, Python's start state, the
 * hot path's cached Python callables and the C twin's entry points, the cached Java classes, and
 * the HostMemory type that hands C-owned host memory to Python.
 *
 * Part of the bridge library's one translation unit: cudabridge_jni.c includes it once, after
 * the headers before it in its list, whose definitions it uses (all static: nothing leaves the
 * library but the JNI entry points).
 */
#ifndef CB_PROCESS_STATE_H
#define CB_PROCESS_STATE_H

/* ---------------------------------------------------------------------------------------------
 * Process-wide state
 * ------------------------------------------------------------------------------------------- */
static JavaVM *g_vm;
static pthread_mutex_t g_start_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_py_initialized;            /* under g_start_lock */
static char *g_py_failure;              /* a failed Py_InitializeFromConfig: it cannot be retried */
static char g_py_program[PATH_MAX];     /* the python Python was started with */
static PyInterpreterState *g_interp;
static atomic_int g_ready;              /* the hot path's callables are cached */
static atomic_long g_states_created, g_states_deleted;

/* Cached bound methods of the JavaHotPath, and helpers; owned references, never released. */
static PyObject *m_stream, *m_allocate, *m_free, *m_free_many, *m_copy_in, *m_copy_out,
    *m_copy_in_direct, *m_copy_out_direct, *m_copy_device, *m_memset, *m_sync, *m_alloc_pinned,
    *m_free_pinned, *m_ping, *m_thread_exit, *m_bind,
    *m_release, *m_release_many, *m_launch, *m_copy_in_address, *m_copy_out_address, *m_call_function, *f_error_info;
/* The C twin's entry points (JavaHotPath.native_api), or NULL: launches then call m_launch. The
 * capsule is kept (never released) so the HotCore it holds outlives every call. */
static const cb_native_api *g_api;
static PyObject *g_api_capsule;

/* Cached Java classes (global refs) and constructors. */
static jclass c_cbe, c_oom, c_ise, c_iae, c_ioobe, c_npe, c_oome;
static jmethodID ctor_cbe, ctor_oom, of_cbe;   /* of_cbe: CudaBridgeException.of(message, pythonType, kind) */

/* Host memory the C side owns (a staging buffer, a direct ByteBuffer's memory), exported to
 * Python through the buffer protocol. Invariant: every view handed to Python has a real exporting
 * object of this type, which is never registered as pinned memory. The emulated backend tells
 * pinned from pageable memory by a view's exporting object, so it treats these views as pageable,
 * as CUDA treats memory it did not page-lock: a copy is done with the host bytes when it returns.
 * A view with no exporting object (PyMemoryView_FromMemory's, obj == None) must not reach a
 * backend. */
typedef struct {
    PyObject_HEAD
    char *buf;
    Py_ssize_t len;
    Py_ssize_t exports;   /* buffers handed out and not released (the GIL guards it) */
} HostMemory;

static PyTypeObject *t_host_memory;

static int host_memory_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    HostMemory *h = (HostMemory *)self;
    int rc = PyBuffer_FillInfo(view, self, h->buf, h->len, 0 /* writable */, flags);
    if (rc == 0) h->exports++;
    return rc;
}

static void host_memory_releasebuffer(PyObject *self, Py_buffer *view) {
    (void)view;
    ((HostMemory *)self)->exports--;
}

/* `exports`: how many buffers of it are held now. A memoryview made from another shares its
 * export, so a view handed to a function is released after the call and then this must read 0,
 * or the function kept something over memory that is Java's (jvm/function_calls.py). */
static PyObject *host_memory_exports(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(((HostMemory *)self)->exports);
}

static PyGetSetDef host_memory_getset[] = {
    {"exports", host_memory_exports, NULL, "buffers of this memory held now", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* A heap type's instances hold a reference to their type (PyObject_New took it): drop it. */
static void host_memory_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static PyType_Slot host_memory_slots[] = {
    {Py_bf_getbuffer, (void *)host_memory_getbuffer},
    {Py_bf_releasebuffer, (void *)host_memory_releasebuffer},
    {Py_tp_getset, (void *)host_memory_getset},
    {Py_tp_dealloc, (void *)host_memory_dealloc},
    {0, NULL},
};

static PyType_Spec host_memory_spec = {
    "cudabridge_jni.HostMemory", sizeof(HostMemory), 0, Py_TPFLAGS_DEFAULT, host_memory_slots,
};

/* A writable memoryview over [buf, buf+len) (GIL held); NULL with a Python error set. */
static PyObject *host_view(char *buf, size_t len) {
    HostMemory *h = PyObject_New(HostMemory, t_host_memory);
    if (h == NULL) return NULL;
    h->buf = buf;
    h->len = (Py_ssize_t)len;
    h->exports = 0;
    PyObject *mv = PyMemoryView_FromObject((PyObject *)h);
    Py_DECREF(h); /* the view keeps it */
    return mv;
}

#endif /* CB_PROCESS_STATE_H */
