/*
 * cudabridge_jni.c: hosts CPython inside a running JVM, lets JPype bind to that JVM, and carries
 * the hot path of the Java API (org.cudabridge.NativeBridge's natives) into Python.
 *
 * Why it looks the way it does (the facts behind it: docs/architecture.md, "Facts the code relies
 * on", "JPype 1.7.1 and the JVM"):
 *  - JPype 1.7 cannot attach to a JVM that `java` started. It can "start" one through any library
 *    that exports JNI_CreateJavaVM / JNI_GetCreatedJavaVMs: ours hand back the running VM, and
 *    bootstrap.py calls jpype.startJVM(jvmpath=<this library>).
 *  - JPype's extension is not linked to libpython: libpython must be RTLD_GLOBAL, or _jpype.so
 *    fails with "undefined symbol: PyExc_ValueError". We are linked to it (so it is loaded with
 *    us, locally); dlopen(RTLD_NOLOAD|RTLD_GLOBAL) promotes it to global scope.
 *  - A JNI native calling a cached bound method costs a fraction of a pinned JPype proxy call
 *    (one from a thread that keeps a Python thread state); an unpinned proxy call costs several
 *    times more again and leaks native memory. So: hot path here, control path through JPype on
 *    threads that keep a Python thread state.
 *  - Per call: PyEval_RestoreThread(kept state), PyObject_Vectorcall, PyEval_SaveThread, and only
 *    then (GIL dropped) any JNI call, e.g. ThrowNew with a message fetched while the GIL was held.
 *    Java arrays are read before the GIL is taken; no critical region is held while waiting for it.
 *
 * Python is started once per JVM and never finalized: the JVM may still call in at any time.
 * Every JNI and Python C-API return code is checked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <jni.h>
#include <jvmti.h>

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hot_gate.h"
#include "native_api.h"   /* python/cudabridge/jvm: the hot path C twin's entry points */
#include "staging_ring.h"

#ifndef CB_LIBPYTHON
#error "CB_LIBPYTHON (the path of the libpython this library is linked to) must be defined by the build"
#endif
#ifndef CB_PYTHON_BASE
#error "CB_PYTHON_BASE (the interpreter of the installation CB_LIBPYTHON belongs to) must be defined by the build"
#endif

#define CB_JNI_VERSION JNI_VERSION_1_8
/* Java heap arrays are staged through a per-thread native buffer (the GC moves heap arrays, and a
 * critical region must not be held while we wait for the GIL); copies larger than this go in
 * chunks, so the buffer, kept for the thread's life, stays bounded. */
#define CB_STAGE_MAX ((size_t)4 << 20)

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
    *m_release, *m_release_many, *m_launch, *m_copy_in_address, *m_copy_out_address, *f_error_info;
/* The C twin's entry points (JavaHotPath.native_api), or NULL: launches then call m_launch. The
 * capsule is kept (never released) so the HotCore it holds outlives every call. */
static const cb_native_api *g_api;
static PyObject *g_api_capsule;

/* Cached Java classes (global refs) and constructors. */
static jclass c_cbe, c_oom, c_ise, c_iae, c_ioobe, c_npe, c_oome;
static jmethodID ctor_cbe, ctor_oom;

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
} HostMemory;

static PyTypeObject *t_host_memory;

static int host_memory_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    HostMemory *h = (HostMemory *)self;
    return PyBuffer_FillInfo(view, self, h->buf, h->len, 0 /* writable */, flags);
}

/* A heap type's instances hold a reference to their type (PyObject_New took it): drop it. */
static void host_memory_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static PyType_Slot host_memory_slots[] = {
    {Py_bf_getbuffer, (void *)host_memory_getbuffer},
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
    PyObject *mv = PyMemoryView_FromObject((PyObject *)h);
    Py_DECREF(h); /* the view keeps it */
    return mv;
}

/* ---------------------------------------------------------------------------------------------
 * Per-thread state: the Java thread's own Python thread state, kept across calls, and its
 * pageable staging buffer (copies where no pinned staging applies). A pthread key's destructor deletes both when the thread ends, so that threads
 * coming and going leave nothing behind (the interpreter's thread-state list stays bounded).
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    PyThreadState *ts;   /* ours: created here, deleted by the key destructor */
    char *stage;
    size_t stage_cap;
    int keyed;           /* the pthread key points at this slot */
} thread_slot;

static __thread thread_slot t_slot;
static pthread_key_t g_slot_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static int g_key_error;

static void slot_destructor(void *arg);

static void make_key(void) { g_key_error = pthread_key_create(&g_slot_key, slot_destructor); }

/* A GIL section: either our kept state, or (on a thread that already has a Python thread state
 * we do not own: a Python-started thread calling Java, or JPype's state while a proxy call of
 * this thread is on the stack) PyGILState_Ensure/Release around this one call. */
typedef struct {
    PyThreadState *ts;
    PyGILState_STATE gstate;
    int borrowed;
} gil_section;

/* Errors captured while the GIL was held, thrown once it is released. */
#define CB_OOM_MAX_FIELDS 16   /* room for OutOfDeviceMemory.FIELDS (7 today) */

typedef struct {
    int kind;            /* 0 none, 1 Python exception */
    char *message;       /* malloc'ed */
    char *pytype;        /* malloc'ed */
    int is_oom;
    int oom_n;           /* the numbers of OutOfDeviceMemory.FIELDS, in order (the Java side checks the count) */
    jlong oom[CB_OOM_MAX_FIELDS];
} captured_error;

static void throw_plain(JNIEnv *env, jclass cls, const char *fallback_name, const char *msg) {
    if ((*env)->ExceptionCheck(env)) return; /* keep the first exception */
    if (cls == NULL) {
        cls = (*env)->FindClass(env, fallback_name);
        if (cls == NULL) return; /* FindClass threw NoClassDefFoundError */
    }
    if ((*env)->ThrowNew(env, cls, msg) != 0 && !(*env)->ExceptionCheck(env)) {
        (*env)->FatalError(env, "cudabridge: ThrowNew failed");
    }
}

static void throw_state(JNIEnv *env, const char *msg) {
    throw_plain(env, c_ise, "java/lang/IllegalStateException", msg);
}

/* With the GIL held and a Python exception set: describe it into `err` and clear it. Uses
 * cudabridge.jvm.errors.error_info, so that the hot path and the control path word errors alike;
 * falls back to str() if that itself fails. */
static void capture_python_error(captured_error *err) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    err->kind = 1;
    err->is_oom = 0;
    err->oom_n = 0;
    err->message = NULL;
    err->pytype = NULL;
    if (value == NULL) {
        err->message = strdup("unknown Python error (no exception object)");
        err->pytype = strdup("unknown");
        goto done;
    }
    if (f_error_info != NULL) {
        PyObject *info = PyObject_CallOneArg(f_error_info, value);
        if (info != NULL && PyTuple_Check(info) && PyTuple_GET_SIZE(info) == 3) {
            const char *m = PyUnicode_AsUTF8(PyTuple_GET_ITEM(info, 0));
            const char *t = m ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(info, 1)) : NULL;
            PyObject *oom = PyTuple_GET_ITEM(info, 2);
            if (m && t) {
                err->message = strdup(m);
                err->pytype = strdup(t);
                if (oom != Py_None && PyTuple_Check(oom) && PyTuple_GET_SIZE(oom) <= CB_OOM_MAX_FIELDS) {
                    int ok = 1;
                    err->oom_n = (int)PyTuple_GET_SIZE(oom);
                    for (int i = 0; i < err->oom_n; i++) {
                        err->oom[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(oom, i));
                        if (err->oom[i] == -1 && PyErr_Occurred()) ok = 0;
                    }
                    err->is_oom = ok;
                }
            }
        }
        Py_XDECREF(info);
        PyErr_Clear();
    }
    if (err->message == NULL) {
        PyObject *s = PyObject_Str(value);
        const char *m = s ? PyUnicode_AsUTF8(s) : NULL;
        const char *tn = Py_TYPE(value)->tp_name;
        size_t n = (m ? strlen(m) : 0) + strlen(tn) + 4;
        err->message = malloc(n);
        if (err->message) snprintf(err->message, n, "%s: %s", tn, m ? m : "?");
        err->pytype = strdup(tn);
        Py_XDECREF(s);
        PyErr_Clear();
    }
done:
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* GIL released: throw what was captured. */
static void throw_captured(JNIEnv *env, captured_error *err) {
    if (err->kind == 0) return;
    const char *msg = err->message ? err->message : "cudabridge: error (message lost: out of native memory)";
    const char *pytype = err->pytype ? err->pytype : "unknown";
    if (!(*env)->ExceptionCheck(env)) {
        jstring jm = (*env)->NewStringUTF(env, msg);
        jstring jt = jm ? (*env)->NewStringUTF(env, pytype) : NULL;
        jthrowable ex = NULL;
        if (jm && jt && c_cbe) {
            jlongArray fields = (err->is_oom && c_oom) ? (*env)->NewLongArray(env, err->oom_n) : NULL;
            if (fields != NULL) {
                (*env)->SetLongArrayRegion(env, fields, 0, err->oom_n, err->oom);
                ex = (jthrowable)(*env)->NewObject(env, c_oom, ctor_oom, jm, jt, fields);
                (*env)->DeleteLocalRef(env, fields);
                if (ex == NULL && (*env)->ExceptionCheck(env))
                    (*env)->ExceptionClear(env); /* fields Java does not take: keep the message at least */
            }
            if (ex == NULL && !(*env)->ExceptionCheck(env)) {
                ex = (jthrowable)(*env)->NewObject(env, c_cbe, ctor_cbe, jm, jt);
            }
        }
        if (ex != NULL) {
            if ((*env)->Throw(env, ex) != 0 && !(*env)->ExceptionCheck(env))
                (*env)->FatalError(env, "cudabridge: Throw failed");
            (*env)->DeleteLocalRef(env, ex);
        } else if (!(*env)->ExceptionCheck(env)) {
            throw_state(env, msg); /* classes not cached: still a clear message */
        }
        if (jm) (*env)->DeleteLocalRef(env, jm);
        if (jt) (*env)->DeleteLocalRef(env, jt);
    }
    free(err->message);
    free(err->pytype);
    err->message = err->pytype = NULL;
    err->kind = 0;
}

/* Take the GIL on this thread, creating its kept thread state on first use. Returns 0, or -1
 * with a Java exception pending (no GIL held). */
