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
 * Kept frees: a free of a tensor this part made since the last drain (below), on a stream that is
 * one stream on every thread, with no stream recorded on it, is kept here (its allocation stays
 * live in the pool) instead of listed; an allocation of the same size on the same device and
 * stream for the same owner takes the newest such back with no call into the allocator: torch's
 * own caching, ordered as the pool's own bin for that stream would order it (work queued on the
 * stream from now on runs after the block's last use there). Why: each call into the allocator
 * runs some ten thousand instructions over Python objects (its C twin, the pool's fast path),
 * which inside a real torch step, whose working set evicts them from the caches, cost several
 * times what they cost hot (bench/RESULTS.md); a kept free is taken back with the GIL, one
 * owner_for call and a scan of at most g_keep_limit entries. The owner is what the allocator said it made the tensor for (a task's
 * id, or the executor's), and owner_for says whose an allocation here would be now (and that its
 * task's lease is open), so a task never gets another's memory. Every drain (flush(): a task's
 * release before its memory is reclaimed, statistics, empty_cache, a connect, the pool's
 * out-of-memory give-back) hands every kept free over and counts one more drain: a tensor made before
 * it is never kept (its task may have been released and its memory reclaimed since), and nothing
 * kept outlives the release of the task it was made for.
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
 *    (GIL held: the call may let the GIL go, and a connect meanwhile must see it), or from a kept
 *    free's taking back, to the moment its free is kept, listed or counted in flight (under
 *    g_pending_mu, in the same step); a connect decides and swaps holding the GIL and the mutex,
 *    with nothing kept or listed and nothing in flight, so every tensor is then either counted or
 *    already with the old owner's allocator;
 *  - the callables are read and replaced only with the GIL held (connect, disconnect), so a call
 *    sees one complete set; a call with no set connected fails (alloc) or does nothing (the rest);
 *  - a kept free's allocation is live in the pool and owned as it was made; it is handed back to
 *    torch only with the GIL held, only to an owner_for answer equal to its owner, and only while
 *    no drain came since it was made (g_drains: so no release of its task either);
 *    g_live, g_kept and g_drains are guarded by g_pending_mu; g_kept holds at most g_keep_limit
 *    (the oldest are listed; more only where listing them ran out of memory).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>

static PyObject *g_alloc, *g_free, *g_record, *g_reset, *g_owner_for;   // strong references, set by connect(); GIL
static PyObject *g_owner;   // the last connect's owner (strong; kept across disconnect); GIL
static std::atomic<long> g_outstanding;   // allocations returned to torch, not yet freed by it
// The frees listed, not yet handed to g_free (oldest first), and how many are being handed over
// now (taken from the list, the call to g_free not returned): both guarded by g_pending_mu, which
// is never held while waiting for the GIL or calling Python. Never destroyed: a thread may free a
// tensor while the process exits, after static destructors ran.
static std::mutex &g_pending_mu = *new std::mutex;
static std::condition_variable &g_handed = *new std::condition_variable;   // a hand-over ended
static std::deque<void *> &g_pending = *new std::deque<void *>;
static long g_in_flight;
static thread_local long t_in_flight;   // this thread's part of g_in_flight
// The hand-overs in flight, oldest first, and the tickets given so far: a drain waits only for
// those begun before it (wait_handed), so hand-overs that keep overlapping on other threads never
// hold it up. Nodes are on the heap, never freed (an ended one is kept for the next): a thread
// can end inside its hand-over (CPython ends one that wants the GIL back while the interpreter
// finalizes) and its node then stays linked, valid memory, as it stays in flight. Where no node
// can be had (out of memory) the hand-over is counted in g_untracked, which a drain waits to see
// at 0 when it was not. Guarded by g_pending_mu.
struct HandOver {
    unsigned long long ticket;
    pthread_t thread;   // the handing thread (a fork's child keeps only its own: at_fork_child)
    HandOver *prev, *next;
};
static HandOver *g_oldest, *g_newest, *g_spare;   // g_spare: ended nodes, linked by next
static unsigned long long g_tickets;
static long g_untracked;

// Owners as the part keeps them: a task's id (>= 0), the executor's, or one never kept.
constexpr long long EXECUTOR = -1, NOT_KEPT = -2;
static size_t g_keep_limit = 128;   // kept frees at most (the oldest is listed; 0: none kept); a scan's length;
                                    // set by keep_at_most (torchKeptFrees), under g_pending_mu
constexpr uintptr_t PER_THREAD_STREAM = 2;   // CU_STREAM_PER_THREAD: another stream on each thread

// What the part made a live tensor for (g_live) and what it keeps of a free (g_kept). Guarded by
// g_pending_mu, as is the count of drains.
struct Made {
    size_t size;
    int device;
    void *stream;
    long long owner;
    unsigned long long drains;   // g_drains when it was made
    bool recorded;   // a stream was named through record_stream: its free waits for that stream too
};
struct Kept {
    void *ptr;
    Made made;
};
static std::unordered_map<void *, Made> &g_live = *new std::unordered_map<void *, Made>;
static std::deque<Kept> &g_kept = *new std::deque<Kept>;   // oldest first
static unsigned long long g_drains;   // flush() calls so far
static std::atomic<long> g_reuses, g_reuses_outside;   // allocations served from kept frees while g_owner was
                                                       // connected; of those, the executor's
// The counts of the owners connected before, each owner a strong reference (kept: an owner is a
// service's small token). Guarded by g_pending_mu, and changed with the owner in one step, so
// that no reader sees an owner's count gone or its earlier one (a C++ map: no Python code runs).
struct Reuses {
    long all, outside;
};
static std::unordered_map<PyObject *, Reuses> &g_reuses_before = *new std::unordered_map<PyObject *, Reuses>;

namespace {

// A C size or pointer as a Python int (new reference, or NULL with an error). GIL held.
PyObject *as_int(uintptr_t v) { return PyLong_FromSize_t((size_t)v); }

// An owner as the allocator names it (None: the executor's; a task's id) as the part keeps it; any
// other value (owner_for's -1: an allocation now would not be served) is never kept. GIL held.
long long owner_key(PyObject *owner) {
    if (owner == Py_None) return EXECUTOR;
    if (!PyLong_CheckExact(owner)) return NOT_KEPT;
    long long v = PyLong_AsLongLong(owner);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return NOT_KEPT;
    }
    return v >= 0 ? v : NOT_KEPT;
}

// Whether a free of what `m` describes may be kept. Under g_pending_mu.
bool keepable(const Made &m) {
    return g_keep_limit > 0 && !m.recorded && m.owner != NOT_KEPT && m.drains == g_drains &&
           (uintptr_t)m.stream != PER_THREAD_STREAM;
}

// Whether what `m` describes was made for an allocation of `size` bytes on `device` and `stream`.
bool made_for(const Made &m, size_t size, int device, void *stream) {
    return m.size == size && m.device == device && m.stream == stream;
}

// Lists the oldest kept frees over g_keep_limit. Under g_pending_mu; may throw std::bad_alloc
// (then those not listed yet stay kept, over the limit, until the next free or drain).
void list_over_limit() {
    while (g_kept.size() > g_keep_limit) {
        g_pending.push_back(g_kept.front().ptr);
        g_kept.pop_front();
    }
}

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

// A hand-over begins (g_pending_mu held): counted in flight, linked newest with the next ticket
// (or, with no node to be had, untracked); its node, for hand_over to end it.
HandOver *begin_hand_over() {
    HandOver *h = g_spare;
    if (h != nullptr) g_spare = h->next;
    else h = new (std::nothrow) HandOver;
    if (h != nullptr) {
        h->ticket = g_tickets++;
        h->thread = pthread_self();
        h->prev = g_newest;
        h->next = nullptr;
        (g_newest != nullptr ? g_newest->next : g_oldest) = h;
        g_newest = h;
    } else {
        g_untracked++;
    }
    g_in_flight++;
    t_in_flight++;
    return h;
}

// A node's hand-over ended (g_pending_mu held): unlinked, kept for the next. In-flight counts are
// the caller's.
void unlink_hand_over(HandOver *h) {
    (h->prev != nullptr ? h->prev->next : g_oldest) = h->next;
    (h->next != nullptr ? h->next->prev : g_newest) = h->prev;
    h->next = g_spare;
    g_spare = h;
}

// One free, begun by the caller (begin_hand_over), to g_free (GIL held), then counted out.
void hand_over(void *ptr, HandOver *h) {
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
    if (h != nullptr) unlink_hand_over(h);
    else g_untracked--;
    t_in_flight--;
    g_in_flight--;
    g_handed.notify_all();   // every end: a waiter may wait for its own part, not for none
}

// Hands the listed frees to g_free (free_pointer: each queued in Python), oldest first, one at a
// time, GIL held: a free is taken from the list and counted in flight in one step under the mutex,
// so another thread's flush (a release's drain, through flush()) sees every free either still
// listed or in flight, and waits for those in flight (wait_handed). A failure is written as
// unraisable and the memory stays with the pool; with nothing connected the frees are dropped.
void flush_pending() {
    for (;;) {
        void *ptr;
        HandOver *h;
        {
            std::lock_guard<std::mutex> hold(g_pending_mu);
            if (g_pending.empty()) return;
            ptr = g_pending.front();
            g_pending.pop_front();
            h = begin_hand_over();
        }
        hand_over(ptr, h);
    }
}

// Counts a drain and hands every free kept before it over (GIL held): a drain's first step.
// One at a time, each counted in flight as it leaves g_kept (one step under the mutex), as
// flush_pending does, so a concurrent flush sees it kept or waits for it. Frees of tensors made
// after the count (kept after the older ones: g_kept is in time order) stay.
void flush_kept() {
    unsigned long long ended;
    {
        std::lock_guard<std::mutex> hold(g_pending_mu);
        ended = g_drains++;
    }
    for (;;) {
        void *ptr;
        HandOver *h;
        {
            std::lock_guard<std::mutex> hold(g_pending_mu);
            if (g_kept.empty() || g_kept.front().made.drains > ended) return;
            ptr = g_kept.front().ptr;
            g_kept.pop_front();
            h = begin_hand_over();
        }
        hand_over(ptr, h);
    }
}

// A kept free for an allocation of `size` bytes on `device` and `stream` by the calling thread, taken
// back (the tensor live again), or nullptr. GIL held. owner_for is asked only where a kept free of
// that size and stream exists; an error from it is cleared (the allocator's own call follows, and
// says what is wrong).
void *take_kept(size_t size, int device, void *stream) {
    {
        std::lock_guard<std::mutex> hold(g_pending_mu);
        bool any = false;
        for (const Kept &k : g_kept)
            if ((any = made_for(k.made, size, device, stream))) break;
        if (!any) return nullptr;
    }
    PyObject *fn = g_owner_for;
    if (fn == nullptr) return nullptr;
    Py_INCREF(fn);
    PyObject *args[2] = {PyLong_FromLong(device), as_int((uintptr_t)stream)};
    PyObject *r = args[0] && args[1] ? PyObject_Vectorcall(fn, args, 2, nullptr) : nullptr;
    for (PyObject *a : args) Py_XDECREF(a);
    Py_DECREF(fn);
    if (r == nullptr) {
        PyErr_Clear();
        return nullptr;
    }
    long long owner = owner_key(r);
    Py_DECREF(r);
    if (owner == NOT_KEPT) return nullptr;
    std::lock_guard<std::mutex> hold(g_pending_mu);
    for (auto it = g_kept.end(); it != g_kept.begin();) {   // newest first: the block last used there
        --it;
        const Made &m = it->made;
        if (!made_for(m, size, device, stream) || m.owner != owner || m.drains != g_drains) continue;
        void *ptr = it->ptr;
        try {
            g_live[ptr] = m;
        } catch (const std::bad_alloc &) {
            return nullptr;   // stays kept; the allocator serves this one
        }
        g_kept.erase(it);
        g_outstanding.fetch_add(1, std::memory_order_relaxed);
        g_reuses.fetch_add(1, std::memory_order_relaxed);
        if (owner == EXECUTOR) g_reuses_outside.fetch_add(1, std::memory_order_relaxed);
        return ptr;
    }
    return nullptr;
}

// Waits, the GIL given back, until every hand-over other threads had begun when it was called has
// ended; not for those begun since (other threads' hand-overs may overlap one another without
// end). Not from inside a hand-over of this thread's own (a finalizer or an error report that
// drains): two such threads would wait for each other; that drain sees the frees handed over so
// far. The mutex is let go before the GIL is taken again: a GIL holder may be waiting for it.
void wait_handed() {
    if (t_in_flight != 0) return;
    unsigned long long begun;
    bool untracked;
    {
        std::lock_guard<std::mutex> hold(g_pending_mu);
        if (g_oldest == nullptr && g_untracked == 0) return;
        begun = g_tickets;
        untracked = g_untracked != 0;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        std::unique_lock<std::mutex> hold(g_pending_mu);
        g_handed.wait(hold, [begun, untracked] {
            return (g_oldest == nullptr || g_oldest->ticket >= begun) && (!untracked || g_untracked == 0);
        });
    }
    Py_END_ALLOW_THREADS
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void *cb_torch_alloc(size_t size, int device, void *stream) {
    if (size == 0) return nullptr;   // as torch's own allocator: no memory, no call
    PyGILState_STATE st = PyGILState_Ensure();
    void *kept = g_alloc != nullptr ? take_kept(size, device, stream) : nullptr;
    flush_pending();   // the frees listed since: queued before this allocation drains the queue
    if (kept != nullptr) {
        PyGILState_Release(st);
        return kept;
    }
    if (g_alloc == nullptr) {   // checked after the hand-over, whose Python code may disconnect
        PyGILState_Release(st);
        throw std::runtime_error("cudabridge torch allocator: not connected to a service (cudabridge.allocators.torch.install)");
    }
    PyObject *fn = g_alloc;
    Py_INCREF(fn);
    g_outstanding.fetch_add(1, std::memory_order_relaxed);   // from before the call: the invariants
    unsigned long long drains;
    {
        std::lock_guard<std::mutex> hold(g_pending_mu);
        drains = g_drains;   // before the call: a drain during it makes the tensor one never kept
    }
    PyObject *args[3] = {as_int(size), PyLong_FromLong(device), as_int((uintptr_t)stream)};
    PyObject *r = args[0] && args[1] && args[2] ? PyObject_Vectorcall(fn, args, 3, nullptr) : nullptr;
    for (PyObject *a : args) Py_XDECREF(a);
    Py_DECREF(fn);
    void *ptr = nullptr;
    long long owner = NOT_KEPT;
    std::string why;
    if (r != nullptr) {   // (address, owner)
        if (PyTuple_CheckExact(r) && PyTuple_GET_SIZE(r) == 2) {
            ptr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(r, 0));
            if (!PyErr_Occurred()) owner = owner_key(PyTuple_GET_ITEM(r, 1));
        } else {
            PyErr_SetString(PyExc_TypeError, "the allocator returned no (address, owner) pair");
        }
        Py_DECREF(r);
        if (PyErr_Occurred()) why = take_error();
        else if (ptr == nullptr) why = "the allocator returned address 0";
    } else {
        why = take_error();
    }
    if (!why.empty()) {
        g_outstanding.fetch_sub(1, std::memory_order_relaxed);   // no tensor after all
    } else {
        std::lock_guard<std::mutex> hold(g_pending_mu);
        try {
            g_live[ptr] = Made{size, device, stream, owner, drains, false};
        } catch (const std::bad_alloc &) {
            g_live.erase(ptr);   // not known here: its free is listed, never kept
        }
    }
    PyGILState_Release(st);
    if (!why.empty()) throw std::runtime_error("cudabridge torch allocator: " + why);
    return ptr;
}

__attribute__((visibility("default"))) void cb_torch_free(void *ptr, size_t size, int device, void *stream) {
    (void)size;
    (void)device;
    (void)stream;   // the allocation knows its stream, and any recorded since
    if (ptr == nullptr) return;
    HandOver *h = nullptr;   // used only where the address cannot be listed
    {
        std::lock_guard<std::mutex> hold(g_pending_mu);
        try {
            auto it = g_live.find(ptr);
            if (it != g_live.end()) {
                Made made = it->second;
                if (keepable(made)) {
                    g_kept.push_back(Kept{ptr, made});   // may throw: then listed below, as any other
                    g_live.erase(it);
                    list_over_limit();   // one over (more after keep_at_most lowered it); may throw
                    g_outstanding.fetch_sub(1, std::memory_order_relaxed);   // kept: no longer outstanding
                    return;
                }
                g_live.erase(it);
            }
        } catch (const std::bad_alloc &) {
            if (!g_kept.empty() && g_kept.back().ptr == ptr) {   // kept after all (only the list was full)
                g_outstanding.fetch_sub(1, std::memory_order_relaxed);
                return;
            }
            g_live.erase(ptr);
        }
        try {
            g_pending.push_back(ptr);
            g_outstanding.fetch_sub(1, std::memory_order_relaxed);   // listed: no longer outstanding
            return;
        } catch (const std::bad_alloc &) {   // no room to list it: in flight now, handed over under the GIL
            h = begin_hand_over();   // before the GIL, so no flush meanwhile misses it (a free that
                                     // cannot list its address while Python finalizes would keep a
                                     // later flush waiting)
            g_outstanding.fetch_sub(1, std::memory_order_relaxed);
        }
    }
    PyGILState_STATE st = PyGILState_Ensure();
    flush_pending();
    hand_over(ptr, h);
    PyGILState_Release(st);
}

__attribute__((visibility("default"))) void cb_torch_record_stream(void *ptr, void *stream) {
    if (ptr == nullptr) return;
    {
        std::lock_guard<std::mutex> hold(g_pending_mu);
        auto it = g_live.find(ptr);
        if (it != g_live.end()) it->second.recorded = true;   // its free waits for that stream: never kept
    }
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

// The reuse counts follow a switch of g_owner to `owner` (g_pending_mu and the GIL held, before
// the switch): the old owner's are kept under it (the map takes g_owner's reference, or drops it
// where it holds one already), the new owner's resume where it was connected before. False where
// the old owner's could not be kept (no memory): they are dropped, the switch goes on, and *drop
// is the old owner's reference, for the caller to let go after the mutex.
static bool switch_reuses(PyObject *owner, PyObject **drop) {
    Reuses ended{g_reuses.load(std::memory_order_relaxed), g_reuses_outside.load(std::memory_order_relaxed)};
    Reuses resume{0, 0};
    auto was = g_reuses_before.find(owner);
    if (was != g_reuses_before.end()) resume = was->second;
    bool kept = true;
    if (g_owner != nullptr) {
        try {
            auto [at, added] = g_reuses_before.try_emplace(g_owner, ended);
            if (!added) {
                at->second = ended;
                Py_DECREF(g_owner);   // the map's own reference stays (no Python code: another holds one)
            }
        } catch (const std::bad_alloc &) {
            kept = false;
            *drop = g_owner;
        }
    }
    g_reuses.store(resume.all, std::memory_order_relaxed);
    g_reuses_outside.store(resume.outside, std::memory_order_relaxed);
    return kept;
}

// Replaces the four callables and, unless keep_owner, the owner (GIL held). The frees listed and
// in flight go to the old set first; then, with the list empty and nothing in flight, the mutex and
// the GIL held (no allocation, free or hand-over can run, no Python code runs), a new owner is
// checked against the tensors outstanding and the set swapped in one step. A free listed while
// the old set took the last ones is handed over on the next turn. NULLs disconnect. Returns 0, or
// -1 with InvalidArgument set and nothing changed.
static int switch_to(PyObject *owner, bool keep_owner, PyObject *a, PyObject *f, PyObject *rs, PyObject *rt,
                     PyObject *of) {
    for (;;) {
        flush_kept();
        flush_pending();
        wait_handed();
        PyObject *old[6] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
        long refused = 0;
        bool stuck = false, counts_lost = false;
        {
            std::lock_guard<std::mutex> hold(g_pending_mu);
            if (!g_pending.empty() || !g_kept.empty()) continue;
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
                old[4] = g_owner_for;
                Py_XINCREF(a);
                Py_XINCREF(f);
                Py_XINCREF(rs);
                Py_XINCREF(rt);
                Py_XINCREF(of);
                g_alloc = a;
                g_free = f;
                g_record = rs;
                g_reset = rt;
                g_owner_for = of;
                if (!keep_owner && owner != g_owner) {   // the reuses counted so far were the old owner's
                    counts_lost = !switch_reuses(owner, &old[5]);
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
        if (counts_lost) {   // the switch stands; only the old owner's count is lost
            PyErr_NoMemory();
            PyErr_WriteUnraisable(owner);
        }
        for (PyObject *o : old) Py_XDECREF(o);   // after the mutex: a destructor may run Python code
        return 0;
    }
}

// connect(owner, alloc, free, record_stream, reset, owner_for): the Python side of the four
// functions, for owner (a token of one service: torch.py's): alloc(size, device, stream) ->
// (address, the owner it was made for), free(address), record_stream(address, stream), reset(),
// owner_for(device, stream) -> whose an allocation there would be now (LibraryAllocator's
// allocate_pointer_owned, free_pointer, record_stream_pointer, drain, owner_for). A later connect
// for the same owner replaces the callables; one for another owner only while no tensor this part
// allocated is outstanding (the invariants), else it raises cudabridge's InvalidArgument and
// changes nothing.
static PyObject *connect(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *owner, *a, *f, *rs, *rt, *of;
    if (!PyArg_ParseTuple(args, "OOOOOO:connect", &owner, &a, &f, &rs, &rt, &of)) return nullptr;
    if (!PyCallable_Check(a) || !PyCallable_Check(f) || !PyCallable_Check(rs) || !PyCallable_Check(rt) ||
        !PyCallable_Check(of)) {
        PyErr_SetString(PyExc_TypeError, "connect: an owner and five callables");
        return nullptr;
    }
    if (switch_to(owner, false, a, f, rs, rt, of) < 0) return nullptr;
    Py_RETURN_NONE;
}

// disconnect(): allocations fail ("not connected"), frees and hooks do nothing; the owner stays
// (its tensors still count against another owner's connect).
static PyObject *disconnect(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (switch_to(nullptr, true, nullptr, nullptr, nullptr, nullptr, nullptr) < 0) return nullptr;
    Py_RETURN_NONE;
}

// flush(): every free torch made before the call is with the allocator's free_pointer when it
// returns: the kept and the listed ones handed over here (a drain counted), those another
// thread is handing over waited for (the LibraryAllocator's pending_frees: every drain, a task's
// release's included, runs it first).
static PyObject *flush(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    flush_kept();
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

// reuses(owner) -> (all, outside tasks): the allocations served from kept frees while owner was
// connected, and those of them the executor's (its allocator counts each as an allocation and a
// free made: LibraryAllocator.reused_frees). Never reset: a reconnect of the same owner goes on
// counting, and an owner connected again resumes its count.
static PyObject *reuses(PyObject *self, PyObject *owner) {
    (void)self;
    Reuses counts{0, 0};
    {
        std::lock_guard<std::mutex> hold(g_pending_mu);
        if (owner == g_owner) {
            counts = {g_reuses.load(std::memory_order_relaxed), g_reuses_outside.load(std::memory_order_relaxed)};
        } else {
            auto was = g_reuses_before.find(owner);
            if (was != g_reuses_before.end()) counts = was->second;
        }
    }
    return Py_BuildValue("(ll)", counts.all, counts.outside);
}

// keep_at_most(n): keep at most n frees from now on (0: none); the oldest kept over it are listed
// now (where listing one runs out of memory, the rest at the next free or drain).
static PyObject *keep_at_most(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred()) return nullptr;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "keep_at_most: a count >= 0");
        return nullptr;
    }
    std::lock_guard<std::mutex> hold(g_pending_mu);
    g_keep_limit = (size_t)n;
    try {
        list_over_limit();
    } catch (const std::bad_alloc &) {   // the rest at the next free or drain
    }
    Py_RETURN_NONE;
}

// kept(): how many frees are kept now.
static PyObject *kept(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    std::lock_guard<std::mutex> hold(g_pending_mu);
    return PyLong_FromSize_t(g_kept.size());
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
    {"connect", connect, METH_VARARGS, "connect(owner, alloc, free, record_stream, reset, owner_for): the Python side"},
    {"reuses", reuses, METH_O, "reuses(owner) -> (all, outside tasks): allocations served from owner's kept frees"},
    {"kept", kept, METH_NOARGS, "kept() -> int: frees kept for reuse now"},
    {"keep_at_most", keep_at_most, METH_O, "keep_at_most(n): keep at most n frees for reuse (0: none)"},
    {"check_owner", check_owner, METH_O, "check_owner(owner): raises as connect would for owner, connects nothing"},
    {"owner", owner, METH_NOARGS, "owner(): the last connect's owner, or None"},
    {"outstanding", outstanding, METH_NOARGS, "outstanding() -> int: tensors allocated, not yet freed by torch"},
    {"disconnect", disconnect, METH_NOARGS, "disconnect(): no Python side (allocations fail)"},
    {"flush", flush, METH_NOARGS, "flush(): the frees kept and listed, to the allocator now (a drain)"},
    {"addresses", addresses, METH_NOARGS, "addresses() -> dict: the C functions' addresses"},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef torch_allocator_module = {PyModuleDef_HEAD_INIT, "_torch_allocator",
                                    "PyTorch's pluggable allocator functions over cudabridge's pools", -1, torch_allocator_methods,
                                    nullptr, nullptr, nullptr, nullptr};

// fork(): the mutex is held across it (no thread holds it while it waits for anything, so taking
// it cannot deadlock), so the child's copy is consistent and free; the child has only the forking
// thread, so the other threads' hand-overs, which would never end there, are dropped from the
// in-flight list and counts (a drain in the child would otherwise wait for them for ever).
static void at_fork_prepare() { g_pending_mu.lock(); }
static void at_fork_parent() { g_pending_mu.unlock(); }
static void at_fork_child() {
    pthread_t me = pthread_self();
    long mine = 0;
    for (HandOver *h = g_oldest, *next; h != nullptr; h = next) {
        next = h->next;
        if (pthread_equal(h->thread, me)) mine++;
        else unlink_hand_over(h);
    }
    g_in_flight = t_in_flight;
    g_untracked = t_in_flight - mine;   // this thread's own, begun without a node
    g_pending_mu.unlock();
}

PyMODINIT_FUNC PyInit__torch_allocator(void) {
    static bool registered = false;   // once per process (the module may be initialized again)
    if (!registered) {
        if (pthread_atfork(at_fork_prepare, at_fork_parent, at_fork_child) != 0) {
            PyErr_SetString(PyExc_OSError, "cudabridge torch allocator: pthread_atfork failed");
            return nullptr;
        }
        registered = true;
    }
    return PyModule_Create(&torch_allocator_module);
}
