"""Python GPU libraries on the service's pools against their own (issue 26), in interleaved rounds.

    python bench/bench_allocators.py [--backend cuda|emulated] [--rounds 5] [--steps 100] [--only PART] [--out DIR]

* The plug-ins' own layer, on either backend: the allocation pair through a LibraryAllocator
  against the pool's own pair, on a task's thread and stream; and the pair through torch's
  compiled part called from C++ as torch calls it (tests/native/pluggable_caller.cpp, built with
  g++), from a Python thread, from a new native thread that keeps a Python thread state with the
  GIL given back (as autograd's device threads do), and from one with none (a user's C++ thread),
  naming the task's stream.

* CuPy, in this process: a step of elementwise chains and reductions over 1, 4, 16 and 64 MiB
  arrays (many temporaries) on the task's stream, with CuPy's own memory pool against
  cudabridge.allocators.cupy (the allocator is switched before each candidate runs); time per step,
  the bytes each holds reserved after the step (CuPy's pool ``total_bytes()``, our pool's
  ``reserved_bytes``: neither gives memory back, so that is each one's peak), the device memory
  each took from the driver (``cudaMemGetInfo`` around its runs), the allocation pair
  (``cupy.cuda.alloc`` of 1 MiB, then dropped), and the allocations a step makes.
* PyTorch, one process per candidate and round (an allocator is process-wide and set before the
  first allocation): torch's caching allocator, cudabridge.allocators.torch (the global swap) and
  ``torch.cuda.MemPool`` over the same pluggable allocator (torch's caching above our pool); a
  step is a small MLP's forward and backward (1024-4096-1024, batch 256, SGD) on a non-default
  stream (ours: the task's; torch's own: a torch.cuda.Stream, since session 14), then the pair
  (``torch.empty`` of 1 MiB, dropped), the peak reserved bytes (torch's
  ``max_memory_reserved`` for its own allocator, our pool's ``peak_reserved_bytes`` otherwise),
  and the allocations a step makes. Where g++ is, a fourth candidate, "timed", is ours through
  bench/timed_pluggable.cpp, which times every call inside the compiled part on whichever thread
  torch makes it (autograd's included): the calls and the microseconds inside our part per step,
  and, its allocator's two callables wrapped in timing Python functions, how much of that is the
  allocator's own allocate_pointer and free_pointer (a Python frame more a call).

Targets (issue 26): time per step <= 1.1x the library's own, peak reserved <= 1.0x. Nothing is
asserted; the table is printed last and written as JSON under --out (bench_allocators.json).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from statistics import median
from typing import Callable

from rounds import Report, interleave, library_path

sys.path.insert(0, str(library_path()))

MIB = 1 << 20


def _service():
    from cudabridge.config import ServiceConfig
    from cudabridge.service import CudaBridgeService

    return CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=4, high_priority_streams=0))


# the plug-ins' own layer ------------------------------------------------------------------------------
def layer_rounds(report: Report, backend: str, rounds: int, pairs: int) -> None:
    """The pair through a LibraryAllocator (the rules every plug-in runs: task lookup, lease,
    bookkeeping, the queued free and its drain) against the pool's own pair, on a task's thread and
    stream: what the plug-ins add before any library's own cost. Either backend."""
    from cudabridge.allocators.library_allocator import LibraryAllocator
    from cudabridge.config import ServiceConfig
    from cudabridge.service import CudaBridgeService

    service = CudaBridgeService(ServiceConfig(backend=backend, streams_per_gpu=4, high_priority_streams=0))
    allocator = LibraryAllocator(service, "cupy")
    b = service.bind_task(1)
    service.registry.attach(1)
    pool = service.memory_pool(0)

    def pool_pair() -> float:
        t0 = time.perf_counter()
        for _ in range(pairs):
            pool.allocate(MIB, b.stream, 1).free()
        return (time.perf_counter() - t0) / pairs * 1e6

    def plugin_pair() -> float:
        alloc, free = allocator.allocate, allocator.free
        t0 = time.perf_counter()
        for _ in range(pairs):
            free(alloc(MIB, 0, b.stream))   # the next allocate drains it
        allocator.drain()
        return (time.perf_counter() - t0) / pairs * 1e6

    # torch's compiled part called as torch calls it (C++ function pointers, no GIL held), through
    # the tests' caller (tests/native/pluggable_caller.cpp): from this Python thread, and from a new
    # native thread with no Python thread state (as autograd's device threads), naming the task's
    # stream; the torch plug-in's own allocator, connected to the part
    import tempfile
    import ctypes

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from cudabridge.allocators import torch as cb_torch
    from standin_torch import StandinTorch, build_caller

    cb_torch.attach(service)
    fn = cb_torch.compiled_part().addresses()
    with tempfile.TemporaryDirectory() as tmp:
        caller = build_caller(Path(tmp))
    err = ctypes.create_string_buffer(256)

    def torch_part_pair() -> float:
        t0 = time.perf_counter()
        for _ in range(pairs):
            p = caller.caller_alloc(fn["alloc"], MIB, 0, b.stream, err, len(err))
            caller.caller_free(fn["free"], p, MIB, 0, b.stream)
        return (time.perf_counter() - t0) / pairs * 1e6

    torch = StandinTorch(None, cb_torch.compiled_part(), caller)

    def on_new_thread(python_state: bool) -> Callable[[], float]:
        return lambda: torch.pairs_on_new_thread(MIB, b.stream, pairs, python_state) / pairs * 1e6

    # CuPy's malloc and its allocations' owner over the tests' stand-in CuPy (standin_libraries.py:
    # CuPy's interface, Python classes for its memory objects): what our side of CuPy's pair costs
    from cudabridge.allocators import cupy as cb_cupy
    from standin_libraries import StandinCupy

    cp = StandinCupy(None)
    cb_cupy.install(service, module=cp)

    def cupy_standin_pair() -> float:
        empty = cp.empty
        with cp.stream(b.stream):
            t0 = time.perf_counter()
            for _ in range(pairs):
                empty(MIB)   # dropped at once: its owner queues the free, the next allocation drains it
            took = time.perf_counter() - t0
        return took / pairs * 1e6

    res = interleave({"pool": pool_pair, "plug-in": plugin_pair, "torch part": torch_part_pair,
                      "torch part, an autograd-like thread": on_new_thread(True),
                      "torch part, a thread with no Python state": on_new_thread(False),
                      "cupy (stand-in)": cupy_standin_pair}, rounds=rounds)
    report.values_of(res, "pool", "us", better="lower")
    report.values_of(res, "plug-in", "us", better="lower")
    report.ratio_of("pair: plug-in / pool", res, "plug-in", "pool", better="lower")
    report.values_of(res, "torch part", "us", better="lower")
    report.values_of(res, "torch part, an autograd-like thread", "us", better="lower")
    report.values_of(res, "torch part, a thread with no Python state", "us", better="lower")
    report.ratio_of("pair: torch part, an autograd-like thread / pool", res, "torch part, an autograd-like thread",
                    "pool", better="lower")
    report.values_of(res, "cupy (stand-in)", "us", better="lower")
    cb_torch.detach()
    service.registry.detach()
    service.release_task(1)
    service.close()