static int gil_enter(JNIEnv *env, gil_section *g) {
    if (t_slot.ts != NULL) {
        g->ts = t_slot.ts;
        g->borrowed = 0;
        PyEval_RestoreThread(g->ts);
        return 0;
    }
    if (!atomic_load_explicit(&g_ready, memory_order_acquire) && !g_py_initialized) {
        throw_state(env, "cudabridge: Python is not started in this JVM (call CudaBridge.start first)");
        return -1;
    }
    if (PyGILState_GetThisThreadState() != NULL) {
        /* Someone else's state for this thread (see gil_section): borrow it for this call. */
        g->gstate = PyGILState_Ensure();
        g->ts = NULL;
        g->borrowed = 1;
        return 0;
    }
    if (pthread_once(&g_key_once, make_key) != 0 || g_key_error != 0) {
        throw_state(env, "cudabridge: pthread_key_create failed; cannot keep Python thread states");
        return -1;
    }
    /* PyThreadState_New also registers the state as this thread's PyGILState state (3.11 and
     * 3.12), so JPype's PyGILState_Ensure on this thread finds it and its Release (the counter
     * starts at 1) leaves it alone: proxy calls from this thread are "pinned". */
    PyThreadState *ts = PyThreadState_New(g_interp);
    if (ts == NULL) {
        throw_plain(env, c_oome, "java/lang/OutOfMemoryError", "cudabridge: PyThreadState_New failed");
        return -1;
    }
    atomic_fetch_add(&g_states_created, 1);
    t_slot.ts = ts;
    if (!t_slot.keyed) {
        if (pthread_setspecific(g_slot_key, &t_slot) != 0) {
            /* Without the key the state would outlive the thread: refuse rather than leak. */
            PyEval_RestoreThread(ts);
            PyThreadState_Clear(ts);
            PyThreadState_DeleteCurrent();
            atomic_fetch_add(&g_states_deleted, 1);
            t_slot.ts = NULL;
            throw_state(env, "cudabridge: pthread_setspecific failed; cannot keep a Python thread state");
            return -1;
        }
        t_slot.keyed = 1;
    }
    g->ts = ts;
    g->borrowed = 0;
    PyEval_RestoreThread(ts);
    return 0;
}

static inline void gil_exit(gil_section *g) {
    if (g->borrowed) {
        PyGILState_Release(g->gstate);
    } else {
        PyThreadState *saved = PyEval_SaveThread();
        (void)saved; /* == g->ts */
    }
}

/* Makes ctx current on this thread for a copy's driver calls: 0, or a CUresult with *call naming
 * the call that failed. *prev is the thread's context before (NULL: none), for ctx_restore. */
static int ctx_enter(const cb_driver *d, cb_CUcontext ctx, cb_CUcontext *prev, const char **call) {
    *prev = NULL;
    int rc = d->cuCtxGetCurrent(prev);
    if (rc != CB_CUDA_SUCCESS) *call = "cuCtxGetCurrent";
    else if (*prev != ctx && (rc = d->cuCtxSetCurrent(ctx)) != CB_CUDA_SUCCESS) *call = "cuCtxSetCurrent";
    return rc;
}

/* Puts back the context the thread had before ctx_enter. A thread that had none keeps ctx, as the
 * launch does (the runtime's first call would have made it current): its next call costs no switch. */
static void ctx_restore(const cb_driver *d, cb_CUcontext ctx, cb_CUcontext prev) {
    if (prev != NULL && prev != ctx) d->cuCtxSetCurrent(prev);
}

/* Runs when a thread that used the bridge ends (after the JVM has detached it). */
static void slot_destructor(void *arg) {
    thread_slot *slot = (thread_slot *)arg;
    if (slot == NULL) return;
    PyThreadState *ts = slot->ts;
    if (ts != NULL) {
        slot->ts = NULL;
        PyEval_RestoreThread(ts);
        if (m_thread_exit != NULL) {
            PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
            PyObject *r = ident ? PyObject_CallOneArg(m_thread_exit, ident) : NULL;
            if (r == NULL) PyErr_Clear(); /* best effort: only bookkeeping of `threading` */
            Py_XDECREF(r);
            Py_XDECREF(ident);
        }
        PyThreadState_Clear(ts);
        PyThreadState_DeleteCurrent(); /* also releases the GIL and unbinds the PyGILState state */
        atomic_fetch_add(&g_states_deleted, 1);
    }
    free(slot->stage);
    slot->stage = NULL;
    slot->stage_cap = 0;
    slot->keyed = 0;
}

/* Makes sure the slot's destructor runs when this thread ends (best effort: without the key, what
 * the slot holds outlives the thread). */
static void keep_slot(void) {
    if (!t_slot.keyed && pthread_once(&g_key_once, make_key) == 0 && g_key_error == 0 &&
        pthread_setspecific(g_slot_key, &t_slot) == 0)
        t_slot.keyed = 1;
}

static char *stage_buffer(size_t n) {
    if (n <= t_slot.stage_cap) return t_slot.stage;
    size_t cap = t_slot.stage_cap ? t_slot.stage_cap : 4096;
    while (cap < n) cap *= 2;
    if (cap > CB_STAGE_MAX) cap = CB_STAGE_MAX;
    char *p = malloc(cap);
    if (p == NULL) return NULL;
    free(t_slot.stage);
    t_slot.stage = p;
    t_slot.stage_cap = cap;
    keep_slot();   /* so the buffer is freed with the thread even without a Python state */
    return p;
}

/* ---------------------------------------------------------------------------------------------
 * JNI entry points the JVM and JPype look for
 * ------------------------------------------------------------------------------------------- */
JNIEXPORT jint JNICALL JNI_OnLoad(JavaVM *vm, void *reserved) {
    (void)reserved;
    g_vm = vm;
    return CB_JNI_VERSION;
}

/* JPype "starts" the JVM through this: hand back the running one, with the caller's JNIEnv
 * (attaching the calling thread if it is not a Java thread yet). */
JNIEXPORT jint JNICALL JNI_CreateJavaVM(JavaVM **pvm, void **penv, void *args) {
    (void)args; /* the running VM's options cannot change; JPype's are ignored */
    if (g_vm == NULL || pvm == NULL || penv == NULL) return JNI_ERR;
    jint rc = (*g_vm)->GetEnv(g_vm, penv, CB_JNI_VERSION);
    if (rc == JNI_EDETACHED) rc = (*g_vm)->AttachCurrentThread(g_vm, penv, NULL);
    if (rc != JNI_OK) return rc;
    *pvm = g_vm;
    return JNI_OK;
}

JNIEXPORT jint JNICALL JNI_GetCreatedJavaVMs(JavaVM **vmBuf, jsize bufLen, jsize *nVMs) {
    if (nVMs != NULL) *nVMs = g_vm != NULL ? 1 : 0;
    if (g_vm != NULL && vmBuf != NULL && bufLen >= 1) vmBuf[0] = g_vm;
    return JNI_OK;
}

/* A JPype default-JVM probe may look for this too. */
JNIEXPORT jint JNICALL JNI_GetDefaultJavaVMInitArgs(void *args) {
    (void)args;
    return JNI_ERR;
}

static jclass global_class(JNIEnv *env, const char *name) {
    jclass local = (*env)->FindClass(env, name);
    if (local == NULL) return NULL;
    jclass global = (jclass)(*env)->NewGlobalRef(env, local);
    (*env)->DeleteLocalRef(env, local);
    if (global == NULL) throw_plain(env, NULL, "java/lang/OutOfMemoryError", "cudabridge: NewGlobalRef failed");
    return global;
}

/* Called from NativeBridge's static initializer right after System.load: FindClass from a native
 * method of NativeBridge resolves through NativeBridge's own class loader. */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_nativeInit(JNIEnv *env, jclass cls) {
    (void)cls;
    if (c_cbe != NULL) return;
    if ((c_ise = global_class(env, "java/lang/IllegalStateException")) == NULL) return;
    if ((c_iae = global_class(env, "java/lang/IllegalArgumentException")) == NULL) return;
    if ((c_ioobe = global_class(env, "java/lang/IndexOutOfBoundsException")) == NULL) return;
    if ((c_npe = global_class(env, "java/lang/NullPointerException")) == NULL) return;
    if ((c_oome = global_class(env, "java/lang/OutOfMemoryError")) == NULL) return;
    jclass oom = global_class(env, "org/cudabridge/GpuOutOfMemoryException");
    if (oom == NULL) return;
    jmethodID oc = (*env)->GetMethodID(env, oom, "<init>", "(Ljava/lang/String;Ljava/lang/String;[J)V");
    if (oc == NULL) return;
    jclass cbe = global_class(env, "org/cudabridge/CudaBridgeException");
    if (cbe == NULL) return;
    jmethodID cc = (*env)->GetMethodID(env, cbe, "<init>", "(Ljava/lang/String;Ljava/lang/String;)V");
    if (cc == NULL) return;
    c_oom = oom;
    ctor_oom = oc;
    ctor_cbe = cc;
    c_cbe = cbe; /* last: marks the cache complete */
}

/* ---------------------------------------------------------------------------------------------
 * Starting Python
 * ------------------------------------------------------------------------------------------- */

/* Appends printf-style text to a growing message. */
static void appendf(char **buf, size_t *len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void appendf(char **buf, size_t *len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    char *p = realloc(*buf, *len + (size_t)n + 1);
    if (p == NULL) return;
    va_start(ap, fmt);
    vsnprintf(p + *len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    *buf = p;
    *len += (size_t)n;
}

/* With the GIL held and an exception set: "<what>: <traceback>", malloc'ed. Uses only the
 * standard library (cudabridge itself may be what failed to import). */
static char *format_python_failure(const char *what) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    char *out = NULL;
    size_t len = 0;
    appendf(&out, &len, "%s", what);
    PyObject *mod = PyImport_ImportModule("traceback");
    PyObject *lines = NULL, *text = NULL, *empty = NULL;
    if (mod != NULL && value != NULL) {
        if (tb != NULL) PyException_SetTraceback(value, tb);
        lines = PyObject_CallMethod(mod, "format_exception", "OOO", type ? type : Py_None, value,
                                    tb ? tb : Py_None);
        empty = lines ? PyUnicode_FromString("") : NULL;
        text = empty ? PyUnicode_Join(empty, lines) : NULL;
    }
    const char *s = text ? PyUnicode_AsUTF8(text) : NULL;
    if (s != NULL) {
        appendf(&out, &len, ":\n%s", s);
    } else {
        PyErr_Clear();
        PyObject *str = value ? PyObject_Str(value) : NULL;
        const char *v = str ? PyUnicode_AsUTF8(str) : NULL;
        appendf(&out, &len, ": %s: %s", value ? Py_TYPE(value)->tp_name : "?", v ? v : "(no message)");
        Py_XDECREF(str);
    }
    PyErr_Clear();
    Py_XDECREF(text);
    Py_XDECREF(empty);
    Py_XDECREF(lines);
    Py_XDECREF(mod);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return out;
}

/* Trims leading and trailing white space in place; returns the start. */
static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = '\0';
    return s;
}

/* Whether `path` is (or is a symlink to) an executable regular file. */
static int is_executable_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/*
 * Checks cudabridge.python before anything of Python starts: an executable regular file (or a
 * symlink to one) that is either
 *  - a venv's python: pyvenv.cfg beside it or one level above its directory (venv, virtualenv
 *    and uv write one), whose version (or version_info) is the major.minor this library is
 *    linked to and whose home holds a python<major>.<minor>; or
 *  - the interpreter of the installation this library is linked to (CB_PYTHON_BASE, from the
 *    build), through any symlink.
 * Anything else (/bin/false, a directory, another version's plain interpreter) is refused here:
 * Python's own path search would not fail on it but quietly settle on another prefix (whatever
 * stdlib lies near the executable, e.g. /usr for /usr/bin/false, or the compiled-in one), start
 * an interpreter nobody asked for, and fail much later (cudabridge or JPype not importable).
 * Returns NULL if fine, else a malloc'ed message saying what is wrong. Reads files only.
 */
