/*
 * pluggable_caller.cpp: calls a pluggable allocator's functions the way PyTorch's
 * CUDAPluggableAllocator does (C++, through plain function pointers, without the GIL: ctypes drops
 * it for the call), and turns a C++ exception thrown by them into an error string, as torch's
 * Python bindings turn it into RuntimeError. The tests' stand-in for PyTorch builds it with g++
 * (tests/standin_torch.py).
 */
#include <cstddef>
#include <cstdio>
#include <exception>

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

}