# CuPy -----------------------------------------------------------------------------------------------
def cupy_rounds(report: Report, rounds: int, steps: int, pairs: int) -> None:
    try:
        import cupy
    except ImportError as exc:
        report.missing("cupy", f"not installed: {exc}")
        return
    from cudabridge.allocators import cupy as cb_cupy

    service = _service()
    ours = cb_cupy.make_malloc(cb_cupy.install(service), cupy)
    own_pool = cupy.cuda.MemoryPool()
    service.bind_task(1)
    service.registry.attach(1)
    stream = cb_cupy.task_stream(service)
    pool = service.memory_pool(0)

    def step() -> None:
        for n in (MIB, 4 * MIB, 16 * MIB, 64 * MIB):
            a = cupy.ones(n // 4, dtype=cupy.float32)
            b = a * 2 + 1
            c = cupy.sqrt(b) - a
            d = (c * c).sum() + b.max()
            e = cupy.exp(-c) * b
            float(d + e.mean())   # a reduction read back: the step ends on the host

    library = service.library_allocators["cupy"]
    # the device memory each pool takes from the driver (cudaMemGetInfo), beside what each reports:
    # CuPy's total_bytes() sums its requests rounded to 512 bytes, ours its chunks and segment. The
    # step's kernels are loaded first (their code takes device memory too), with a third pool that
    # then gives its memory back, so that neither candidate is charged for them.
    primer = cupy.cuda.MemoryPool()
    cupy.cuda.set_allocator(primer.malloc)
    with stream:
        step()
        stream.synchronize()
    cupy.cuda.set_allocator(None)
    gc.collect()
    primer.free_all_blocks()
    taken = {"cupy pool": 0, "ours": 0}

    def run(malloc, reserved, name) -> dict:
        free_before = cupy.cuda.runtime.memGetInfo()[0]
        cupy.cuda.set_allocator(malloc)
        with stream:
            step()   # warm
            stream.synchronize()
            made = library.statistics().allocations
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            stream.synchronize()
            per_step = (time.perf_counter() - t0) / steps * 1e6
            per_step_allocations = (library.statistics().allocations - made) / steps
            t0 = time.perf_counter()
            for _ in range(pairs):
                cupy.cuda.alloc(MIB)
            per_pair = (time.perf_counter() - t0) / pairs * 1e6
        gc.collect()
        taken[name] += free_before - cupy.cuda.runtime.memGetInfo()[0]
        return {"step": per_step, "pair": per_pair, "reserved": reserved(), "allocations": per_step_allocations,
                "device": taken[name]}

    res = interleave({"cupy pool": lambda: run(own_pool.malloc, own_pool.total_bytes, "cupy pool"),
                      "ours": lambda: run(ours, lambda: pool.statistics().reserved_bytes, "ours")}, rounds=rounds)
    # what the pairs cost a step: ours allocates as often as CuPy's pool is asked to (one malloc per
    # array), so (our pair - CuPy's) x allocations is the step time the allocator itself adds
    report.values("cupy allocations per step", [r["ours"]["allocations"] for r in res], "")
    report.values("cupy step: (our pair - cupy pool's) x allocations per step",
                  [(r["ours"]["pair"] - r["cupy pool"]["pair"]) * r["ours"]["allocations"] for r in res], "us")
    for what, unit in (("step", "us"), ("pair", "us"), ("reserved", "bytes"), ("device", "bytes")):
        label = "device memory taken" if what == "device" else what
        for name in ("cupy pool", "ours"):
            report.values(f"cupy {label}: {name}", [r[name][what] for r in res], unit, better="lower")
        report.ratio(f"cupy {label}: ours / cupy pool", [r["ours"][what] / r["cupy pool"][what] for r in res],
                     better="lower", note={"step": "target <= 1.1", "reserved": "target <= 1.0"}.get(what, ""))
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    service.registry.detach()
    service.release_task(1)
    service.close()


# PyTorch ------------------------------------------------------------------------------------------
TORCH_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
mode, steps, pairs = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
MIB = 1 << 20
service = None
if mode != "caching":
    from cudabridge.config import ServiceConfig
    from cudabridge.service import CudaBridgeService
    from cudabridge.allocators import torch as cb_torch
    service = CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=4, high_priority_streams=0))
    if mode == "ours":
        cb_torch.install(service)
    elif mode == "timed":   # ours through a shim that times each call inside the part (timed_pluggable.cpp)
        import ctypes
        lib_alloc = cb_torch.attach(service)
        # and the allocator's own calls timed from the part's side (a Python frame each: about 0.2 us
        # more a call), so that the part's time splits into the allocator's and the rest
        in_alloc = [0, 0]   # calls, ns
        in_free = [0, 0]
        def timed(fn, acc):
            _ns = time.perf_counter_ns
            def call(*args):
                t = _ns()
                try:
                    return fn(*args)
                finally:
                    acc[1] += _ns() - t
                    acc[0] += 1
            return call
        part = cb_torch.compiled_part()
        part.connect(part.owner(), timed(lib_alloc.allocate_pointer_owned, in_alloc),
                     timed(lib_alloc.free_pointer, in_free), lib_alloc.record_stream_pointer, lib_alloc.drain,
                     lib_alloc.owner_for)
        shim = ctypes.CDLL(sys.argv[5])
        shim.timed_read.restype = ctypes.c_longlong
        assert shim.timed_connect(cb_torch.compiled_part().__file__.encode()) == 0, "timed_connect"
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(sys.argv[5], "timed_alloc", "timed_free"))
    else:   # MemPool: torch's caching above our pool, for this thread's allocations
        cb_torch.attach(service)
        part = cb_torch.compiled_part()
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(part.__file__, cb_torch.ALLOC, cb_torch.FREE)
        mempool = torch.cuda.MemPool(pluggable.allocator())
        ctx = torch.cuda.use_mem_pool(mempool)
        ctx.__enter__()
    b = service.bind_task(1)
    service.registry.attach(1)
    torch.cuda.set_stream(torch.cuda.ExternalStream(b.stream))
