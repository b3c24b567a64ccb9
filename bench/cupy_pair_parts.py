"""Where CuPy's allocation pair through cudabridge.allocators.cupy spends its time, part by part, in
interleaved rounds (issue 26: the pair against CuPy's own pool's).

    python bench/cupy_pair_parts.py [--backend cuda|emulated] [--rounds 5] [--pairs 20000] [--out DIR]

On the GPU it runs over the real CuPy; on the emulated device over the tests' stand-in CuPy
(tests/standin_libraries.py), whose memory classes are Python (so its wrapping parts cost more).
Each row is the median per call in microseconds over the rounds:

* ``cupy pool pair``: CuPy's own ``MemoryPool.malloc`` of 1 MiB, dropped (real CuPy only);
* ``alloc pair, ours``: ``cupy.cuda.alloc`` of 1 MiB through our allocator, dropped (what
  bench_allocators.py reports as "cupy pair: ours");
* ``malloc pair, ours``: our malloc called directly, dropped;
* ``malloc pair, the reference``: the Python reference malloc, dropped;
* ``calls handed to the reference``: how many of the C malloc's calls it handed over (0 expected);
* the parts: ``getDevice``, ``get_current_stream().ptr``, CuPy's ``UnownedMemory`` and
  ``MemoryPointer`` made and dropped, our allocator's pair (allocate, free, drain at the next
  allocate) and the pool's own pair.

Nothing is asserted; the table is printed last and written as JSON under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rounds import Report, interleave, library_path

sys.path.insert(0, str(library_path()))

MIB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuda", choices=("cuda", "emulated"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from cudabridge.allocators import cupy as cb_cupy
    from cudabridge.config import ServiceConfig
    from cudabridge.service import CudaBridgeService

    service = CudaBridgeService(ServiceConfig(backend=args.backend, streams_per_gpu=4, high_priority_streams=0))
    if args.backend == "cuda":
        import cupy
        own_pool = cupy.cuda.MemoryPool()
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from standin_libraries import StandinCupy
        cupy = StandinCupy(service.backend)
        own_pool = None
    allocator = cb_cupy.install(service, module=cupy)
    b = service.bind_task(1)
    service.registry.attach(1)
    pool = service.memory_pool(0)
    stream = cb_cupy.task_stream(service)

    # the C malloc as make_malloc builds it, with a reference that counts the calls handed to it
    handed = [0]
    memory = cupy.cuda.memory
    python_malloc = cb_cupy.reference_malloc(allocator, cupy)

    def counting(size):
        handed[0] += 1
        return python_malloc(size)

    core = allocator.core
    c_malloc = (core.cupy_malloc(allocator, memory.UnownedMemory, memory.MemoryPointer, cupy.cuda.runtime.getDevice,
                                 cupy.cuda.get_current_stream, counting) if core is not None else None)
    n = args.pairs

    def timed(body):
        def run() -> float:
            with stream:
                t0 = time.perf_counter()
                body(n)
                return (time.perf_counter() - t0) / n * 1e6
        return run

    def loop(call, *a):
        def body(k):
            for _ in range(k):
                call(*a)
        return body

    get_device, current_stream = cupy.cuda.runtime.getDevice, cupy.cuda.get_current_stream
    unowned, pointer = memory.UnownedMemory, memory.MemoryPointer
    owner = object()

    def wrap(k):
        for _ in range(k):
            pointer(unowned(1 << 20, MIB, owner, 0), 0)

    def stream_ptr(k):
        for _ in range(k):
            current_stream().ptr

    alloc, free = allocator.allocate, allocator.free

    def plugin_pair(k):
        for _ in range(k):
            free(alloc(MIB, 0, b.stream))
        allocator.drain()

    def pool_pair(k):
        for _ in range(k):
            pool.allocate(MIB, b.stream, 1).free()

    candidates = {
        "getDevice": timed(loop(get_device)),
        "get_current_stream().ptr": timed(stream_ptr),
        "UnownedMemory + MemoryPointer, dropped": timed(wrap),
        "plug-in pair (allocate, free, drain)": timed(plugin_pair),
        "pool pair": timed(pool_pair),
        "malloc pair, the reference": timed(loop(python_malloc, MIB)),
    }
    if c_malloc is not None:
        candidates["malloc pair, ours (C)"] = timed(loop(c_malloc, MIB))
    if args.backend == "cuda":
        cupy.cuda.set_allocator(c_malloc or python_malloc)
        candidates["alloc pair, ours"] = timed(loop(cupy.cuda.alloc, MIB))
        candidates["cupy pool pair"] = timed(loop(own_pool.malloc, MIB))
    res = interleave(candidates, rounds=args.rounds)
    report = Report()
    for name in candidates:
        report.values_of(res, name, "us", better="lower")
    report.values("calls handed to the reference", [handed[0]], "calls")
    print(report.text())
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cupy_pair_parts.json").write_text(json.dumps(report.summary(), indent=1))
    if args.backend == "cuda":
        cb_cupy.uninstall()
    service.registry.detach()
    service.release_task(1)
    service.close()


if __name__ == "__main__":
    main()
