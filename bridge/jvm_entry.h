/*
 * jvm_entry.h: the entry points the JVM and JPype look for in the library (JNI_OnLoad, and
 * JNI_CreateJavaVM / JNI_GetCreatedJavaVMs handing JPype the running VM), and NativeBridge's
 * nativeInit, which caches the Java classes the bridge throws.
 *
 * Part of the bridge library's one translation unit: cudabridge_jni.c includes it once, after
 * the headers before it in its list, whose definitions it uses (all static: nothing leaves the
 * library but the JNI entry points).
 */
#ifndef CB_JVM_ENTRY_H
#define CB_JVM_ENTRY_H

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
    jmethodID of = (*env)->GetStaticMethodID(env, cbe, "of",
        "(Ljava/lang/String;Ljava/lang/String;Ljava/lang/String;)Lorg/cudabridge/CudaBridgeException;");
    if (of == NULL) return;
    of_cbe = of;
    c_oom = oom;
    ctor_oom = oc;
    ctor_cbe = cc;
    c_cbe = cbe; /* last: marks the cache complete */
}

#endif /* CB_JVM_ENTRY_H */
