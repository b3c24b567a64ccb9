/*
 * timed_pluggable.cpp: PyTorch's pluggable allocator functions over cudabridge's compiled part
 * (allocators/_torch_allocator.cpp), each call forwarded to it and timed, on whichever thread
 * PyTorch calls from (autograd's device threads included): bench_allocators.py's torch child in
 * mode "timed" reads how many calls a step makes and how long they spend inside the part, split by
 * thread (the one that connected, where the step's Python runs, and every other: autograd's) and,
 * for allocations, how much of it is taking and giving back the GIL: the shim takes it
 * (PyGILState_Ensure, found in the process) around the part's call, whose own Ensure then finds it
 * held. Built by the bench with g++; not part of the package.
 *
 *   int       timed_connect(const char *part_path)   the part's cb_torch_alloc / cb_torch_free; 0 or < 0
 *   void     *timed_alloc(size_t, int, void *)        CUDAPluggableAllocator's alloc
 *   void      timed_free(void *, size_t, int, void *) ... and free
 *   long long timed_read(int i)                       thread t (0 the connecting one, 1 others) at 6 t + k:
 *             k = 0 allocations, 1 their ns, 2 of which taking the GIL, 3 giving it back, 4 frees, 5 their ns
 *
 * An allocation the part refuses throws through, as from the part itself (not counted).
 */
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstddef>

namespace {
using alloc_fn = void *(*)(size_t, int, void *);
using free_fn = void (*)(void *, size_t, int, void *);
using ensure_fn = int (*)();
using release_fn = void (*)(int);
alloc_fn part_alloc;
free_fn part_free;
ensure_fn gil_ensure;
release_fn gil_release;
pthread_t connecting;
std::atomic<long long> counts[12];

long long now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int which() { return pthread_equal(pthread_self(), connecting) ? 0 : 6; }

// Adds the time since t0 to counts[i] and returns now.
long long lap(int i, long long t0) {
    long long t = now_ns();
    counts[i] += t - t0;
    return t;
}
}  // namespace

extern "C" {

int timed_connect(const char *part_path) {
    void *h = dlopen(part_path, RTLD_NOW | RTLD_NOLOAD);   // Python has loaded it: the same copy
    if (h == nullptr) return -1;
    part_alloc = reinterpret_cast<alloc_fn>(dlsym(h, "cb_torch_alloc"));
    part_free = reinterpret_cast<free_fn>(dlsym(h, "cb_torch_free"));
    gil_ensure = reinterpret_cast<ensure_fn>(dlsym(RTLD_DEFAULT, "PyGILState_Ensure"));
    gil_release = reinterpret_cast<release_fn>(dlsym(RTLD_DEFAULT, "PyGILState_Release"));
    connecting = pthread_self();
    return part_alloc != nullptr && part_free != nullptr && gil_ensure != nullptr && gil_release != nullptr ? 0 : -2;
}

void *timed_alloc(size_t size, int device, void *stream) {
    int w = which();
    long long t0 = now_ns();
    int st = gil_ensure();
    long long t1 = lap(w + 2, t0);
    void *p;
    try {
        p = part_alloc(size, device, stream);
    } catch (...) {
        gil_release(st);
        throw;
    }
    long long t2 = now_ns();
    gil_release(st);
    long long t3 = lap(w + 3, t2);
    counts[w + 1] += t3 - t0;
    counts[w]++;
    (void)t1;
    return p;
}

void timed_free(void *ptr, size_t size, int device, void *stream) {
    int w = which();
    long long t0 = now_ns();
    part_free(ptr, size, device, stream);
    lap(w + 5, t0);
    counts[w + 4]++;
}

long long timed_read(int i) { return i >= 0 && i < 12 ? counts[i].load() : -1; }

}  // extern "C"
