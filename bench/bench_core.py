"""Core benchmarks: the pool and the stream pool against the anchors, compared in interleaved rounds.

    python bench/bench_core.py [--backend cuda|emulated] [--quick] [--rounds 7] [--warmup 1] [--out DIR]

On the GPU machine it compares with cudaMalloc/cudaFree, cudaMallocAsync/cudaFreeAsync, CuPy's
pool, PyTorch's caching allocator and cudaStreamCreate/Destroy (the ones importable there).

How it measures (bench/rounds.py): each comparison is a group of candidates, run in a discarded
warm-up round and then --rounds rounds; a round runs every candidate of its group once, in an
order that rotates from round to round. A candidate is one batch of n calls timed as a whole (per
call = batch / n), or one thread-scaling run (aggregate pairs/s). The groups:

* pair: allocate+free of 1 MiB on one stream: ours (C fast path), ours (Python fast path), our
  cross-stream step (6 MiB, freed on stream A while A is idle, allocated on B; n/4 calls) and, on
  the GPU, cudaMallocAsync+cudaFreeAsync, cudaMalloc+cudaFree (n/20 calls), CuPy's pool, torch's
  caching allocator.
* streams: round-robin stream acquire, idle-first acquire (n/10), cudaStreamCreate+Destroy (n/10).
* threads: aggregate pairs/s with 1..16 threads, each on its own stream: ours and, on the GPU,
  cudaMallocAsync.

The trace replay (peak reserved / peak requested: no timing) and the hardware-queue test (a ratio
inside one subprocess) run once, on the GPU.

What the numbers mean: every row is a median over the rounds, with the min-max over the rounds
beside it. Per-call times and pairs/s move with the machine (about 2x between runs). The ratios
(anchor / ours, 16 threads / 1 thread, ...) are computed inside each round from measurements made
next to each other, so they are what to compare between runs and against the targets; a min-max
that straddles a target means this run does not decide it. Nothing is asserted; the table is
printed last and written as JSON under --out (bench_core_<backend>.json: "summary" holds every
row's median, min, max and per-round values, "raw" every round's results).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from rounds import Report, interleave, library_path  # noqa: E402

sys.path.insert(0, str(library_path()))

MiB = 1 << 20
report = Report()
OURS = "pool alloc+free 1 MiB, one stream"
OURS_PY = "same, Python fast path"
CROSS = "pool cross-stream alloc+free 6 MiB (other stream idle)"
MALLOC_ASYNC = "cudaMallocAsync+cudaFreeAsync 1 MiB"
RR, IDLE, CREATE = "stream acquire, round-robin", "stream acquire, idle-first", "cudaStreamCreate+Destroy"


def batch(loop, n: int):
    """A candidate: one batch of loop(n) (n calls), returning the time per call in us."""
    def run() -> float:
        t = time.perf_counter()
        loop(n)
        return (time.perf_counter() - t) / n * 1e6
    return run


def threaded(threads: int, per_thread: int, work) -> float:
    """Aggregate pairs/s of `threads` threads, thread i running work(i, per_thread), timed between
    two barriers."""
    barrier = threading.Barrier(threads + 1)

    def body(i: int) -> None:
        barrier.wait()
        work(i, per_thread)
        barrier.wait()
    ths = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for th in ths:
        th.start()
    barrier.wait()
    t0 = time.perf_counter()
    barrier.wait()
    took = time.perf_counter() - t0
    for th in ths:
        th.join()
    return threads * per_thread / took


def cuda_runtime():
    from cuda.bindings import runtime as rt

    def chk(r):
        if r[0] != rt.cudaError_t.cudaSuccess:
            raise RuntimeError(r)
        return r[1] if len(r) > 1 else None
    return rt, chk


def pair_group(backend, gpu: bool, n: int, closers: list):
    """Candidates of the pair group, notes for their rows, and the cross-stream pool."""
    from cudabridge.memory import StreamOrderedMemoryPool

    s, a, b = (backend.stream_create() for _ in range(3))
    closers += [lambda: [backend.stream_destroy(x) for x in (s, a, b)]]
    cands, notes = {}, {}
    for name, fast_path in ((OURS, "auto"), (OURS_PY, "python")):
        pool = StreamOrderedMemoryPool(backend, 0, [s], limit_bytes=1 << 30, fast_path=fast_path)
        closers.append(pool.close)
        alloc, free = pool.allocate, pool.free

        def pair(k, alloc=alloc, free=free):
            for _ in range(k):
                free(alloc(MiB, s))
        cands[name] = batch(pair, n)
        notes[name] = f"{pool.fast_path} fast path"

    cross = StreamOrderedMemoryPool(backend, 0, [a, b], limit_bytes=8 * MiB)
    closers.append(cross.close)
    cross.allocate(6 * MiB, a).free()  # the pool holds one 8 MiB chunk; this leaves 2 MiB beside it
    backend.stream_synchronize(a)

    def cross_pair(k, alloc=cross.allocate, free=cross.free):
        for i in range(k):
            free(alloc(6 * MiB, b if i & 1 else a))  # the only fitting block was freed on the other stream
    cands[CROSS] = batch(cross_pair, max(1, n // 4))
    notes[CROSS] = "target <= 1.5 us, no host sync"
    if not gpu:
        return cands, notes, cross
    rt, chk = cuda_runtime()
    cs = chk(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))

    def malloc_async(k):
        for _ in range(k):
            chk(rt.cudaFreeAsync(chk(rt.cudaMallocAsync(MiB, cs)), cs))

    def malloc(k):
        for _ in range(k):
            chk(rt.cudaFree(chk(rt.cudaMalloc(MiB))))
    cands[MALLOC_ASYNC] = batch(malloc_async, n)
    cands["cudaMalloc+cudaFree 1 MiB"] = batch(malloc, max(1, n // 20))
    try:
        import cupy

        def cp(k):
            for _ in range(k):
                x = cupy.cuda.alloc(MiB)
                del x
        cands["CuPy pool alloc+free 1 MiB"] = batch(cp, n)
        notes["CuPy pool alloc+free 1 MiB"] = "no cross-stream safety"
    except Exception as exc:
        report.missing("CuPy pool", repr(exc)[:60])
    try:
        import torch

        torch.empty(1, device="cuda")

        def th(k):
            for _ in range(k):
                x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
                del x
        cands["torch caching alloc+free 1 MiB"] = batch(th, n)
    except Exception as exc:
        report.missing("torch caching", repr(exc)[:60])
    return cands, notes, cross


def stream_group(backend, n: int, closers: list) -> dict:
    from cudabridge.stream_pool import StreamPool

    sp = StreamPool(backend, 0, 32, 0)
    closers.append(sp.close)
    acq = sp.acquire

    def rr(k):
        for _ in range(k):
            acq()

    def idle(k):
        for _ in range(k):
            acq(policy="idle-first")

    def create(k):
        for _ in range(k):
            backend.stream_destroy(backend.stream_create())
    return {RR: batch(rr, n), IDLE: batch(idle, max(1, n // 10)), CREATE: batch(create, max(1, n // 10))}


def thread_group(backend, gpu: bool, threads_list, per_thread: int, closers: list) -> dict:
    from cudabridge.memory import StreamOrderedMemoryPool

    streams = [backend.stream_create() for _ in range(max(threads_list))]
    pool = StreamOrderedMemoryPool(backend, 0, streams, limit_bytes=2 << 30)
    closers += [lambda: [backend.stream_destroy(s) for s in streams], pool.close]

    def ours(i, k):
        alloc, free, s = pool.allocate, pool.free, streams[i]
        for _ in range(k):
            free(alloc(MiB, s))
    cands = {f"pool pairs/s, {t} threads": (lambda t=t: threaded(t, per_thread, ours)) for t in threads_list}
    if gpu:
        rt, chk = cuda_runtime()
        cstreams = [chk(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)) for _ in range(max(threads_list))]

        def malloc_async(i, k):
            s = cstreams[i]
            for _ in range(k):
                chk(rt.cudaFreeAsync(chk(rt.cudaMallocAsync(MiB, s)), s))
        cands.update({f"cudaMallocAsync pairs/s, {t} threads": (lambda t=t: threaded(t, max(1, per_thread // 4), malloc_async))
                      for t in threads_list})
    return cands


def bench_fragmentation(backend, growth="auto"):
    import spark_trace as tr

    from cudabridge.memory import StreamOrderedMemoryPool

    events = tr.generate()
    peak = tr.peak_requested(events)
    streams = [backend.stream_create() for _ in range(tr.STREAMS)]
    pool = StreamOrderedMemoryPool(backend, 0, streams, growth=growth)
    label = pool.growth
    live = {}
    t0 = time.perf_counter()
    for ev in events:
        if ev[0] == "alloc":
            live[ev[1]] = pool.allocate(ev[2], streams[ev[3]])
        else:
            live.pop(ev[1]).free()
    took = time.perf_counter() - t0
    st = pool.statistics()
    pool.close()
    for s in streams:
        backend.stream_destroy(s)
    ratio = st.peak_reserved_bytes / peak
    report.ratio(f"trace: cudabridge ({label}) peak reserved / peak requested", [ratio], "lower",
                 f"peak req {peak / 2**30:.2f} GiB, {len(events)} events, {took:.2f} s, pieces moved {st.pieces_moved}")
    return ratio, peak, events


def bench_fragmentation_anchors(events, peak):
    import spark_trace as tr

    try:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_reserved()
        ss = [torch.cuda.Stream() for _ in range(tr.STREAMS)]
        live = {}
        for ev in events:
            if ev[0] == "alloc":
                with torch.cuda.stream(ss[ev[3]]):
                    live[ev[1]] = torch.empty(ev[2], dtype=torch.uint8, device="cuda")
            else:
                del live[ev[1]]
        torch.cuda.synchronize()
        r = (torch.cuda.max_memory_reserved() - base) / peak
        report.ratio("trace: torch peak reserved / peak requested", [r], "lower")
        torch.cuda.empty_cache()
    except Exception as exc:
        report.missing("trace: torch", repr(exc)[:60])
    try:
        from cuda.bindings import driver as drv
        from cuda.bindings import runtime as rt

        err, mp = rt.cudaDeviceGetDefaultMemPool(0)
        ss = [rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)[1] for _ in range(tr.STREAMS)]
        rt.cudaMemPoolSetAttribute(mp, rt.cudaMemPoolAttr.cudaMemPoolAttrReservedMemHigh, drv.cuuint64_t(0))
        live = {}
        for ev in events:
            if ev[0] == "alloc":
                e, p = rt.cudaMallocAsync(ev[2], ss[ev[3]])
                assert e == rt.cudaError_t.cudaSuccess, e
                live[ev[1]] = (p, ss[ev[3]])
            else:
                p, st = live.pop(ev[1])
                rt.cudaFreeAsync(p, st)
        rt.cudaDeviceSynchronize()
        err, high = rt.cudaMemPoolGetAttribute(mp, rt.cudaMemPoolAttr.cudaMemPoolAttrReservedMemHigh)
        report.ratio("trace: cudaMallocAsync peak reserved / peak requested", [int(high) / peak], "lower")
    except Exception as exc:
        report.missing("trace: cudaMallocAsync", repr(exc)[:60])


def chain_child(streams: int, chain: int, spin_s: float) -> None:
    """Run in a subprocess (CUDA_DEVICE_MAX_CONNECTIONS is read at context creation). The spin
    kernel is the tests' (tests/device_kernels.py), compiled by the first, unmeasured, launch."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from device_kernels import spin_async

    from cudabridge.device.cuda_backend import CudaBackend
    from cudabridge.stream_pool import StreamPool

    b = CudaBackend()
    b.set_device(0)
    sp = StreamPool(b, 0, streams, 0)
    hs = sp.handles
    spin_async(b, hs[0], 0.001)
    b.device_synchronize()

    def run(handles):
        t = time.perf_counter()
        for h in handles:
            for _ in range(chain):
                spin_async(b, h, spin_s)
        b.device_synchronize()
        return time.perf_counter() - t
    one = run(hs[:1])
    allx = run(hs)
    print(json.dumps({"one": one, "all": allx}))
    sp.close()


