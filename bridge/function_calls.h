/*
 * function_calls.h: the native that calls a Python function for a task (org.cudabridge.PythonFunction):
 * callFunction(task, function, n, kinds, values, refs) -> the result as Java objects.
 *
 * Three phases, so that the GIL is held only while Python runs: (1) the Java arguments are read
 * into C memory (strings as UTF-16, byte arrays copied, a direct ByteBuffer's address and size, an
 * array's description); (2) with the GIL: the Python arguments are built, JavaHotPath.call_function
 * runs (jvm/function_calls.py) and its result is read into C memory; (3) GIL released: the Java
 * result is built from that. Not gated: a function may run for long.
 *
 * Argument kinds (PythonFunction's ARG_* constants, same codes): 0 null, 1 a long (values[i]),
 * 2 a double (values[i]'s raw bits), 3 a boolean (values[i] 0 or 1), 4 a String (refs[i]), 5 a
 * byte[] (refs[i], copied), 6 a direct ByteBuffer (refs[i]: its memory from 0 to its capacity, as a
 * memoryview valid during the call; values[i] 1: read-only), 7 a device array (values[i] the
 * buffer's handle, refs[i] a long[] {offset, dtype code, framework code, dims...}).
 *
 * Results (what call_function returns, one level of list): None -> null, int -> Long, float ->
 * Double, bool -> Boolean (a result that is one of these four alone: its kind and bits in the
 * caller's scalar[], which Java boxes), str -> String, bytes -> byte[], a tuple of ints (a device array:
 * handle, pointer, bytes, dtype code, dims...) -> long[], a list -> Object[] of those.
 *
 * Part of the bridge library's one translation unit: cudabridge_jni.c includes it once, after
 * the headers before it in its list, whose definitions it uses (all static: nothing leaves the
 * library but the JNI entry points).
 */
#ifndef CB_FUNCTION_CALLS_H
#define CB_FUNCTION_CALLS_H

enum { ARG_NULL, ARG_LONG, ARG_DOUBLE, ARG_BOOL, ARG_STRING, ARG_BYTES, ARG_DIRECT, ARG_ARRAY, ARG_KINDS };
enum { RES_NULL, RES_LONG, RES_DOUBLE, RES_BOOL, RES_STRING, RES_BYTES, RES_ARRAY };

#define CALL_MAX_ARGS 256
#define CALL_MAX_RESULTS 1024
#define ARRAY_MAX_DIMS 32

typedef struct {
    int kind;
    jlong value;
    void *data;     /* malloc'ed: UTF-16 (a String), bytes, or jlongs (an array's description); or a direct buffer's memory */
    jlong n;        /* chars, bytes, longs, or the direct buffer's capacity */
} call_arg;

typedef struct {
    int kind;
    jlong l;
    double d;
    char *data;     /* malloc'ed: UTF-8 (str) or bytes */
    Py_ssize_t n;
    jlong desc[5 + ARRAY_MAX_DIMS];
    int ndesc;
} call_result;

/* Java classes the results are built of; cached at the first call (global refs, never released). */
static jclass c_long, c_double, c_boolean, c_object;
static jmethodID long_of, double_of, boolean_of;
static atomic_int g_result_classes;

static int cache_result_classes(JNIEnv *env) {
    if (atomic_load_explicit(&g_result_classes, memory_order_acquire)) return 0;
    jclass l = global_class(env, "java/lang/Long"), d = l ? global_class(env, "java/lang/Double") : NULL;
    jclass b = d ? global_class(env, "java/lang/Boolean") : NULL, o = b ? global_class(env, "java/lang/Object") : NULL;
    if (o == NULL) return -1;   /* an exception is pending; the refs made are kept (a rare, bounded loss) */
    long_of = (*env)->GetStaticMethodID(env, l, "valueOf", "(J)Ljava/lang/Long;");
    double_of = long_of ? (*env)->GetStaticMethodID(env, d, "valueOf", "(D)Ljava/lang/Double;") : NULL;
    boolean_of = double_of ? (*env)->GetStaticMethodID(env, b, "valueOf", "(Z)Ljava/lang/Boolean;") : NULL;
    if (boolean_of == NULL) return -1;
    c_long = l, c_double = d, c_boolean = b, c_object = o;
    atomic_store_explicit(&g_result_classes, 1, memory_order_release);
    return 0;
}

static void free_args(call_arg *args, jsize n) {
    for (jsize i = 0; i < n; i++)
        if (args[i].kind != ARG_DIRECT) free(args[i].data);
}

