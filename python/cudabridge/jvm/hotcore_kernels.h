/*
 * hotcore_kernels.h: the kernel registry and the launch in C. add_kernel registers a CUDA
 * function with everything its checks need; launch (and launch_raw, which the JNI library calls
 * through native_api.h) queues it with cuLaunchKernel; synchronize waits for a task's stream
 * without the GIL and clears its launch log. Part of _hotcore.c's one translation unit: included
 * by it after HotCore, native_kernel, the shared helpers (resolve_driver, retain_context, int_attr) and
 * hotcore_leases.h, not a header to include anywhere else.
 *
 * The launch's C path, for kernels added with add_kernel (CUDA functions): the same checks as the
 * reference (JavaHotPath.launch, then TaskRegistry.launch and CudaKernel.launch), in the same
 * order of effect: every argument and limit is checked before anything is queued, the kernel is
 * queued inside the task's lease (the lease protocol, as allocate), and recorded in the launch
 * log. A launch this path does not take as it stands (a kernel not added, a limit or an argument
 * it would refuse, a larger dynamic shared memory to opt in to, a buffer not the task's own) goes
 * to the reference whole, outside any lease: the reference refuses it with its own words, or
 * launches it (an opt-in), so both paths give the same outcome for the same input.
 *
 * Invariants:
 *  - a registered kernel's function, GPU, parameters and limits never change (add_kernel again
 *    replaces the entry whole); only its dynamic shared memory is re-read, after the reference
 *    opted it in to more;
 *  - the kernel runs in its GPU's primary context, retained once (released at HotCore's
 *    dealloc); a thread that had another context current gets it back;
 *  - a buffer argument is resolved through the handle table only when it is live, on the
 *    kernel's GPU, the task's own, and the offset inside it; anything else goes to the reference.
 */

#ifndef CB_HOTCORE_KERNELS_H
#define CB_HOTCORE_KERNELS_H

#define LOG_KEEP 64   /* LaunchLog.KEEP: past twice this a stream's list is handed to record() */

/* add_kernel(kernel_id, kernel, name, function, gpu, kinds, sizes, ranges, device_limits,
 *            kernel_max_threads, static_shared, dynamic_shared)
 * kinds: each parameter's kind code (0: ptr, a buffer's handle), sizes: its bytes, ranges: the
 * (lo, hi) of the raw values Java may send for it (JavaHotPath.add_kernel derives all three from
 * PARAM_KINDS: this file keeps no table of kinds).
 * device_limits: (max threads per block, max block x, y, z, max grid x, y, z, shared per block
 * opt-in). Resolves the driver's entry points and retains the GPU's primary context the first
 * time; RuntimeError saying why when it cannot (no libcuda). */
