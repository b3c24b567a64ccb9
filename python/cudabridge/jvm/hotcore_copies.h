/*
 * hotcore_copies.h: copy admission, what the JNI library's copies on a GPU need from here
 * (native_api.h: enter_copy, leave_copy, driver_failed): the buffer, its task's lease entered the
 * way every queued operation enters it, and for host memory outside the heap whether the range is
 * page-locked (one asynchronous DMA) or pageable (its GPU's staging slots,
 * bridge/staging_ring.h); then the service's words for a driver error. enable_copies hands this
 * part the hot path's page-locked regions. Part of _hotcore.c's one translation unit: included by
 * it after HotCore, the shared helpers and hotcore_leases.h, not a header to include anywhere
 * else.
 *
 * The C path below takes a copy whose every check passes as it stands, with no Python frame;
 * anything else (a dead handle, a range outside the buffer or running past a region, a task not
 * open, a range the task unregistered, an object not as documented) goes whole to the reference,
 * JavaHotPath's _enter_buffer (heap arrays) or enter_host_copy, which refuses it in its own words
 * or takes it: both paths give the same outcome for the same input.
 *
 * Invariants:
 *  - a copy holds its buffer's task lease from enter_copy to leave_copy, from before its first
 *    DMA is queued until after its last;
 *  - a page-locked range's stream is recorded on its region's user at the lookup, and the GIL is
 *    held from there until its DMA is queued (unregister_host waits for the streams recorded); a
 *    range the reference admitted is looked up again here, and staged if its region is gone;
 *  - the region tables are read with no Python code run in between, as one state (regions never
 *    overlap, nor does an unregistered range overlap a region).
 */

#ifndef CB_HOTCORE_COPIES_H
#define CB_HOTCORE_COPIES_H

/* The last of the sorted, exact-int `bases` (a list) below `probe`, in *at: 1 found, 0 none, -1
 * error (an item not an int). bisect_left(bases, probe) - 1, as the reference computes it. */
static int last_below(PyObject *bases, unsigned long long probe, PyObject **at) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(bases);
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        unsigned long long v = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(bases, mid));
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        if (v < probe) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return 0;
    *at = PyList_GET_ITEM(bases, lo - 1);
    return 1;
}

/* Whether `task`'s unregistered ranges (a (sorted bases, base -> size) pair in
 * reg_unregistered, or none) touch [address, probe): 1 yes, 0 no, -1 tables not as documented.
 * They never overlap: the last starting before probe ends last of those that do. A writer adds a
 * range's size before its base and removes its base before its size, so a base read here always
 * has its size. */
static int unregistered_touch(HotCore *self, long long task, unsigned long long address, unsigned long long probe) {
    PyObject *key = PyLong_FromLongLong(task);
    if (key == NULL) return -1;
    PyObject *table = PyDict_GetItemWithError(self->reg_unregistered, key);
    Py_DECREF(key);
    if (table == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(table) || PyTuple_GET_SIZE(table) != 2 || !PyList_CheckExact(PyTuple_GET_ITEM(table, 0)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(table, 1)))
        return -1;
    PyObject *base = NULL;
    int found = last_below(PyTuple_GET_ITEM(table, 0), probe, &base);
    if (found <= 0) return found;
    Py_INCREF(base);
    PyObject *size = PyDict_GetItemWithError(PyTuple_GET_ITEM(table, 1), base);
    unsigned long long b = PyLong_AsUnsignedLongLong(base);
    unsigned long long n = size != NULL ? PyLong_AsUnsignedLongLong(size) : 0;
    Py_DECREF(base);
    if (size == NULL || PyErr_Occurred()) return -1;
    return b + n > address;
}

/* The page-locked region [address, address + nbytes) lies in, as PageLockedRegions.lookup finds
 * it: 1 inside the region starting at *base (of *size bytes), 0 pageable, -1 for the reference (a
 * range that runs past a region or into one, or one `task` (or no task) unregistered, or tables not
 * as documented). Regions never overlap: the one a range can touch is the last starting before
 * its end; no unregistered range overlaps a region. One bisect per table. No Python code runs
 * here: the tables are read as one state, between two of their writers' steps at worst, as the
 * reference reads them. */
