/*
 * copies.h: copies between Java memory (heap arrays, direct buffers, raw addresses) and device
 * buffers: on a GPU in C (one DMA for page-locked memory, else pipelined staging slots,
 * staging_ring.h, or pageable memory); on the emulated device through the Python reference.
 *
 * Part of the bridge library's one translation unit: cudabridge_jni.c includes it once, after
 * the headers before it in its list, whose definitions it uses (all static: nothing leaves the
 * library but the JNI entry points).
 */
#ifndef CB_COPIES_H
#define CB_COPIES_H

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

/* Calls fn(handle, devOffset[, address], view of mem); returns its result's truth (the hot path's
 * copies by address return whether they queued an asynchronous DMA), 0 with err set on an error. */
static int call_with_view(PyObject *fn, jlong handle, jlong devOffset, char *mem, size_t n, int direct,
                          jlong address, captured_error *err) {
    PyObject *args[4] = {NULL, NULL, NULL, NULL};
    int nargs = direct ? 4 : 3;
    args[0] = PyLong_FromLongLong(handle);
    args[1] = args[0] ? PyLong_FromLongLong(devOffset) : NULL;
    if (direct) args[2] = args[1] ? PyLong_FromLongLong(address) : NULL;
    PyObject **viewslot = &args[direct ? 3 : 2];
    int ok = args[0] && args[1] && (!direct || args[2]);
    if (ok) *viewslot = host_view(mem, n);
    int queued = 0;
    if (!ok || *viewslot == NULL) {
        capture_python_error(err);
    } else {
        PyObject *r = PyObject_Vectorcall(fn, args, (size_t)nargs, NULL);
        int truth = r == NULL ? -1 : PyObject_IsTrue(r);
        Py_XDECREF(r);
        if (truth < 0) capture_python_error(err);
        queued = truth == 1;
    }
    decref_all(args, 4);
    return queued;
}

/* A staged copy of at most CB_QUICK_COPY_BYTES that took one idle staging slot without waiting,
 * the GIL and the buffer's lease held: host->device is done with both held (one memcpy shorter
 * than handing the GIL off and taking it back, then the DMA); device->host queues its one DMA,
 * leaves the lease (it queues nothing more) and waits for the DMA and copies out without the GIL.
 * The slot goes back at the end. Returns with the GIL released and the lease left; a driver error
 * is raised to Java. */
