"""The pool's C fast path (memory/_fastpath.c) against its Python reference.

The rest of the suite runs on whichever path is active (native where built, as dev/setup does);
here the two are run side by side on the same operations, the native path's error handling is
checked call by call, and the pool suites are re-run with the C path switched off.
"""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from device_kernels import spin_async

from cudabridge.device import EmulatedBackend
from cudabridge.errors import InvalidArgument, InvalidFree, PoolClosed, UnknownStream
from cudabridge.memory import StreamOrderedMemoryPool
from cudabridge.memory import native

ROOT = Path(__file__).resolve().parents[1]
NATIVE_OFF = not native.supported()[0]
needs_native = pytest.mark.skipif(native.load() is None, reason="the C fast path is not built or is switched off")
MiB = 1 << 20


@pytest.fixture
def backend():
    b = EmulatedBackend(devices=1, memory_bytes=256 * MiB)
    yield b
    b.close()


def make_pool(backend, fast_path, streams, **kw):
    return StreamOrderedMemoryPool(backend, 0, streams, limit_bytes=64 * MiB, fast_path=fast_path, **kw)


def test_dev_setup_builds_the_native_path():
    """Guards against the whole suite silently running the Python path only."""
    if NATIVE_OFF:
        pytest.skip(f"{native.ENV_SWITCH} switches the C fast path off")
    assert native.load() is not None, "dev/setup should have built memory/_fastpath (python -m cudabridge.memory.build_fastpath)"


def test_unknown_fast_path_is_refused(backend):
    with pytest.raises(InvalidArgument, match="fast_path"):
        StreamOrderedMemoryPool(backend, 0, [], limit_bytes=MiB, fast_path="turbo")


def _replay(fast_path, seed):
    """A random single-threaded workload on a fresh device; returns everything observable."""
    backend = EmulatedBackend(devices=1, memory_bytes=256 * MiB)
    streams = [backend.stream_create() for _ in range(3)]
    pool = make_pool(backend, fast_path, streams)
    rng = random.Random(seed)
    live = []
    trace = []
    for step in range(3000):
        op = rng.random()
        if op < 0.55 or not live:
            size = rng.choice([1, 255, 256, 4096, 100_000, MiB, 3 * MiB])
            # No per-thread stream here: its frees record events that the emulated device
            # completes on a worker thread, which would make the replay timing-dependent (both
            # paths hand those frees to the same Python code anyway).
            s = rng.choice(streams)
            a = pool.allocate(size, s, owner=rng.choice([None, 1, 2]))
            live.append(a)
            trace.append(("a", a.ptr, a.size, a.id))
        elif op < 0.62:   # reissued: its own stream (a new handle) or another (None, nothing changed)
            i = rng.randrange(len(live))
            b = pool.reissue(live[i], rng.choice([live[i].stream, *streams]))
            if b is not None:
                live[i] = b
            trace.append(("i", None) if b is None else ("i", b.ptr, b.size, b.id, b.owner))
        elif op < 0.9:
            a = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.2:
                a.record_stream(rng.choice(streams))
            pool.free(a, stream=rng.choice([None, a.stream]))
            trace.append(("f", a.ptr))
        else:
            owner = rng.choice([1, 2])
            n, nbytes = pool.reclaim_owner(owner)
            live = [a for a in live if a.alive]
            trace.append(("r", n, nbytes))
        if step % 500 == 0:
            for s in streams:
                backend.stream_synchronize(s)
    for a in live:
        a.free()
    st = pool.statistics().as_dict()
    pool.close()
    for s in streams:
        backend.stream_destroy(s)
    backend.close()
    return trace, st


@needs_native
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_native_and_python_paths_agree(seed):
    trace_py, st_py = _replay("python", seed)
    trace_c, st_c = _replay("native", seed)
    assert trace_c == trace_py
    for key in ("in_use_bytes", "peak_in_use_bytes", "allocations", "live_allocations", "leaks_reclaimed",
                "leaked_bytes_reclaimed"):
        assert st_c[key] == st_py[key], key
    assert st_c["in_use_bytes"] == 0 and st_c["live_allocations"] == 0


@needs_native
def test_native_bad_input_is_refused_and_changes_nothing(backend):
    s = backend.stream_create()
    pool = make_pool(backend, "native", [s])
    assert pool.fast_path == "native"
    a = pool.allocate(1000, s, owner=7)
    before = pool.statistics()
    with pytest.raises(InvalidArgument, match="must be an int"):
        pool.allocate("1000", s)
    with pytest.raises(InvalidArgument, match="must be an int"):
        pool.allocate(True, s)
    with pytest.raises(InvalidArgument, match="positive"):
        pool.allocate(0, s)
    with pytest.raises(InvalidArgument, match="exceeds"):
        pool.allocate(1 << 80, s)
    with pytest.raises(UnknownStream):
        pool.allocate(10, 0xDEAD)
    with pytest.raises(InvalidArgument, match="int handle"):
        pool.allocate(10, [1])
    with pytest.raises(TypeError):
        pool.allocate(10)
    with pytest.raises(TypeError):
        pool.allocate(10, s, 7, 8)
    with pytest.raises(TypeError):
        pool.allocate(10, s, colour=1)
    with pytest.raises(InvalidFree, match="expects an Allocation"):
        pool.free(object())
    with pytest.raises(InvalidFree, match="expects an Allocation"):
        pool.free([1])
    with pytest.raises(UnknownStream):
        pool.free(a, 0xBEEF)
    with pytest.raises(TypeError):
        pool.free(a, s, s)
    with pytest.raises(TypeError):
        pool.free(a, strem=s)
    after = pool.statistics()
    assert after.in_use_bytes == before.in_use_bytes and after.live_allocations == 1
    pool.free(a, stream=s)
    with pytest.raises(InvalidFree, match="double free"):
        pool.free(a)
    b = pool.allocate(1000, s, owner=7)
    assert b.ptr == a.ptr and b.id != a.id      # the same block, a new identity
    assert pool.reclaim_owner(7) == (1, 1000)
    with pytest.raises(InvalidFree, match="stale handle"):
        pool.free(b)
    other = make_pool(backend, "native", [s])
    c = other.allocate(10, s)
    with pytest.raises(InvalidFree, match="belongs to the pool"):
        pool.free(c)
    other.free(c)
    other.close()
    pool.close()
    with pytest.raises(PoolClosed):
        pool.allocate(10, s)
    backend.stream_destroy(s)


