/*
 * python_start.h: starting Python inside the JVM, once: the interpreter checked before anything
 * starts, PyConfig, sys.path, JPype's jar on the system class loader, the bootstrap and the hot
 * path's callables it caches (NativeBridge.startPython, isReady).
 *
 * Part of the bridge library's one translation unit: cudabridge_jni.c includes it once, after
 * the headers before it in its list, whose definitions it uses (all static: nothing leaves the
 * library but the JNI entry points).
 */
#ifndef CB_PYTHON_START_H
#define CB_PYTHON_START_H

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
             cache_method(hot, "copy_out_address", &m_copy_out_address) ||
             cache_method(hot, "call_function", &m_call_function);
    if (rc == 0) {   /* the gate's yield and resume, for allocations that wait (hot_calls.h) */
        PyObject *r = PyObject_CallMethod(hot, "install_gate", "KK", (unsigned long long)(uintptr_t)&cb_gate_yield,
                                          (unsigned long long)(uintptr_t)&cb_gate_resume);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    if (rc == 0) {   /* the threads inside calls of tasks, for the deadlock breaker (entry_waits.h) */
        PyObject *r = PyObject_CallMethod(hot, "install_entry_waits", "KKK", (unsigned long long)(uintptr_t)&cb_entering,
                                          (unsigned long long)(uintptr_t)&cb_entry_pause,
                                          (unsigned long long)(uintptr_t)&cb_entry_resume);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
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
        t_slot.ts_forever = 1;   /* its slot destructor leaves it alone (thread_states.h) */
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

#endif /* CB_PYTHON_START_H */
