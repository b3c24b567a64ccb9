/*
 * pluggable_caller.cpp: calls a pluggable allocator's functions the way PyTorch's
 * CUDAPluggableAllocator does (C++, through plain function pointers, without the GIL: ctypes drops
 * it for the call), and turns a C++ exception thrown by them into an error string, as torch's
 * Python bindings turn it into RuntimeError. The tests' stand-in for PyTorch builds it with g++
 * (tests/standin_torch.py).
 */
#include <dlfcn.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <future>
#include <memory>
#include <thread>

typedef void *(*alloc_fn)(size_t, int, void *);
typedef void (*free_fn)(void *, size_t, int, void *);
typedef void (*record_fn)(void *, void *);
typedef void (*reset_fn)(void);

extern "C" {

void *caller_alloc(void *fn, size_t size, int device, void *stream, char *err, size_t errlen) {
    err[0] = '\0';
    try {
        return reinterpret_cast<alloc_fn>(fn)(size, device, stream);
    } catch (const std::exception &e) {
        snprintf(err, errlen, "%s", e.what());
        return nullptr;
    }
}

void caller_free(void *fn, void *ptr, size_t size, int device, void *stream) {
    reinterpret_cast<free_fn>(fn)(ptr, size, device, stream);   // torch: from a destructor, noexcept
}

int caller_record_stream(void *fn, void *ptr, void *stream, char *err, size_t errlen) {
    err[0] = '\0';
    try {
        reinterpret_cast<record_fn>(fn)(ptr, stream);
        return 0;
    } catch (const std::exception &e) {
        snprintf(err, errlen, "%s", e.what());
        return -1;
    }
}

void caller_reset(void *fn) { reinterpret_cast<reset_fn>(fn)(); }

// `pairs` allocations of `size` bytes, each freed at once, on a new native thread, joined before
// it returns. `python_state` 0: the thread has no Python thread state (a user's C++ thread: each
// call of the part makes and drops one); 1: it makes one at its start and keeps it, the GIL given
// back, until it ends, as PyTorch's autograd device threads do (PythonEngine::thread_init's
// gil_scoped_acquire, then gil_scoped_release); the Python C API is found in the process, which
// loaded libpython. Returns the nanoseconds the pairs took, or -1 with the first allocation's
// error in `err`.
long long caller_pairs_on_new_thread(void *alloc, void *free, size_t size, int device, void *stream, int pairs,
                                     int python_state, char *err, size_t errlen) {
    typedef int (*ensure_fn)(void);
    typedef void (*release_fn)(int);
    typedef void *(*save_fn)(void);
    typedef void (*restore_fn)(void *);
    auto ensure = reinterpret_cast<ensure_fn>(dlsym(RTLD_DEFAULT, "PyGILState_Ensure"));
    auto release = reinterpret_cast<release_fn>(dlsym(RTLD_DEFAULT, "PyGILState_Release"));
    auto save = reinterpret_cast<save_fn>(dlsym(RTLD_DEFAULT, "PyEval_SaveThread"));
    auto restore = reinterpret_cast<restore_fn>(dlsym(RTLD_DEFAULT, "PyEval_RestoreThread"));
    long long took = -1;
    err[0] = '\0';
    if (python_state && !(ensure && release && save && restore)) {
        snprintf(err, errlen, "the Python C API is not in this process");
        return -1;
    }
    std::thread t([&] {
        int gil = 0;
        void *saved = nullptr;
        if (python_state) {
            gil = ensure();
            saved = save();
        }
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < pairs; i++) {
            void *p = caller_alloc(alloc, size, device, stream, err, errlen);
            if (err[0] != '\0') break;
            caller_free(free, p, size, device, stream);
        }
        if (err[0] == '\0')
            took = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
        if (python_state) {
            restore(saved);
            release(gil);
        }
    });
    t.join();
    return took;
}

// Frees `ptr` on a new native thread with no Python thread state (as a tensor dropped on
// autograd's device thread) and waits up to `timeout_ms` for the free to return: 1 it did, 0 it
// did not (the thread is left to finish). Called through ctypes.PyDLL, the caller keeps the GIL
// throughout: a free that waits for the GIL does not return in time.
int caller_free_on_new_thread_within(void *free, void *ptr, size_t size, int device, void *stream, int timeout_ms) {
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> returned = done->get_future();
    std::thread t([=] {
        caller_free(free, ptr, size, device, stream);
        done->set_value();
    });
    bool in_time = returned.wait_for(std::chrono::milliseconds(timeout_ms)) == std::future_status::ready;
    if (in_time)
        t.join();
    else
        t.detach();
    return in_time ? 1 : 0;
}

}