/* Phase 1: the Java arguments into C memory; -1 with a Java exception pending. Every entry is
 * set before any is read, so that free_args may free all n whatever entry failed. */
static int read_args(JNIEnv *env, const jbyte *kinds, const jlong *values, jobjectArray refs, call_arg *args, jsize n) {
    for (jsize i = 0; i < n; i++) {
        args[i].kind = ARG_NULL;
        args[i].data = NULL;
        args[i].n = 0;
    }
    for (jsize i = 0; i < n; i++) {
        call_arg *a = &args[i];
        a->kind = kinds[i];
        a->value = values[i];
        a->data = NULL;
        a->n = 0;
        if (a->kind < ARG_STRING) continue;
        if (a->kind >= ARG_KINDS) {
            throw_plain(env, c_iae, "java/lang/IllegalArgumentException", "callFunction: unknown argument kind");
            return -1;
        }
        jobject ref = (*env)->GetObjectArrayElement(env, refs, i);
        if (ref == NULL) {
            if (!(*env)->ExceptionCheck(env))
                throw_plain(env, c_npe, "java/lang/NullPointerException", "callFunction: an argument's reference is null");
            return -1;
        }
        int rc = 0;
        if (a->kind == ARG_STRING) {
            jsize len = (*env)->GetStringLength(env, (jstring)ref);
            a->data = malloc(sizeof(jchar) * (size_t)(len ? len : 1));
            a->n = len;
            if (a->data) (*env)->GetStringRegion(env, (jstring)ref, 0, len, (jchar *)a->data);
        } else if (a->kind == ARG_BYTES || a->kind == ARG_ARRAY) {
            jsize len = (*env)->GetArrayLength(env, (jarray)ref);
            size_t each = a->kind == ARG_BYTES ? 1 : sizeof(jlong);
            a->data = malloc(each * (size_t)(len ? len : 1));
            a->n = len;
            if (a->data && a->kind == ARG_BYTES) (*env)->GetByteArrayRegion(env, (jbyteArray)ref, 0, len, (jbyte *)a->data);
            else if (a->data) (*env)->GetLongArrayRegion(env, (jlongArray)ref, 0, len, (jlong *)a->data);
            if (a->kind == ARG_ARRAY && (len < 3 || len > 3 + ARRAY_MAX_DIMS)) {
                throw_plain(env, c_iae, "java/lang/IllegalArgumentException",
                            "callFunction: an array's description is {offset, dtype, framework, dims...} (at most 32 dims)");
                rc = -1;
            }
        } else {   /* ARG_DIRECT */
            a->data = (*env)->GetDirectBufferAddress(env, ref);
            a->n = (*env)->GetDirectBufferCapacity(env, ref);
            if (a->data == NULL || a->n < 0) {
                throw_plain(env, c_iae, "java/lang/IllegalArgumentException", "callFunction: a ByteBuffer is not direct");
                rc = -1;
            }
        }
        (*env)->DeleteLocalRef(env, ref);
        if (rc == 0 && a->kind != ARG_DIRECT && a->data == NULL && !(*env)->ExceptionCheck(env)) {
            throw_plain(env, c_oome, "java/lang/OutOfMemoryError", "callFunction: malloc failed");
        }
        if (rc != 0 || (*env)->ExceptionCheck(env)) {
            a->kind = ARG_NULL;   /* this one is freed here: free_args frees those before it */
            if (kinds[i] != ARG_DIRECT) free(a->data);
            a->data = NULL;
            return -1;
        }
    }
    return 0;
}