static char *check_python(const char *python) {
    char *msg = NULL;
    size_t len = 0;
    const int want_major = PY_MAJOR_VERSION, want_minor = PY_MINOR_VERSION;
    struct stat st;
    if (python == NULL || python[0] != '/') {
        appendf(&msg, &len, "cudabridge: the Python executable must be an absolute path, got '%s'",
                python ? python : "(null)");
        return msg;
    }
    if (strlen(python) >= PATH_MAX) {
        appendf(&msg, &len, "cudabridge: cudabridge.python is longer than PATH_MAX (%d): %.200s...", PATH_MAX, python);
        return msg;
    }
    if (stat(python, &st) != 0) {
        int err = errno;
        struct stat lst;
        char target[PATH_MAX];
        ssize_t n = -1;
        if (lstat(python, &lst) == 0 && S_ISLNK(lst.st_mode)) n = readlink(python, target, sizeof target - 1);
        if (n >= 0) {
            target[n] = '\0';
            appendf(&msg, &len, "cudabridge: no such Python executable: %s (a symlink to %s, which does not exist: "
                    "%s)", python, target, strerror(err));
        } else {
            appendf(&msg, &len, "cudabridge: no such Python executable: %s (%s)", python, strerror(err));
        }
        return msg;
    }
    if (S_ISDIR(st.st_mode)) {
        appendf(&msg, &len, "cudabridge: cudabridge.python=%s is a directory, not a Python executable: give the "
                "venv's interpreter (e.g. %s/bin/python)", python, python);
        return msg;
    }
    if (!S_ISREG(st.st_mode)) {
        appendf(&msg, &len, "cudabridge: cudabridge.python=%s is not a regular file (mode %06o), not a Python "
                "executable", python, (unsigned)st.st_mode);
        return msg;
    }
    if (access(python, X_OK) != 0) {
        appendf(&msg, &len, "cudabridge: cudabridge.python=%s is not executable (mode %04o: %s)", python,
                (unsigned)(st.st_mode & 07777), strerror(errno));
        return msg;
    }

    /* pyvenv.cfg beside the executable, or one level above its directory (<venv>/bin/python). */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", python);
    *strrchr(dir, '/') = '\0'; /* python is absolute: there is a '/' */
    char cfg[PATH_MAX + 16], tried[2][PATH_MAX + 16];
    int ntried = 0;
    FILE *f = NULL;
    for (int up = 0; up < 2 && f == NULL; up++) {
        snprintf(cfg, sizeof cfg, "%s/pyvenv.cfg", dir);
        snprintf(tried[ntried++], sizeof tried[0], "%s", cfg);
        struct stat cst;
        if (stat(cfg, &cst) == 0 && S_ISREG(cst.st_mode)) f = fopen(cfg, "r");
        if (f == NULL) {
            char *slash = strrchr(dir, '/');
            if (slash == NULL) break;
            *slash = '\0';
        }
    }

    if (f == NULL) {
        /* No venv: only the interpreter of the installation we are linked to will do. */
        char real[PATH_MAX], base[PATH_MAX];
        if (realpath(python, real) != NULL && realpath(CB_PYTHON_BASE, base) != NULL && strcmp(real, base) == 0)
            return NULL;
        appendf(&msg, &len,
                "cudabridge: cudabridge.python=%s is not a Python %d.%d interpreter or venv: no pyvenv.cfg beside it "
                "and it is not %s (the interpreter whose libpython this bridge library is linked to: %s; looked for ",
                python, want_major, want_minor, CB_PYTHON_BASE, CB_LIBPYTHON);
        for (int i = 0; i < ntried; i++) appendf(&msg, &len, "%s%s", i ? " and " : "", tried[i]);
        appendf(&msg, &len, ")");
        const char *name = strrchr(realpath(python, real) != NULL ? real : python, '/') + 1;
        int a, b;
        if (sscanf(name, "python%d.%d", &a, &b) == 2) {
            if (a != want_major || b != want_minor)
                appendf(&msg, &len, "; by its name (%s) it is Python %d.%d", name, a, b);
            else
                appendf(&msg, &len, "; by its name (%s) it is a Python %d.%d of another installation, which "
                        "this library is not linked to", name, a, b);
        }
        appendf(&msg, &len, ". Give a Python %d.%d venv's <venv>/bin/python, or rebuild the library with the python "
                "you mean (python -m cudabridge build --native-only)", want_major, want_minor);
        return msg;
    }

    char line[PATH_MAX + 64], home[PATH_MAX];
    int major = -1, minor = -1, have_home = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        char *eq = strchr(line, '=');
        if (eq == NULL) continue;
        *eq = '\0';
        char *key = trim(line), *value = trim(eq + 1);
        int a, b;
        if ((strcmp(key, "version") == 0 || strcmp(key, "version_info") == 0) && major < 0 &&
            sscanf(value, "%d.%d", &a, &b) == 2) {
            major = a;
            minor = b;
        } else if (strcmp(key, "home") == 0 && !have_home) {
            snprintf(home, sizeof home, "%s", value);
            have_home = 1;
        }
    }
    fclose(f);
    if (major < 0) {
        appendf(&msg, &len, "cudabridge: %s has no 'version' line; cannot check the venv's Python version", cfg);
        return msg;
    }
    if (major != want_major || minor != want_minor) {
        appendf(&msg, &len,
                "cudabridge: the virtual environment of %s is Python %d.%d (%s), but this bridge library is "
                "linked to Python %d.%d (%s); rebuild the library with that venv's python "
                "(python -m cudabridge build --native-only) or point cudabridge.python at a %d.%d venv",
                python, major, minor, cfg, want_major, want_minor, CB_LIBPYTHON, want_major, want_minor);
        return msg;
    }
    if (!have_home || home[0] == '\0') {
        appendf(&msg, &len, "cudabridge: %s has no 'home' line: cudabridge.python=%s is not in a usable venv "
                "(Python finds the venv's base installation through home)", cfg, python);
        return msg;
    }
    char base_exe[PATH_MAX + 32];
    snprintf(base_exe, sizeof base_exe, "%s/python%d.%d", home, want_major, want_minor);
    if (!is_executable_file(base_exe)) {
        appendf(&msg, &len,
                "cudabridge: the virtual environment of %s says home = %s (%s), but there is no Python %d.%d "
                "there (no executable %s): its base installation was removed or is another version; recreate "
                "the venv with a Python %d.%d (e.g. %s -m venv)",
                python, home, cfg, want_major, want_minor, base_exe, want_major, want_minor, CB_PYTHON_BASE);
        return msg;
    }
    return NULL;
}

static char *status_message(const char *what, PyStatus st) {
    char *msg = NULL;
    size_t len = 0;
    appendf(&msg, &len, "cudabridge: %s failed: %s%s%s", what, st.func ? st.func : "", st.func ? ": " : "",
            st.err_msg ? st.err_msg : (PyStatus_IsExit(st) ? "Python asked to exit" : "unknown error"));
    return msg;
}

/* Initializes the interpreter (g_start_lock held). Returns NULL or a malloc'ed message. The GIL
 * is held by this thread on success. */
static char *init_python(const char *python) {
    /* (a) libpython into the global scope, for extension modules not linked to it (_jpype). */
    void *h = dlopen(CB_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (h == NULL) h = dlopen(CB_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        char *msg = NULL;
        size_t len = 0;
        const char *e = dlerror();
        appendf(&msg, &len, "cudabridge: dlopen(%s, RTLD_GLOBAL) failed: %s", CB_LIBPYTHON, e ? e : "?");
        return msg;
    }
    /* The handle is kept for the process's life: libpython must never be unloaded. */

    PyStatus st;
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0; /* the JVM owns the signals */
    config.parse_argv = 0;
    config.buffered_stdio = 0;         /* share stdout/stderr with Java without reordering surprises */
    /* program_name = the venv's python: getpath then finds pyvenv.cfg and sys.prefix is the venv. */
    st = PyConfig_SetBytesString(&config, &config.program_name, python);
    if (PyStatus_Exception(st)) {
        PyConfig_Clear(&config);
        return status_message("PyConfig_SetBytesString(program_name)", st);
    }
    st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) return status_message("Py_InitializeFromConfig", st);
    g_interp = PyInterpreterState_Get();
    return NULL;
}

/* With the GIL: sys.path[0:0] = entries. */
static int prepend_sys_path(JNIEnv *env, jobjectArray entries, char **failure) {
    if (entries == NULL) return 0;
    jsize n = (*env)->GetArrayLength(env, entries);
    PyObject *path = PySys_GetObject("path"); /* borrowed */
    if (path == NULL || !PyList_Check(path)) {
        *failure = strdup("cudabridge: sys.path is not a list");
        return -1;
    }
    for (jsize i = n - 1; i >= 0; i--) {
        jstring js = (jstring)(*env)->GetObjectArrayElement(env, entries, i);
        if ((*env)->ExceptionCheck(env)) return -1;
        if (js == NULL) continue;
        const char *s = (*env)->GetStringUTFChars(env, js, NULL);
        if (s == NULL) {
            (*env)->DeleteLocalRef(env, js);
            return -1;
        }
        PyObject *p = PyUnicode_DecodeFSDefault(s);
        (*env)->ReleaseStringUTFChars(env, js, s);
        (*env)->DeleteLocalRef(env, js);
        if (p == NULL || PyList_Insert(path, 0, p) != 0) {
            Py_XDECREF(p);
            *failure = format_python_failure("cudabridge: could not extend sys.path");
            return -1;
        }
        Py_DECREF(p);
    }
    return 0;
}

static int cache_method(PyObject *hot, const char *name, PyObject **slot) {
    PyObject *m = PyObject_GetAttrString(hot, name);
    if (m == NULL) return -1;
    if (!PyCallable_Check(m)) {
        Py_DECREF(m);
        PyErr_Format(PyExc_TypeError, "JavaHotPath.%s is not callable", name);
        return -1;
    }
    *slot = m;
    return 0;
}

static char *copy_jstring(JNIEnv *env, jstring js) {
    if (js == NULL) return NULL;
    const char *s = (*env)->GetStringUTFChars(env, js, NULL);
    if (s == NULL) return NULL; /* OutOfMemoryError pending */
    char *out = strdup(s);
    (*env)->ReleaseStringUTFChars(env, js, s);
    if (out == NULL) throw_plain(env, c_oome, "java/lang/OutOfMemoryError", "cudabridge: strdup failed");
    return out;
}

/* Whether the JVM's system class loader can load `name` (binary name, dots); clears what it threw. */
static int system_loader_sees(JNIEnv *env, const char *name) {
    if ((*env)->PushLocalFrame(env, 8) != 0) {   /* the caller's frame may be nearly full (JPype's start follows) */
        (*env)->ExceptionClear(env);
        return 0;
    }
    int seen = 0;
    jobject system = NULL;
    jstring jname = NULL;
    jclass loader_class = (*env)->FindClass(env, "java/lang/ClassLoader");
    jmethodID get_system = NULL, load_class = NULL;
    if (loader_class != NULL)
        get_system = (*env)->GetStaticMethodID(env, loader_class, "getSystemClassLoader", "()Ljava/lang/ClassLoader;");
    if (get_system != NULL)
        load_class = (*env)->GetMethodID(env, loader_class, "loadClass", "(Ljava/lang/String;)Ljava/lang/Class;");
    if (load_class != NULL) {
        system = (*env)->CallStaticObjectMethod(env, loader_class, get_system);
        if ((*env)->ExceptionCheck(env)) system = NULL;
    }
    if (system != NULL) jname = (*env)->NewStringUTF(env, name);
    if (jname != NULL) {
        jobject found = (*env)->CallObjectMethod(env, system, load_class, jname);
        seen = !(*env)->ExceptionCheck(env) && found != NULL;
        if (found != NULL) (*env)->DeleteLocalRef(env, found);
    }
    (*env)->ExceptionClear(env);   /* ClassNotFoundException: not seen */
    if (jname != NULL) (*env)->DeleteLocalRef(env, jname);
    if (system != NULL) (*env)->DeleteLocalRef(env, system);
    if (loader_class != NULL) (*env)->DeleteLocalRef(env, loader_class);
    (*env)->PopLocalFrame(env, NULL);
    return seen;
}