#define CB_QUICK_COPY_BYTES (64 << 10)
static void quick_copy(JNIEnv *env, gil_section *g, cb_copy_entry *entry, cb_ring *r, cb_host_side *host,
                       jlong byteOffset, jlong nbytes, int to_device) {
    const cb_driver *d = g_api->driver;
    captured_error err = {0};
    const char *call = NULL;
    cb_CUcontext prev;
    jlong issued = 0;
    int held = 1;   /* the GIL */
    int rc = ctx_enter(d, entry->context, &prev, &call);
    if (rc == CB_CUDA_SUCCESS)
        rc = to_device ? ring_to_device(d, r, host, byteOffset, nbytes, entry->address, entry->stream, 1, &call)
                       : ring_from_device_queue(d, r, nbytes, entry->address, entry->stream, &issued, &call);
    g_api->leave_copy(g_api->core, entry);
    if (rc == CB_CUDA_SUCCESS && !to_device) {
        gil_exit(g);
        held = 0;
        rc = ring_from_device_drain(d, r, host, byteOffset, nbytes, entry->address, entry->stream, 1, issued, &call);
    }
    ctx_restore(d, entry->context, prev);
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
static int gpu_copy(JNIEnv *env, jlong handle, jlong devOffset, cb_host_side *host, jlong byteOffset,
                    jlong nbytes, int to_device, int kind) {
    const cb_driver *d = g_api->driver;
    gil_section g;
    captured_error err = {0};
    if (gil_enter(env, &g) != 0) return 0;
    cb_copy_entry entry = {0};
    int entered = g_api->enter_copy(g_api->core, handle, devOffset, nbytes, to_device, kind,
                                    (unsigned long long)(uintptr_t)host->raw, &entry) == 0;
    if (entered && entry.pagelocked) {
        const char *call = NULL;
        cb_CUcontext prev;
        int rc = ctx_enter(d, entry.context, &prev, &call);
        if (rc == CB_CUDA_SUCCESS) {
            rc = to_device ? d->cuMemcpyHtoDAsync(entry.address, host->raw, (size_t)nbytes, entry.stream)
                           : d->cuMemcpyDtoHAsync(host->raw, entry.address, (size_t)nbytes, entry.stream);
            if (rc != CB_CUDA_SUCCESS) call = to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync";
        }
        ctx_restore(d, entry.context, prev);
        g_api->leave_copy(g_api->core, &entry);
        if (rc != CB_CUDA_SUCCESS) {
            g_api->driver_failed(g_api->core, call, rc);
            capture_python_error(&err);
        }
        gil_exit(&g);
        if (rc != CB_CUDA_SUCCESS) {
            throw_captured(env, &err);
            return 0;
        }
        return 1;   /* queued: one asynchronous DMA */
    }
    if (!entered) {
        capture_python_error(&err);
        gil_exit(&g);
        throw_captured(env, &err);
        return 0;
    }
    cb_ring slots;   /* the staging slots this copy holds */
    const char *call = NULL;
    int rc = CB_CUDA_SUCCESS;
    size_t slot_bytes = (size_t)g_api->staging_slot_bytes;
    if (nbytes <= CB_QUICK_COPY_BYTES && (size_t)nbytes <= slot_bytes &&
        g_api->staging_take(g_api->core, entry.gpu, 1, 1, &slots, &rc, &call) == 1) {
        quick_copy(env, &g, &entry, &slots, host, byteOffset, nbytes, to_device);
        return 0;
    }
    gil_exit(&g);
    cb_CUcontext prev;
    rc = ctx_enter(d, entry.context, &prev, &call);
    if (rc == CB_CUDA_SUCCESS) {
        jlong chunks = (nbytes + (jlong)slot_bytes - 1) / (jlong)slot_bytes;
        int want = chunks < g_api->staging_slots ? (int)chunks : g_api->staging_slots;
        int taken = g_api->staging_take(g_api->core, entry.gpu, want, 0, &slots, &rc, &call);
        if (taken > 0) {
            int threads = g_api->staging_copy_threads;
            rc = to_device ? ring_to_device(d, &slots, host, byteOffset, nbytes, entry.address, entry.stream, threads, &call)
                           : ring_from_device(d, &slots, host, byteOffset, nbytes, entry.address, entry.stream, threads,
                                              &call);
            g_api->staging_give(g_api->core, &slots, rc > 0);   /* a driver call failed: the slots' state is unknown */
        } else if (taken == 0) {   /* none within the staging wait (counted there) */
            rc = pageable_copy(d, host, byteOffset, nbytes, entry.address, entry.stream, to_device, &call);
        }
    }
    ctx_restore(d, entry.context, prev);
    if (gil_enter(env, &g) != 0) return 0;   /* cannot happen: this thread has its Python state */
    g_api->leave_copy(g_api->core, &entry);
    if (rc > 0) {
        g_api->driver_failed(g_api->core, call, rc);
        capture_python_error(&err);
    }
    gil_exit(&g);
    if (rc > 0) throw_captured(env, &err);
    /* rc -1: the array could not be pinned; its Java exception is pending */
    return 0;   /* staged (or through pageable memory): complete for the host memory on return */
}

/* A copy between a Java heap array and a device buffer (to_device: array -> device). On a GPU in C
 * (gpu_copy); on the emulated device through the Python reference, chunk by chunk through this
 * thread's pageable buffer: the array is read (or written) in a short critical region, with no
 * JNI call and no GIL wait inside it, and the buffer goes to Python as a pageable view (into
 * pageable memory the backend returns only when the bytes are there). */
static void heap_copy_in_call(JNIEnv *env, jlong handle, jlong devOffset, jobject array, jlong byteOffset,
                              jlong nbytes, jint elemSize, int to_device);

/* The copy, inside a call published for its buffer (entry_waits.h) from start to end: its GIL
 * waits, its chunks and its driver calls. */
static void heap_copy(JNIEnv *env, jlong handle, jlong devOffset, jobject array, jlong byteOffset, jlong nbytes,
                      jint elemSize, int to_device) {
    unsigned long long entry_prior = entry_begin(&t_slot.entry, ENTRY_HANDLE(handle));
    heap_copy_in_call(env, handle, devOffset, array, byteOffset, nbytes, elemSize, to_device);
    entry_end(&t_slot.entry, entry_prior);
}

static void heap_copy_in_call(JNIEnv *env, jlong handle, jlong devOffset, jobject array, jlong byteOffset,
                              jlong nbytes, jint elemSize, int to_device) {
    if (!check_array(env, array, byteOffset, nbytes, elemSize)) return;
    if (!atomic_load_explicit(&g_ready, memory_order_acquire)) {
        throw_state(env, "cudabridge: the bridge is not started in this JVM");
        return;
    }
    if (g_api != NULL && g_api->driver != NULL && nbytes > 0) {   /* a GPU: pinned staging, pipelined */
        cb_host_side host = {env, (jarray)array, NULL};
        gpu_copy(env, handle, devOffset, &host, byteOffset, nbytes, to_device, CB_HOST_HEAP);
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
        if (n && to_device) {
            char *src = (*env)->GetPrimitiveArrayCritical(env, (jarray)array, NULL);
            if (src == NULL) return; /* OutOfMemoryError pending */
            memcpy(stage, src + byteOffset + done, n);
            (*env)->ReleasePrimitiveArrayCritical(env, (jarray)array, src, JNI_ABORT);
        }
        gil_section g;
        captured_error err = {0};
        if (gil_enter(env, &g) != 0) return;
        call_with_view(to_device ? m_copy_in : m_copy_out, handle, devOffset + done, stage, n, 0, 0, &err);
        gil_exit(&g);
        if (err.kind) {
            throw_captured(env, &err);
            return;
        }
        if (n && !to_device) {
            char *dst = (*env)->GetPrimitiveArrayCritical(env, (jarray)array, NULL);
            if (dst == NULL) return;
            memcpy(dst + byteOffset + done, stage, n);
            (*env)->ReleasePrimitiveArrayCritical(env, (jarray)array, dst, 0);
        }
        done += (jlong)n;
    } while (done < nbytes);
}

/* static native void copyIn(long handle, long devOffset, Object array, long byteOffset, long nbytes, int elemSize) */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_copyIn(JNIEnv *env, jclass cls, jlong handle, jlong devOffset,
                                                               jobject array, jlong byteOffset, jlong nbytes,
                                                               jint elemSize) {
    (void)cls;
    heap_copy(env, handle, devOffset, array, byteOffset, nbytes, elemSize, 1);
}

/* static native void copyOut(long handle, long devOffset, Object array, long byteOffset, long nbytes, int elemSize) */
JNIEXPORT void JNICALL Java_org_cudabridge_NativeBridge_copyOut(JNIEnv *env, jclass cls, jlong handle,
                                                                jlong devOffset, jobject array, jlong byteOffset,
                                                                jlong nbytes, jint elemSize) {
    (void)cls;
    heap_copy(env, handle, devOffset, array, byteOffset, nbytes, elemSize, 0);
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
static jboolean host_memory_copy(JNIEnv *env, PyObject *fn, jlong handle, jlong devOffset, char *mem, jlong nbytes,
                                 int to_device, int kind) {
    if (atomic_load_explicit(&g_ready, memory_order_acquire) && g_api != NULL && g_api->driver != NULL && nbytes > 0) {
        cb_host_side host = {env, NULL, mem};
        unsigned long long entry_prior = entry_begin(&t_slot.entry, ENTRY_HANDLE(handle));   /* entry_waits.h */
        int queued = gpu_copy(env, handle, devOffset, &host, 0, nbytes, to_device, kind);
        entry_end(&t_slot.entry, entry_prior);
        return queued ? JNI_TRUE : JNI_FALSE;
    }
    HOT_ENTER(JNI_FALSE, 0, ENTRY_HANDLE(handle))
    int queued = call_with_view(fn, handle, devOffset, mem, (size_t)nbytes, 1, (jlong)(intptr_t)mem, &err);
    HOT_LEAVE()
    if (err.kind) throw_captured(env, &err);
    return queued && !err.kind ? JNI_TRUE : JNI_FALSE;
}

/* Direct ByteBuffers: pinned ones (allocatePinned) asynchronously on the buffer's stream, others
 * staged (host_memory_copy). Returns whether the copy was queued asynchronously (page-locked). */
static jboolean direct_copy(JNIEnv *env, PyObject *fn, jlong handle, jlong devOffset, jobject buf, jlong bufOffset,
                            jlong nbytes) {
    char *mem = direct_range(env, buf, bufOffset, nbytes);
    if (mem == NULL) return JNI_FALSE;
    return host_memory_copy(env, fn, handle, devOffset, mem, nbytes, fn == m_copy_in_direct, CB_HOST_DIRECT);
}

/* static native void copyInAddress(long handle, long devOffset, long address, long nbytes) and
 * copyOutAddress: memory Java code owns outside the heap (an Arrow buffer's memoryAddress(), an
 * off-heap column vector, Unsafe). The address cannot be checked: a wrong one crashes the JVM, as
 * any native copy would. Asynchronous from and into a registered region (registerHost). */
static jboolean address_copy(JNIEnv *env, PyObject *fn, jlong handle, jlong devOffset, jlong address, jlong nbytes) {
    if (address == 0 || nbytes < 0) {
        throw_plain(env, c_iae, "java/lang/IllegalArgumentException",
                    "cudabridge copy: the host address must not be 0 and the size not negative");
        return JNI_FALSE;
    }
    return host_memory_copy(env, fn, handle, devOffset, (char *)(intptr_t)address, nbytes, fn == m_copy_in_address,
                            CB_HOST_ADDRESS);
}

JNIEXPORT jboolean JNICALL Java_org_cudabridge_NativeBridge_copyInDirect(JNIEnv *env, jclass cls, jlong handle,
                                                                     jlong devOffset, jobject buf, jlong bufOffset,
                                                                     jlong nbytes) {
    (void)cls;
    return direct_copy(env, m_copy_in_direct, handle, devOffset, buf, bufOffset, nbytes);
}

JNIEXPORT jboolean JNICALL Java_org_cudabridge_NativeBridge_copyOutDirect(JNIEnv *env, jclass cls, jlong handle,
                                                                      jlong devOffset, jobject buf, jlong bufOffset,
                                                                      jlong nbytes) {
    (void)cls;
    return direct_copy(env, m_copy_out_direct, handle, devOffset, buf, bufOffset, nbytes);
}

JNIEXPORT jboolean JNICALL Java_org_cudabridge_NativeBridge_copyInAddress(JNIEnv *env, jclass cls, jlong handle,
                                                                      jlong devOffset, jlong address, jlong nbytes) {
    (void)cls;
    return address_copy(env, m_copy_in_address, handle, devOffset, address, nbytes);
}

JNIEXPORT jboolean JNICALL Java_org_cudabridge_NativeBridge_copyOutAddress(JNIEnv *env, jclass cls, jlong handle,
                                                                       jlong devOffset, jlong address, jlong nbytes) {
    (void)cls;
    return address_copy(env, m_copy_out_address, handle, devOffset, address, nbytes);
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

#endif /* CB_COPIES_H */