def bench_hardware_queues(streams=32, spin_s=0.02):
    out = {}
    for conns in ("32", "8"):
        for chain in (1, 2, 4):
            env = dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS=conns)
            r = subprocess.run([sys.executable, __file__, "--chain-child", str(streams), str(chain), str(spin_s)],
                               env=env, capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                report.missing(f"chains conns={conns} chain={chain}", r.stderr[-80:])
                continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            out[(conns, chain)] = d["all"] / d["one"]
            report.ratio(f"{streams} streams x chain {chain}, CUDA_DEVICE_MAX_CONNECTIONS={conns}: time / one stream",
                         [d["all"] / d["one"]], "lower", "one run (inside one process)")
    return out



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=7, help="rounds per comparison, after the warm-up")
    ap.add_argument("--warmup", type=int, default=1, help="discarded warm-up rounds")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--chain-child", nargs=3)
    args = ap.parse_args()
    if args.chain_child:
        chain_child(int(args.chain_child[0]), int(args.chain_child[1]), float(args.chain_child[2]))
        return
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    from cudabridge.device import open_backend

    backend = open_backend(args.backend)
    backend.set_device(0)
    gpu = backend.name == "cuda"
    n = 10000 if args.quick else 20000
    per_thread = 5000 if args.quick else 20000
    threads_list = (1, 2, 4, 8, 16)
    closers: list = []
    raw = {}

    cands, notes, cross = pair_group(backend, gpu, n, closers)
    res = raw["pair"] = interleave(cands, args.rounds, args.warmup)
    for name in cands:
        report.values_of(res, name, "us", "lower", notes.get(name, ""))
    st = cross.statistics()
    report.values("cross-stream host syncs, all rounds", [st.host_syncs], "", "lower",
                  f"gpu waits {st.gpu_waits}, stream polls {st.stream_polls}")
    report.ratio_of("cudaMallocAsync pair / our pair", res, MALLOC_ASYNC, OURS, "higher", "target >= 3.5x")
    report.ratio_of("CuPy pair / our pair", res, "CuPy pool alloc+free 1 MiB", OURS, "higher", "target >= 1")
    report.ratio_of("torch pair / our pair", res, "torch caching alloc+free 1 MiB", OURS, "higher")
    report.ratio_of("cudaMalloc pair / our pair", res, "cudaMalloc+cudaFree 1 MiB", OURS, "higher")
    report.ratio_of("Python fast path / C fast path", res, OURS_PY, OURS, "higher", f"ours: {notes[OURS]}")
    report.ratio_of("cross-stream pair / one-stream pair", res, CROSS, OURS, "lower")

    cands = stream_group(backend, n, closers)
    res = raw["streams"] = interleave(cands, args.rounds, args.warmup)
    for name in cands:
        report.values_of(res, name, "us", "lower")
    report.ratio_of("stream create+destroy / round-robin acquire", res, CREATE, RR, "higher", "target >= 20x")
    report.ratio_of("idle-first / round-robin acquire", res, IDLE, RR, "lower")

    cands = thread_group(backend, gpu, threads_list, per_thread, closers)
    res = raw["threads"] = interleave(cands, args.rounds, args.warmup)
    for name in cands:
        report.values_of(res, name, "/s", "higher")
    hi = max(threads_list)
    report.ratio_of(f"pool {hi} threads / 1 thread (aggregate)", res, f"pool pairs/s, {hi} threads",
                    "pool pairs/s, 1 threads", "higher", "target >= 0.8")
    report.ratio_of(f"cudaMallocAsync {hi} threads / 1 thread", res, f"cudaMallocAsync pairs/s, {hi} threads",
                    "cudaMallocAsync pairs/s, 1 threads", "higher")
    for close in reversed(closers):
        close()
    if gpu:
        ratio, peak, events = bench_fragmentation(backend)
        bench_fragmentation(backend, growth="chunks")
        bench_fragmentation_anchors(events, peak)
        bench_hardware_queues()
    backend.close()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"bench_core_{backend.name}.json"), "w") as f:
        json.dump({"backend": backend.name, "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": args.rounds,
                   "warmup": args.warmup, "quick": args.quick, "summary": report.summary(), "raw": raw}, f, indent=1)
    print(f"\n== bench_core on backend {backend.name} ({time.strftime('%Y-%m-%d %H:%M')}), median and min-max "
          f"over {args.rounds} interleaved rounds after {args.warmup} warm-up ==")
    print(report.text())


if __name__ == "__main__":
    main()
