/*
 * thread_states.h: each Java thread's own Python thread state, kept across calls and deleted when
 * the thread ends; GIL sections; Python errors captured with the GIL held and thrown to Java after
 * it is released; the CUDA context of a copy; the thread's pageable staging buffer; and the JNI
 * natives about them (ensureThreadState, threadStates).
 *
 * Part of the bridge library's one translation unit: cudabridge_jni.c includes it once, after
 * the headers before it in its list, whose definitions it uses (all static: nothing leaves the
 * library but the JNI entry points).
 */
#ifndef CB_THREAD_STATES_H
#define CB_THREAD_STATES_H

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
    int ts_forever;      /* ts is the main thread state (the thread that started Python): never deleted */
    entry_mine entry;    /* its part of entry_waits.h's table */
} thread_slot;

static __thread thread_slot t_slot;

/* Whether this thread holds the gate now (between HOT_ENTER and HOT_LEAVE of a short call). */
static __thread int t_in_gate;

/* A short call about to wait (an allocation waiting for other tasks' frees: pressure/
 * memory_waits.py) lets the gate go, so that the other threads' calls (the frees it waits for
 * among them) pass meanwhile; it goes back in before it returns. Called from Python through
 * ctypes, which releases the GIL around them: the gate is never waited for with the GIL held
 * (the order is always gate, then GIL). gate_yield returns whether it let the gate go. */
static int cb_gate_yield(void) {
    if (!t_in_gate) return 0;
    t_in_gate = 0;
    gate_exit();
    return 1;
}

static void cb_gate_resume(int yielded) {
    if (yielded && !t_in_gate) t_in_gate = gate_enter((uintptr_t)&t_slot);
}

/* The same allocation, before it registers its wait: the thread stops counting as inside its call
 * for the deadlock breaker (entry_waits.h) until cb_entry_resume, after the wait is over, so that
 * a thread waiting for memory is a registered wait and not a running call. Through ctypes too, on
 * the waiting thread itself; 0 from a thread in no published call (a Python thread). */
static unsigned long long cb_entry_pause(void) { return entry_pause(&t_slot.entry); }

static void cb_entry_resume(unsigned long long saved) { entry_resume(&t_slot.entry, saved); }
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
#define CB_OOM_MAX_FIELDS 16   /* room for OutOfDeviceMemory.FIELDS (8 today) */

typedef struct {
    int kind;            /* 0 none, 1 Python exception */
    char *message;       /* malloc'ed */
    char *pytype;        /* malloc'ed */
    char *java_kind;     /* malloc'ed or NULL: the Java exception type (cudabridge.jvm.errors.java_kind) */
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
    err->java_kind = NULL;
    if (value == NULL) {
        err->message = strdup("unknown Python error (no exception object)");
        err->pytype = strdup("unknown");
        goto done;
    }
    if (f_error_info != NULL) {
        PyObject *info = PyObject_CallOneArg(f_error_info, value);
        if (info != NULL && PyTuple_Check(info) && PyTuple_GET_SIZE(info) == 4) {
            const char *m = PyUnicode_AsUTF8(PyTuple_GET_ITEM(info, 0));
            const char *t = m ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(info, 1)) : NULL;
            PyObject *oom = PyTuple_GET_ITEM(info, 2);
            PyObject *kind = PyTuple_GET_ITEM(info, 3);
            const char *k = (t && kind != Py_None) ? PyUnicode_AsUTF8(kind) : NULL;
            if (m && t) {
                err->message = strdup(m);
                err->pytype = strdup(t);
                if (k) err->java_kind = strdup(k);
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
            if (ex == NULL && !(*env)->ExceptionCheck(env)) {   /* the type the kind names (CudaBridgeException.of) */
                jstring jk = err->java_kind ? (*env)->NewStringUTF(env, err->java_kind) : NULL;
                if (err->java_kind == NULL || jk != NULL)
                    ex = (jthrowable)(*env)->CallStaticObjectMethod(env, c_cbe, of_cbe, jm, jt, jk);
                if ((*env)->ExceptionCheck(env)) {   /* of() itself failed (out of memory): the plain one below */
                    (*env)->ExceptionClear(env);
                    if (ex != NULL) (*env)->DeleteLocalRef(env, ex);
                    ex = NULL;
                }
                if (jk) (*env)->DeleteLocalRef(env, jk);
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
    free(err->java_kind);
    err->message = err->pytype = err->java_kind = NULL;
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
    entry_slot_give_back(&slot->entry);   /* first: nothing below may keep it from others */
    PyThreadState *ts = slot->ts;
    if (ts != NULL && !slot->ts_forever) {   /* the main thread state stays: Python is never finalized */
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
static int keep_slot(void) {
    if (!t_slot.keyed && pthread_once(&g_key_once, make_key) == 0 && g_key_error == 0 &&
        pthread_setspecific(g_slot_key, &t_slot) == 0)
        t_slot.keyed = 1;
    return t_slot.keyed;
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

#endif /* CB_THREAD_STATES_H */
