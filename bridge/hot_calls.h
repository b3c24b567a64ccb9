/*
 * hot_calls.h: the hot path's JNI natives (allocate, free, bind, release, memset, launch,
 * synchronize, ...): arguments marshalled to the cached Python callables or the C twin, behind the
 * gate (hot_gate.h) for the short calls.
 *
 * Part of the bridge library's one translation unit: cudabridge_jni.c includes it once, after
 * the headers before it in its list, whose definitions it uses (all static: nothing leaves the
 * library but the JNI entry points).
 */
#ifndef CB_HOT_CALLS_H
#define CB_HOT_CALLS_H

/* ---------------------------------------------------------------------------------------------
 * The hot path
 * ------------------------------------------------------------------------------------------- */
/* Entering a hot call: the bridge must be up; the call publishes what it is for (`what`:
 * ENTRY_TASK(task), ENTRY_HANDLE(handle), ENTRY_UNKNOWN or ENTRY_NOTHING; entry_waits.h) until
 * HOT_LEAVE; the short calls (allocate, free, memset, stream, ping) pass the gate (hot_gate.h)
 * before they take the GIL; then the GIL. HOT_LEAVE drops the GIL, ends the publication and leaves
 * the gate. */
#define HOT_ENTER(ret, short_call, what)                                                                    \
    if (!atomic_load_explicit(&g_ready, memory_order_acquire)) {                                             \
        throw_state(env, "cudabridge: the bridge is not started in this JVM (call CudaBridge.start first)"); \
        return ret;                                                                                          \
    }                                                                                                        \
    gil_section g;                                                                                           \
    captured_error err = {0};                                                                                \
    unsigned long long entry_prior = entry_begin(&t_slot.entry, what);                                       \
    int gated = (short_call) ? gate_enter((uintptr_t)&t_slot) : 0;                                           \
    t_in_gate = gated;                                                                                       \
    if (gil_enter(env, &g) != 0) {                                                                           \
        entry_end(&t_slot.entry, entry_prior);                                                               \
        if (gated) gate_exit();                                                                              \
        t_in_gate = 0;                                                                                       \
        return ret;                                                                                          \
    }
/* t_in_gate, not gated: a call that waited (gate_yield) may have gone back in (gate_resume). */
#define HOT_LEAVE()                                \
    gil_exit(&g);                                  \
    entry_end(&t_slot.entry, entry_prior);         \
    if (t_in_gate) gate_exit();                    \
    t_in_gate = 0;



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

/* Calls fn(ints...) -> (int, int) into out[0..1]. Through the gate (allocate, stream) or not. in[0]
 * is the call's task (allocate, release, stream). */
static void pair_call(JNIEnv *env, PyObject *fn, const long long *in, int nin, jlongArray out, int short_call) {
    HOT_ENTER(, short_call, ENTRY_TASK(in[0]))
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
    HOT_ENTER(, 0, ENTRY_UNKNOWN)
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
    HOT_ENTER(, 0, ENTRY_TASK(task))
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

/* Calls fn(ints...) and discards its None; through the gate for the short calls, or not. `what`:
 * what the call is for (entry_waits.h). */
static void void_call(JNIEnv *env, PyObject *fn, const long long *in, int nin, int short_call,
                      unsigned long long what) {
    HOT_ENTER(, short_call, what)
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
    void_call(env, m_free, in, 1, 1, ENTRY_HANDLE(handle));
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_memset(JNIEnv *env, jclass cls, jlong handle, jlong offset,
                                                               jint value, jlong nbytes) {
    (void)cls;
    long long in[4] = {handle, offset, value, nbytes};
    void_call(env, m_memset, in, 4, 1, ENTRY_HANDLE(handle));
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
    HOT_ENTER(, 1, ENTRY_TASK(task))
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
    void_call(env, m_sync, in, 1, 0, ENTRY_TASK(task));
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_copyDevice(JNIEnv *env, jclass cls, jlong dst, jlong dstOff,
                                                                   jlong src, jlong srcOff, jlong nbytes) {
    (void)cls;
    long long in[5] = {dst, dstOff, src, srcOff, nbytes};
    void_call(env, m_copy_device, in, 5, 0, ENTRY_HANDLE(dst));
}

JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_ping(JNIEnv *env, jclass cls) {
    (void)cls;
    void_call(env, m_ping, NULL, 0, 1, ENTRY_NOTHING);
}

/* One Python call for `count` frees (the handles were read from Java before the GIL is taken). */
static void free_many_call(JNIEnv *env, const jlong *vals, jint count) {
    HOT_ENTER(, 1, ENTRY_UNKNOWN)
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

#endif /* CB_HOT_CALLS_H */
