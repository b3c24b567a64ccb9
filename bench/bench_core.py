"""Core benchmarks: the pool and stream pool against the anchors, as ratios measured in one run.

    python bench/bench_core.py [--backend cuda|emulated] [--quick] [--out DIR]

On the GPU machine it compares with cudaMalloc/cudaFree, cudaMallocAsync/cudaFreeAsync, CuPy's
pool, PyTorch's caching allocator and cudaStreamCreate/Destroy (the ones importable there).
Per-call times are medians over batches (each batch timed as a whole, per call = batch/n).
Nothing is asserted: the table is printed last and written as JSON under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

MiB = 1 << 20
rows: list[tuple[str, str, str]] = []
results: dict[str, float] = {}


def row(name: str, value: float, unit: str, note: str = "") -> None:
    results[name] = value
    rows.append((name, f"{value:,.3f} {unit}", note))


def per_call(fn, n: int, batches: int) -> float:
    """Median over batches of the per-call time of fn(n) (which runs n calls), in us."""
    fn(min(n, 1000))  # warm up
    samples = []
    for _ in range(batches):
        t = time.perf_counter()
        fn(n)
        samples.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(samples)


def bench_pool_fast_path(backend, n, batches, fast_path="auto"):
    from cudabridge.memory import StreamOrderedMemoryPool

    s = backend.stream_create()
    pool = StreamOrderedMemoryPool(backend, 0, [s], limit_bytes=1 << 30, fast_path=fast_path)
    alloc, free = pool.allocate, pool.free

    def loop(k):
        for _ in range(k):
            free(alloc(MiB, s))
    us = per_call(loop, n, batches)
    row(f"pool alloc+free 1MiB, one stream ({pool.fast_path} fast path)", us, "us")
    pool.close()
    backend.stream_destroy(s)
    return us


def bench_cross_stream(backend, n, batches):
    """Freed on A after A's work completed, allocated on B: alternate streams every pair."""
    from cudabridge.memory import StreamOrderedMemoryPool

    a, b = backend.stream_create(), backend.stream_create()
    pool = StreamOrderedMemoryPool(backend, 0, [a, b], limit_bytes=8 * MiB)
    alloc, free = pool.allocate, pool.free
    blk = alloc(6 * MiB, a)  # the pool holds one 8 MiB chunk; this leaves 2 MiB beside it
    free(blk)
    backend.stream_synchronize(a)

    def loop(k):
        for i in range(k):
            x = alloc(6 * MiB, b if i & 1 else a)  # the only fitting block was freed on the other stream
            free(x)
    us = per_call(loop, n, batches)
    st = pool.statistics()
    row("pool cross-stream alloc+free (other stream idle)", us, "us",
        f"host syncs {st.host_syncs}, gpu waits {st.gpu_waits}, stream polls {st.stream_polls}")
    results["cross_stream_host_syncs"] = st.host_syncs
    pool.close()
    backend.stream_destroy(a)
    backend.stream_destroy(b)
    return us


