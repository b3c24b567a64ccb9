"""A task released while its other threads still allocate (Spark: a task that ends, fails or is
killed while helper threads work for it).

The guarantee (task_registry.TaskLease): every allocation either completes before the release
reclaims (and is then freed by its thread or reclaimed as a leak) or is refused with
UnknownTask and changes nothing; after the release nothing is owned by the task, and no
operation of it is in progress. The sweep that found the defect saw 0-29 allocations per 30
rounds left live and owned by the released task.
"""

from __future__ import annotations

import random
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cudabridge.config import ServiceConfig
from cudabridge.errors import InvalidArgument, InvalidFree, UnknownTask
from cudabridge.jvm.hot_path import JavaHotPath
from cudabridge.memory import native
from cudabridge.service import CudaBridgeService

SIZES = (256, 4096, 65536, 3 << 20)


def _service(pool_fast_path: str, monkeypatch) -> CudaBridgeService:
    if pool_fast_path == "python":
        monkeypatch.setenv(native.ENV_SWITCH, "0")
    else:
        monkeypatch.delenv(native.ENV_SWITCH, raising=False)
        if native.load() is None:
            pytest.skip("the pool's C fast path is not built")
    svc = CudaBridgeService(ServiceConfig(backend="emulated", emulated_memory="512m", pool_limit="256m",
                                          streams_per_gpu=4, high_priority_streams=0, log_level="WARNING"))
    assert svc.memory_pool(0).fast_path == pool_fast_path
    return svc


def _race_round(svc, allocate, free, task: int, threads: int, seed: int, alone: bool = True,
                frees_counted=None) -> None:
    """``threads`` threads allocate (and sometimes free) for ``task`` until it is refused; the
    calling thread releases the task meanwhile. Checks that every allocation is accounted for:
    freed (a free that returned, or what ``frees_counted()`` counted meanwhile: the Java hot path's
    free of a buffer its task's release took returns with no effect) or reclaimed as a leak."""
    counted_before = frees_counted() if frees_counted is not None else 0
    svc.registry.bind(task)
    started = threading.Barrier(threads + 1)
    made = [0] * threads
    freed = [0] * threads
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        rng = random.Random(seed * 100 + k)
        held = []
        started.wait()
        try:
            while True:
                try:
                    held.append(allocate(task, rng.choice(SIZES)))
                except UnknownTask:
                    return
                made[k] += 1
                if len(held) > 3 or rng.random() < 0.3:
                    try:
                        free(held.pop(rng.randrange(len(held))))
                        freed[k] += 1
                    except InvalidFree:
                        pass  # reclaimed by the release first: counted there as a leak
        except BaseException as exc:  # anything else is a failure of the test
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in workers:
        t.start()
    started.wait()
    time.sleep(random.Random(seed).random() * 0.002)  # a varying head start for the allocators
    report = svc.release_task(task)
    for t in workers:
        t.join(30)
    assert not any(t.is_alive() for t in workers), "an allocating thread hung"
    assert not errors, errors
    mem = svc.memory_pool(0)
    assert mem.owned_by(task) == []
    if alone:  # no other task's allocations in the pool
        stats = mem.statistics()
        assert stats.live_allocations == 0, f"{stats.live_allocations} allocation(s) left live after the release"
        assert stats.in_use_bytes == 0
    frees = frees_counted() - counted_before if frees_counted is not None else sum(freed)
    assert sum(made) == frees + report.leaks_reclaimed


@pytest.mark.parametrize("pool_fast_path", ["native", "python"])
def test_release_while_12_threads_allocate_through_the_service(pool_fast_path, monkeypatch):
    svc = _service(pool_fast_path, monkeypatch)
    try:
        for round_ in range(30):
            _race_round(svc, svc.allocate, lambda a: a.free(), 1000 + round_, 12, round_)
    finally:
        svc.close()


@pytest.mark.parametrize("hot_fast_path", ["native", "python"])
def test_release_while_12_threads_allocate_through_the_java_hot_path(hot_fast_path, monkeypatch):
    svc = _service("native" if native.load() is not None else "python", monkeypatch)
    try:
        hot = JavaHotPath(svc, fast_path=hot_fast_path)
        for round_ in range(30):
            _race_round(svc, lambda t, n: hot.allocate(t, n)[0], hot.free, 2000 + round_, 12, round_,
                        frees_counted=lambda: hot.counters["frees"])
            assert hot.live_handles == 0
    finally:
        svc.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(threads=st.integers(1, 16), tasks=st.integers(1, 4), seed=st.integers(0, 2**16),
       python_pool=st.booleans())