/* JPype 1.7 finds its entry class with FindClass and defines the rest through a loader whose parent
 * is the system class loader: org.jpype.jar must be the system class loader's. Where the bridge's
 * own jars came through a child loader (Spark's --jars) it is not on the system class path, and it
 * cannot be put there at launch (Spark unpacks --archives after the executor JVM starts, and the
 * JVM drops class path entries that do not exist when it first searches them). So it is appended
 * to the system class loader's search (JVMTI, live phase: the JDK's application class loader
 * supports it). Returns NULL or a malloc'ed message. */
static char *jpype_on_system_class_path(JNIEnv *env, const char *jar) {
    const char *probe = "org.jpype.JPypeClassLoader";
    if (system_loader_sees(env, probe)) return NULL;
    jvmtiEnv *jvmti = NULL;
    jint rc = (*g_vm)->GetEnv(g_vm, (void **)&jvmti, JVMTI_VERSION_1_2);
    char msg[PATH_MAX + 256];
    if (rc != JNI_OK || jvmti == NULL) {
        snprintf(msg, sizeof msg, "cudabridge: JPype's %s is not on the JVM's system class path and JVMTI is not "
                 "available to add it (GetEnv returned %d): put it on the system class path "
                 "(spark.executor.extraClassPath)", jar, (int)rc);
        return strdup(msg);
    }
    jvmtiError err = (*jvmti)->AddToSystemClassLoaderSearch(jvmti, jar);
    (*jvmti)->DisposeEnvironment(jvmti);
    if (err != JVMTI_ERROR_NONE) {
        snprintf(msg, sizeof msg, "cudabridge: appending JPype's %s to the system class loader's search failed "
                 "(JVMTI error %d): put it on the system class path (spark.executor.extraClassPath)", jar, (int)err);
        return strdup(msg);
    }
    if (!system_loader_sees(env, probe)) {
        snprintf(msg, sizeof msg, "cudabridge: %s was appended to the system class loader's search but %s is still "
                 "not found there: is it JPype's org.jpype.jar?", jar, probe);
        return strdup(msg);
    }
    return NULL;
}

/* Called with g_start_lock held, and GIL held by this thread. Runs the bootstrap and caches the
 * hot path's methods. Returns NULL or a malloc'ed message (the GIL is still held either way). */
static char *run_bootstrap(JNIEnv *env, jobjectArray pythonpath, const char *library, const char *conf) {
    char *failure = NULL;
    if (prepend_sys_path(env, pythonpath, &failure) != 0)
        return failure ? failure : strdup("cudabridge: reading the Python path from Java failed");
    if (t_host_memory == NULL) {
        t_host_memory = (PyTypeObject *)PyType_FromSpec(&host_memory_spec);
        if (t_host_memory == NULL) return format_python_failure("cudabridge: creating the HostMemory type failed");
    }
    PyObject *mod = PyImport_ImportModule("cudabridge.jvm.bootstrap");
    if (mod == NULL) {
        /* Set the import error aside while sys.path is described, then put it back. */
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyObject *sys_path = PySys_GetObject("path");
        PyObject *repr = sys_path ? PyObject_Repr(sys_path) : NULL;
        const char *rp = repr ? PyUnicode_AsUTF8(repr) : NULL;
        if (rp == NULL) PyErr_Clear();
        PyErr_Restore(et, ev, etb);
        char what[8192];
        snprintf(what, sizeof what,
                 "cudabridge: cannot import cudabridge.jvm.bootstrap in Python %s (sys.path %s); is cudabridge "
                 "installed in that environment, or on cudabridge.pythonpath?",
                 g_py_program, rp ? rp : "?");
        char *msg = format_python_failure(what); /* `what` already holds a copy of rp */
        Py_XDECREF(repr);
        return msg;
    }
    PyObject *jar = PyObject_CallMethod(mod, "jpype_class_path", NULL);
    const char *jar_path = jar == NULL ? NULL : PyUnicode_AsUTF8(jar);
    if (jar_path == NULL) {
        Py_XDECREF(jar);
        Py_DECREF(mod);
        return format_python_failure("cudabridge: JPype's org.jpype.jar was not found");
    }
    char *unseen = jpype_on_system_class_path(env, jar_path);
    Py_DECREF(jar);
    if (unseen != NULL) {
        Py_DECREF(mod);
        return unseen;
    }
    PyObject *control = PyObject_CallMethod(mod, "start", "ss", library, conf);
    Py_DECREF(mod);
    if (control == NULL) return format_python_failure("cudabridge: the Python bootstrap (cudabridge.jvm.bootstrap.start) failed");
    PyObject *hot = PyObject_GetAttrString(control, "hot");
    if (hot == NULL || cache_method(control, "native_bind", &m_bind) || cache_method(control, "native_release", &m_release)
        || cache_method(control, "native_release_many", &m_release_many)) {
        Py_XDECREF(hot);
        Py_DECREF(control);
        return format_python_failure("cudabridge: the bootstrap's control object lacks hot, native_bind, native_release "
                                     "or native_release_many");
    }
    Py_DECREF(control); /* the bound methods keep it alive */
    PyObject *errmod = PyImport_ImportModule("cudabridge.jvm.errors");
    int rc = errmod == NULL ? -1 : 0;
    if (rc == 0) {
        f_error_info = PyObject_GetAttrString(errmod, "error_info");
        rc = f_error_info == NULL ? -1 : 0;
    }
    Py_XDECREF(errmod);
    if (rc == 0)
        rc = cache_method(hot, "stream", &m_stream) || cache_method(hot, "allocate", &m_allocate) ||
             cache_method(hot, "free", &m_free) || cache_method(hot, "free_many", &m_free_many) ||
             cache_method(hot, "copy_in", &m_copy_in) || cache_method(hot, "copy_out", &m_copy_out) ||
             cache_method(hot, "copy_in_direct", &m_copy_in_direct) ||
             cache_method(hot, "copy_out_direct", &m_copy_out_direct) ||
             cache_method(hot, "copy_device", &m_copy_device) || cache_method(hot, "memset", &m_memset) ||
             cache_method(hot, "synchronize", &m_sync) || cache_method(hot, "alloc_pinned", &m_alloc_pinned) ||
             cache_method(hot, "free_pinned", &m_free_pinned) ||
             cache_method(hot, "ping", &m_ping) ||
             cache_method(hot, "thread_exit", &m_thread_exit) || cache_method(hot, "launch", &m_launch) ||
             cache_method(hot, "copy_in_address", &m_copy_in_address) ||
             cache_method(hot, "copy_out_address", &m_copy_out_address);
    if (rc == 0) {
        PyObject *api = PyObject_GetAttrString(hot, "native_api");
        if (api == NULL) {
            rc = -1;
        } else if (api == Py_None) {
            Py_DECREF(api);
        } else {
            const cb_native_api *p = PyCapsule_GetPointer(api, CB_NATIVE_API_CAPSULE);
            if (p == NULL || p->version != CB_NATIVE_API_VERSION) {
                if (p != NULL) PyErr_Format(PyExc_RuntimeError, "native_api version %d, the bridge needs %d",
                                            p->version, CB_NATIVE_API_VERSION);
                Py_DECREF(api);
                rc = -1;
            } else {
                Py_XSETREF(g_api_capsule, api);
                g_api = p;
            }
        }
    }
    Py_DECREF(hot); /* the bound methods keep it alive */
    if (rc != 0) return format_python_failure("cudabridge: the hot-path object lacks a method the bridge needs");
    return NULL;
}

/*
 * static native void startPython(String python, String[] pythonPath, String library, String confJson)
 * Idempotent and thread-safe: the first caller starts Python and the bootstrap; later callers
 * return at once (or get the recorded failure of an interpreter start, which cannot be retried).
 * A failed bootstrap (cudabridge or JPype not importable, bad configuration) can be retried.
 */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_startPython(JNIEnv *env, jclass cls, jstring jpython,
                                                                    jobjectArray jpath, jstring jlibrary,
                                                                    jstring jconf) {
    (void)cls;
    if (c_cbe == NULL) {
        throw_state(env, "cudabridge: NativeBridge.nativeInit did not complete");
        return;
    }
    if (jpython == NULL || jlibrary == NULL || jconf == NULL) {
        throw_plain(env, c_npe, "java/lang/NullPointerException", "cudabridge: startPython(python, path, library, conf): null argument");
        return;
    }
    char *python = copy_jstring(env, jpython);
    char *library = python ? copy_jstring(env, jlibrary) : NULL;
    char *conf = library ? copy_jstring(env, jconf) : NULL;
    if (conf == NULL) {
        free(python);
        free(library);
        return; /* exception pending */
    }
    char *failure = NULL;
    int lock_rc = pthread_mutex_lock(&g_start_lock);
    if (lock_rc != 0) {
        free(python);
        free(library);
        free(conf);
        throw_state(env, "cudabridge: pthread_mutex_lock failed");
        return;
    }
    if (atomic_load(&g_ready)) {
        pthread_mutex_unlock(&g_start_lock);
        goto out;
    }
    if (g_py_failure != NULL) {
        failure = strdup(g_py_failure);
        pthread_mutex_unlock(&g_start_lock);
        goto out;
    }
    if (!g_py_initialized) {
        failure = check_python(python);
        if (failure == NULL) failure = init_python(python);
        if (failure != NULL) {
            /* A failed check changes nothing and may be retried with another python; a failed
             * Py_InitializeFromConfig cannot be retried in this process. */
            if (strstr(failure, "Py_InitializeFromConfig") != NULL) g_py_failure = strdup(failure);
            pthread_mutex_unlock(&g_start_lock);
            goto out;
        }
        snprintf(g_py_program, sizeof g_py_program, "%s", python);
        g_py_initialized = 1;
        /* This thread holds the GIL with the main thread state, kept as its own (never deleted). */
        t_slot.ts = PyThreadState_Get();
        atomic_fetch_add(&g_states_created, 1);
    } else {
        if (strcmp(python, g_py_program) != 0) {
            char *msg = NULL;
            size_t len = 0;
            appendf(&msg, &len, "cudabridge: Python was already started in this JVM with %s; cannot switch to %s",
                    g_py_program, python);
            failure = msg;
            pthread_mutex_unlock(&g_start_lock);
            goto out;
        }
        /* Retrying a bootstrap that failed: Python is up, take the GIL as any call does. */
        gil_section g;
        if (gil_enter(env, &g) != 0) {
            pthread_mutex_unlock(&g_start_lock);
            goto out;
        }
        failure = run_bootstrap(env, jpath, library, conf);
        if (failure == NULL) atomic_store_explicit(&g_ready, 1, memory_order_release);
        gil_exit(&g);
        pthread_mutex_unlock(&g_start_lock);
        goto out;
    }
    /* First start: the GIL is held by this thread now. */
    failure = run_bootstrap(env, jpath, library, conf);
    if (failure == NULL) atomic_store_explicit(&g_ready, 1, memory_order_release);
    /* Release the GIL: from now on every thread takes it only around its own calls. */
    t_slot.ts = PyEval_SaveThread();
    pthread_mutex_unlock(&g_start_lock);
out:
    free(python);
    free(library);
    free(conf);
    if (failure != NULL) {
        if (!(*env)->ExceptionCheck(env)) {
            jstring jm = (*env)->NewStringUTF(env, failure);
            jstring jt = jm ? (*env)->NewStringUTF(env, "startup") : NULL;
            if (jm && jt) {
                jthrowable ex = (jthrowable)(*env)->NewObject(env, c_cbe, ctor_cbe, jm, jt);
                if (ex != NULL && (*env)->Throw(env, ex) != 0 && !(*env)->ExceptionCheck(env))
                    (*env)->FatalError(env, "cudabridge: Throw failed");
            }
        }
        free(failure);
    }
}

