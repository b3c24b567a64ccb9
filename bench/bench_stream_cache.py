"""The pool's stream cache on repeating steps: how many of a step's allocations reach the pool's
locked slow path, how many physical pieces it moves, its time and the pool's peak reserved bytes,
with the stream cache (``cache_frees``, the default) and without it (``cache_frees=0``).

The steps are the allocation and free orders of the two workloads of bench_allocators.py, replayed
through a library allocator (library_allocator.py: each free queued and made, or its block
reissued, at the library's next allocation, as the plug-ins make them) on one task's stream, with
no library and no kernels, so that they run on the emulated device too:

* "torch MLP": the 1024-4096-1024 MLP's forward, backward and SGD step at batch 256 as PyTorch's
  pluggable allocator sees it (the forward's activations, the gradients kept until the next step's
  ``zero_grad(set_to_none=True)``), by address (allocate_pointer / free_pointer, as torch's
  compiled part hands them over); and once more through the compiled part itself, called from C++
  as PyTorch calls it (the tests' stand-in torch, tests/standin_torch.py; g++ builds its caller),
  whose kept frees serve the repeating step without the pool (its time includes the stand-in's
  ctypes calls and tensor objects: not comparable with the other rows'; its pool counters are);
* "CuPy chain": bench_allocators.py's chain of temporaries over 1, 4, 16 and 64 MiB arrays, each
  temporary freed when Python drops its last reference (a reduction's scalar is 512 bytes, CuPy's
  smallest block).

Each setting runs its own service (``poolCacheFrees``): ``--warm`` steps first, then ``--steps``
counted. Nothing is
asserted (tests/test_memory_pool.py and tests/test_allocators.py hold the behaviour); the table is
printed last and written as JSON under --out (bench_stream_cache.json).

    python bench/bench_stream_cache.py [--backend emulated|cuda] [--growth auto|chunks]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rounds import Report, library_path  # noqa: E402

sys.path.insert(0, str(library_path()))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))   # the stand-in torch

MIB = 1 << 20


def torch_mlp(alloc: Callable[[int], object], live: dict) -> None:
    """One step; ``live`` carries the gradients from one step to the next."""
    for name in ("gw1", "gb1", "gw2", "gb2"):   # zero_grad(set_to_none=True): the parameters in order
        if name in live:
            live.pop(name).free()
    h1, r, o, sq, m = alloc(4 * MIB), alloc(4 * MIB), alloc(MIB), alloc(MIB), alloc(4)
    g, gsq = alloc(4), alloc(MIB)
    sq.free()
    m.free()
    go = alloc(MIB)
    gsq.free()
    live["gw2"], live["gb2"], gr = alloc(16 * MIB), alloc(4096), alloc(4 * MIB)
    o.free()
    go.free()
    gh = alloc(4 * MIB)
    gr.free()
    r.free()
    live["gw1"], live["gb1"] = alloc(16 * MIB), alloc(16384)
    gh.free()
    h1.free()
    g.free()
    alloc(MIB).free()


def cupy_chain(alloc: Callable[[int], object], live: dict) -> None:
    """One step: a, b, c, d, e rebound per size (the old one freed after the new one is made)."""
    def rebind(name: str, new: object) -> None:
        old = live.pop(name, None)
        if old is not None:
            old.free()
        live[name] = new

    for n in (MIB, 4 * MIB, 16 * MIB, 64 * MIB):
        rebind("a", alloc(n))                       # a = ones(n)
        t = alloc(n)                                # b = a * 2 + 1
        rebind("b", alloc(n))
        t.free()
        t = alloc(n)                                # c = sqrt(b) - a
        rebind("c", alloc(n))
        t.free()
        t, s1 = alloc(n), alloc(512)                # d = (c * c).sum() + b.max()
        t.free()
        s2, s3 = alloc(512), alloc(512)
        s1.free()
        s2.free()
        rebind("d", s3)
        t = alloc(n)                                # e = exp(-c) * b
        t2 = alloc(n)
        t.free()
        rebind("e", alloc(n))
        t2.free()
        s1, s2 = alloc(512), alloc(512)             # float(d + e.mean())
        s1.free()
        s2.free()
    for name in list(live):
        live.pop(name).free()


def run(backend_name: str, growth: str, library: str, step: Callable, cache_frees: int | None, warm: int,
        steps: int, through_part: bool = False) -> dict:
    from cudabridge.allocators.library_allocator import LibraryAllocator
    from cudabridge.config import ServiceConfig
    from cudabridge.service import CudaBridgeService

    kw = {} if cache_frees is None else {"pool_cache_frees": cache_frees}
    service = CudaBridgeService(ServiceConfig(backend=backend_name, streams_per_gpu=4, high_priority_streams=0,
                                              pool_growth=growth, **kw))
    allocator = LibraryAllocator(service, library, **({"by_stream": True, "register_streams": True}
                                                       if library == "torch" else {}))
    service.library_allocators[library] = allocator
    binding = service.bind_task(1)
    service.registry.attach(1)
    pool = service.memory_pool(binding.gpu)
    live: dict = {}

    class Freed:   # what the step frees: the library's free queues it, its next allocation makes it
        __slots__ = ("a",)

        def __init__(self, a: object) -> None:
            self.a = a

        def free(self) -> None:
            if through_part:
                self.a = None   # the stand-in tensor's deleter: torch's part keeps or lists the free
            elif library == "torch":
                allocator.free_pointer(self.a)
            else:
                allocator.free(self.a)

    if through_part:   # through torch's compiled part, called from C++ as torch calls it
        import tempfile

        from cudabridge.allocators import torch as cb_torch
        from standin_torch import StandinTorch, build_caller

        cb_torch.attach(service)
        with tempfile.TemporaryDirectory() as tmp:
            standin = StandinTorch(None, cb_torch.compiled_part(), build_caller(Path(tmp)))
        standin.set_stream(binding.stream)

        def alloc(n: int) -> Freed:
            return Freed(standin.empty(n))
    elif library == "torch":
        def alloc(n: int) -> Freed:
            return Freed(allocator.allocate_pointer(n, binding.gpu, binding.stream))
    else:
        def alloc(n: int) -> Freed:
            return Freed(allocator.allocate(n, binding.gpu, binding.stream))

    try:
        for _ in range(warm):
            step(alloc, live)
        allocator.drain()
        service.backend.stream_synchronize(binding.stream)
        before = pool.statistics()
        t0 = time.perf_counter()
        for _ in range(steps):
            step(alloc, live)
        allocator.drain()
        service.backend.stream_synchronize(binding.stream)
        took = (time.perf_counter() - t0) / steps * 1e6
        after = pool.statistics()
        for a in live.values():
            a.free()
        return {"slow": (after.slow_allocations - before.slow_allocations) / steps,
                "moved": (after.pieces_moved - before.pieces_moved) / steps,
                "allocations": (after.allocations - before.allocations) / steps,
                "step_us": took, "peak_reserved": after.peak_reserved_bytes, "cache_frees": pool.cache_frees}
    finally:
        live.clear()
        if through_part:
            cb_torch.detach()
        service.registry.detach()
        service.release_task(1)
        service.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("emulated", "cuda"), default="emulated")
    parser.add_argument("--growth", choices=("auto", "chunks"), default="auto")
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "out")))
    args = parser.parse_args()
    report = Report()
    raw = {}
    cases = [(name, library, step, label, cache, False)
             for name, library, step in (("torch MLP", "torch", torch_mlp), ("CuPy chain", "cupy", cupy_chain))
             for label, cache in (("stream cache", None), ("no cache", 0))]
    cases.insert(2, ("torch MLP through its part", "torch", torch_mlp, "kept frees", None, True))
    for name, library, step, label, cache, through_part in cases:
        r = raw[f"{name}, {label}"] = run(args.backend, args.growth, library, step, cache, args.warm, args.steps,
                                          through_part)
        key = f"{name}, {label} (cache_frees={r['cache_frees']})"
        report.values(f"{key}: slow allocations per step", [r["slow"]], "", better="lower",
                      note=f"of {r['allocations']:.0f}")
        report.values(f"{key}: pieces moved per step", [r["moved"]], "", better="lower")
        report.values(f"{key}: step", [r["step_us"]], "us", better="lower")
        report.values(f"{key}: peak reserved", [r["peak_reserved"] / MIB], "MiB", better="lower")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_stream_cache.json"), "w") as f:
        json.dump({"backend": args.backend, "growth": args.growth, "date": time.strftime("%Y-%m-%d %H:%M"),
                   "summary": report.summary(), "raw": raw}, f, indent=1)
    print(f"\n== bench_stream_cache on backend {args.backend}, growth {args.growth} "
          f"({args.warm} warm steps, {args.steps} counted) ==")
    print(report.text())


if __name__ == "__main__":
    main()