static int find_region(HotCore *self, unsigned long long address, unsigned long long nbytes, long long task,
                       unsigned long long *base, unsigned long long *size) {
    PyObject *bases = self->reg_bases;
    if (!PyList_CheckExact(bases) || !PyDict_CheckExact(self->reg_memory) || !PyDict_CheckExact(self->reg_unregistered))
        return -1;
    unsigned long long end = address + nbytes, probe = address + (nbytes > 0 ? nbytes : 1);
    PyObject *key = NULL;
    int below = last_below(bases, probe, &key);
    if (below < 0) return -1;
    if (below) {
        Py_INCREF(key);
        unsigned long long b = PyLong_AsUnsignedLongLong(key);
        PyObject *mem = b == (unsigned long long)-1 && PyErr_Occurred() ? NULL : PyDict_GetItemWithError(self->reg_memory, key);
        Py_ssize_t n = mem != NULL ? PyObject_Size(mem) : -1;   /* a ctypes array or a memoryview: no frame */
        Py_DECREF(key);
        if (PyErr_Occurred()) return -1;
        if (n >= 0) {   /* else removed meanwhile: pageable, as the reference finds it */
            if (b <= address && end <= b + (unsigned long long)n) {
                *base = b;
                *size = (unsigned long long)n;
                return 1;
            }
            if (nbytes > 0 && address < b + (unsigned long long)n)
                return -1;   /* runs past the region: the reference refuses it */
        }
    }
    if (PyDict_GET_SIZE(self->reg_unregistered) == 0) return 0;
    int touch = unregistered_touch(self, 0, address, probe);
    if (touch == 0 && task != 0) touch = unregistered_touch(self, task, address, probe);
    if (touch != 0) {   /* one the task or the executor unregistered, or an error: the reference decides */
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* The stream of a DMA from or into the page-locked region at `base` goes into its user's streams
 * (reg_blocks[base].streams: a pinned buffer's reuse, a registration's unregister wait for it).
 * 0, or -1 (error raised, or a user not as documented). */
static int record_region_stream(HotCore *self, unsigned long long base, PyObject *stream) {
    if (!PyDict_CheckExact(self->reg_blocks)) return -1;
    PyObject *key = PyLong_FromUnsignedLongLong(base);
    PyObject *user = key != NULL ? PyDict_GetItemWithError(self->reg_blocks, key) : NULL;
    Py_XDECREF(key);
    if (user == NULL) return -1;
    Py_INCREF(user);
    PyObject *streams = PyObject_GetAttr(user, s_streams);
    Py_DECREF(user);
    int rc = streams != NULL && PySet_CheckExact(streams) && PySet_Add(streams, stream) == 0 ? 0 : -1;
    Py_XDECREF(streams);
    return rc;
}

/* The C path of enter_copy: 1 entered (out filled), 0 not taken (nothing held, no error: the
 * reference decides), -1 an error (nothing held). A page-locked range's stream is recorded in its
 * region's user here; the caller queues the DMA with the GIL still held and no Python code run in
 * between (the invariant of memory/page_locked_regions.py: unregister waits for the streams recorded). */
static int fast_enter_copy(HotCore *self, long long handle, long long offset, long long nbytes, int kind,
                           unsigned long long host, cb_copy_entry *out) {
    if (offset < 0 || nbytes < 0) return 0;
    PyObject *h = PyLong_FromLongLong(handle);
    PyObject *a = h != NULL ? PyObject_CallOneArg(self->h_get, h) : NULL;
    Py_XDECREF(h);
    if (a == NULL) return -1;
    if (a == Py_None) {
        Py_DECREF(a);
        return 0;
    }
    int ok = 1;
    PyObject *owner = int_attr(a, s_state, &ok) == 0 && ok ? PyObject_GetAttr(a, s_owner) : NULL;
    if (owner == NULL || !PyLong_CheckExact(owner)) {
        Py_XDECREF(owner);
        Py_DECREF(a);
        PyErr_Clear();
        return 0;
    }
    PyObject *lease, *inside;
    unsigned long ident;
    if (enter_lease(self, owner, &lease, &inside, &ident) < 0) {   /* not bound, or its release begun */
        Py_DECREF(owner);
        Py_DECREF(a);
        PyErr_Clear();
        return 0;
    }
    /* inside the lease: the allocation read again (a free on another thread may have run) */
    long long task = PyLong_AsLongLong(owner);
    long long state = int_attr(a, s_state, &ok);
    long long size = ok ? int_attr(a, s_size, &ok) : 0;
    long long ptr = ok ? int_attr(a, s_ptr, &ok) : 0;
    PyObject *stream = ok ? PyObject_GetAttr(a, s_stream) : NULL;
    unsigned long long st = stream != NULL ? PyLong_AsUnsignedLongLong(stream) : 0;
    int taken = stream != NULL && !PyErr_Occurred() && state == 0 && offset <= size && nbytes <= size - offset;
    int pagelocked = 0;
    if (taken && kind != CB_HOST_HEAP) {
        unsigned long long base = 0, rsize = 0;
        int found = find_region(self, host, (unsigned long long)nbytes, task, &base, &rsize);
        taken = found >= 0;
        pagelocked = found == 1;
        if (pagelocked && record_region_stream(self, base, stream) < 0) taken = 0;
        if (PyErr_Occurred()) taken = 0;
    }
    Py_XDECREF(stream);
    Py_DECREF(owner);
    Py_DECREF(a);
    if (!taken) {
        PyErr_Clear();
        leave_lease(inside, ident);
        Py_DECREF(inside);
        Py_DECREF(lease);
        return 0;
    }
    out->lease = lease;
    out->inside = inside;
    out->ident = ident;
    out->address = (unsigned long long)ptr + (unsigned long long)offset;
    out->stream = (cb_CUstream)(uintptr_t)st;
    out->pagelocked = pagelocked;
    return 1;
}

/* The reference: _enter_buffer (a heap array) or enter_host_copy, whose (allocation, lease[,
 * page-locked]) is unpacked into out; -1 with its refusal raised. The reference may have let other
 * threads run after it looked the region up (an unregister_host among them), so a page-locked
 * range is looked up again here, with the GIL held from now until its DMA is queued, and its
 * stream recorded again: a region gone meanwhile is staged instead (out->pagelocked 0). */
static int refer_enter_copy(HotCore *self, long long handle, long long offset, long long nbytes, int to_device,
                            int kind, unsigned long long host, cb_copy_entry *out) {
    PyObject *r = NULL;
    if (kind == CB_HOST_HEAP) {
        PyObject *a[4] = {PyLong_FromLongLong(handle), PyUnicode_FromString(to_device ? "copy_in" : "copy_out"),
                          PyLong_FromLongLong(offset), PyLong_FromLongLong(nbytes)};
        if (a[0] && a[1] && a[2] && a[3]) r = PyObject_Vectorcall(self->enter_buffer, a, 4, NULL);
        for (int i = 0; i < 4; i++) Py_XDECREF(a[i]);
    } else {
        PyObject *a[6] = {PyLong_FromLongLong(handle), PyLong_FromLongLong(offset), PyLong_FromUnsignedLongLong(host),
                          PyLong_FromLongLong(nbytes), PyBool_FromLong(to_device), PyBool_FromLong(kind == CB_HOST_DIRECT)};
        if (a[0] && a[1] && a[2] && a[3] && a[4] && a[5]) r = PyObject_Vectorcall(self->enter_host_copy, a, 6, NULL);
        for (int i = 0; i < 6; i++) Py_XDECREF(a[i]);
    }
    if (r == NULL) return -1;
    /* (allocation, lease[, page-locked]), the lease entered on this thread: left on every way out from here */
    Py_ssize_t want = kind == CB_HOST_HEAP ? 2 : 3;
    PyObject *alloc = PyTuple_CheckExact(r) && PyTuple_GET_SIZE(r) == want ? PyTuple_GET_ITEM(r, 0) : NULL;
    PyObject *lease = alloc ? PyTuple_GET_ITEM(r, 1) : NULL;
    PyObject *inside = lease ? PyObject_GetAttr(lease, s_inside) : NULL;
    if (inside == NULL || !PyList_CheckExact(inside)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "enter_copy: the reference's result is not as documented");
        Py_XDECREF(inside);
        Py_DECREF(r);
        return -1;
    }
    int ok = 1;
    long long ptr = int_attr(alloc, s_ptr, &ok);
    long long stream = ok ? int_attr(alloc, s_stream, &ok) : 0;
    int pagelocked = ok && want == 3 ? PyObject_IsTrue(PyTuple_GET_ITEM(r, 2)) : 0;
    unsigned long ident = PyThread_get_thread_ident();
    if (!ok || pagelocked < 0) {
        leave_lease(inside, ident);
        Py_DECREF(inside);
        Py_DECREF(r);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "enter_copy: an allocation's ptr and stream are ints");
        return -1;
    }
    if (pagelocked) {
        unsigned long long base = 0, rsize = 0;
        PyObject *st = PyLong_FromLongLong(stream);
        if (st == NULL || find_region(self, host, (unsigned long long)nbytes, 0, &base, &rsize) != 1 ||
            record_region_stream(self, base, st) < 0) {
            pagelocked = 0;
            PyErr_Clear();
        }
        Py_XDECREF(st);
    }
    Py_INCREF(lease);
    out->lease = lease;
    out->inside = inside;
    out->ident = ident;
    out->address = (unsigned long long)ptr + (unsigned long long)offset;
    out->stream = (cb_CUstream)(uintptr_t)(unsigned long long)stream;
    out->pagelocked = pagelocked;
    Py_DECREF(r);
    return 0;
}

