/*
 * _torch_allocator.cpp: the functions PyTorch's CUDAPluggableAllocator loads by name from this
 * library (torch.py passes its path), over the torch plug-in's LibraryAllocator
 * (library_allocator.py). Built with the package's C extensions (setup.py, memory/native.py's
 * ALLOCATOR_PARTS), so it is the installed package's own file, as trusted as its Python; a Python
 * extension module too, so that torch.py can hand it the Python callables (connect()).
 *
 *   void *cb_torch_alloc(size_t size, int device, cudaStream_t stream)
 *   void  cb_torch_free(void *ptr, size_t size, int device, cudaStream_t stream)
 *   void  cb_torch_record_stream(void *ptr, cudaStream_t stream)   set_record_stream_fn
 *   void  cb_torch_reset(void)                                      set_reset_fn (empty_cache)
 *
 * Why C++: an allocation that fails must fail in torch, not return NULL (torch stores whatever
 * alloc returns as the tensor's data without a check, and a kernel would then write through
 * address 0). A C++ exception thrown here crosses torch's std::function into its own handlers,
 * which raise it in Python as RuntimeError with this message, as RMM's allocator does.
 *
 * Frees do not take the GIL: cb_torch_free appends the address to a list of its own (a mutex, no
 * Python), and the list is handed to the Python side (free_pointer: queued there) by the next
 * allocation through this part, by record_stream and empty_cache, and by the allocator's every
 * drain (flush(): torch.py makes it the LibraryAllocator's pending_frees), which also waits for
 * the hand-overs other threads have begun, so a task's release still sees every free made before
 * it. Autograd's device threads free as often as they allocate,
 * and a free that had to take the GIL waited for whichever thread held it.
 *
 * Invariants:
 *  - torch calls these with or without the GIL, from any thread (autograd's included): alloc,
 *    record_stream and reset take it with PyGILState_Ensure and give it back before returning or
 *    throwing (autograd's
 *    device threads keep a Python thread state for their life, PyTorch's PythonEngine::thread_init,
 *    so there Ensure only takes the GIL; a thread with none, a user's C++ thread, gets one made and
 *    dropped per call: keeping one would need the GIL at the thread's end, which a thread joined
 *    by a GIL holder, or ending while the interpreter finalizes, cannot take);
 *  - free never throws (torch calls it from destructors) and never waits for the GIL: an address it
 *    cannot list (out of memory) is freed at once under the GIL instead; a failure in Python is
 *    written with PyErr_WriteUnraisable when the list is handed over, and the memory stays with
 *    the pool (reclaimed at its task's release, or at close);
 *  - the listed addresses go to the callables connected when they are handed over: connect and
 *    disconnect hand the list to the old set first, so no free listed before reaches another
 *    service's allocator;
 *  - a connect to another owner (a service's token) is refused while tensors this part allocated
 *    are outstanding: such a tensor's later free would reach the new owner's allocator, whose pool
 *    may by then have handed the same address to a live allocation of its own (an address alone
 *    cannot tell the two apart). g_outstanding counts them, from before an allocation's call
 *    (GIL held: the call may let the GIL go, and a connect meanwhile must see it) to the moment its
 *    free is listed or counted in flight (under g_pending_mu, in the same step); a connect decides
 *    and swaps holding the GIL and the mutex, with the list empty and nothing in flight, so every
 *    tensor is then either counted or already with the old owner's allocator;
 *  - the callables are read and replaced only with the GIL held (connect, disconnect), so a call
 *    sees one complete set; a call with no set connected fails (alloc) or does nothing (the rest).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

static PyObject *g_alloc, *g_free, *g_record, *g_reset;   // strong references, set by connect(); GIL
static PyObject *g_owner;   // the last connect's owner (strong; kept across disconnect); GIL
static std::atomic<long> g_outstanding;   // allocations returned to torch, not yet freed by it
// The frees listed, not yet handed to g_free (oldest first), and how many are being handed over
// now (taken from the list, the call to g_free not returned): both guarded by g_pending_mu, which
// is never held while waiting for the GIL or calling Python. Never destroyed: a thread may free a
// tensor while the process exits, after static destructors ran.
static std::mutex &g_pending_mu = *new std::mutex;
static std::condition_variable &g_handed = *new std::condition_variable;   // g_in_flight fell
static std::deque<void *> &g_pending = *new std::deque<void *>;
static long g_in_flight;
static thread_local long t_in_flight;   // this thread's part of g_in_flight

namespace {

// A C size or pointer as a Python int (new reference, or NULL with an error). GIL held.
PyObject *as_int(uintptr_t v) { return PyLong_FromSize_t((size_t)v); }

// The pending Python error as one line ("Type: message"), cleared. GIL held.
std::string take_error() {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    std::string out = "unknown error";
    if (type != nullptr) {
        PyObject *name = PyObject_GetAttrString(type, "__name__");
        PyObject *text = value != nullptr ? PyObject_Str(value) : nullptr;
        const char *n = name != nullptr ? PyUnicode_AsUTF8(name) : nullptr;
        const char *t = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
        out = std::string(n != nullptr ? n : "?") + ": " + (t != nullptr ? t : "?");
        PyErr_Clear();
        Py_XDECREF(name);
        Py_XDECREF(text);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return out;
}

// Hands the listed frees to g_free (free_pointer: each queued in Python), oldest first, one at a
// time, GIL held: a free is taken from the list and counted in flight in one step under the mutex,
// so another thread's flush (a release's drain, through flush()) sees every free either still
// listed or in flight, and waits for those in flight (wait_handed). A failure is written as
// unraisable and the memory stays with the pool; with nothing connected the frees are dropped.
// One free, counted in flight by the caller, to g_free (GIL held), then counted out.
void hand_over(void *ptr) {
    PyObject *fn = g_free;
    if (fn != nullptr) {
        Py_INCREF(fn);   // a disconnect inside the call must not free the callable under it
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);   // the caller's pending error, if any, stays its own
        PyObject *p = as_int((uintptr_t)ptr);
        PyObject *r = p != nullptr ? PyObject_CallOneArg(fn, p) : nullptr;
        Py_XDECREF(p);
        if (r == nullptr) PyErr_WriteUnraisable(fn);
        Py_XDECREF(r);
        PyErr_Restore(et, ev, etb);
        Py_DECREF(fn);
    }
    std::lock_guard<std::mutex> hold(g_pending_mu);
    t_in_flight--;
    g_in_flight--;
    g_handed.notify_all();   // every fall: a waiter may wait for its own part, not for 0
}

void flush_pending() {
    for (;;) {
        void *ptr;
        {
            std::lock_guard<std::mutex> hold(g_pending_mu);
            if (g_pending.empty()) return;
            ptr = g_pending.front();
            g_pending.pop_front();
            g_in_flight++;
            t_in_flight++;
        }
        hand_over(ptr);
    }
}

// Waits, the GIL given back, until no other thread is handing a free over. Not from inside a
// hand-over of this thread's own (a finalizer or an error report that drains): two such threads
// would wait for each other; that drain sees the frees handed over so far. The mutex is let go
// before the GIL is taken again: a GIL holder may be waiting for the mutex.
void wait_handed() {
    if (t_in_flight != 0) return;
    {
        std::lock_guard<std::mutex> hold(g_pending_mu);
        if (g_in_flight == 0) return;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        std::unique_lock<std::mutex> hold(g_pending_mu);
        g_handed.wait(hold, [] { return g_in_flight == 0; });
    }
    Py_END_ALLOW_THREADS
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void *cb_torch_alloc(size_t size, int device, void *stream) {
    if (size == 0) return nullptr;   // as torch's own allocator: no memory, no call
    PyGILState_STATE st = PyGILState_Ensure();
    flush_pending();   // the frees listed since: queued before this allocation drains the queue
    if (g_alloc == nullptr) {   // checked after the hand-over, whose Python code may disconnect
        PyGILState_Release(st);
        throw std::runtime_error("cudabridge torch allocator: not connected to a service (cudabridge.allocators.torch.install)");
    }
    PyObject *fn = g_alloc;
    Py_INCREF(fn);
    g_outstanding.fetch_add(1, std::memory_order_relaxed);   // from before the call: the invariants
    PyObject *args[3] = {as_int(size), PyLong_FromLong(device), as_int((uintptr_t)stream)};
    PyObject *r = args[0] && args[1] && args[2] ? PyObject_Vectorcall(fn, args, 3, nullptr) : nullptr;
    for (PyObject *a : args) Py_XDECREF(a);
    Py_DECREF(fn);
    void *ptr = nullptr;
    std::string why;
    if (r != nullptr) {
        ptr = PyLong_AsVoidPtr(r);
        Py_DECREF(r);
        if (PyErr_Occurred()) why = take_error();
        else if (ptr == nullptr) why = "the allocator returned address 0";
    } else {
        why = take_error();
    }
    if (!why.empty()) g_outstanding.fetch_sub(1, std::memory_order_relaxed);   // no tensor after all
    PyGILState_Release(st);
    if (!why.empty()) throw std::runtime_error("cudabridge torch allocator: " + why);
    return ptr;
}

__attribute__((visibility("default"))) void cb_torch_free(void *ptr, size_t size, int device, void *stream) {
    (void)size;
    (void)device;
    (void)stream;   // the allocation knows its stream, and any recorded since
    if (ptr == nullptr) return;
    {
        std::lock_guard<std::mutex> hold(g_pending_mu);
        try {
            g_pending.push_back(ptr);
            g_outstanding.fetch_sub(1, std::memory_order_relaxed);   // listed: no longer outstanding
            return;
        } catch (const std::bad_alloc &) {   // no room to list it: in flight now, handed over under the GIL
            g_in_flight++;   // before the GIL, so no flush meanwhile misses it (a free that cannot list
                             // its address while Python finalizes would keep a later flush waiting)
            g_outstanding.fetch_sub(1, std::memory_order_relaxed);
        }
    }
    PyGILState_STATE st = PyGILState_Ensure();
    t_in_flight++;   // this thread's from here (counted in g_in_flight under the mutex above)
    flush_pending();
    hand_over(ptr);
    PyGILState_Release(st);
}

__attribute__((visibility("default"))) void cb_torch_record_stream(void *ptr, void *stream) {
    if (ptr == nullptr) return;
    PyGILState_STATE st = PyGILState_Ensure();
    flush_pending();   // a free listed before it is made first, as it was called first
    std::string why;
    if (g_record != nullptr) {
        PyObject *fn = g_record;
        Py_INCREF(fn);
        PyObject *args[2] = {as_int((uintptr_t)ptr), as_int((uintptr_t)stream)};
        PyObject *r = args[0] && args[1] ? PyObject_Vectorcall(fn, args, 2, nullptr) : nullptr;
        for (PyObject *a : args) Py_XDECREF(a);
        if (r == nullptr) why = take_error();
        Py_XDECREF(r);
        Py_DECREF(fn);
    }
    PyGILState_Release(st);
    if (!why.empty()) throw std::runtime_error("cudabridge torch allocator: record_stream: " + why);
}

__attribute__((visibility("default"))) void cb_torch_reset(void) {
    PyGILState_STATE st = PyGILState_Ensure();
    flush_pending();
    if (g_reset != nullptr) {
        PyObject *fn = g_reset;
        Py_INCREF(fn);
        PyObject *r = PyObject_CallNoArgs(fn);
        if (r == nullptr) PyErr_WriteUnraisable(fn);
        Py_XDECREF(r);
        Py_DECREF(fn);
    }
    PyGILState_Release(st);
}

}  // extern "C"

// The exception connect raises for a refused owner: cudabridge's InvalidArgument (already imported
// by the package that calls connect; connect is no hot call).
// The tensors outstanding that refuse a connect for owner (another owner's, while any is out), or 0.
// GIL held (g_owner); under g_pending_mu where the answer must hold until a switch (switch_to).
static long refused_for(PyObject *owner) {
    long held = g_outstanding.load(std::memory_order_relaxed);
    return g_owner != nullptr && owner != g_owner && held > 0 ? held : 0;
}

static void refuse_owner(long held) {
    PyObject *errors = PyImport_ImportModule("cudabridge.errors");
    PyObject *invalid = errors != nullptr ? PyObject_GetAttrString(errors, "InvalidArgument") : nullptr;
    Py_XDECREF(errors);
    if (invalid == nullptr) return;
    PyErr_Format(invalid,
                 "PyTorch still holds %ld tensor(s) that cudabridge's torch allocator made for another service; "
                 "their frees would reach this service's allocator: drop them (del, gc.collect()) before "
                 "attaching the torch allocator to another service",
                 held);
    Py_DECREF(invalid);
}

// Replaces the four callables and, unless keep_owner, the owner (GIL held). The frees listed and
// in flight go to the old set first; then, with the list empty and nothing in flight, the mutex and
// the GIL held (no allocation, free or hand-over can run, no Python code runs), a new owner is
// checked against the tensors outstanding and the set swapped in one step. A free listed while
// the old set took the last ones is handed over on the next turn. NULLs disconnect. Returns 0, or
// -1 with InvalidArgument set and nothing changed.
static int switch_to(PyObject *owner, bool keep_owner, PyObject *a, PyObject *f, PyObject *rs, PyObject *rt) {
    for (;;) {
        flush_pending();
        wait_handed();
        PyObject *old[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
        long refused = 0;
        bool stuck = false;
        {
            std::lock_guard<std::mutex> hold(g_pending_mu);
            if (!g_pending.empty()) continue;
            // this thread's own hand-over (a switch from inside one) goes to the old set already
            if (g_in_flight != t_in_flight) {
                if (t_in_flight == 0) continue;   // wait_handed waits for the others
                stuck = true;   // inside a hand-over this thread cannot wait for another's (wait_handed)
            }
            if (!stuck && !keep_owner) refused = refused_for(owner);
            if (!stuck && refused == 0) {   // else nothing changes
                old[0] = g_alloc;
                old[1] = g_free;
                old[2] = g_record;
                old[3] = g_reset;
                Py_XINCREF(a);
                Py_XINCREF(f);
                Py_XINCREF(rs);
                Py_XINCREF(rt);
                g_alloc = a;
                g_free = f;
                g_record = rs;
                g_reset = rt;
                if (!keep_owner) {
                    old[4] = g_owner;
                    Py_INCREF(owner);
                    g_owner = owner;
                }
            }
        }
        if (stuck) {
            PyErr_SetString(PyExc_RuntimeError, "cudabridge torch allocator: connect or disconnect from inside a "
                                                "free's hand-over while another thread hands frees over");
            return -1;
        }
        if (refused != 0) {
            refuse_owner(refused);
            return -1;
        }
        for (PyObject *o : old) Py_XDECREF(o);   // after the mutex: a destructor may run Python code
        return 0;
    }
}

// connect(owner, alloc, free, record_stream, reset): the Python side of the four functions, for
// owner (a token of one service: torch.py's). A later connect for the same owner replaces the
// callables; one for another owner only while no tensor this part allocated is outstanding (the
// invariants), else it raises cudabridge's InvalidArgument and changes nothing.
static PyObject *connect(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *owner, *a, *f, *rs, *rt;
    if (!PyArg_ParseTuple(args, "OOOOO:connect", &owner, &a, &f, &rs, &rt)) return nullptr;
    if (!PyCallable_Check(a) || !PyCallable_Check(f) || !PyCallable_Check(rs) || !PyCallable_Check(rt)) {
        PyErr_SetString(PyExc_TypeError, "connect: an owner and four callables");
        return nullptr;
    }
    if (switch_to(owner, false, a, f, rs, rt) < 0) return nullptr;
    Py_RETURN_NONE;
}

// disconnect(): allocations fail ("not connected"), frees and hooks do nothing; the owner stays
// (its tensors still count against another owner's connect).
static PyObject *disconnect(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (switch_to(nullptr, true, nullptr, nullptr, nullptr, nullptr) < 0) return nullptr;
    Py_RETURN_NONE;
}

// flush(): every free torch made before the call is with the allocator's free_pointer when it
// returns: the listed ones handed over here, those another thread is handing over waited for (the
// LibraryAllocator's pending_frees: every drain, a task's release's included, runs it first).
static PyObject *flush(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    flush_pending();
    wait_handed();
    Py_RETURN_NONE;
}

// outstanding(): the allocations returned to torch and not yet freed by it (the connect check's
// count; a free torch made of an address this part never returned would make it low).
static PyObject *outstanding(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLong(g_outstanding.load(std::memory_order_relaxed));
}

// check_owner(owner): raises what connect(owner, ...) would raise for the tensors outstanding now,
// without connecting (torch.attach asks before it makes the service's allocator).
static PyObject *check_owner(PyObject *self, PyObject *owner) {
    (void)self;
    long held = refused_for(owner);
    if (held != 0) {
        refuse_owner(held);
        return nullptr;
    }
    Py_RETURN_NONE;
}

// owner(): the last connect's owner, or None.
static PyObject *owner(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *o = g_owner != nullptr ? g_owner : Py_None;
    Py_INCREF(o);
    return o;
}

// addresses(): the four functions' addresses, for torch's set_*_fn hooks and the tests.
static PyObject *addresses(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "alloc", (Py_ssize_t)(uintptr_t)&cb_torch_alloc, "free",
                         (Py_ssize_t)(uintptr_t)&cb_torch_free, "record_stream",
                         (Py_ssize_t)(uintptr_t)&cb_torch_record_stream, "reset", (Py_ssize_t)(uintptr_t)&cb_torch_reset);
}

static PyMethodDef torch_allocator_methods[] = {
    {"connect", connect, METH_VARARGS, "connect(owner, alloc, free, record_stream, reset): the Python side"},
    {"check_owner", check_owner, METH_O, "check_owner(owner): raises as connect would for owner, connects nothing"},
    {"owner", owner, METH_NOARGS, "owner(): the last connect's owner, or None"},
    {"outstanding", outstanding, METH_NOARGS, "outstanding() -> int: tensors allocated, not yet freed by torch"},
    {"disconnect", disconnect, METH_NOARGS, "disconnect(): no Python side (allocations fail)"},
    {"flush", flush, METH_NOARGS, "flush(): the frees listed since the last hand-over, to the allocator now"},
    {"addresses", addresses, METH_NOARGS, "addresses() -> dict: the C functions' addresses"},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef torch_allocator_module = {PyModuleDef_HEAD_INIT, "_torch_allocator",
                                    "PyTorch's pluggable allocator functions over cudabridge's pools", -1, torch_allocator_methods,
                                    nullptr, nullptr, nullptr, nullptr};

PyMODINIT_FUNC PyInit__torch_allocator(void) { return PyModule_Create(&torch_allocator_module); }
