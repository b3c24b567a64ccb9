"""Functions Java reaches through ``CudaBridge.callTool(name, json)``: two kernels for the tests (a
slow writer and a spinner, to drive the seven-step race from Java threads and to keep a stream
busy), pool and interpreter introspection for the tests, and in-process Python timings for the
benchmark (so that Java and Python numbers come from the same process in the same run). Each
takes the :class:`BridgeControl` first and keyword arguments decoded from JSON, and returns
something JSON can carry.

The two kernels are no part of the device backend: they are a user module's, as task code would
write them, CUDA source loaded through the service's module cache on a GPU (``load_module``) and
their host kernels on the emulated device, where the race detector counts the fill's words as
read and written, as it does for any host kernel's buffer."""

from __future__ import annotations

import gc
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..device.launch_config import LaunchConfig
from ..device.params import DevicePointer
from ..errors import InvalidArgument
from ..kernels.host_kernels import HostKernel
from ..kernels.modules import ModuleSource

if TYPE_CHECKING:
    from ..service import CudaBridgeService
    from .hot_path import JavaHotPath


class Control(Protocol):
    """What a tool is handed first (``BridgeControl`` is one; control.py imports this module, not
    the other way round): the service and the Java hot path."""

    service: "CudaBridgeService"
    hot: "JavaHotPath"


# the tools' kernels ------------------------------------------------------------------------------
TOOL_KERNELS = ModuleSource.of(r"""
__device__ __forceinline__ unsigned long long cb_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" __global__ void cb_fill_u32(unsigned int* p, unsigned long long n, unsigned int v,
                                       unsigned long long delay_ns) {
    if (delay_ns) {
        unsigned long long t0 = cb_now();
        while (cb_now() - t0 < delay_ns) { }
    }
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = v;
}
extern "C" __global__ void cb_spin(unsigned long long ns) {
    unsigned long long t0 = cb_now();
    while (cb_now() - t0 < ns) { }
}
""", signatures={"cb_fill_u32": "ptr, i64, i32, i64", "cb_spin": "i64"})   # declared: PTX's .u64 reads as a pointer


def _fill_host(grid: Any, block: Any, p: Any, n: int, v: int, delay_ns: int) -> None:
    """cb_fill_u32 on the emulated device: spin, then write n 32-bit words."""
    if delay_ns > 0:
        time.sleep(delay_ns / 1e9)
    p[:4 * n].view("<u4")[:] = v & 0xFFFFFFFF


def _spin_host(grid: Any, block: Any, ns: int) -> None:
    """cb_spin on the emulated device."""
    time.sleep(ns / 1e9)


_HOST_KERNELS = {
    "cb_fill_u32": HostKernel("cb_fill_u32", ("ptr", "i64", "i32", "i64"), _fill_host, f"{__name__}._fill_host"),
    "cb_spin": HostKernel("cb_spin", ("i64",), _spin_host, f"{__name__}._spin_host"),
}


def _tool_kernel(c: Control, name: str, gpu: int) -> Any:
    """The tools' kernel ``name`` for GPU ``gpu``: its host kernel on the emulated device, else the
    kernel of :data:`TOOL_KERNELS` loaded on that GPU (once: the service's module cache)."""
    if c.service.backend.runs_host_kernels:
        return _HOST_KERNELS[name]
    return c.service.load_module(TOOL_KERNELS, gpu).kernel(name)


