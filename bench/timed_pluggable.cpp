/*
 * timed_pluggable.cpp: PyTorch's pluggable allocator functions over cudabridge's compiled part
 * (allocators/_torch_allocator.cpp), each call forwarded to it and timed, on whichever thread
 * PyTorch calls from (autograd's device threads included): bench_allocators.py's torch child in
 * mode "timed" reads how many calls a step makes and how long they spend inside the part. Built
 * by the bench with g++; not part of the package.
 *
 *   int       timed_connect(const char *part_path)   the part's cb_torch_alloc / cb_torch_free; 0 or < 0
 *   void     *timed_alloc(size_t, int, void *)        CUDAPluggableAllocator's alloc
 *   void      timed_free(void *, size_t, int, void *) ... and free
 *   long long timed_read(int i)                       0 allocations, 1 their ns, 2 frees, 3 their ns
 *
 * An allocation the part refuses throws through, as from the part itself (not counted).
 */
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstddef>

namespace {
using alloc_fn = void *(*)(size_t, int, void *);
using free_fn = void (*)(void *, size_t, int, void *);
alloc_fn part_alloc;
free_fn part_free;
std::atomic<long long> counts[4];

long long now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
}  // namespace

extern "C" {

int timed_connect(const char *part_path) {
    void *h = dlopen(part_path, RTLD_NOW | RTLD_NOLOAD);   // Python has loaded it: the same copy
    if (h == nullptr) return -1;
    part_alloc = reinterpret_cast<alloc_fn>(dlsym(h, "cb_torch_alloc"));
    part_free = reinterpret_cast<free_fn>(dlsym(h, "cb_torch_free"));
    return part_alloc != nullptr && part_free != nullptr ? 0 : -2;
}

void *timed_alloc(size_t size, int device, void *stream) {
    long long t0 = now_ns();
    void *p = part_alloc(size, device, stream);
    counts[1] += now_ns() - t0;
    counts[0]++;
    return p;
}

void timed_free(void *ptr, size_t size, int device, void *stream) {
    long long t0 = now_ns();
    part_free(ptr, size, device, stream);
    counts[3] += now_ns() - t0;
    counts[2]++;
}

long long timed_read(int i) { return i >= 0 && i < 4 ? counts[i].load() : -1; }

}  // extern "C"