JNIEXPORT jboolean JNICALL Java_org_cudabridge_NativeBridge_isReady(JNIEnv *env, jclass cls) {
    (void)env;
    (void)cls;
    return atomic_load_explicit(&g_ready, memory_order_acquire) ? JNI_TRUE : JNI_FALSE;
}

/* Make sure this thread keeps a Python thread state (so that JPype proxy calls from it are
 * pinned). Cheap after the first call. */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_ensureThreadState(JNIEnv *env, jclass cls) {
    (void)cls;
    if (t_slot.ts != NULL) return;
    gil_section g;
    if (gil_enter(env, &g) != 0) return;
    gil_exit(&g);
}

/* long[3]: {thread states in the interpreter now, created by the bridge, deleted by the bridge} */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_threadStates(JNIEnv *env, jclass cls, jlongArray out) {
    (void)cls;
    if (out == NULL || (*env)->GetArrayLength(env, out) < 3) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException", "threadStates needs a long[3]");
        return;
    }
    gil_section g;
    if (gil_enter(env, &g) != 0) return;
    jlong count = 0;
    /* With the GIL held the list does not change under us (states are added and removed by
     * threads that hold the GIL or, for PyThreadState_New, under the runtime's HEAD lock, and
     * our own creations happen before they take the GIL: a racing creation may be missed). */
    for (PyThreadState *t = PyInterpreterState_ThreadHead(g_interp); t != NULL; t = PyThreadState_Next(t)) count++;
    gil_exit(&g);
    jlong vals[3] = {count, atomic_load(&g_states_created), atomic_load(&g_states_deleted)};
    (*env)->SetLongArrayRegion(env, out, 0, 3, vals);
}

/* ---------------------------------------------------------------------------------------------
 * The hot path
 * ------------------------------------------------------------------------------------------- */
/* Entering a hot call: the bridge must be up; the short calls (allocate, free, memset, stream,
 * ping) pass the gate (hot_gate.h) before they take the GIL; then the GIL. HOT_LEAVE drops the
 * GIL first and then leaves the gate. */
#define HOT_ENTER(ret, short_call)                                                                          \
    if (!atomic_load_explicit(&g_ready, memory_order_acquire)) {                                             \
        throw_state(env, "cudabridge: the bridge is not started in this JVM (call CudaBridge.start first)"); \
        return ret;                                                                                          \
    }                                                                                                        \
    gil_section g;                                                                                           \
    captured_error err = {0};                                                                                \
    int gated = (short_call) ? gate_enter((uintptr_t)&t_slot) : 0;                                           \
    if (gil_enter(env, &g) != 0) {                                                                           \
        if (gated) gate_exit();                                                                              \
        return ret;                                                                                          \
    }
#define HOT_LEAVE()   \
    gil_exit(&g);     \
    if (gated) gate_exit();

/* static native void configureGate(boolean enabled, long holdNanos) */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_configureGate(JNIEnv *env, jclass cls, jboolean enabled,
                                                                      jlong holdNanos) {
    (void)cls;
    if (holdNanos < 1000 || holdNanos > 1000000000LL) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException",
                    "configureGate: the hold interval must be within [1 us, 1 s]");
        return;
    }
    atomic_store(&g_gate.wait_ns, (long long)holdNanos);
    atomic_store(&g_gate.enabled, enabled ? 1 : 0);
}

/* long[4]: {enabled, hold interval in ns, hand-offs, sleeps} */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_gateStats(JNIEnv *env, jclass cls, jlongArray out) {
    (void)cls;
    if (out == NULL || (*env)->GetArrayLength(env, out) < 4) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException", "gateStats needs a long[4]");
        return;
    }
    jlong vals[4] = {atomic_load(&g_gate.enabled), atomic_load(&g_gate.wait_ns), atomic_load(&g_gate.handoffs),
                     atomic_load(&g_gate.sleeps)};
    (*env)->SetLongArrayRegion(env, out, 0, 4, vals);
}

/* Calls fn(args...) and discards a None result; captures an error. GIL held. */
static int call_void(PyObject *fn, PyObject *const *args, size_t nargs, captured_error *err) {
    PyObject *r = PyObject_Vectorcall(fn, args, nargs, NULL);
    if (r == NULL) {
        capture_python_error(err);
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

static void decref_all(PyObject **objs, int n) {
    for (int i = 0; i < n; i++) Py_XDECREF(objs[i]);
}

/* Builds n PyLongs; on failure captures the error. */
static int make_longs(PyObject **out, const long long *vals, int n, captured_error *err) {
    for (int i = 0; i < n; i++) {
        out[i] = PyLong_FromLongLong(vals[i]);
        if (out[i] == NULL) {
            decref_all(out, i);
            capture_python_error(err);
            return -1;
        }
    }
    return 0;
}

/* A new tuple of n ints, or NULL with the Python error set (GIL held). */
static PyObject *long_tuple(const jlong *vals, jint n) {
    PyObject *tuple = PyTuple_New(n);
    for (jint i = 0; tuple != NULL && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(vals[i]);
        if (v == NULL) {
            Py_CLEAR(tuple);
        } else {
            PyTuple_SET_ITEM(tuple, i, v);
        }
    }
    return tuple;
}

/* Parses a 2-tuple of ints (GIL held). */
static int parse_pair(PyObject *r, long long *a, long long *b, captured_error *err) {
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) {
        PyErr_SetString(PyExc_TypeError, "hot path returned something other than a pair");
        capture_python_error(err);
        return -1;
    }
    *a = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 0));
    *b = *a == -1 && PyErr_Occurred() ? -1 : PyLong_AsLongLong(PyTuple_GET_ITEM(r, 1));
    if (PyErr_Occurred()) {
        capture_python_error(err);
        return -1;
    }
    return 0;
}

/* Calls fn(ints...) -> (int, int) into out[0..1]. Through the gate (allocate, stream) or not. */
static void pair_call(JNIEnv *env, PyObject *fn, const long long *in, int nin, jlongArray out, int short_call) {
    HOT_ENTER(, short_call)
    PyObject *args[4];
    long long a = 0, b = 0;
    if (make_longs(args, in, nin, &err) == 0) {
        PyObject *r = PyObject_Vectorcall(fn, args, (size_t)nin, NULL);
        decref_all(args, nin);
        if (r == NULL) {
            capture_python_error(&err);
        } else {
            parse_pair(r, &a, &b, &err);
            Py_DECREF(r);
        }
    }
    HOT_LEAVE()
    if (err.kind) {
        throw_captured(env, &err);
        return;
    }
    jlong vals[2] = {a, b};
    (*env)->SetLongArrayRegion(env, out, 0, 2, vals); /* out is a long[2] the Java side owns */
}

/* static native void allocate(long task, long size, long[] out): out = {handle, device pointer} */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_allocate(JNIEnv *env, jclass cls, jlong task, jlong size,
                                                                 jlongArray out) {
    (void)cls;
    /* Checked before Python allocates: a result that cannot be stored would leave an allocation
     * Java never learns of (reclaimed only at the task's release). */
    if (out == NULL || (*env)->GetArrayLength(env, out) < 2) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException", "allocate needs a long[2]");
        return;
    }
    long long in[2] = {task, size};
    pair_call(env, m_allocate, in, 2, out, 1);
}

/* static native void releaseTask(long task, long[] out): out = {leaked allocations, leaked bytes}.
 * Not gated: a release frees what the task still holds and may take a while. */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_releaseTask(JNIEnv *env, jclass cls, jlong task,
                                                                    jlongArray out) {
    (void)cls;
    if (out == NULL || (*env)->GetArrayLength(env, out) < 2) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException", "releaseTask needs a long[2]");
        return;
    }
    long long in[1] = {task};
    pair_call(env, m_release, in, 1, out, 0);
}

/* native_release_many((task, ...)) -> ((leaked allocations, leaked bytes) * n flat, messages or None),
 * with (-1, -1) for a task whose release failed; GIL held. counts gets 2n values, *messages a
 * malloc'ed copy of the messages (or NULL). */
static void release_many_call(JNIEnv *env, const jlong *tasks, jint n, jlong *counts, char **messages) {
    HOT_ENTER(, 0)
    PyObject *tuple = long_tuple(tasks, n);
    PyObject *r = NULL;
    if (tuple != NULL) {
        r = PyObject_CallOneArg(m_release_many, tuple);
        Py_DECREF(tuple);
    }
    if (r == NULL) {
        capture_python_error(&err);
    } else {
        PyObject *flat = PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2 ? PyTuple_GET_ITEM(r, 0) : NULL;
        PyObject *msgs = flat ? PyTuple_GET_ITEM(r, 1) : NULL;
        if (flat == NULL || !PyTuple_Check(flat) || PyTuple_GET_SIZE(flat) != 2 * (Py_ssize_t)n
            || (msgs != Py_None && (!PyTuple_Check(msgs) || PyTuple_GET_SIZE(msgs) != (Py_ssize_t)n))) {
            PyErr_SetString(PyExc_TypeError,
                            "native_release_many returned something other than (counts, None or a message per task)");
        } else {
            for (Py_ssize_t k = 0; k < 2 * (Py_ssize_t)n && !PyErr_Occurred(); k++) {
                counts[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(flat, k));
            }
            for (Py_ssize_t k = 0; msgs != Py_None && k < (Py_ssize_t)n && !PyErr_Occurred(); k++) {
                PyObject *m = PyTuple_GET_ITEM(msgs, k);
                if (m == Py_None) continue;
                const char *utf = PyUnicode_Check(m) ? PyUnicode_AsUTF8(m) : NULL;
                if (utf == NULL) {
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a release failure message is not a str");
                } else if ((messages[k] = strdup(utf)) == NULL) {
                    PyErr_NoMemory();
                }
            }
        }
        Py_DECREF(r);
        if (PyErr_Occurred()) capture_python_error(&err);
    }
    HOT_LEAVE()
    throw_captured(env, &err);
}

/* static native String[] releaseTasks(long[] tasks, int n, long[] out): releases n tasks in one
 * call into Python (one GIL acquisition; the lifecycle thread batches the releases of tasks that
 * ended close together). out[2i], out[2i+1] = task i's leaked allocations and bytes, or -1, -1
 * if its release failed; returns null when every release succeeded, else n entries: task i's
 * failure message, or null. Not gated. */