/* Phase 2 (GIL held): one Python argument; NULL with a Python error set. */
static PyObject *python_arg(const call_arg *a) {
    switch (a->kind) {
        case ARG_NULL: Py_RETURN_NONE;
        case ARG_LONG: return PyLong_FromLongLong(a->value);
        case ARG_DOUBLE: {
            double d;
            memcpy(&d, &a->value, sizeof d);
            return PyFloat_FromDouble(d);
        }
        case ARG_BOOL: return PyBool_FromLong(a->value != 0);
        case ARG_STRING: {
            int order = -1;   /* UTF-16 in this machine's order: little-endian on the platforms we build for */
            return PyUnicode_DecodeUTF16((const char *)a->data, (Py_ssize_t)a->n * 2, "surrogatepass", &order);
        }
        case ARG_BYTES: return PyBytes_FromStringAndSize((const char *)a->data, (Py_ssize_t)a->n);
        case ARG_DIRECT: {
            PyObject *mv = host_view((char *)a->data, (size_t)a->n);
            if (mv == NULL || a->value == 0) return mv;
            PyObject *ro = PyObject_CallMethod(mv, "toreadonly", NULL);
            PyObject *r = PyObject_CallMethod(mv, "release", NULL);   /* the read-only view keeps the memory's export */
            Py_XDECREF(r);
            Py_DECREF(mv);
            if (r == NULL) Py_CLEAR(ro);
            return ro;
        }
        case ARG_ARRAY: {
            const jlong *desc = (const jlong *)a->data;
            PyObject *t = PyTuple_New(1 + (Py_ssize_t)a->n);
            for (Py_ssize_t k = 0; t != NULL && k <= (Py_ssize_t)a->n; k++) {
                PyObject *v = PyLong_FromLongLong(k == 0 ? a->value : desc[k - 1]);
                if (v == NULL) Py_CLEAR(t);
                else PyTuple_SET_ITEM(t, k, v);
            }
            return t;
        }
    }
    PyErr_SetString(PyExc_ValueError, "unknown argument kind");
    return NULL;
}

/* Phase 2 (GIL held): one Python result into C memory; -1 with a Python error set. */
static int read_result(PyObject *v, call_result *r) {
    memset(r, 0, sizeof *r);
    if (v == Py_None) {
        r->kind = RES_NULL;
    } else if (PyBool_Check(v)) {
        r->kind = RES_BOOL;
        r->l = v == Py_True;
    } else if (PyLong_CheckExact(v)) {
        r->kind = RES_LONG;
        r->l = PyLong_AsLongLong(v);
        if (r->l == -1 && PyErr_Occurred()) return -1;
    } else if (PyFloat_CheckExact(v)) {
        r->kind = RES_DOUBLE;
        r->d = PyFloat_AS_DOUBLE(v);
    } else if (PyUnicode_CheckExact(v)) {
        Py_ssize_t n;
        /* Java's NewStringUTF takes modified UTF-8: go through UTF-16 in phase 3 instead */
        PyObject *utf16 = PyUnicode_AsEncodedString(v, "utf-16-le", "surrogatepass");
        if (utf16 == NULL) return -1;
        n = PyBytes_GET_SIZE(utf16);
        r->data = malloc(n ? (size_t)n : 1);
        if (r->data == NULL) {
            Py_DECREF(utf16);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(r->data, PyBytes_AS_STRING(utf16), (size_t)n);
        Py_DECREF(utf16);
        r->kind = RES_STRING;
        r->n = n / 2;
    } else if (PyBytes_CheckExact(v)) {
        r->n = PyBytes_GET_SIZE(v);
        r->data = malloc(r->n ? (size_t)r->n : 1);
        if (r->data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(r->data, PyBytes_AS_STRING(v), (size_t)r->n);
        r->kind = RES_BYTES;
    } else if (PyTuple_CheckExact(v) && PyTuple_GET_SIZE(v) >= 4 && PyTuple_GET_SIZE(v) <= 5 + ARRAY_MAX_DIMS) {
        r->kind = RES_ARRAY;
        r->ndesc = (int)PyTuple_GET_SIZE(v);
        for (int k = 0; k < r->ndesc; k++) {
            r->desc[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(v, k));
            if (r->desc[k] == -1 && PyErr_Occurred()) return -1;
        }
    } else {
        PyErr_Format(PyExc_TypeError, "call_function returned a %s, which the bridge does not hand to Java",
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    return 0;
}

static void free_results(call_result *rs, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) free(rs[i].data);
}

/* GIL held, after the call: releases the direct ByteBuffers' views (and drops our references).
 * Returns -1 when something still holds one (a reference to the view, an export of it, a view made
 * from it, which holds the exporter's export), since Java may free that memory once the call
 * returns. Any Python error set meanwhile is kept. */
static int release_views(PyObject **views, int n) {
    int kept = 0;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    for (int i = 0; i < n; i++) {
        PyObject *v = views[i];
        PyObject *exporter = Py_XNewRef(PyMemoryView_GET_BUFFER(v)->obj);
        if (Py_REFCNT(v) > 1) kept = 1;   /* ours is the only reference left once the call's own are gone */
        PyObject *r = PyObject_CallMethod(v, "release", NULL);
        if (r == NULL) {
            PyErr_Clear();
            kept = 1;
        }
        Py_XDECREF(r);
        if (exporter != NULL && Py_TYPE(exporter) == t_host_memory && ((HostMemory *)exporter)->exports > 0) kept = 1;
        Py_XDECREF(exporter);
        Py_DECREF(v);
    }
    PyErr_Restore(type, value, tb);
    return kept ? -1 : 0;
}

/* GIL held: frees the result buffers of a call that cannot hand them to Java (its device arrays'
 * handles, each the first int of a result tuple). Best effort: the task's release reclaims any left. */
static void free_result_buffers(PyObject *r) {
    Py_ssize_t n = PyList_CheckExact(r) ? PyList_GET_SIZE(r) : 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_CheckExact(r) ? PyList_GET_ITEM(r, i) : r;
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) < 4) continue;
        PyObject *f = PyObject_CallOneArg(m_free, PyTuple_GET_ITEM(e, 0));
        if (f == NULL) PyErr_Clear();
        Py_XDECREF(f);
    }
}

