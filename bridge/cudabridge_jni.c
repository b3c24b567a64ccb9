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
 *
 * The library is one translation unit, this file, which includes its parts, a file per concern,
 * each after those it uses (their definitions are static; only the JNI entry points leave it):
 *   hot_gate.h        the gate in front of the GIL for the short hot calls
 *   staging_ring.h    pipelined copies through pinned staging slots (host_copy.h: the host memcpy)
 *   process_state.h   the JVM, Python's start state, cached callables and classes, HostMemory
 *   entry_waits.h     the threads waiting to enter Python (gate, GIL), for the deadlock breaker
 *   thread_states.h   each Java thread's kept Python thread state, GIL sections, errors to Java
 *   jvm_entry.h       JNI_OnLoad, the JNI_CreateJavaVM shims JPype binds through, nativeInit
 *   python_start.h    starting Python and the bootstrap (startPython, isReady)
 *   hot_calls.h       the hot path's natives: allocate, free, bind, release, launch, ...
 *   copies.h          copies between heap arrays, direct buffers or addresses and the device
 *   pinned_buffers.h  page-locked direct ByteBuffers
 *   function_calls.h  Python functions called for a task (org.cudabridge.PythonFunction)
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

#include "process_state.h"
#include "entry_waits.h"
#include "thread_states.h"
#include "jvm_entry.h"
#include "python_start.h"
#include "hot_calls.h"
#include "copies.h"
#include "pinned_buffers.h"
#include "function_calls.h"