JNIEXPORT jobjectArray JNICALL Java_org_cudabridge_NativeBridge_releaseTasks(JNIEnv *env, jclass cls, jlongArray tasks,
                                                                            jint n, jlongArray out) {
    (void)cls;
    if (tasks == NULL || out == NULL) {
        throw_plain(env, c_npe, "java/lang/NullPointerException", "releaseTasks: tasks and out are required");
        return NULL;
    }
    if (n < 0 || n > (*env)->GetArrayLength(env, tasks) || 2LL * n > (*env)->GetArrayLength(env, out)) {
        throw_plain(env, c_ioobe, "java/lang/IndexOutOfBoundsException",
                    "releaseTasks: n outside tasks, or out shorter than 2n");
        return NULL;
    }
    if (n == 0) return NULL;
    jlong *buf = malloc(sizeof(jlong) * 3 * (size_t)n); /* n task ids, then 2n counts */
    char **messages = calloc((size_t)n, sizeof(char *));
    if (buf == NULL || messages == NULL) {
        free(buf);
        free(messages);
        throw_plain(env, c_oome, "java/lang/OutOfMemoryError", "releaseTasks: malloc failed");
        return NULL;
    }
    jobjectArray result = NULL;
    (*env)->GetLongArrayRegion(env, tasks, 0, n, buf);
    if (!(*env)->ExceptionCheck(env)) {
        release_many_call(env, buf, n, buf + n, messages);
        if (!(*env)->ExceptionCheck(env)) {
            (*env)->SetLongArrayRegion(env, out, 0, 2 * n, buf + n);
            int failed = 0;
            for (jint k = 0; k < n; k++) failed |= messages[k] != NULL;
            if (failed) {
                jclass string = (*env)->FindClass(env, "java/lang/String");
                result = string ? (*env)->NewObjectArray(env, n, string, NULL) : NULL;
                for (jint k = 0; result != NULL && k < n && !(*env)->ExceptionCheck(env); k++) {
                    if (messages[k] == NULL) continue;
                    jstring m = (*env)->NewStringUTF(env, messages[k]);
                    if (m != NULL) {
                        (*env)->SetObjectArrayElement(env, result, k, m);
                        (*env)->DeleteLocalRef(env, m);
                    }
                }
                if (string) (*env)->DeleteLocalRef(env, string);
                if ((*env)->ExceptionCheck(env)) result = NULL;
            }
        }
    }
    for (jint k = 0; k < n; k++) free(messages[k]);
    free(messages);
    free(buf);
    return result;
}

/* With the strings copied: native_bind(task, gpu or None, priority) -> out = {stream, GPU ordinal}. */
static void bind_call(JNIEnv *env, jlong task, const char *gpu, const char *priority, jlongArray out) {
    HOT_ENTER(, 0)
    long long a = 0, b = 0;
    PyObject *args[3] = {PyLong_FromLongLong(task), NULL, NULL};
    if (args[0] != NULL) args[1] = gpu ? PyUnicode_FromString(gpu) : Py_NewRef(Py_None);
    if (args[1] != NULL) args[2] = PyUnicode_FromString(priority);
    if (args[2] == NULL) {
        capture_python_error(&err);
    } else {
        PyObject *r = PyObject_Vectorcall(m_bind, args, 3, NULL);
        if (r == NULL) {
            capture_python_error(&err);
        } else {
            parse_pair(r, &a, &b, &err);
            Py_DECREF(r);
        }
    }
    decref_all(args, 3);
    HOT_LEAVE()
    if (err.kind) {
        throw_captured(env, &err);
        return;
    }
    jlong vals[2] = {a, b};
    (*env)->SetLongArrayRegion(env, out, 0, 2, vals);
}

/* static native void bindTask(long task, String gpuAddress, String priority, long[] out):
 * out = {stream, GPU ordinal}. The strings are copied before the GIL is taken. */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_bindTask(JNIEnv *env, jclass cls, jlong task,
                                                                 jstring jgpu, jstring jpriority, jlongArray out) {
    (void)cls;
    if (jpriority == NULL || out == NULL || (*env)->GetArrayLength(env, out) < 2) {
        throw_plain(env, c_npe, "java/lang/NullPointerException", "bindTask: priority and a long[2] are required");
        return;
    }
    char *gpu = NULL;
    if (jgpu != NULL && (gpu = copy_jstring(env, jgpu)) == NULL) return; /* exception pending */
    char *priority = copy_jstring(env, jpriority);
    if (priority != NULL) bind_call(env, task, gpu, priority, out);
    free(gpu);
    free(priority);
}

/* static native void taskStream(long task, long[] out): out = {stream, GPU ordinal} */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_taskStream(JNIEnv *env, jclass cls, jlong task,
                                                                   jlongArray out) {
    (void)cls;
    if (out == NULL || (*env)->GetArrayLength(env, out) < 2) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException", "taskStream needs a long[2]");
        return;
    }
    long long in[1] = {task};
    pair_call(env, m_stream, in, 1, out, 1);
}