static int enter_copy(void *core, long long handle, long long offset, long long nbytes, int to_device, int kind,
                      unsigned long long host, cb_copy_entry *out) {
    HotCore *self = (HotCore *)core;
    if (self->refuse_unusable != NULL) {
        refuse_unusable(self, to_device ? "copy_in" : "copy_out");
        return -1;
    }
    if (kind != CB_HOST_HEAP && kind != CB_HOST_DIRECT && kind != CB_HOST_ADDRESS) {
        PyErr_Format(PyExc_ValueError, "enter_copy: host memory kind %d", kind);
        return -1;
    }
    long gpu = (long)((unsigned long long)handle & GPU_MASK);
    if (retain_context(self, (int)gpu) < 0) return -1;
    int taken = fast_enter_copy(self, handle, offset, nbytes, kind, host, out);
    if (taken < 0) return -1;
    if (!taken) {
        if (refer_enter_copy(self, handle, offset, nbytes, to_device, kind, host, out) < 0) return -1;
        self->copies_referred++;
    }
    out->context = self->contexts[gpu];
    out->gpu = (int)gpu;
    /* counted here but for what the reference counts itself (enter_host_copy) */
    if (kind == CB_HOST_HEAP) {
        if (to_device) self->copies_in++;
        else self->copies_out++;
    } else if (taken) {
        if (kind == CB_HOST_DIRECT) self->copies_direct++;
        else self->copies_address++;
    }
    return 0;
}