static void set_kept_view_error(void) {
    const char *msg = "call: the function kept a view or an array over a direct ByteBuffer argument, whose memory is "
                      "Java's once the call returns: copy what it needs (bytes(view), numpy.array(view))";
    PyObject *errors = PyImport_ImportModule("cudabridge.errors");
    PyObject *cls = errors ? PyObject_GetAttrString(errors, "InvalidArgument") : NULL;
    if (cls != NULL) PyErr_SetString(cls, msg);
    else if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, msg);
    Py_XDECREF(cls);
    Py_XDECREF(errors);
}

/* Phase 3 (no GIL): one Java result; NULL for null, or with an exception pending. */
static jobject java_result(JNIEnv *env, const call_result *r) {
    switch (r->kind) {
        case RES_LONG: return (*env)->CallStaticObjectMethod(env, c_long, long_of, r->l);
        case RES_DOUBLE: return (*env)->CallStaticObjectMethod(env, c_double, double_of, r->d);
        case RES_BOOL: return (*env)->CallStaticObjectMethod(env, c_boolean, boolean_of, (jboolean)(r->l != 0));
        case RES_STRING: return (*env)->NewString(env, (const jchar *)r->data, (jsize)r->n);
        case RES_BYTES: {
            jbyteArray b = (*env)->NewByteArray(env, (jsize)r->n);
            if (b != NULL) (*env)->SetByteArrayRegion(env, b, 0, (jsize)r->n, (const jbyte *)r->data);
            return b;
        }
        case RES_ARRAY: {
            jlongArray d = (*env)->NewLongArray(env, r->ndesc);
            if (d != NULL) (*env)->SetLongArrayRegion(env, d, 0, r->ndesc, r->desc);
            return d;
        }
        default: return NULL;
    }
}

/* static native Object callFunction(long task, long function, int n, byte[] kinds, long[] values, Object[] refs,
 * long[] scalar): the first n entries of each array are the arguments (the caller reuses its arrays). A
 * scalar result (null, a long, a double, a boolean) comes back in scalar[0..1] = {its RES_* kind, its
 * bits} with null returned; any other result is returned. */