static PyObject *hc_add_kernel(HotCore *self, PyObject *args) {
    long long kid, st, dyn, optin;
    PyObject *kernel, *name, *kinds, *sizes, *ranges;
    unsigned long long function;
    int gpu, dmt, kmt, mb[3], mg[3];
    if (!PyArg_ParseTuple(args, "LOUKiO!O!O!(iiiiiiiL)iLL:add_kernel", &kid, &kernel, &name, &function, &gpu,
                          &PyBytes_Type, &kinds, &PyBytes_Type, &sizes, &PyTuple_Type, &ranges, &dmt, &mb[0], &mb[1],
                          &mb[2], &mg[0], &mg[1], &mg[2], &optin, &kmt, &st, &dyn))
        return NULL;
    if (self->ref_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "add_kernel: this HotCore was built without the launch's parts");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(kinds);
    const unsigned char *kb = (const unsigned char *)PyBytes_AS_STRING(kinds);
    const unsigned char *sb = (const unsigned char *)PyBytes_AS_STRING(sizes);
    if (PyBytes_GET_SIZE(sizes) != n || PyTuple_GET_SIZE(ranges) != n) {
        PyErr_Format(PyExc_ValueError, "add_kernel: %zd kinds, %zd sizes, %zd ranges", n, PyBytes_GET_SIZE(sizes),
                     PyTuple_GET_SIZE(ranges));
        return NULL;
    }
    if (kid < 1 || kid > (1 << 24) || gpu < 0 || gpu >= MAX_GPUS || n > CB_LAUNCH_MAX_ARGS || function == 0) {
        PyErr_Format(PyExc_ValueError, "add_kernel: kernel id %lld, GPU %d, %zd parameters, function %llu", kid, gpu,
                     n, function);
        return NULL;
    }
    native_kernel *k = PyMem_Calloc(1, sizeof *k);
    if (k == NULL) return PyErr_NoMemory();
    int at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int size = sb[i];
        PyObject *range = PyTuple_GET_ITEM(ranges, i);
        long long lo = 0, hi = -1;
        if (!PyArg_ParseTuple(range, "LL", &lo, &hi) || (size != 1 && size != 2 && size != 4 && size != 8)
            || (kb[i] == 0 && size != 8) || lo > hi) {
            PyMem_Free(k);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "add_kernel: parameter %zd: kind code %d, %d bytes, range [%lld, %lld]",
                             i, kb[i], size, lo, hi);
            return NULL;
        }
        at = (at + size - 1) / size * size;   /* natural alignment, as the C compiler lays them out */
        k->kinds[i] = kb[i];
        k->sizes[i] = (unsigned char)size;
        k->lo[i] = lo;
        k->hi[i] = hi;
        k->offsets[i] = (unsigned short)at;
        at += size;
    }
    if (retain_context(self, gpu) < 0) {
        PyMem_Free(k);
        return NULL;
    }
    if (kid >= self->nkernels) {
        Py_ssize_t cap = self->nkernels ? self->nkernels : 16;
        while (cap <= kid) cap *= 2;
        native_kernel **grown = PyMem_Realloc(self->kernels, cap * sizeof *grown);
        if (grown == NULL) {
            PyMem_Free(k);
            return PyErr_NoMemory();
        }
        memset(grown + self->nkernels, 0, (cap - self->nkernels) * sizeof *grown);
        self->kernels = grown;
        self->nkernels = cap;
    }
    Py_INCREF(kernel);
    Py_INCREF(name);
    k->kernel = kernel;
    k->name = name;
    k->function = (cb_CUfunction)(uintptr_t)function;
    k->gpu = gpu;
    k->nparams = (int)n;
    k->param_bytes = at;
    k->max_threads = dmt < kmt ? dmt : kmt;
    for (int i = 0; i < 3; i++) {
        k->max_block[i] = mb[i];
        k->max_grid[i] = mg[i];
    }
    k->static_shared = st;
    k->shared_optin = optin;
    k->dynamic_shared = dyn;
    native_kernel *old = self->kernels[kid];
    self->kernels[kid] = k;
    if (old != NULL) {
        Py_DECREF(old->kernel);
        Py_DECREF(old->name);
        PyMem_Free(old);
    }
    Py_RETURN_NONE;
}

/* The launch by the reference, its arguments boxed; after it succeeds, the kernel's dynamic shared
 * memory is re-read (the reference may have opted it in to more). */
static int refer_launch(HotCore *self, native_kernel *k, long long task, long long kid, const int *dims,
                        long long shared, const long long *values, const signed char *kinds,
                        const long long *offsets, int n) {
    PyObject *vals = PyTuple_New(n), *offs = PyTuple_New(n);
    PyObject *a[7] = {PyLong_FromLongLong(task), PyLong_FromLongLong(kid),
                      Py_BuildValue("(iiiiii)", dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]),
                      PyLong_FromLongLong(shared), vals, PyBytes_FromStringAndSize((const char *)kinds, n), offs};
    int ok = vals != NULL && offs != NULL;
    for (int i = 0; ok && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]), *o = PyLong_FromLongLong(offsets[i]);
        if (v == NULL || o == NULL) {
            Py_XDECREF(v);
            Py_XDECREF(o);
            ok = 0;
            break;
        }
        PyTuple_SET_ITEM(vals, i, v);
        PyTuple_SET_ITEM(offs, i, o);
    }
    for (int i = 0; i < 7; i++) ok &= a[i] != NULL;
    PyObject *r = ok ? PyObject_Vectorcall(self->ref_launch, a, 7, NULL) : NULL;
    for (int i = 0; i < 7; i++) Py_XDECREF(a[i]);
    if (r == NULL) return -1;
    Py_DECREF(r);
    self->launches_referred++;
    if (k != NULL && self->kernels[kid] == k) {
        PyObject *limits = PyObject_GetAttr(k->kernel, s_limits);
        PyObject *dyn = limits ? PyObject_GetAttr(limits, s_max_dynamic_shared) : NULL;
        long long d = dyn ? PyLong_AsLongLong(dyn) : -1;
        if (d >= 0) k->dynamic_shared = d;
        PyErr_Clear();   /* the launch is done; a limit not re-read only sends later launches here */
        Py_XDECREF(dyn);
        Py_XDECREF(limits);
    }
    return 0;
}

/* Whether the C path takes this launch before the task is looked up: the count, kinds, scalar
 * ranges, dimensions and shared memory the reference would accept without opting in. */