def test_property_bind_allocate_release_races(threads, tasks, seed, python_pool, monkeypatch):
    """Several tasks at once, each with its own allocating threads, released in random order."""
    svc = _service("python" if python_pool or native.load() is None else "native", monkeypatch)
    try:
        failures: list[BaseException] = []

        def one_task(i: int) -> None:
            try:
                _race_round(svc, svc.allocate, lambda a: a.free(), 5000 + i, threads, seed + i, alone=False)
            except BaseException as exc:
                failures.append(exc)

        releasers = [threading.Thread(target=one_task, args=(i,)) for i in range(tasks)]
        for t in releasers:
            t.start()
        for t in releasers:
            t.join(60)
        assert not any(t.is_alive() for t in releasers), "a release hung"
        assert not failures, failures
        stats = svc.memory_pool(0).statistics()
        assert stats.live_allocations == 0 and stats.in_use_bytes == 0
        assert svc.registry.tasks_bound == 0
    finally:
        svc.close()



@pytest.mark.parametrize("pool_fast_path", ["python", "native"])
def test_bytes_in_use_stay_exact_under_threads(pool_fast_path, monkeypatch):
    """The sweep's case: 8 threads allocating and freeing 4 KiB and 5 MiB blocks. The Python path
    read a freed block's size after the block was visible to other threads (one of them could cut
    it first) and ended 4 KiB to 10 MiB below zero; the C path was exact."""
    svc = _service(pool_fast_path, monkeypatch)
    pool = svc.memory_pool(0)
    streams = svc.stream_pool(0).handles
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        rng = random.Random(k)
        try:
            for _ in range(1500):
                a = pool.allocate(rng.choice((4096, 5 << 20)), streams[rng.randrange(len(streams))])
                a.free()
        except BaseException as exc:
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)   # more thread switches inside the pool's steps
    try:
        for _ in range(4):   # the drift needs an unlucky switch: several rounds make it near certain
            threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not errors, errors
            s = pool.statistics()
            assert (s.in_use_bytes, s.live_allocations) == (0, 0)
    finally:
        sys.setswitchinterval(interval)
        svc.close()


def test_a_failed_set_device_inside_a_copy_leaves_the_lease(monkeypatch):
    """Two GPUs: a copy's set_device fails (a sticky error, say). The copy must leave the task's
    lease on that way out too, or the task's release would wait for it forever."""
    from cudabridge.errors import CudaError

    svc = CudaBridgeService(ServiceConfig(backend="emulated", emulated_devices=2, emulated_memory="64m",
                                          pool_limit="32m", streams_per_gpu=2, high_priority_streams=0,
                                          log_level="WARNING"))
    try:
        hot = JavaHotPath(svc, fast_path="python")
        svc.registry.bind(1, gpu=1)
        h, _ = hot.allocate(1, 4096)

        def failing(ordinal):
            raise CudaError("cudaSetDevice", 700, "cudaErrorIllegalAddress", "injected")

        monkeypatch.setattr(hot, "_set_device", failing)
        with pytest.raises(CudaError):
            hot.copy_in(h, 0, memoryview(bytearray(64)))
        assert svc.registry.leases[1].inside == []
        done = []
        t = threading.Thread(target=lambda: done.append(svc.release_task(1)))
        t.start()
        t.join(10)
        assert not t.is_alive() and done[0].leaks_reclaimed == 1
    finally:
        lease = svc.registry.leases.get(1)
        if lease is not None:
            lease.inside.clear()   # so that a failure here does not hang close()
        svc.close()


def test_a_task_id_cannot_be_bound_again_until_its_release_has_reclaimed(monkeypatch):
    """A release that waits for an operation of its task keeps the id: a bind of the same id
    meanwhile is refused, so the old release never reclaims the new task's memory."""
    svc = _service("python", monkeypatch)
    try:
        reg = svc.registry
        reg.bind(7)
        lease = reg.enter(7)                    # an operation of task 7 in progress
        r = threading.Thread(target=lambda: reg.release(7), daemon=True)
        r.start()
        try:
            deadline = time.monotonic() + 10
            while 7 in reg.leases and time.monotonic() < deadline:
                time.sleep(0.001)
            with pytest.raises(InvalidArgument, match="still being released"):
                reg.bind(7)
        finally:
            reg.leave(lease)                    # so that a failure above does not hang the release
        r.join(10)
        assert not r.is_alive()
        reg.bind(7)                             # now it may
        a = svc.allocate(7, 4096)
        assert a.alive
        assert svc.release_task(7).leaks_reclaimed == 1
    finally:
        svc.close()