def bench_streams(backend, n, batches):
    from cudabridge.stream_pool import StreamPool

    sp = StreamPool(backend, 0, 32, 0)
    acq = sp.acquire

    def rr(k):
        for _ in range(k):
            acq()
    rr_us = per_call(rr, n, batches)

    def idle(k):
        for _ in range(k):
            acq(policy="idle-first")
    idle_us = per_call(idle, max(1, n // 10), batches)

    def create(k):
        for _ in range(k):
            backend.stream_destroy(backend.stream_create())
    create_us = per_call(create, max(1, n // 10), batches)
    row("stream acquire, round-robin", rr_us, "us")
    row("stream acquire, idle-first", idle_us, "us", "queries streams")
    row("cudaStreamCreate+Destroy", create_us, "us")
    sp.close()
    return rr_us, create_us


def bench_threads(backend, per_thread, threads_list):
    """Aggregate allocate+free pairs/s with T threads, each on its own pool stream."""
    from cudabridge.memory import StreamOrderedMemoryPool

    streams = [backend.stream_create() for _ in range(max(threads_list))]
    pool = StreamOrderedMemoryPool(backend, 0, streams, limit_bytes=2 << 30)
    out = {}
    for t in threads_list:
        barrier = threading.Barrier(t + 1)

        def work(s):
            alloc, free = pool.allocate, pool.free
            barrier.wait()
            for _ in range(per_thread):
                free(alloc(MiB, s))
            barrier.wait()
        ths = [threading.Thread(target=work, args=(streams[i],)) for i in range(t)]
        for th in ths:
            th.start()
        barrier.wait()
        t0 = time.perf_counter()
        barrier.wait()
        out[t] = t * per_thread / (time.perf_counter() - t0)
        for th in ths:
            th.join()
    pool.close()
    for s in streams:
        backend.stream_destroy(s)
    return out


def bench_cuda_anchors(n, batches, threads_list, per_thread):
    from cuda.bindings import runtime as rt

    ok = rt.cudaError_t.cudaSuccess

    def chk(r):
        if r[0] != ok:
            raise RuntimeError(r)
        return r[1] if len(r) > 1 else None
    s = chk(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))

    def malloc(k):
        for _ in range(k):
            p = chk(rt.cudaMalloc(MiB))
            chk(rt.cudaFree(p))
    row("cudaMalloc+cudaFree 1MiB", per_call(malloc, max(1, n // 20), batches), "us")

    def malloc_async(k):
        for _ in range(k):
            p = chk(rt.cudaMallocAsync(MiB, s))
            chk(rt.cudaFreeAsync(p, s))
    row("cudaMallocAsync+cudaFreeAsync 1MiB", per_call(malloc_async, n, batches), "us")

    streams = [chk(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)) for _ in range(max(threads_list))]
    out = {}
    for t in threads_list:
        barrier = threading.Barrier(t + 1)

        def work(st):
            barrier.wait()
            for _ in range(per_thread):
                p = chk(rt.cudaMallocAsync(MiB, st))
                chk(rt.cudaFreeAsync(p, st))
            barrier.wait()
        ths = [threading.Thread(target=work, args=(streams[i],)) for i in range(t)]
        for th in ths:
            th.start()
        barrier.wait()
        t0 = time.perf_counter()
        barrier.wait()
        out[t] = t * per_thread / (time.perf_counter() - t0)
        for th in ths:
            th.join()
    chk(rt.cudaDeviceSynchronize())
    return out


def bench_cupy_torch(n, batches):
    try:
        import cupy

        def cp(k):
            for _ in range(k):
                x = cupy.cuda.alloc(MiB)
                del x
        row("CuPy pool alloc+free 1MiB", per_call(cp, n, batches), "us", "no cross-stream safety")
    except Exception as exc:
        rows.append(("CuPy pool", "n/a", repr(exc)[:60]))
    try:
        import torch

        torch.empty(1, device="cuda")

        def th(k):
            for _ in range(k):
                x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
                del x
        row("torch caching alloc+free 1MiB", per_call(th, n, batches), "us")
    except Exception as exc:
        rows.append(("torch caching", "n/a", repr(exc)[:60]))


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
    row(f"trace: cudabridge ({label}) peak reserved / peak requested", ratio, "x",
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
        row("trace: torch peak reserved / peak requested", r, "x")
        torch.cuda.empty_cache()
    except Exception as exc:
        rows.append(("trace: torch", "n/a", repr(exc)[:60]))
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
        row("trace: cudaMallocAsync peak reserved / peak requested", int(high) / peak, "x")
    except Exception as exc:
        rows.append(("trace: cudaMallocAsync", "n/a", repr(exc)[:60]))


def chain_child(streams: int, chain: int, spin_s: float) -> None:
    """Run in a subprocess (CUDA_DEVICE_MAX_CONNECTIONS is read at context creation)."""
    from cudabridge.device.cuda_backend import CudaBackend
    from cudabridge.stream_pool import StreamPool

    b = CudaBackend()
    b.set_device(0)
    sp = StreamPool(b, 0, streams, 0)
    hs = sp.handles
    b.spin_async(hs[0], 0.001)
    b.device_synchronize()

    def run(handles):
        t = time.perf_counter()
        for h in handles:
            for _ in range(chain):
                b.spin_async(h, spin_s)
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
                rows.append((f"chains conns={conns} chain={chain}", "error", r.stderr[-80:]))
                continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            out[(conns, chain)] = d["all"] / d["one"]
            row(f"{streams} streams x chain {chain}, CUDA_DEVICE_MAX_CONNECTIONS={conns}: time / one stream",
                d["all"] / d["one"], "x")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--quick", action="store_true")
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
    n, batches = (2000, 7) if args.quick else (20000, 15)
    threads_list = (1, 2, 4, 8, 16)
    per_thread = 2000 if args.quick else 20000

    ours = bench_pool_fast_path(backend, n, batches)
    if gpu:
        bench_pool_fast_path(backend, n, batches, fast_path="python")
    cross = bench_cross_stream(backend, max(1, n // 4), batches)
    rr_us, create_us = bench_streams(backend, n, batches)
    row("stream create+destroy / round-robin acquire", create_us / rr_us, "x", "target >= 20x")
    thr = bench_threads(backend, per_thread, threads_list)
    for t, v in thr.items():
        row(f"pool pairs/s, {t} threads", v, "/s")
    row("pool 16 threads / 1 thread (aggregate)", thr[16] / thr[1], "x", "target >= 0.8")
    if gpu:
        anchors = bench_cuda_anchors(n, batches, threads_list, max(1, per_thread // 4))
        for t, v in anchors.items():
            row(f"cudaMallocAsync pairs/s, {t} threads", v, "/s")
        row("cudaMallocAsync 16 threads / 1 thread", anchors[16] / anchors[1], "x")
        bench_cupy_torch(n, batches)
        ma = results["cudaMallocAsync+cudaFreeAsync 1MiB"]
        row("cudaMallocAsync pair / cudabridge pair", ma / ours, "x", "target >= 3.5x")
        if "CuPy pool alloc+free 1MiB" in results:
            row("CuPy pair / cudabridge pair", results["CuPy pool alloc+free 1MiB"] / ours, "x", "target >= 1")
        if "torch caching alloc+free 1MiB" in results:
            row("torch pair / cudabridge pair", results["torch caching alloc+free 1MiB"] / ours, "x")
        ratio, peak, events = bench_fragmentation(backend)
        bench_fragmentation(backend, growth="chunks")
        bench_fragmentation_anchors(events, peak)
        bench_hardware_queues()
    backend.close()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"bench_core_{backend.name}.json"), "w") as f:
        json.dump({"rows": rows, "results": {k: v for k, v in results.items()}}, f, indent=1)
    w = max(len(r[0]) for r in rows)
    print(f"\n== bench_core on backend {backend.name} ({time.strftime('%Y-%m-%d %H:%M')}) ==")
    for name, value, note in rows:
        print(f"{name:<{w}}  {value:>18}  {note}")


if __name__ == "__main__":
    main()
