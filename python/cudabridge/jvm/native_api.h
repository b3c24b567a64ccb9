/*
 * native_api.h: what the Java hot path's C twin (_hotcore.c) hands the bridge's JNI library, so
 * that a JNI call reaches it with no Python objects built for its arguments. Got from Python as
 * the capsule `JavaHotPath.native_api` (None when the C twin is not built); the capsule owns a
 * reference to its HotCore.
 *
 * Every function is called with the GIL held (the JNI side takes it, behind its gate) and returns
 * 0, or -1 with a Python exception set, which the caller describes to Java.
 */
#ifndef CB_NATIVE_API_H
#define CB_NATIVE_API_H

#define CB_NATIVE_API_CAPSULE "cudabridge.jvm._hotcore.native_api"
#define CB_NATIVE_API_VERSION 1
#define CB_LAUNCH_MAX_ARGS 512   /* a kernel's parameters take at most 4 KiB: 512 of 8 bytes */

typedef struct {
    int version;                 /* CB_NATIVE_API_VERSION */
    void *core;                  /* the HotCore the functions take */
    /* JavaHotPath.launch, its arguments unboxed: one kernel on the task's stream. dims are grid x,
     * y, z then block x, y, z; values, kinds and offsets hold n entries (n <= CB_LAUNCH_MAX_ARGS). */
    int (*launch)(void *core, long long task, long long kernel, const int dims[6], long long shared,
                  const long long *values, const signed char *kinds, const long long *offsets, int n);
} cb_native_api;

#endif
