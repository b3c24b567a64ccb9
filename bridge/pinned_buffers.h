/*
 * pinned_buffers.h: page-locked host memory as direct ByteBuffers (allocPinned, freePinned).
 *
 * Part of the bridge library's one translation unit: cudabridge_jni.c includes it once, after
 * the headers before it in its list, whose definitions it uses (all static: nothing leaves the
 * library but the JNI entry points).
 */
#ifndef CB_PINNED_BUFFERS_H
#define CB_PINNED_BUFFERS_H

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
    HOT_ENTER(NULL, 0, ENTRY_NOTHING)   /* page-locked host memory: no GPU memory of the task */
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
    void_call(env, m_free_pinned, in, 1, 0, ENTRY_NOTHING);
}

#endif /* CB_PINNED_BUFFERS_H */