static void leave_copy(void *core, cb_copy_entry *l) {
    (void)core;
    if (l->inside == NULL) return;
    leave_lease((PyObject *)l->inside, l->ident);
    Py_DECREF((PyObject *)l->inside);
    Py_DECREF((PyObject *)l->lease);
    l->inside = l->lease = NULL;
}

static int driver_failed(void *core, const char *call, int rc) {
    HotCore *self = (HotCore *)core;
    PyObject *a[2] = {PyUnicode_FromString(call), PyLong_FromLong(rc)};
    if (a[0] && a[1]) raise_exc(PyObject_Vectorcall(self->copy_failed, a, 2, NULL));
    Py_XDECREF(a[0]);
    Py_XDECREF(a[1]);
    return -1;
}

/* enable_copies(enter_buffer, copy_failed, slots, slot_bytes, copy_threads): the JNI library's
 * heap-array copies go through pinned staging from now on (a CUDA device: the driver loads here). */
static PyObject *hc_enable_copies(HotCore *self, PyObject *args) {
    PyObject *enter, *enter_host, *failed, *regions;
    int slots, copy_threads;
    long long slot_bytes;
    if (!PyArg_ParseTuple(args, "OOOO!iLi:enable_copies", &enter, &enter_host, &failed, &PyTuple_Type, &regions,
                          &slots, &slot_bytes, &copy_threads))
        return NULL;
    if (copy_threads < 1 || copy_threads > 64) {
        PyErr_Format(PyExc_ValueError, "enable_copies: 1 to 64 copy threads, got %d", copy_threads);
        return NULL;
    }
    if (!PyCallable_Check(enter) || !PyCallable_Check(enter_host) || !PyCallable_Check(failed)) {
        PyErr_SetString(PyExc_TypeError, "enable_copies: enter_buffer, enter_host_copy and copy_failed must be callable");
        return NULL;
    }
    if (PyTuple_GET_SIZE(regions) != 4 || !PyList_CheckExact(PyTuple_GET_ITEM(regions, 0)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(regions, 1)) || !PyDict_CheckExact(PyTuple_GET_ITEM(regions, 2)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(regions, 3))) {
        PyErr_SetString(PyExc_TypeError, "enable_copies: regions is (bases list, memory dict, blocks dict, "
                                         "unregistered dict)");
        return NULL;
    }
    if (slots < 1 || slots > CB_STAGING_MAX_SLOTS || slot_bytes < 4096 || slot_bytes > (1LL << 30)) {
        PyErr_Format(PyExc_ValueError, "enable_copies: 1 to %d slots of 4 KiB to 1 GiB, got %d of %lld bytes",
                     CB_STAGING_MAX_SLOTS, slots, slot_bytes);
        return NULL;
    }
    if (resolve_driver(self) < 0) return NULL;
#define TAKE(field, obj) do { PyObject *o_ = (obj); Py_INCREF(o_); Py_XSETREF(self->field, o_); } while (0)
    TAKE(enter_buffer, enter);
    TAKE(enter_host_copy, enter_host);
    TAKE(copy_failed, failed);
    TAKE(reg_bases, PyTuple_GET_ITEM(regions, 0));
    TAKE(reg_memory, PyTuple_GET_ITEM(regions, 1));
    TAKE(reg_blocks, PyTuple_GET_ITEM(regions, 2));
    TAKE(reg_unregistered, PyTuple_GET_ITEM(regions, 3));
#undef TAKE
    self->staging_slots = slots;
    self->staging_slot_bytes = slot_bytes;
    self->staging_copy_threads = copy_threads;
    Py_RETURN_NONE;
}

#endif /* CB_HOTCORE_COPIES_H */