/* Calls fn(ints...) and discards its None; through the gate for the short calls, or not. */
static void void_call(JNIEnv *env, PyObject *fn, const long long *in, int nin, int short_call) {
    HOT_ENTER(, short_call)
    PyObject *args[5];
    if (make_longs(args, in, nin, &err) == 0) {
        call_void(fn, args, (size_t)nin, &err);
        decref_all(args, nin);
    }
    HOT_LEAVE()
    throw_captured(env, &err);
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_free(JNIEnv *env, jclass cls, jlong handle) {
    (void)cls;
    long long in[1] = {handle};
    void_call(env, m_free, in, 1, 1);
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_memset(JNIEnv *env, jclass cls, jlong handle, jlong offset,
                                                               jint value, jlong nbytes) {
    (void)cls;
    long long in[4] = {handle, offset, value, nbytes};
    void_call(env, m_memset, in, 4, 1);
}

#define LAUNCH_MAX_ARGS CB_LAUNCH_MAX_ARGS

/* static native void launch(long task, long kernel, int[] dims, long shared, long[] values, byte[] kinds,
 * long[] offsets): one user kernel on the task's stream. The arrays are read before the GIL is
 * taken; the hot path C twin's launch (native_api.h) checks the arguments, marshals them and
 * queues the kernel with cuLaunchKernel under the task guard, with no Python object built here
 * (without the C twin, JavaHotPath.launch does it in Python). Gated: a launch is a short call. */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_launch(JNIEnv *env, jclass cls, jlong task, jlong kernel,
                                                               jintArray dims, jlong shared, jlongArray values,
                                                               jbyteArray kinds, jlongArray offsets) {
    (void)cls;
    if (dims == NULL || values == NULL || kinds == NULL || offsets == NULL) {
        throw_plain(env, c_npe, "java/lang/NullPointerException", "launch: dims, values, kinds and offsets are required");
        return;
    }
    jsize n = (*env)->GetArrayLength(env, values);
    if ((*env)->GetArrayLength(env, dims) != 6 || (*env)->GetArrayLength(env, kinds) != n ||
        (*env)->GetArrayLength(env, offsets) != n || n > LAUNCH_MAX_ARGS) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException",
                    "launch: dims holds 6, values, kinds and offsets one per argument (at most 512)");
        return;
    }
    /* On the stack: HOT_ENTER may return early, and nothing may leak then. */
    jint d[6];
    jlong buf[2 * LAUNCH_MAX_ARGS];
    jbyte kb[LAUNCH_MAX_ARGS];
    (*env)->GetIntArrayRegion(env, dims, 0, 6, d);
    (*env)->GetLongArrayRegion(env, values, 0, n, buf);
    (*env)->GetLongArrayRegion(env, offsets, 0, n, buf + n);
    (*env)->GetByteArrayRegion(env, kinds, 0, n, kb);
    if ((*env)->ExceptionCheck(env)) return;
    HOT_ENTER(, 1)
    if (g_api != NULL) {
        if (g_api->launch(g_api->core, task, kernel, d, shared, (const long long *)buf, kb, (const long long *)buf + n, n) < 0) capture_python_error(&err);
        HOT_LEAVE()
        throw_captured(env, &err);
        return;
    }
    PyObject *args[7] = {PyLong_FromLongLong(task), PyLong_FromLongLong(kernel),
                         Py_BuildValue("(iiiiii)", d[0], d[1], d[2], d[3], d[4], d[5]),
                         PyLong_FromLongLong(shared), long_tuple(buf, n),
                         PyBytes_FromStringAndSize((const char *)kb, n), long_tuple(buf + n, n)};
    int ok = 1;
    for (int i = 0; i < 7; i++) ok &= args[i] != NULL;
    if (!ok) {
        capture_python_error(&err);
    } else {
        call_void(m_launch, args, 7, &err);
    }
    for (int i = 0; i < 7; i++) Py_XDECREF(args[i]);
    HOT_LEAVE()
    throw_captured(env, &err);
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_synchronize(JNIEnv *env, jclass cls, jlong task) {
    (void)cls;
    long long in[1] = {task};
    void_call(env, m_sync, in, 1, 0);
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_copyDevice(JNIEnv *env, jclass cls, jlong dst, jlong dstOff,
                                                                   jlong src, jlong srcOff, jlong nbytes) {
    (void)cls;
    long long in[5] = {dst, dstOff, src, srcOff, nbytes};
    void_call(env, m_copy_device, in, 5, 0);
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_ping(JNIEnv *env, jclass cls) {
    (void)cls;
    void_call(env, m_ping, NULL, 0, 1);
}

/* One Python call for `count` frees (the handles were read from Java before the GIL is taken). */
static void free_many_call(JNIEnv *env, const jlong *vals, jint count) {
    HOT_ENTER(, 1)
    PyObject *tuple = long_tuple(vals, count);
    if (tuple == NULL) {
        capture_python_error(&err);
    } else {
        call_void(m_free_many, &tuple, 1, &err);
        Py_DECREF(tuple);
    }
    HOT_LEAVE()
    throw_captured(env, &err);
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_freeMany(JNIEnv *env, jclass cls, jlongArray handles,
                                                                 jint count) {
    (void)cls;
    if (handles == NULL) {
        throw_plain(env, c_npe, "java/lang/NullPointerException", "freeMany: handles is null");
        return;
    }
    if (count < 0 || count > (*env)->GetArrayLength(env, handles)) {
        throw_plain(env, c_ioobe, "java/lang/IndexOutOfBoundsException", "freeMany: count outside the array");
        return;
    }
    if (count == 0) return;
    jlong small[64];
    jlong *vals = count <= 64 ? small : malloc(sizeof(jlong) * (size_t)count);
    if (vals == NULL) {
        throw_plain(env, c_oome, "java/lang/OutOfMemoryError", "freeMany: malloc failed");
        return;
    }
    (*env)->GetLongArrayRegion(env, handles, 0, count, vals);
    if (!(*env)->ExceptionCheck(env)) free_many_call(env, vals, count);
    if (vals != small) free(vals);
}

/* Heap-array copies. Java has checked the ranges against the array and the buffer; the array's
 * bytes [byteOffset, byteOffset+nbytes) are staged in chunks through this thread's buffer. */
static jboolean check_array(JNIEnv *env, jobject array, jlong byteOffset, jlong nbytes, jint elemSize) {
    if (array == NULL) {
        throw_plain(env, c_npe, "java/lang/NullPointerException", "cudabridge copy: array is null");
        return JNI_FALSE;
    }
    jsize len = (*env)->GetArrayLength(env, (jarray)array);
    if (elemSize <= 0 || byteOffset < 0 || nbytes < 0 || byteOffset + nbytes > (jlong)len * elemSize) {
        throw_plain(env, c_ioobe, "java/lang/IndexOutOfBoundsException", "cudabridge copy: range outside the array");
        return JNI_FALSE;
    }
    return JNI_TRUE;
}

static void call_with_view(PyObject *fn, jlong handle, jlong devOffset, char *mem, size_t n, int direct,
                           jlong address, captured_error *err) {
    PyObject *args[4] = {NULL, NULL, NULL, NULL};
    int nargs = direct ? 4 : 3;
    args[0] = PyLong_FromLongLong(handle);
    args[1] = args[0] ? PyLong_FromLongLong(devOffset) : NULL;
    if (direct) args[2] = args[1] ? PyLong_FromLongLong(address) : NULL;
    PyObject **viewslot = &args[direct ? 3 : 2];
    int ok = args[0] && args[1] && (!direct || args[2]);
    if (ok) *viewslot = host_view(mem, n);
    if (!ok || *viewslot == NULL) {
        capture_python_error(err);
    } else {
        call_void(fn, args, (size_t)nargs, err);
    }
    decref_all(args, 4);
}

/* static native void copyIn(long handle, long devOffset, Object array, long byteOffset, long nbytes, int elemSize) */
/* A staged copy of at most CB_QUICK_COPY_BYTES that took one idle staging slot without waiting,
 * the GIL and the buffer's lease held: host->device is done with both held (one memcpy shorter
 * than handing the GIL off and taking it back, then the DMA); device->host queues its one DMA,
 * leaves the lease (it queues nothing more) and waits for the DMA and copies out without the GIL.
 * The slot goes back at the end. Returns with the GIL released and the lease left; a driver error
 * is raised to Java. */
#define CB_QUICK_COPY_BYTES (64 << 10)
static void quick_copy(JNIEnv *env, gil_section *g, cb_copy_lease *lease, cb_ring *r, cb_host_side *host,
                       jlong byteOffset, jlong nbytes, int to_device) {
    const cb_driver *d = g_api->driver;
    captured_error err = {0};
    const char *call = NULL;
    cb_CUcontext prev;
    jlong issued = 0;
    int held = 1;   /* the GIL */
    int rc = ctx_enter(d, lease->context, &prev, &call);
    if (rc == CB_CUDA_SUCCESS)
        rc = to_device ? ring_to_device(d, r, host, byteOffset, nbytes, lease->address, lease->stream, 1, &call)
                       : ring_from_device_queue(d, r, nbytes, lease->address, lease->stream, &issued, &call);
    g_api->leave_copy(g_api->core, lease);
    if (rc == CB_CUDA_SUCCESS && !to_device) {
        gil_exit(g);
        held = 0;
        rc = ring_from_device_drain(d, r, host, byteOffset, nbytes, lease->address, lease->stream, 1, issued, &call);
    }
    ctx_restore(d, lease->context, prev);
    g_api->staging_give(g_api->core, r, rc > 0);   /* a driver call failed: the slot's state is unknown */
    if (rc > 0) {
        if (!held && gil_enter(env, g) != 0) return;
        held = 1;
        g_api->driver_failed(g_api->core, call, rc);
        capture_python_error(&err);
    }
    if (held) gil_exit(g);
    if (rc > 0) throw_captured(env, &err);
    /* rc -1: the array could not be pinned; its Java exception is pending */
}

/* No staging slot came within the staging wait: the copy goes through pageable memory, ordered on
 * the buffer's stream as a staged one (the driver stages it itself: host->device returns once the
 * source is consumed, device->host once the bytes are there). A heap array goes through this
 * thread's pageable buffer, chunk by chunk (the array has no stable address outside a short
 * critical region). 0, a CUresult (*call says which call), or -1 with a Java exception pending. */
static int pageable_copy(const cb_driver *d, cb_host_side *h, jlong off, jlong nbytes, unsigned long long dev,
                         cb_CUstream stream, int to_device, const char **call) {
    for (jlong done = 0; done < nbytes;) {
        size_t n = h->array == NULL ? (size_t)(nbytes - done)
                 : (size_t)(nbytes - done) < CB_STAGE_MAX ? (size_t)(nbytes - done) : CB_STAGE_MAX;
        char *buf = h->array == NULL ? h->raw + off + done : stage_buffer(n);
        if (buf == NULL) {
            throw_plain(h->env, c_oome, "java/lang/OutOfMemoryError", "cudabridge copy: staging buffer malloc failed");
            return -1;
        }
        if (to_device && h->array != NULL) {
            char *src = host_side_enter(h);
            if (src == NULL) return -1;
            memcpy(buf, src + off + done, n);
            host_side_leave(h, src, 0);
        }
        int rc = to_device ? d->cuMemcpyHtoDAsync(dev + (unsigned long long)done, buf, n, stream)
                           : d->cuMemcpyDtoHAsync(buf, dev + (unsigned long long)done, n, stream);
        if (rc != CB_CUDA_SUCCESS) {
            *call = to_device ? "cuMemcpyHtoDAsync(pageable)" : "cuMemcpyDtoHAsync(pageable)";
            return rc;
        }
        if (!to_device) {   /* into pageable memory the call returns with the bytes there; make sure */
            if ((rc = d->cuStreamSynchronize(stream)) != CB_CUDA_SUCCESS) {
                *call = "cuStreamSynchronize(pageable copy)";
                return rc;
            }
            if (h->array != NULL) {
                char *dst = host_side_enter(h);
                if (dst == NULL) return -1;
                memcpy(dst + off + done, buf, n);
                host_side_leave(h, dst, 1);
            }
        }
        done += (jlong)n;
    }
    return CB_CUDA_SUCCESS;
}

/* A copy on a GPU, in C (native_api.h's enter_copy says how): the buffer's task lease entered
 * with the GIL held (no Python frame when the hot path's C twin takes it as it stands). Page-locked
 * host memory outside the heap is then one asynchronous DMA on the buffer's stream, queued with the
 * GIL still held, as a launch is; anything else (a heap array, pageable memory) goes through
 * staging slots of its GPU, taken for this copy and given back when it ends (staging_ring.h), the
 * chunks and DMAs without the GIL; with no slot free within the staging wait, through pageable
 * memory. The lease is left (and any driver error raised) with the GIL. Not gated: a copy waits. */
static void gpu_copy(JNIEnv *env, jlong handle, jlong devOffset, cb_host_side *host, jlong byteOffset,
                     jlong nbytes, int to_device, int kind) {
    const cb_driver *d = g_api->driver;
    gil_section g;
    captured_error err = {0};
    if (gil_enter(env, &g) != 0) return;
    cb_copy_lease lease = {0};
    int entered = g_api->enter_copy(g_api->core, handle, devOffset, nbytes, to_device, kind,
                                    (unsigned long long)(uintptr_t)host->raw, &lease) == 0;
    if (entered && lease.pagelocked) {
        const char *call = NULL;
        cb_CUcontext prev;
        int rc = ctx_enter(d, lease.context, &prev, &call);
        if (rc == CB_CUDA_SUCCESS) {
            rc = to_device ? d->cuMemcpyHtoDAsync(lease.address, host->raw, (size_t)nbytes, lease.stream)
                           : d->cuMemcpyDtoHAsync(host->raw, lease.address, (size_t)nbytes, lease.stream);
            if (rc != CB_CUDA_SUCCESS) call = to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync";
        }
        ctx_restore(d, lease.context, prev);
        g_api->leave_copy(g_api->core, &lease);
        if (rc != CB_CUDA_SUCCESS) {
            g_api->driver_failed(g_api->core, call, rc);
            capture_python_error(&err);
        }
        gil_exit(&g);
        if (rc != CB_CUDA_SUCCESS) throw_captured(env, &err);
        return;
    }
    if (!entered) {
        capture_python_error(&err);
        gil_exit(&g);
        throw_captured(env, &err);
        return;
    }
    cb_ring slots;   /* the staging slots this copy holds */
    const char *call = NULL;
    int rc = CB_CUDA_SUCCESS;
    size_t slot_bytes = (size_t)g_api->staging_slot_bytes;
    if (nbytes <= CB_QUICK_COPY_BYTES && (size_t)nbytes <= slot_bytes &&
        g_api->staging_take(g_api->core, lease.gpu, 1, 1, &slots, &rc, &call) == 1) {
        quick_copy(env, &g, &lease, &slots, host, byteOffset, nbytes, to_device);
        return;
    }
    gil_exit(&g);
    cb_CUcontext prev;
    rc = ctx_enter(d, lease.context, &prev, &call);
    if (rc == CB_CUDA_SUCCESS) {
        jlong chunks = (nbytes + (jlong)slot_bytes - 1) / (jlong)slot_bytes;
        int want = chunks < g_api->staging_slots ? (int)chunks : g_api->staging_slots;
        int taken = g_api->staging_take(g_api->core, lease.gpu, want, 0, &slots, &rc, &call);
        if (taken > 0) {
            int threads = g_api->staging_copy_threads;
            rc = to_device ? ring_to_device(d, &slots, host, byteOffset, nbytes, lease.address, lease.stream, threads, &call)
                           : ring_from_device(d, &slots, host, byteOffset, nbytes, lease.address, lease.stream, threads,
                                              &call);
            g_api->staging_give(g_api->core, &slots, rc > 0);   /* a driver call failed: the slots' state is unknown */
        } else if (taken == 0) {   /* none within the staging wait (counted there) */
            rc = pageable_copy(d, host, byteOffset, nbytes, lease.address, lease.stream, to_device, &call);
        }
    }
    ctx_restore(d, lease.context, prev);
    if (gil_enter(env, &g) != 0) return;   /* cannot happen: this thread has its Python state */
    g_api->leave_copy(g_api->core, &lease);
    if (rc > 0) {
        g_api->driver_failed(g_api->core, call, rc);
        capture_python_error(&err);
    }
    gil_exit(&g);
    if (rc > 0) throw_captured(env, &err);
    /* rc -1: the array could not be pinned; its Java exception is pending */
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_copyIn(JNIEnv *env, jclass cls, jlong handle, jlong devOffset,
                                                               jobject array, jlong byteOffset, jlong nbytes,
                                                               jint elemSize) {
    (void)cls;
    if (!check_array(env, array, byteOffset, nbytes, elemSize)) return;
    if (!atomic_load_explicit(&g_ready, memory_order_acquire)) {
        throw_state(env, "cudabridge: the bridge is not started in this JVM");
        return;
    }
    if (g_api != NULL && g_api->driver != NULL && nbytes > 0) {   /* a GPU: pinned staging, pipelined */
        cb_host_side host = {env, (jarray)array, NULL};
        gpu_copy(env, handle, devOffset, &host, byteOffset, nbytes, 1, CB_HOST_HEAP);
        return;
    }
    jlong done = 0;
    do {
        size_t n = (size_t)(nbytes - done) < CB_STAGE_MAX ? (size_t)(nbytes - done) : CB_STAGE_MAX;
        char *stage = stage_buffer(n ? n : 1);
        if (stage == NULL) {
            throw_plain(env, c_oome, "java/lang/OutOfMemoryError", "cudabridge copy: staging buffer malloc failed");
            return;
        }
        if (n) {
            /* Short critical region: a memcpy, no JNI call, no GIL wait inside it. */
            char *src = (*env)->GetPrimitiveArrayCritical(env, (jarray)array, NULL);
            if (src == NULL) return; /* OutOfMemoryError pending */
            memcpy(stage, src + byteOffset + done, n);
            (*env)->ReleasePrimitiveArrayCritical(env, (jarray)array, src, JNI_ABORT);
        }
        gil_section g;
        captured_error err = {0};
        if (gil_enter(env, &g) != 0) return;
        call_with_view(m_copy_in, handle, devOffset + done, stage, n, 0, 0, &err);
        gil_exit(&g);
        if (err.kind) {
            throw_captured(env, &err);
            return;
        }
        done += (jlong)n;
    } while (done < nbytes);
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_copyOut(JNIEnv *env, jclass cls, jlong handle,
                                                                jlong devOffset, jobject array, jlong byteOffset,
                                                                jlong nbytes, jint elemSize) {
    (void)cls;
    if (!check_array(env, array, byteOffset, nbytes, elemSize)) return;
    if (!atomic_load_explicit(&g_ready, memory_order_acquire)) {
        throw_state(env, "cudabridge: the bridge is not started in this JVM");
        return;
    }
    if (g_api != NULL && g_api->driver != NULL && nbytes > 0) {   /* a GPU: pinned staging, pipelined */
        cb_host_side host = {env, (jarray)array, NULL};
        gpu_copy(env, handle, devOffset, &host, byteOffset, nbytes, 0, CB_HOST_HEAP);
        return;
    }
    jlong done = 0;
    do {
        size_t n = (size_t)(nbytes - done) < CB_STAGE_MAX ? (size_t)(nbytes - done) : CB_STAGE_MAX;
        char *stage = stage_buffer(n ? n : 1);
        if (stage == NULL) {
            throw_plain(env, c_oome, "java/lang/OutOfMemoryError", "cudabridge copy: staging buffer malloc failed");
            return;
        }
        gil_section g;
        captured_error err = {0};
        if (gil_enter(env, &g) != 0) return;
        /* Into pageable staging memory the backend returns only when the bytes are there. */
        call_with_view(m_copy_out, handle, devOffset + done, stage, n, 0, 0, &err);
        gil_exit(&g);
        if (err.kind) {
            throw_captured(env, &err);
            return;
        }
        if (n) {
            char *dst = (*env)->GetPrimitiveArrayCritical(env, (jarray)array, NULL);
            if (dst == NULL) return;
            memcpy(dst + byteOffset + done, stage, n);
            (*env)->ReleasePrimitiveArrayCritical(env, (jarray)array, dst, 0);
        }
        done += (jlong)n;
    } while (done < nbytes);
}

/* A direct ByteBuffer's memory from bufOffset, nbytes of it inside the buffer; NULL with a Java
 * exception pending otherwise. */
static char *direct_range(JNIEnv *env, jobject buf, jlong bufOffset, jlong nbytes) {
    if (buf == NULL) {
        throw_plain(env, c_npe, "java/lang/NullPointerException", "cudabridge copy: ByteBuffer is null");
        return NULL;
    }
    char *addr = (*env)->GetDirectBufferAddress(env, buf);
    jlong cap = (*env)->GetDirectBufferCapacity(env, buf);
    if (addr == NULL || cap < 0) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException",
                    "cudabridge copy: not a direct ByteBuffer (use the byte[] overloads for heap buffers)");
        return NULL;
    }
    if (bufOffset < 0 || nbytes < 0 || bufOffset + nbytes > cap) {
        throw_plain(env, c_ioobe, "java/lang/IndexOutOfBoundsException", "cudabridge copy: range outside the ByteBuffer");
        return NULL;
    }
    return addr + bufOffset;
}

/* A copy between a buffer and host memory Java owns outside the heap (a direct ByteBuffer's:
 * CB_HOST_DIRECT, or an address: CB_HOST_ADDRESS). On a GPU it runs in C (gpu_copy: one DMA from or
 * into page-locked memory, the GPU's staging slots for pageable memory, the driver's own pageable copy
 * being one thread's memcpy with no overlap); elsewhere fn copies it (the hot path's Python). */
static void host_memory_copy(JNIEnv *env, PyObject *fn, jlong handle, jlong devOffset, char *mem, jlong nbytes,
                             int to_device, int kind) {
    if (atomic_load_explicit(&g_ready, memory_order_acquire) && g_api != NULL && g_api->driver != NULL && nbytes > 0) {
        cb_host_side host = {env, NULL, mem};
        gpu_copy(env, handle, devOffset, &host, 0, nbytes, to_device, kind);
        return;
    }
    HOT_ENTER(, 0)
    call_with_view(fn, handle, devOffset, mem, (size_t)nbytes, 1, (jlong)(intptr_t)mem, &err);
    HOT_LEAVE()
    if (err.kind) throw_captured(env, &err);
}

/* Direct ByteBuffers: pinned ones (allocatePinned) asynchronously on the buffer's stream, others
 * staged (host_memory_copy). */
static void direct_copy(JNIEnv *env, PyObject *fn, jlong handle, jlong devOffset, jobject buf, jlong bufOffset,
                        jlong nbytes) {
    char *mem = direct_range(env, buf, bufOffset, nbytes);
    if (mem == NULL) return;
    host_memory_copy(env, fn, handle, devOffset, mem, nbytes, fn == m_copy_in_direct, CB_HOST_DIRECT);
}

/* static native void copyInAddress(long handle, long devOffset, long address, long nbytes) and
 * copyOutAddress: memory Java code owns outside the heap (an Arrow buffer's memoryAddress(), an
 * off-heap column vector, Unsafe). The address cannot be checked: a wrong one crashes the JVM, as
 * any native copy would. Asynchronous from and into a registered region (registerHost). */
static void address_copy(JNIEnv *env, PyObject *fn, jlong handle, jlong devOffset, jlong address, jlong nbytes) {
    if (address == 0 || nbytes < 0) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException",
                    "cudabridge copy: the host address must not be 0 and the size not negative");
        return;
    }
    host_memory_copy(env, fn, handle, devOffset, (char *)(intptr_t)address, nbytes, fn == m_copy_in_address,
                     CB_HOST_ADDRESS);
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_copyInDirect(JNIEnv *env, jclass cls, jlong handle,
                                                                     jlong devOffset, jobject buf, jlong bufOffset,
                                                                     jlong nbytes) {
    (void)cls;
    direct_copy(env, m_copy_in_direct, handle, devOffset, buf, bufOffset, nbytes);
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_copyOutDirect(JNIEnv *env, jclass cls, jlong handle,
                                                                      jlong devOffset, jobject buf, jlong bufOffset,
                                                                      jlong nbytes) {
    (void)cls;
    direct_copy(env, m_copy_out_direct, handle, devOffset, buf, bufOffset, nbytes);
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_copyInAddress(JNIEnv *env, jclass cls, jlong handle,
                                                                      jlong devOffset, jlong address, jlong nbytes) {
    (void)cls;
    address_copy(env, m_copy_in_address, handle, devOffset, address, nbytes);
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_copyOutAddress(JNIEnv *env, jclass cls, jlong handle,
                                                                       jlong devOffset, jlong address, jlong nbytes) {
    (void)cls;
    address_copy(env, m_copy_out_address, handle, devOffset, address, nbytes);
}

/* static native long address(ByteBuffer buffer): a direct buffer's address, 0 otherwise. */
JNIEXPORT jlong JNICALL Java_org_cudabridge_NativeBridge_address(JNIEnv *env, jclass cls, jobject buf) {
    (void)cls;
    if (buf == NULL) {
        throw_plain(env, c_npe, "java/lang/NullPointerException", "address: ByteBuffer is null");
        return 0;
    }
    return (jlong)(intptr_t)(*env)->GetDirectBufferAddress(env, buf);
}

/* static native ByteBuffer allocPinned(long task, long nbytes, boolean[] pinnedOut): page-locked host
 * memory as a direct buffer, owned by task (0: no owner); pinnedOut[0] is set to whether it is
 * page-locked (false: the pageable fallback). */
JNIEXPORT jobject JNICALL Java_org_cudabridge_NativeBridge_allocPinned(JNIEnv *env, jclass cls, jlong task,
                                                                       jlong nbytes, jbooleanArray pinned_out) {
    (void)cls;
    if (nbytes <= 0) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException", "allocatePinned: size must be positive");
        return NULL;
    }
    if (pinned_out == NULL || (*env)->GetArrayLength(env, pinned_out) < 1) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException", "allocatePinned: pinnedOut needs one element");
        return NULL;
    }
    HOT_ENTER(NULL, 0)
    long long addr = 0, pinned = 0;
    PyObject *args[2] = {PyLong_FromLongLong(nbytes), PyLong_FromLongLong(task)};
    if (args[0] == NULL || args[1] == NULL) {
        Py_XDECREF(args[0]);
        Py_XDECREF(args[1]);
        capture_python_error(&err);
    } else {
        PyObject *r = PyObject_Vectorcall(m_alloc_pinned, args, 2, NULL);
        Py_DECREF(args[0]);
        Py_DECREF(args[1]);
        if (r == NULL) {
            capture_python_error(&err);
        } else {
            parse_pair(r, &addr, &pinned, &err);   /* (address, pinned) */
            Py_DECREF(r);
        }
    }
    HOT_LEAVE()
    if (err.kind) {
        throw_captured(env, &err);
        return NULL;
    }
    jboolean flag = pinned ? JNI_TRUE : JNI_FALSE;
    (*env)->SetBooleanArrayRegion(env, pinned_out, 0, 1, &flag);
    jobject bb = (*env)->NewDirectByteBuffer(env, (void *)(intptr_t)addr, nbytes);
    if (bb == NULL) {
        /* Give the memory back rather than leak it; an exception is pending (or JNI lacks support). */
        jthrowable pending = (*env)->ExceptionOccurred(env);
        if (pending) (*env)->ExceptionClear(env);
        gil_section g2;
        captured_error err2 = {0};
        if (gil_enter(env, &g2) == 0) {
            PyObject *a = PyLong_FromLongLong(addr);
            if (a) {
                call_void(m_free_pinned, &a, 1, &err2);
                Py_DECREF(a);
            } else {
                PyErr_Clear();
            }
            gil_exit(&g2);
            free(err2.message);
            free(err2.pytype);
        }
        if (pending) {
            (*env)->Throw(env, pending);
        } else if (!(*env)->ExceptionCheck(env)) {
            throw_state(env, "cudabridge: NewDirectByteBuffer failed (direct buffer access unsupported)");
        }
        return NULL;
    }
    return bb;
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_freePinned(JNIEnv *env, jclass cls, jobject buf) {
    (void)cls;
    if (buf == NULL) {
        throw_plain(env, c_npe, "java/lang/NullPointerException", "freePinned: buffer is null");
        return;
    }
    char *addr = (*env)->GetDirectBufferAddress(env, buf);
    if (addr == NULL) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException", "freePinned: not a direct ByteBuffer");
        return;
    }
    long long in[1] = {(long long)(intptr_t)addr};
    void_call(env, m_free_pinned, in, 1, 0);
}