static int launch_fits(const native_kernel *k, const int *dims, long long shared, const long long *values,
                       const signed char *kinds, const long long *offsets, int n) {
    if (n != k->nparams || shared < 0 || shared > k->dynamic_shared || k->static_shared + shared > k->shared_optin)
        return 0;
    long long threads = 1;
    for (int i = 0; i < 3; i++) {
        if (dims[i] < 1 || dims[i] > k->max_grid[i] || dims[3 + i] < 1 || dims[3 + i] > k->max_block[i]) return 0;
        threads *= dims[3 + i];
    }
    if (threads > k->max_threads) return 0;
    for (int i = 0; i < n; i++) {
        long long v = values[i];
        if ((unsigned char)kinds[i] != k->kinds[i]) return 0;
        if (k->kinds[i] == 0 ? offsets[i] < 0 : (v < k->lo[i] || v > k->hi[i])) return 0;
    }
    return 1;
}

/* JavaHotPath.launch with its arguments unboxed (cb_native_api.launch). */
static int launch_raw(void *core, long long task, long long kid, const int dims[6], long long shared,
                      const long long *values, const signed char *kinds, const long long *offsets, int n) {
    HotCore *self = (HotCore *)core;
    if (self->refuse_unusable != NULL) {
        refuse_unusable(self, "launch");
        return -1;
    }
    native_kernel *k = kid > 0 && kid < self->nkernels ? self->kernels[kid] : NULL;
    if (k == NULL || n < 0 || !launch_fits(k, dims, shared, values, kinds, offsets, n))
        return refer_launch(self, k, task, kid, dims, shared, values, kinds, offsets, n);
    PyObject *task_obj = PyLong_FromLongLong(task);
    if (task_obj == NULL) return -1;
    PyObject *lease, *inside;
    unsigned long ident;
    if (enter_lease(self, task_obj, &lease, &inside, &ident) < 0) {
        Py_DECREF(task_obj);
        return -1;
    }
    int result = -1, refer = 0;
    cb_CUresult rc = CB_CUDA_SUCCESS;
    PyObject *b = NULL, *stream_obj = NULL;
    b = PyObject_GetAttr(lease, s_binding);
    if (b == NULL) goto left;
    int ok = 1;
    long long gpu = int_attr(b, s_gpu, &ok);
    if (!ok) goto left;
    if (gpu != k->gpu) {
        refer = 1;
        goto left;
    }
    stream_obj = PyObject_GetAttr(b, s_stream);
    if (stream_obj == NULL) goto left;
    unsigned long long stream = PyLong_AsUnsignedLongLong(stream_obj);
    if (stream == (unsigned long long)-1 && PyErr_Occurred()) goto left;
    /* the parameter buffer: each argument at its place, pointers resolved through the handle table */
    _Alignas(16) unsigned char params[CB_LAUNCH_MAX_ARGS * 8];
    void *ptrs[CB_LAUNCH_MAX_ARGS];
    long long extents[CB_LAUNCH_MAX_ARGS];   /* for a model device (cuda_driver.h: cbLaunchExtents) */
    for (int i = 0; i < n; i++) {
        unsigned char *at = params + k->offsets[i];
        ptrs[i] = at;
        long long v = values[i];
        extents[i] = 0;
        if (k->kinds[i] != 0) {
            switch (k->sizes[i]) {
                case 1: { uint8_t x = (uint8_t)v; memcpy(at, &x, 1); break; }
                case 2: { uint16_t x = (uint16_t)v; memcpy(at, &x, 2); break; }
                case 4: { uint32_t x = (uint32_t)v; memcpy(at, &x, 4); break; }
                default: memcpy(at, &v, 8); break;
            }
            continue;
        }
        /* a buffer: live in the handle table, on this GPU (the handle's low bits), the task's own,
         * the offset inside it; anything else goes to the reference, which says what is wrong */
        if ((v & GPU_MASK) != gpu) {
            refer = 1;
            goto left;
        }
        PyObject *h = PyLong_FromLongLong(v);
        PyObject *a = h ? PyObject_CallOneArg(self->h_get, h) : NULL;
        Py_XDECREF(h);
        if (a == NULL) goto left;
        long long state = a != Py_None ? int_attr(a, s_state, &ok) : -1;
        long long owner = ok && state == 0 ? int_attr(a, s_owner, &ok) : -1;
        long long size = ok && owner == task ? int_attr(a, s_size, &ok) : -1;
        long long ptr = ok && offsets[i] <= size ? int_attr(a, s_ptr, &ok) : -1;
        Py_DECREF(a);
        PyErr_Clear();   /* an attribute that did not read as an int: the reference decides */
        if (!ok || state != 0 || owner != task || offsets[i] > size) {
            refer = 1;
            goto left;
        }
        unsigned long long address = (unsigned long long)ptr + (unsigned long long)offsets[i];
        memcpy(at, &address, 8);
        extents[i] = size - offsets[i];
    }
    /* the kernel's GPU's primary context, current for the call. A thread with no context (a
     * Java thread that never touched CUDA) keeps it, as the runtime's first call would have made
     * it current: later launches then cost no switch. A thread that had another GPU's context
     * current gets that one back. */
    cb_CUcontext prev = NULL, ctx = self->contexts[k->gpu];
    rc = self->driver->cuCtxGetCurrent(&prev);
    int switched = rc == CB_CUDA_SUCCESS && prev != ctx;
    if (switched) rc = self->driver->cuCtxSetCurrent(ctx);
    if (prev == NULL) switched = 0;
    if (rc == CB_CUDA_SUCCESS && self->driver->cbLaunchExtents != NULL) rc = self->driver->cbLaunchExtents(extents, n);
    if (rc == CB_CUDA_SUCCESS)
        rc = self->driver->cuLaunchKernel(k->function, (unsigned)dims[0], (unsigned)dims[1], (unsigned)dims[2],
                                     (unsigned)dims[3], (unsigned)dims[4], (unsigned)dims[5], (unsigned)shared,
                                     (cb_CUstream)(uintptr_t)stream, n ? ptrs : NULL, NULL);
    if (switched) self->driver->cuCtxSetCurrent(prev);
    if (rc == CB_CUDA_SUCCESS) {
        /* the launch log: appended in place while the list is short, else by its record() */
        PyObject *names = PyDict_GetItemWithError(self->log_recent, stream_obj);
        int logged;
        if (names != NULL && PyList_CheckExact(names) && PyList_GET_SIZE(names) < 2 * LOG_KEEP) {
            logged = PyList_Append(names, k->name);
        } else {
            PyObject *la[2] = {stream_obj, k->name};
            PyObject *r = PyErr_Occurred() ? NULL : PyObject_Vectorcall(self->log_record, la, 2, NULL);
            logged = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
        if (logged < 0) PyErr_WriteUnraisable(self->log_record);   /* the kernel is queued all the same */
        result = 0;
    }
left:
    leave_lease(inside, ident);
    Py_XDECREF(stream_obj);
    Py_XDECREF(b);
    Py_DECREF(inside);
    Py_DECREF(lease);
    Py_DECREF(task_obj);
    if (refer) {
        PyErr_Clear();
        return refer_launch(self, k, task, kid, dims, shared, values, kinds, offsets, n);
    }
    if (rc != CB_CUDA_SUCCESS) {   /* the driver refused the launch: the service words the error */
        PyObject *ka[2] = {PyLong_FromLongLong(kid), PyLong_FromLong(rc)};
        if (ka[0] != NULL && ka[1] != NULL) raise_exc(PyObject_Vectorcall(self->launch_failed, ka, 2, NULL));
        Py_XDECREF(ka[0]);
        Py_XDECREF(ka[1]);
        return -1;
    }
    if (result == 0) self->launches++;
    return result;
}

/* launch(task, kernel_id, dims, shared, values, kinds, offsets): JavaHotPath.launch. Forms other
 * than exact ints, a 6-tuple, tuples of exact ints and bytes go to the reference as given. */
static PyObject *hc_launch(HotCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->ref_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "launch: this HotCore was built without the launch's parts");
        return NULL;
    }
    if (kwnames != NULL || nargs != 7) return PyObject_Vectorcall(self->ref_launch, args, nargs, kwnames);
    PyObject *dims = args[2], *values = args[4], *kinds = args[5], *offsets = args[6];
    int simple = PyLong_CheckExact(args[0]) && PyLong_CheckExact(args[1]) && PyLong_CheckExact(args[3]) &&
                 PyTuple_CheckExact(dims) && PyTuple_GET_SIZE(dims) == 6 && PyTuple_CheckExact(values) &&
                 PyTuple_CheckExact(offsets) && PyBytes_CheckExact(kinds) &&
                 PyTuple_GET_SIZE(values) == PyBytes_GET_SIZE(kinds) &&
                 PyTuple_GET_SIZE(values) == PyTuple_GET_SIZE(offsets) &&
                 PyTuple_GET_SIZE(values) <= CB_LAUNCH_MAX_ARGS;
    int d[6];
    long long vals[CB_LAUNCH_MAX_ARGS], offs[CB_LAUNCH_MAX_ARGS];
    int n = simple ? (int)PyTuple_GET_SIZE(values) : 0;
    for (int i = 0; simple && i < 6; i++) {
        PyObject *x = PyTuple_GET_ITEM(dims, i);
        long v = PyLong_CheckExact(x) ? PyLong_AsLong(x) : -1;
        simple = v >= 1 && v <= INT32_MAX;
        d[i] = (int)v;
    }
    for (int i = 0; simple && i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(values, i), *o = PyTuple_GET_ITEM(offsets, i);
        int of1 = 0, of2 = 0;
        vals[i] = PyLong_CheckExact(v) ? PyLong_AsLongLongAndOverflow(v, &of1) : (of1 = 1, 0);
        offs[i] = PyLong_CheckExact(o) ? PyLong_AsLongLongAndOverflow(o, &of2) : (of2 = 1, 0);
        simple = !of1 && !of2;
    }
    int of = 0;
    long long task = simple ? PyLong_AsLongLongAndOverflow(args[0], &of) : 0;
    long long kid = simple && !of ? PyLong_AsLongLongAndOverflow(args[1], &of) : 0;
    long long shared = simple && !of ? PyLong_AsLongLongAndOverflow(args[3], &of) : 0;
    if (PyErr_Occurred()) PyErr_Clear();
    if (!simple || of) return PyObject_Vectorcall(self->ref_launch, args, nargs, kwnames);
    if (launch_raw(self, task, kid, d, shared, vals, (const signed char *)PyBytes_AS_STRING(kinds), offs, n) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* synchronize(task): waits for the task's stream with the GIL released (cuStreamSynchronize in its
 * GPU's primary context), then clears the stream's launch log, as the reference does after a
 * completed wait. Everything else goes to the reference: no driver (the emulated device, or
 * copies not enabled), no launch log, an unusable GPU, a task it cannot look up (the reference
 * raises the right error), and a wait that failed (a kernel fault: the reference waits again,
 * gets the sticky error, and raises KernelFault naming the candidates). */
static PyObject *hc_synchronize(HotCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->enter_buffer == NULL || self->log_clear == NULL || self->refuse_unusable != NULL || kwnames != NULL ||
        nargs != 1 || !PyLong_CheckExact(args[0]))
        return PyObject_Vectorcall(self->ref_synchronize, args, nargs, kwnames);
    PyObject *lease = lookup_lease(self, args[0]);
    PyObject *b = lease ? PyObject_GetAttr(lease, s_binding) : NULL;
    Py_XDECREF(lease);
    int ok = b != NULL;
    long long gpu = ok ? int_attr(b, s_gpu, &ok) : -1;
    PyObject *stream_obj = ok ? PyObject_GetAttr(b, s_stream) : NULL;
    Py_XDECREF(b);
    unsigned long long stream = stream_obj ? PyLong_AsUnsignedLongLong(stream_obj) : 0;
    if (stream_obj == NULL || PyErr_Occurred() || gpu < 0 || gpu >= MAX_GPUS || retain_context(self, (int)gpu) < 0) {
        PyErr_Clear();
        Py_XDECREF(stream_obj);
        return PyObject_Vectorcall(self->ref_synchronize, args, nargs, kwnames);
    }
    cb_CUcontext prev = NULL, ctx = self->contexts[gpu];
    cb_CUresult rc;
    Py_BEGIN_ALLOW_THREADS
    rc = self->driver->cuCtxGetCurrent(&prev);
    int switched = rc == CB_CUDA_SUCCESS && prev != ctx;   /* as the launch: a thread with none keeps it */
    if (switched) rc = self->driver->cuCtxSetCurrent(ctx);
    if (prev == NULL) switched = 0;
    if (rc == CB_CUDA_SUCCESS) rc = self->driver->cuStreamSynchronize((cb_CUstream)(uintptr_t)stream);
    if (switched) self->driver->cuCtxSetCurrent(prev);
    Py_END_ALLOW_THREADS
    if (rc != CB_CUDA_SUCCESS) {
        Py_DECREF(stream_obj);
        return PyObject_Vectorcall(self->ref_synchronize, args, nargs, kwnames);
    }
    self->synchronizes++;
    int logged = PyDict_Contains(self->log_recent, stream_obj);   /* else the log has nothing of it */
    PyObject *r = logged > 0 ? PyObject_CallOneArg(self->log_clear, stream_obj) : NULL;
    Py_DECREF(stream_obj);
    if (logged < 0 || (logged > 0 && r == NULL)) return NULL;
    Py_XDECREF(r);
    Py_RETURN_NONE;
}

#endif /* CB_HOTCORE_KERNELS_H */