def fill_u32(c: Control, handle: int, value: int, delay_s: float = 0.0, offset: int = 0,
             count: int | None = None) -> None:
    """A slow writer: on the buffer's stream, spin ``delay_s`` then write 32-bit ``value``s;
    queued inside the buffer's task lease, as every operation that queues work for a task is."""
    a, lease = c.hot._enter_buffer(int(handle), "fill_u32", int(offset), 0)
    try:
        words = (a.size - offset) // 4 if count is None else int(count)
        if words < 0 or offset + 4 * words > a.size:
            raise InvalidArgument(f"fill_u32: {words} words at offset {offset} do not fit {a.size} bytes")
        v = int(value) & 0xFFFFFFFF
        kernel = _tool_kernel(c, "cb_fill_u32", a.device)
        kernel.launch(c.service.backend, a.stream, LaunchConfig(max(1, min(1024, -(-words // 256))), 256),
                      [DevicePointer(a.ptr + offset, 4 * words), words, v - (1 << 32) if v >= 1 << 31 else v,
                       int(float(delay_s) * 1e9)])
    finally:
        c.service.registry.leave(lease)


def spin(c: Control, task: int, seconds: float) -> None:
    """A kernel that only spins, on the task's stream, inside the task's lease."""
    leases = c.service.registry.leases
    lease = leases.lease_of(int(task))
    me = threading.get_ident()
    try:   # entered and left by single built-in calls (task_registry's "Interruptions")
        lease.inside.append(me)
        if not lease.open:
            raise leases.refusal(int(task), lease)
        binding = lease.binding
        kernel = _tool_kernel(c, "cb_spin", binding.gpu)
        kernel.launch(c.service.backend, binding.stream, LaunchConfig(1, 1), [int(float(seconds) * 1e9)])
    finally:
        lease.inside.remove(me)


def register_host(c: Control, address: int, nbytes: int) -> None:
    """Page-lock host memory as Python task code in the executor does, through the service
    (``service.page_locked.register``): Java's copies then find it page-locked although Java never
    registered it."""
    c.service.page_locked.register(int(address), int(nbytes))


def unregister_host(c: Control, address: int, task: int = 0) -> None:
    """Undo :func:`register_host`, by ``task`` (0: none; copies into the range are then refused
    for every task, PageLockedRegions.unregister)."""
    c.service.page_locked.unregister(int(address), int(task))


def pool_statistics(c: Control, gpu: int = 0) -> dict[str, int]:
    return c.service.memory_pool(int(gpu)).statistics().as_dict()


def interpreter(c: Control) -> dict[str, Any]:
    """Threads Python knows of, and where it runs from (sys.prefix: the venv)."""
    return {
        "threading_active": len(threading._active),  # type: ignore[attr-defined]
        "dummy_threads_dropped": c.hot._dummy_threads,
        "prefix": sys.prefix,
        "executable": sys.executable,
        "version": list(sys.version_info[:3]),
        "gc_objects": len(gc.get_objects()),
        "gc_frozen": gc.get_freeze_count(),   # objects alive at start-up, skipped by collections
    }


def raise_error(c: Control, kind: str = "ValueError", message: str = "raised on purpose") -> None:
    """Raise a Python exception of a builtin type or one of the service's errors, for the
    error-propagation tests."""
    from .. import errors

    if kind == "KernelFault":
        cause = errors.CudaError("cuStreamSynchronize", 700, "CUDA_ERROR_ILLEGAL_ADDRESS")
        raise errors.KernelFault(cause, [], 0, message)
    exc = {"ValueError": ValueError, "ZeroDivisionError": ZeroDivisionError, "KeyError": KeyError,
           "RuntimeError": RuntimeError, "InvalidArgument": errors.InvalidArgument,
           "DeviceUnusable": errors.DeviceUnusable, "HostWaitTimeout": errors.HostWaitTimeout,
           "UnknownTask": errors.UnknownTask, "InvalidFree": errors.InvalidFree}.get(kind)
    if exc is None:
        raise InvalidArgument(f"raise_error: unsupported kind {kind!r}")
    raise exc(message)


def emulated_races(c: Control) -> int:
    """Unordered accesses the emulated device's race detector has seen (-1: no detector: another
    backend, or spark.cudabridge.emulatedRaceCheck off)."""
    backend = c.service.backend
    return len(backend.races) if getattr(backend, "race_check", False) else -1


def _percentiles(samples: list[int]) -> dict[str, float]:
    samples.sort()
    n = len(samples)
    return {"p50_ns": samples[n // 2], "p99_ns": samples[min(n - 1, (n * 99) // 100)], "n": n}


def python_bench(c: Control, n: int = 20000, size: int = 4096, copy_bytes: int = 1 << 20,
                 copies: int = 300, task: int = (1 << 62) + 7) -> dict[str, Any]:
    """The Java benchmark's operations, called from Python in this process: per-call p50/p99
    (perf_counter_ns around each call) and the mean from one timed loop, in nanoseconds.

    * ``stream``: ``registry.stream(task)`` (Java's ``stream()`` is a cached field);
    * ``alloc_free``: ``service.allocate(task, size)`` then ``allocation.free()``: the service's
      own pair, what Python task code would call;
    * ``alloc_free_hot``: the hot-path object's pair (what the JNI natives call), from Python;
    * ``ping``: the empty hot-path method;
    * ``copy_in`` / ``copy_out``: ``copy_bytes`` between a bytearray and the device.
    """
    service, hot = c.service, c.hot
    service.bind_task(task)
    out: dict[str, Any] = {}
    try:
        clock = time.perf_counter_ns
        registry_stream = service.registry.stream
        allocate = service.allocate

        def timed(name: str, body: Callable[[], None], count: int) -> None:
            for _ in range(min(count, 2000)):  # warm up
                body()
            samples = []
            append = samples.append
            for _ in range(count):
                t0 = clock()
                body()
                append(clock() - t0)
            t0 = clock()
            for _ in range(count):
                body()
            mean = (clock() - t0) / count
            out[name] = dict(_percentiles(samples), mean_ns=mean)

        timed("stream", lambda: registry_stream(task), n)

        def pair() -> None:
            allocate(task, size).free()
        timed("alloc_free", pair, n)

        hot_alloc, hot_free = hot.allocate, hot.free

        def hot_pair() -> None:
            hot_free(hot_alloc(task, size)[0])
        timed("alloc_free_hot", hot_pair, n)
        timed("ping", hot.ping, n)
        if "bench_functions" in sys.modules:   # Java resolved it (Bench.java's function_call): the same call here
            add = sys.modules["bench_functions"].add
            timed("function_direct", lambda: add(2, 40), n)
            fid = hot.functions.resolve("bench_functions:add")
            call = hot.call_function
            args = (2, 40)
            timed("function_call", lambda: call(task, fid, args), n)

        a = service.allocate(task, copy_bytes)
        host = bytearray(copy_bytes)
        backend = service.backend
        stream = a.stream
        timed("copy_in", lambda: backend.copy_to_device_async(a.ptr, host, stream), copies)
        timed("copy_out", lambda: backend.copy_from_device_async(host, a.ptr, stream), copies)
        a.free()
    finally:
        service.release_task(task)
    return out


def python_threads(c: Control, seconds: float = 1.0, threads: list[int] | None = None,
                   size: int = 4096) -> dict[str, float]:
    """Aggregate ``service.allocate(task, size).free()`` pairs per second from 1..N Python threads
    in this process (the Java thread-scaling numbers' Python counterpart)."""
    service = c.service
    out: dict[str, float] = {}
    for n in threads or [1]:
        stop = threading.Event()
        counts = [0] * n
        barrier = threading.Barrier(n + 1)

        def worker(k: int) -> None:
            task = (1 << 61) + 1000 * n + k
            service.bind_task(task)
            try:
                allocate = service.allocate
                for _ in range(2000):
                    allocate(task, size).free()
                barrier.wait()
                mine = 0
                while not stop.is_set():
                    allocate(task, size).free()
                    mine += 1
                counts[k] = mine
            finally:
                service.release_task(task)

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
        for t in ts:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        time.sleep(seconds)
        stop.set()
        for t in ts:
            t.join()
        out[str(n)] = sum(counts) / (time.perf_counter() - t0)
    return out


_LAUNCHERS: dict[tuple, Callable[[], None]] = {}   # (how, task, ptr, source) -> one launch (warm)


def launch_bench(c: Control, task: int, how: str, n: int, batch: int, ptr: int, source: str,
                 floor_library: str = "") -> dict[str, Any]:
    """The anchors of bench/bench_launch.py, timed in this process on the task's stream: ``n``
    launches of kernel ``empty(float* p, int n, float a)`` of ``source`` (the module Java loaded:
    the same function), one grid of one block of 32, a synchronize after every ``batch`` launches
    (untimed). ``how``: "cupy" (CuPy's RawKernel on an ExternalStream), "bindings"
    (cuda.bindings' cuLaunchKernel) or "c" (cuLaunchKernel from C: bench/launch_floor.c built as
    ``floor_library``, timing each launch itself). Returns p50/p99/mean in nanoseconds."""
    import ctypes

    from ..kernels.modules import ModuleSource
    service = c.service
    b = service.registry.binding(int(task))
    backend = service.backend
    if backend.name != "cuda":
        raise InvalidArgument("launch_bench: the anchors need the CUDA backend")
    kernel = service.load_module(ModuleSource.of(source), b.gpu).kernel("empty")
    stream = b.stream
    if how == "c":
        lib = ctypes.CDLL(floor_library)
        out = (ctypes.c_longlong * n)()
        rc = lib.cb_floor_launch(ctypes.c_void_p(int(kernel.function)), ctypes.c_void_p(stream),
                                 ctypes.c_ulonglong(ptr), ctypes.c_int(n), ctypes.c_int(batch), out)
        if rc != 0:
            raise RuntimeError(f"launch_bench: the C floor failed with CUresult {rc}")
        samples = list(out)
        return {**_percentiles(samples), "mean_ns": sum(samples) / n}
    key = (how, int(task), int(ptr), source)
    launch = _LAUNCHERS.get(key)
    if launch is None:
        if how == "cupy":
            import cupy
            import numpy as np
            k = cupy.RawKernel(source, "empty")
            mem = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(int(ptr), 4096, None), 0)
            arr = cupy.ndarray((1024,), cupy.float32, mem)
            ext = cupy.cuda.ExternalStream(stream)
            args = (arr, np.int32(n), np.float32(1.0))

            def launch() -> None:
                k((1,), (32,), args, stream=ext)
        elif how == "bindings":
            drv, fn = backend.drv, kernel.function
            params = ((int(ptr), int(n), 1.0), (ctypes.c_void_p, ctypes.c_int, ctypes.c_float))
            ok = drv.CUresult.CUDA_SUCCESS

            def launch() -> None:
                rc = drv.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, params, 0)[0]
                if rc != ok:
                    raise RuntimeError(f"cuLaunchKernel: {rc}")
        else:
            raise InvalidArgument(f"launch_bench: how must be cupy, bindings or c, got {how!r}")
        _LAUNCHERS[key] = launch
    clock = time.perf_counter_ns
    samples = []
    total = 0
    for i in range(n):
        t0 = clock()
        launch()
        dt = clock() - t0
        samples.append(dt)
        total += dt
        if (i + 1) % batch == 0:
            backend.stream_synchronize(stream)
    backend.stream_synchronize(stream)
    return {**_percentiles(samples), "mean_ns": total / n}


def copy_bench(c: Control, task: int, sizes: list[int], reps: int, threads: int = 8) -> dict[str, Any]:
    """The anchors of bench/bench_copies.py, timed in this process, median ns per size of one copy
    (and the synchronize after it): ``memcpy_1`` / ``memcpy_<threads>`` the host's memcpy (numpy,
    one thread, and the buffer split over threads), ``host_alloc`` the device's own pinned allocation and
free (cudaHostAlloc + cudaFreeHost on a GPU), and on a GPU ``cupy_pinned_in/out`` and
    ``cupy_pageable_in/out`` (CuPy's cudaMemcpyAsync on the task's stream, then a synchronize)."""
    import statistics
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    backend = c.service.backend
    stream = c.service.registry.binding(int(task)).stream
    clock = time.perf_counter_ns

    def timed(op: Callable[[], None]) -> float:
        op()
        samples = []
        for _ in range(int(reps)):
            t0 = clock()
            op()
            samples.append(clock() - t0)
        return statistics.median(samples)

    out: dict[str, dict[str, float]] = {}
    pool = ThreadPoolExecutor(max_workers=int(threads))
    try:
        for n in (int(x) for x in sizes):
            src, dst = np.ones(n, np.uint8), np.empty(n, np.uint8)
            out.setdefault("memcpy_1", {})[str(n)] = timed(lambda: np.copyto(dst, src))
            parts = [slice(i * n // threads, (i + 1) * n // threads) for i in range(int(threads))]
            out.setdefault(f"memcpy_{threads}", {})[str(n)] = timed(
                lambda: list(pool.map(lambda p: np.copyto(dst[p], src[p]), parts)))
            # sampled as CopyBench samples allocatePinned: 10x the copies' repetitions
            out.setdefault("host_alloc", {})[str(n)] = statistics.median(
                timed(lambda: backend.free_pinned(backend.alloc_pinned(n))) for _ in range(10))
            if backend.name != "cuda":
                continue
            import cupy
            ext = cupy.cuda.ExternalStream(stream)
            dev = cupy.empty(n, cupy.uint8)
            pinned = cupy.cuda.alloc_pinned_memory(n)
            host = np.frombuffer(pinned, np.uint8, n)
            R = cupy.cuda.runtime

            def copy(dst_ptr: int, src_ptr: int, kind: int) -> None:
                R.memcpyAsync(dst_ptr, src_ptr, n, kind, stream)
                ext.synchronize()
            out.setdefault("cupy_pinned_in", {})[str(n)] = timed(lambda: copy(dev.data.ptr, host.ctypes.data, 1))
            out.setdefault("cupy_pinned_out", {})[str(n)] = timed(lambda: copy(host.ctypes.data, dev.data.ptr, 2))
            out.setdefault("cupy_pageable_in", {})[str(n)] = timed(lambda: copy(dev.data.ptr, src.ctypes.data, 1))
            out.setdefault("cupy_pageable_out", {})[str(n)] = timed(lambda: copy(dst.ctypes.data, dev.data.ptr, 2))
            del dev, pinned
    finally:
        pool.shutdown()
    return out


TOOLS: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (fill_u32, spin, register_host, unregister_host, pool_statistics, interpreter, raise_error, python_bench,
                                          python_threads, launch_bench, emulated_races, copy_bench)
}