@needs_native
def test_native_path_leaks_no_objects(backend):
    s = backend.stream_create()
    pool = make_pool(backend, "native", [s])
    alloc, free, reissue = pool.allocate, pool.free, pool.reissue

    def cycle(n):
        for i in range(n):
            free(reissue(alloc(MiB, s, owner=i & 3), s))
            pool.reclaim_owner(i & 3)

    cycle(2000)
    gc.collect()
    before = len(gc.get_objects())
    cycle(20000)
    gc.collect()
    assert len(gc.get_objects()) - before < 100
    pool.close()
    backend.stream_destroy(s)


@needs_native
def test_pool_suites_pass_on_the_python_path_too():
    """The Python fast path is the fallback (no compiler, free-threaded builds): keep it green."""
    env = dict(os.environ, **{native.ENV_SWITCH: "0"})
    suites = ["tests/test_memory_pool.py", "tests/test_seven_step_race.py", "tests/test_concurrency_stress.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *suites],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


@pytest.mark.parametrize("fast_path", ["native", "python"])
def test_reissue_hands_a_live_allocation_out_again_only_where_no_ordering_is_needed(backend, fast_path):
    """pool.reissue(a, stream): a free and an allocation of a's block on its own stream in one
    step (the library allocators' pair). A new handle of the same memory and owner; the old one is
    freed (its free refused); everything else (another stream, one recorded on it, a per-thread
    stream, an allocation not live, not an Allocation) is None with nothing changed."""
    if fast_path == "native" and native.load() is None:
        pytest.skip("the C fast path is not built")
    from cudabridge.device import PER_THREAD_STREAM

    s, t = backend.stream_create(), backend.stream_create()
    pool = make_pool(backend, fast_path, [s, t])
    a = pool.allocate(MiB, s, owner=7)
    before = pool.statistics()
    b = pool.reissue(a, s)
    after = pool.statistics()
    assert (b.ptr, b.size, b.stream, b.owner) == (a.ptr, a.size, a.stream, a.owner) and b.id != a.id
    assert b.alive and not a.alive
    assert (after.in_use_bytes, after.live_allocations, after.allocations) == (
        before.in_use_bytes, before.live_allocations, before.allocations + 1)
    with pytest.raises(InvalidFree):
        pool.free(a)
    assert pool.reissue(a, s) is None   # not live
    assert pool.reissue(b, t) is None and b.alive   # another stream: that needs ordering
    b.record_stream(t)
    assert pool.reissue(b, s) is None and b.alive   # another stream recorded on it
    c = pool.allocate(MiB, PER_THREAD_STREAM, owner=7)
    assert pool.reissue(c, PER_THREAD_STREAM) is None and c.alive   # one stream per thread behind handle 2
    assert pool.reissue(object(), s) is None and pool.reissue(b, "s") is None
    with pytest.raises(TypeError):
        pool.reissue(b)
    assert pool.reclaim_owner(7) == (2, 2 * MiB)   # b and c: the new handle is the owner's
    for x in (s, t):
        backend.stream_synchronize(x)
    pool.close()
    backend.stream_destroy(s)
    backend.stream_destroy(t)


@pytest.mark.parametrize("fast_path", ["native", "python"])
def test_recent_frees_stay_bounded(backend, fast_path):
    """Every free leaves an entry in its arena's ``recent`` deque; fast-path reuse never pops it,
    so without trimming a long-running executor would grow it without limit."""
    if fast_path == "native" and native.load() is None:
        pytest.skip("the C fast path is not built")
    s = backend.stream_create()
    pool = make_pool(backend, fast_path, [s])
    for _ in range(50_000):
        pool.free(pool.allocate(4096, s))
    arena = pool._streams.by_handle[s]
    assert len(arena.recent) <= 512
    pool.close()
    backend.stream_destroy(s)


@pytest.mark.parametrize("fast_path", ["native", "python"])
def test_cross_stream_reuse_takes_a_passed_block_without_the_slow_path(backend, fast_path):
    if fast_path == "native" and native.load() is None:
        pytest.skip("the C fast path is not built")
    a, b = backend.stream_create(), backend.stream_create()
    pool = make_pool(backend, fast_path, [a, b])
    x = pool.allocate(MiB, a)
    ptr = x.ptr
    pool.free(x)
    slow = pool.statistics().slow_allocations
    y = pool.allocate(MiB, b)       # a is idle: one stream query proves the free passed
    st = pool.statistics()
    assert y.ptr == ptr and st.fast_steals == 1 and st.slow_allocations == slow and st.host_syncs == 0
    pool.free(y)
    # b busy with slow work: its block must not be handed to a on the host's word.
    spin_async(backend, b, 0.3)
    z = pool.allocate(MiB, a)
    assert pool.statistics().fast_steals == 1
    if z.ptr == ptr:                 # then a waits for b on the device, never on the host
        assert pool.statistics().gpu_waits >= 1
    pool.free(z)
    backend.stream_synchronize(b)
    pool.close()
    backend.stream_destroy(a)
    backend.stream_destroy(b)
