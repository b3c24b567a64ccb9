"""The demo job: many short simulated Spark tasks, more threads than streams, through the service.

Each task binds to a stream, allocates buffers of mixed sizes, copies a pattern in, runs a kernel
that fills part of it, copies back and checks every byte, frees most buffers and leaks the rest on
purpose (task end reclaims them), as a sloppy UDF would.

The kernel is a user's: a module loaded once per GPU (``CudaBridgeService.load_module``) and
launched on the task's stream (``CudaBridgeService.launch``); on the emulated device its host
kernel below runs in its place (the demo adds this module to ``emulatedKernels``).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .config import ServiceConfig
from .kernels import LaunchConfig, host_kernel
from .kernels.modules import ModuleSource
from .service import CudaBridgeService

FILL = ModuleSource.of(r"""
extern "C" __global__ void demo_fill(unsigned int* p, long long n, unsigned int v) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = v;
}
""", signatures={"demo_fill": "ptr, i64, i32"})


@host_kernel("demo_fill", "ptr, i64, i32")
def demo_fill(grid: Any, block: Any, p: Any, n: int, v: int) -> None:
    """demo_fill on the emulated device: the first ``n`` 32-bit words of ``p`` become ``v``."""
    p[:4 * n].view("<u4")[:] = v


def _task(service: CudaBridgeService, task_id: int, rng: random.Random) -> tuple[int, int]:
    """Returns (bytes moved, verify failures)."""
    binding = service.bind_task(task_id)
    registry = service.registry
    registry.attach(task_id)
    backend = service.backend
    moved = failures = 0
    try:
        fill = service.load_module(FILL, binding.gpu).kernel("demo_fill")   # loaded once per GPU
        held = []
        for _ in range(rng.randint(2, 6)):
            size = rng.choice((256, 4096, 65536, 1 << 20)) + rng.randrange(0, 256)
            buf = service.allocate(task_id, size)
            data = bytes(rng.randrange(256) for _ in range(min(size, 64))) * (size // 64 + 1)
            data = data[:size]
            backend.copy_to_device_async(buf.ptr, data, binding.stream)
            words = size // 8
            value = task_id & 0x7FFFFFFF
            service.launch(task_id, fill, LaunchConfig(max(1, min(1024, -(-words // 256))), 256), [buf, words, value])
            out = bytearray(size)
            backend.copy_from_device_async(out, buf.ptr, binding.stream)
            backend.stream_synchronize(binding.stream)
            expect = value.to_bytes(4, "little") * words + data[4 * words:]
            if out != expect:
                failures += 1
            moved += 2 * size
            held.append(buf)
        for buf in held[: max(1, len(held) - 1)]:
            buf.free()
        # the last buffer is leaked on purpose: release_task reclaims it
    finally:
        registry.detach()
        service.release_task(task_id)
    return moved, failures


def run_demo(config: ServiceConfig, tasks: int = 400, threads: int = 16, seed: int = 7) -> dict[str, Any]:
    t0 = time.perf_counter()
    modules = [m.strip() for m in (config.emulated_kernels or "").split(",") if m.strip()]
    if __name__ not in modules:   # the host kernel of the demo's kernel, for the emulated device
        config = dataclasses.replace(config, emulated_kernels=",".join(modules + [__name__]))
    service = CudaBridgeService(config)
    streams_seen: set[int] = set()
    lock = threading.Lock()
    try:
        start = time.perf_counter()

        def one(task_id: int) -> tuple[int, int]:
            rng = random.Random(seed * 1_000_003 + task_id)
            moved, failures = _task(service, task_id, rng)
            return moved, failures

        orig_bind = service.bind_task

        def bind_and_note(task_id: int, *a: Any, **k: Any):
            b = orig_bind(task_id, *a, **k)
            with lock:
                streams_seen.add(b.stream)
            return b

        service.bind_task = bind_and_note  # type: ignore[method-assign]
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="task") as pool:
            results = list(pool.map(one, range(tasks)))
        elapsed = time.perf_counter() - start
        stats = service.statistics()
        totals = stats.totals()
        return {
            "backend": stats.backend,
            "gpus": stats.gpus,
            "tasks_run": tasks,
            "task_threads": threads,
            "streams_in_pool": stats.streams,
            "distinct_streams_used": len(streams_seen),
            "bytes_moved": sum(m for m, _ in results),
            "verify_failures": sum(f for _, f in results),
            "leaks_reclaimed": totals["leaks_reclaimed"],
            "leaked_bytes_reclaimed": totals["leaked_bytes_reclaimed"],
            "allocations": totals["allocations"],
            "live_allocations_after": totals["live_allocations"],
            "peak_in_use_bytes": totals["peak_in_use_bytes"],
            "reserved_bytes": totals["reserved_bytes"],
            "event_polls": totals["event_polls"],
            "stream_polls": totals["stream_polls"],
            "gpu_waits": totals["gpu_waits"],
            "host_syncs": totals["host_syncs"],
            "oom": totals["oom"],
            "task_phase_seconds": round(elapsed, 3),
            "total_seconds": round(time.perf_counter() - t0, 3),
        }
    finally:
        service.close()