JNIEXPORT jobject JNICALL Java_org_cudabridge_NativeBridge_callFunction(JNIEnv *env, jclass cls, jlong task,
                                                                        jlong function, jint n, jbyteArray jkinds,
                                                                        jlongArray jvalues, jobjectArray refs,
                                                                        jlongArray scalar) {
    (void)cls;
    if (jkinds == NULL || jvalues == NULL || refs == NULL || scalar == NULL) {
        throw_plain(env, c_npe, "java/lang/NullPointerException", "callFunction: kinds, values, refs and scalar are required");
        return NULL;
    }
    if (n < 0 || n > CALL_MAX_ARGS || (*env)->GetArrayLength(env, jkinds) < n || (*env)->GetArrayLength(env, jvalues) < n
        || (*env)->GetArrayLength(env, refs) < n || (*env)->GetArrayLength(env, scalar) < 2) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException",
                    "callFunction: kinds, values and refs hold an entry per argument (at most 256)");
        return NULL;
    }
    if (cache_result_classes(env) != 0) return NULL;
    jbyte kinds[CALL_MAX_ARGS];
    jlong values[CALL_MAX_ARGS];
    call_arg args[CALL_MAX_ARGS];
    (*env)->GetByteArrayRegion(env, jkinds, 0, n, kinds);
    (*env)->GetLongArrayRegion(env, jvalues, 0, n, values);
    if ((*env)->ExceptionCheck(env)) return NULL;
    if (read_args(env, kinds, values, refs, args, n) != 0) {
        free_args(args, n);
        return NULL;
    }
    call_result one, *many = NULL;
    Py_ssize_t nresults = -1;   /* -1: one result (in `one`), else a list of nresults (in `many`) */
    int ok = 0;
    {
        /* HOT_ENTER's steps, with the arguments freed on its early returns */
        if (!atomic_load_explicit(&g_ready, memory_order_acquire)) {
            free_args(args, n);
            throw_state(env, "cudabridge: the bridge is not started in this JVM (call CudaBridge.start first)");
            return NULL;
        }
        gil_section g;
        captured_error err = {0};
        /* inside a call for this task until HOT_LEAVE (entry_waits.h) */
        unsigned long long entry_prior = entry_begin(&t_slot.entry, ENTRY_TASK(task));
        if (gil_enter(env, &g) != 0) {
            entry_end(&t_slot.entry, entry_prior);
            free_args(args, n);
            return NULL;
        }
        PyObject *tuple = PyTuple_New(n);
        PyObject *direct[CALL_MAX_ARGS];   /* the direct ByteBuffers' views, ours to release after the call */
        int ndirect = 0;
        for (jsize i = 0; tuple != NULL && i < n; i++) {
            PyObject *v = python_arg(&args[i]);
            if (v == NULL) {
                Py_CLEAR(tuple);
            } else {
                if (args[i].kind == ARG_DIRECT) direct[ndirect++] = Py_NewRef(v);
                PyTuple_SET_ITEM(tuple, i, v);
            }
        }
        PyObject *r = NULL;
        if (tuple != NULL) {
            PyObject *call[3] = {PyLong_FromLongLong(task), PyLong_FromLongLong(function), tuple};
            if (call[0] != NULL && call[1] != NULL) r = PyObject_Vectorcall(m_call_function, call, 3, NULL);
            Py_XDECREF(call[0]);
            Py_XDECREF(call[1]);
            Py_DECREF(tuple);
        }
        if (release_views(direct, ndirect) != 0 && r != NULL) {
            free_result_buffers(r);
            Py_CLEAR(r);
            set_kept_view_error();
        }
        if (r != NULL) {
            if (PyList_CheckExact(r)) {
                Py_ssize_t k = PyList_GET_SIZE(r);
                if (k > CALL_MAX_RESULTS) {
                    PyErr_Format(PyExc_ValueError, "a function returned %zd values; at most %d", k, CALL_MAX_RESULTS);
                } else if ((many = calloc((size_t)(k ? k : 1), sizeof *many)) == NULL) {
                    PyErr_NoMemory();
                } else {
                    nresults = 0;
                    while (nresults < k && read_result(PyList_GET_ITEM(r, nresults), &many[nresults]) == 0) nresults++;
                    ok = nresults == k;
                    if (!ok) nresults++;   /* the one that failed may hold memory too */
                }
            } else {
                ok = read_result(r, &one) == 0;
                if (!ok) free(one.data), one.data = NULL;
            }
            Py_DECREF(r);
        }
        if (!ok) capture_python_error(&err);
        HOT_LEAVE()
        free_args(args, n);
        if (err.kind) {
            /* Results given handles but not handed to Java are reclaimed with the task (its release). */
            if (many) free_results(many, nresults);
            free(many);
            throw_captured(env, &err);
            return NULL;
        }
    }
    jobject out = NULL;
    if (nresults < 0) {
        if (one.kind <= RES_BOOL) {   /* a scalar: its kind and bits in scalar[] (Java boxes it; no upcall) */
            jlong bits[2] = {one.kind, one.l};
            if (one.kind == RES_DOUBLE) memcpy(&bits[1], &one.d, sizeof one.d);
            (*env)->SetLongArrayRegion(env, scalar, 0, 2, bits);
            return NULL;
        }
        out = java_result(env, &one);
        free(one.data);
        return out;
    }
    jobjectArray list = (*env)->NewObjectArray(env, (jsize)nresults, c_object, NULL);
    for (Py_ssize_t i = 0; list != NULL && i < nresults && !(*env)->ExceptionCheck(env); i++) {
        jobject e = java_result(env, &many[i]);
        if ((*env)->ExceptionCheck(env)) break;   /* valueOf or an allocation threw */
        if (e != NULL) {
            (*env)->SetObjectArrayElement(env, list, (jsize)i, e);
            (*env)->DeleteLocalRef(env, e);
        }
    }
    free_results(many, nresults);
    free(many);
    return (*env)->ExceptionCheck(env) ? NULL : list;
}

#endif /* CB_FUNCTION_CALLS_H */
