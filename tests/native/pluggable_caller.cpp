/*
 * pluggable_caller.cpp: calls a pluggable allocator's functions the way PyTorch's
 * CUDAPluggableAllocator does (C++, through plain function pointers, without the GIL: ctypes drops
 * it for the call), and turns a C++ exception thrown by them into an error string, as torch's
 * Python bindings turn it into RuntimeError. The tests' stand-in for PyTorch builds it with g++
 * (tests/standin_torch.py).
 */
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <exception>
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

// `pairs` allocations of `size` bytes, each freed at once, on a new native thread (no Python
// thread state of its own: as autograd's device threads call torch's allocator), the thread
// joined before it returns. Returns the nanoseconds the pairs took, or -1 with the first
// allocation's error in `err`.
long long caller_pairs_on_new_thread(void *alloc, void *free, size_t size, int device, void *stream, int pairs,
                                     char *err, size_t errlen) {
    long long took = -1;
    err[0] = '\0';
    std::thread t([&] {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < pairs; i++) {
            void *p = caller_alloc(alloc, size, device, stream, err, errlen);
            if (err[0] != '\0') return;
            caller_free(free, p, size, device, stream);
        }
        took = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    });
    t.join();
    return took;
}

}