else:   # torch's own: a stream of its own too, not the legacy default stream, as the others run on
    torch.cuda.set_stream(torch.cuda.Stream())
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(256, 1024, device="cuda")
def step():
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    opt.step()
def allocations():   # torch's own count where its caching allocator runs (not under the global swap)
    if mode in ("ours", "timed"):   # the library's count: the part's reuses of kept frees included
        return service.library_allocators["torch"].statistics().allocations
    return torch.cuda.memory_stats()["allocation.all.allocated"]
for _ in range(20):
    step()
torch.cuda.synchronize()
made = allocations()
def pool_counts():   # the pool's counters (ours only), to say what a step's allocations did there
    if mode not in ("ours", "timed"):
        return {}
    st = service.memory_pool(0).statistics()
    return {k: getattr(st, k) for k in st.__dataclass_fields__ if isinstance(getattr(st, k), int)}
counted = pool_counts()
inside = [shim.timed_read(i) for i in range(12)] if mode == "timed" else None
called = (list(in_alloc), list(in_free)) if mode == "timed" else None
t0 = time.perf_counter()
for _ in range(steps):
    step()
torch.cuda.synchronize()
per_step = (time.perf_counter() - t0) / steps * 1e6
per_step_allocations = (allocations() - made) / steps
pool_per_step = {k: (v - counted[k]) / steps for k, v in pool_counts().items()
                 if v != counted[k] and not k.endswith("bytes")}
