"""Scenarios shared by the emulated tests and the GPU-marked tests: the same code runs on both."""

from __future__ import annotations

import threading

from device_kernels import fill_u32_async, spin_async

from cudabridge.device import PER_THREAD_STREAM

PATTERN_A = 0xA5A5A5A5
PATTERN_B = 0x5B5B5B5B


def seven_step(backend, pool, stream_a: int, stream_b: int, nbytes: int, delay: float) -> dict:
    """The seven-step race of a pooled allocator that ignores stream order: a block freed on
    stream A goes to stream B while A's queued work still uses it.

    1. stream A allocates; 2. a slow kernel on A writes pattern A; 3. A copies it out (after more
    slow work); 4. A frees; 5. stream B allocates (maybe the same block); 6. B writes pattern B and
    reads it back later; 7. A's work completes. With a safe pool both read what they wrote."""
    words = nbytes // 4
    a = pool.allocate(nbytes, stream_a)                               # 1
    fill_u32_async(backend, a.ptr, words, PATTERN_A, stream_a, delay)  # 2
    spin_async(backend, stream_a, delay)
    host_a = backend.alloc_pinned(nbytes)  # pinned: the copies are truly asynchronous
    host_b = backend.alloc_pinned(nbytes)
    backend.copy_from_device_async(host_a, a.ptr, stream_a)           # 3
    a_ptr = a.ptr
    pool.free(a)                                                       # 4
    b = pool.allocate(nbytes, stream_b)                               # 5
    fill_u32_async(backend, b.ptr, words, PATTERN_B, stream_b)         # 6
    spin_async(backend, stream_b, 3 * delay)
    backend.copy_from_device_async(host_b, b.ptr, stream_b)
    backend.stream_synchronize(stream_a)                               # 7
    backend.stream_synchronize(stream_b)
    result = {
        "a_intact": bytes(host_a) == PATTERN_A.to_bytes(4, "little") * words,
        "b_intact": bytes(host_b) == PATTERN_B.to_bytes(4, "little") * words,
        "same_block": b.ptr == a_ptr,
    }
    backend.free_pinned(host_a)
    backend.free_pinned(host_b)
    pool.free(b)
    return result


def seven_step_per_thread(backend, pool, nbytes: int, delay: float, device: int = 0) -> dict:
    """The same race where A and B are two threads' per-thread default streams (PTDS): the
    same handle, two different streams."""
    words = nbytes // 4
    out: dict = {}
    a_freed = threading.Event()
    errors: list[BaseException] = []

    def thread_a() -> None:
        try:
            backend.set_device(device)
            a = pool.allocate(nbytes, PER_THREAD_STREAM)
            fill_u32_async(backend, a.ptr, words, PATTERN_A, PER_THREAD_STREAM, delay)
            spin_async(backend, PER_THREAD_STREAM, delay)
            host_a = backend.alloc_pinned(nbytes)
            backend.copy_from_device_async(host_a, a.ptr, PER_THREAD_STREAM)
            out["a_ptr"] = a.ptr
            pool.free(a)
            a_freed.set()
            backend.stream_synchronize(PER_THREAD_STREAM)
            out["a_intact"] = bytes(host_a) == PATTERN_A.to_bytes(4, "little") * words
            backend.free_pinned(host_a)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            a_freed.set()

    def thread_b() -> None:
        try:
            backend.set_device(device)
            a_freed.wait()
            b = pool.allocate(nbytes, PER_THREAD_STREAM)
            fill_u32_async(backend, b.ptr, words, PATTERN_B, PER_THREAD_STREAM)
            spin_async(backend, PER_THREAD_STREAM, 3 * delay)
            host_b = backend.alloc_pinned(nbytes)
            backend.copy_from_device_async(host_b, b.ptr, PER_THREAD_STREAM)
            backend.stream_synchronize(PER_THREAD_STREAM)
            out["b_ptr"] = b.ptr
            out["b_intact"] = bytes(host_b) == PATTERN_B.to_bytes(4, "little") * words
            backend.free_pinned(host_b)
            pool.free(b)
        except BaseException as exc:
            errors.append(exc)

    ta = threading.Thread(target=thread_a)
    tb = threading.Thread(target=thread_b)
    ta.start(); tb.start(); ta.join(); tb.join()
    if errors:
        raise errors[0]
    out["same_block"] = out["a_ptr"] == out["b_ptr"]
    return out