if inside is not None:   # per step, by thread (timed_pluggable.cpp): calls, and microseconds inside the part
    inside = [(shim.timed_read(i) - inside[i]) / steps / (1 if i % 6 in (0, 4) else 1000) for i in range(12)]
    # then the allocator's own calls per step: allocations and their us, hand-overs and their us
    inside += [(in_alloc[0] - called[0][0]) / steps, (in_alloc[1] - called[0][1]) / steps / 1000,
               (in_free[0] - called[1][0]) / steps, (in_free[1] - called[1][1]) / steps / 1000]
t0 = time.perf_counter()
for _ in range(pairs):
    torch.empty(MIB, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
per_pair = (time.perf_counter() - t0) / pairs * 1e6
if service is None:
    reserved = torch.cuda.max_memory_reserved()
else:
    reserved = service.memory_pool(0).statistics().peak_reserved_bytes
print("RESULT " + json.dumps({"step": per_step, "pair": per_pair, "reserved": reserved,
                              "allocations": per_step_allocations, "inside": inside,
                              "pool": pool_per_step}))
"""


def torch_rounds(report: Report, rounds: int, steps: int, pairs: int, log: Path) -> None:
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        report.missing("torch", f"not installed: {exc}")
        return

    # the shim the "timed" candidate allocates through (g++ here; without it that candidate is left out)
    shim = log.parent / "timed_pluggable.so"
    built = subprocess.run(["g++", "-O2", "-fPIC", "-shared", str(Path(__file__).with_name("timed_pluggable.cpp")),
                            "-o", str(shim), "-ldl"], capture_output=True, text=True) if shutil.which("g++") else None
    modes = ("caching", "ours", "mempool") + (("timed",) if built is not None and built.returncode == 0 else ())

    def child(mode: str):
        def run() -> dict:
            proc = subprocess.run([sys.executable, "-c", TORCH_CHILD, str(library_path()), mode, str(steps), str(pairs),
                                   str(shim)], capture_output=True, text=True, timeout=600)
            with open(log, "a") as f:
                f.write(f"--- {mode} rc {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}\n")
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                return dict.fromkeys(("step", "pair", "reserved", "allocations", "inside", "pool"), float("nan"))
            return json.loads(lines[-1][len("RESULT "):])
        return run

    res = interleave({m: child(m) for m in modes}, rounds=rounds, warmup=0)
    for what, unit in (("step", "us"), ("pair", "us"), ("reserved", "bytes")):
        for name in ("caching", "ours", "mempool"):
            report.values(f"torch {what}: {name}", [r[name][what] for r in res], unit, better="lower")
        for name in ("ours", "mempool"):
            report.ratio(f"torch {what}: {name} / caching", [r[name][what] / r["caching"][what] for r in res],
                         better="lower", note={"step": "target <= 1.1", "reserved": "target <= 1.0"}.get(what, ""))
    for name in ("caching", "ours"):
        report.values(f"torch allocations per step: {name}", [r[name]["allocations"] for r in res], "")
    report.values("torch step: (our pair - caching's) x allocations per step",
                  [(r["ours"]["pair"] - r["caching"]["pair"]) * r["ours"]["allocations"] for r in res], "us")
    if "timed" in modes:   # ours again, each call timed inside the part (the step pays the timing too)
        inside = [r["timed"]["inside"] for r in res if isinstance(r["timed"]["inside"], list)]
        for t, where in ((0, "the step's thread"), (6, "other threads (autograd's)")):
            if not inside:
                break
            report.values(f"torch step, timed, {where}: allocations per step", [x[t] for x in inside], "",
                          note=f"frees {median(x[t + 4] for x in inside):.1f}")
            report.values(f"torch step, timed, {where}: us inside our part per step (allocations + frees)",
                          [x[t + 1] + x[t + 5] for x in inside], "us",
                          note=f"allocations {median(x[t + 1] for x in inside):.1f} us, frees {median(x[t + 5] for x in inside):.1f} us")
            report.values(f"torch step, timed, {where}: us per allocation taking + giving back the GIL",
                          [(x[t + 2] + x[t + 3]) / x[t] if x[t] else float("nan") for x in inside], "us",
                          note=f"take {median(x[t + 2] / x[t] if x[t] else float('nan') for x in inside):.2f} us")
        if inside and len(inside[0]) >= 16:   # the part's calls into the allocator (Python frames timed)
            report.values("torch step, timed: us in the allocator's allocate_pointer_owned per call (not reused)",
                          [x[13] / x[12] if x[12] else float("nan") for x in inside], "us",
                          note=f"{median(x[12] for x in inside):.1f} a step")
            report.values("torch step, timed: us in the allocator's free_pointer per hand-over",
                          [x[15] / x[14] if x[14] else float("nan") for x in inside], "us",
                          note=f"{median(x[14] for x in inside):.1f} a step")
        if inside:
            report.values("torch step, timed", [r["timed"]["step"] for r in res], "us", better="lower")
    # what a step's allocations did in our pool (its counters that moved, per step)
    counts = [r["ours"].get("pool") for r in res if isinstance(r["ours"].get("pool"), dict)]
    for key in sorted({k for c in counts for k in c}):
        report.values(f"torch step, ours: pool's {key} per step", [c.get(key, 0.0) for c in counts], "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/out"))
    parser.add_argument("--backend", choices=("cuda", "emulated"), default="cuda",
                        help="emulated: only the plug-ins' own layer (the libraries need a GPU)")
    parser.add_argument("--only", action="append", choices=("layer", "cupy", "torch"),
                        help="run only these parts (repeatable; default: every part the backend has)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = Report()
    # each part on a thread of its own: it attaches itself to a task, as a task's thread would
    only = set(args.only or ("layer", "cupy", "torch"))
    parts = [(layer_rounds, (report, args.backend, args.rounds, args.pairs))] if "layer" in only else []
    if args.backend == "cuda" and "cupy" in only:
        parts.append((cupy_rounds, (report, args.rounds, args.steps, args.pairs)))
    for fn, fn_args in parts:
        t = threading.Thread(target=fn, args=fn_args)
        t.start()
        t.join()
    if args.backend == "cuda" and "torch" in only:
        torch_rounds(report, args.rounds, args.steps, args.pairs, out / "bench_allocators_torch.log")
    (out / "bench_allocators.json").write_text(json.dumps({"summary": report.summary(), "argv": sys.argv}, indent=1))
    print(report.text())


if __name__ == "__main__":
    main()
