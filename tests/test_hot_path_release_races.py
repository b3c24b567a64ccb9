"""The Java hot path's frees, copies and launches racing their task's release (issue 23, items 3
and 6.17), on both twins (the C one where built, and the Python reference), through the hot path's
public entry points.

A close documents that it has no effect once its task's release took the buffer
(``DeviceBuffer.close()``): the release freed it and counted it as a leak, so a free of it, single
or batched, neither raises nor counts. A copy, memset or launch of such a buffer is refused as its
task's (``UnknownTask``), one of a handle that is not live as a bad argument (``InvalidArgument``);
only frees say ``InvalidFree``.
"""

from __future__ import annotations

import random
import sys
import threading
import time

import pytest

from cudabridge.config import ServiceConfig
from cudabridge.errors import InvalidArgument, InvalidFree, UnknownTask
from cudabridge.jvm.hot_path import JavaHotPath
from cudabridge.memory import native
from cudabridge.service import CudaBridgeService

TWINS = [pytest.param("native", marks=pytest.mark.skipif(native.load() is None, reason="C fast paths not built")),
         "python"]


@pytest.fixture
def service():
    svc = CudaBridgeService(ServiceConfig(backend="emulated", emulated_kernels="host_kernels_for_tests",
                                          emulated_memory="256m", pool_limit="128m", streams_per_gpu=4,
                                          high_priority_streams=0, log_level="WARNING"))
    yield svc
    svc.close()


def _hot(service, fast_path: str) -> JavaHotPath:
    hot = JavaHotPath(service, fast_path=fast_path)
    assert hot.fast_path == fast_path
    return hot


@pytest.mark.parametrize("fast_path", TWINS)
def test_a_free_after_its_tasks_release_has_no_effect_and_counts_nothing(service, fast_path):
    hot = _hot(service, fast_path)
    service.bind_task(1)
    service.bind_task(2)
    hs = [hot.allocate(1, 4096)[0] for _ in range(10)]
    other, _ = hot.allocate(2, 4096)
    hot.free(hs[0])
    hot.free_many(hs[1:3])
    assert service.release_task(1).leaks_reclaimed == 7
    for h in hs[3:6]:
        hot.free(h)                                    # the release took it: no effect
        hot.free(h)                                    # ... every time
    assert hot.free_many(hs[6:]) == 0                  # a batch of them: nothing freed here
    assert hot.free_many([hs[6], other]) == 1          # with a live one: that one is freed
    c = hot.counters
    assert (c["frees"], c["batched_frees"], c["batches"]) == (1, 3, 3), c
    stats = service.memory_pool(0).statistics()
    assert (stats.live_allocations, stats.in_use_bytes) == (0, 0)
    # what is not a released task's stays refused
    with pytest.raises(InvalidFree, match="not live"):
        hot.free(hs[0])                                # freed by its own free: a double free
    with pytest.raises(InvalidFree, match="not live"):
        hot.free(1 << 20 << 6)                         # never handed out
    with pytest.raises(InvalidFree, match="1 not live"):
        hot.free_many([hs[7], hs[0]])
    with pytest.raises(InvalidFree, match="appears twice"):
        hot.free_many([hs[7], hs[7]])


@pytest.mark.parametrize("fast_path", TWINS)
def test_a_free_whose_allocation_the_release_reclaims_after_its_pop_has_no_effect(service, fast_path):
    """The other order: the free has taken the handle out of the table when the release reclaims
    its allocation (the pool then refuses the free as a stale handle): no effect, counted once,
    as the release's leak."""
    service.bind_task(1)
    hot = JavaHotPath(service, fast_path="python")
    real = hot._frees[0]
    popped, released = threading.Event(), threading.Event()

    def late_free(a):
        popped.set()
        assert released.wait(10)
        return real(a)

    hot._frees[0] = late_free
    if fast_path == "native":   # the C twin holds the frees it was built with: rebuild it
        hot._core = hot._native_core(fast_path)
    h, _ = hot.allocate(1, 4096)
    single = threading.Thread(target=hot.free, args=(h,))
    single.start()
    assert popped.wait(10)
    report = service.release_task(1)
    released.set()
    single.join(10)
    assert not single.is_alive()
    assert report.leaks_reclaimed == 1 and hot.counters["frees"] == 0

    service.bind_task(2)
    popped.clear()
    released.clear()
    hs = [hot.allocate(2, 4096)[0] for _ in range(3)]
    out: list = []
    batch = threading.Thread(target=lambda: out.append(hot.free_many(hs)))
    batch.start()
    assert popped.wait(10)                             # its first free is between pop and free
    report = service.release_task(2)
    released.set()
    batch.join(10)
    assert out == [0] and report.leaks_reclaimed == 3  # the release took all three
    assert hot.counters["batched_frees"] == 0
    stats = service.memory_pool(0).statistics()
    assert (stats.live_allocations, stats.in_use_bytes) == (0, 0)


@pytest.mark.parametrize("fast_path", TWINS)
def test_frees_racing_their_tasks_release_never_raise_and_count_each_buffer_once(service, fast_path):
    """The sweep's case: one thread closes buffers (one by one and in batches) while the task's own
    thread releases the task. Before, about 1 in 7,000 closes raised InvalidFree."""
    hot = _hot(service, fast_path)
    pool = service.memory_pool(0)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for round_ in range(40):
            task = 100 + round_
            service.bind_task(task)
            hs = [hot.allocate(task, 256)[0] for _ in range(400)]
            before = hot.counters
            errors: list[BaseException] = []
            go = threading.Barrier(2)

            def closer(seed: int = round_) -> None:
                rng = random.Random(seed)
                go.wait()
                i = 0
                try:
                    while i < len(hs):
                        n = rng.choice((1, 1, 1, 5))
                        if n == 1:
                            hot.free(hs[i])
                        else:
                            hot.free_many(hs[i:i + n])
                        i += n
                except BaseException as exc:
                    errors.append(exc)

            t = threading.Thread(target=closer)
            t.start()
            go.wait()
            time.sleep(random.Random(round_).random() * 0.003)
            report = service.release_task(task)
            t.join(30)
            assert not t.is_alive()
            assert not errors, errors
            after = hot.counters
            freed = (after["frees"] - before["frees"]) + (after["batched_frees"] - before["batched_frees"])
            assert freed + report.leaks_reclaimed == len(hs), (freed, report)
            stats = pool.statistics()
            assert (stats.live_allocations, stats.in_use_bytes) == (0, 0)
    finally:
        sys.setswitchinterval(interval)
    assert hot.live_handles == 0


@pytest.mark.parametrize("fast_path", TWINS)
def test_copies_and_launches_of_a_released_tasks_buffer_are_its_tasks_refusal(service, fast_path):
    """Item 6.17: while the release waits for an operation of the task, and after it, a copy,
    memset or launch of the task's buffer is refused with UnknownTask (it said InvalidFree); a
    handle that is not live with InvalidArgument."""
    hot = _hot(service, fast_path)
    reg = service.registry
    kid = hot.register_kernel(service.host_kernels.get("saxpy"))
    reg.bind(4)
    reg.bind(5)
    h, _ = hot.allocate(4, 4096)
    mine, _ = hot.allocate(5, 4096)
    gone, _ = hot.allocate(5, 64)
    hot.free(gone)
    data = memoryview(bytearray(64))
    launch_with = lambda x: hot.launch(5, kid, (1, 1, 1, 16, 1, 1), 0, (x, mine, 16, 0), bytes([0, 0, 3, 5]),
                                       (0, 0, 0, 0))
    calls = {
        "copy_in": lambda x: hot.copy_in(x, 0, data),
        "copy_out": lambda x: hot.copy_out(x, 0, data),
        "memset": lambda x: hot.memset(x, 0, 0, 64),
        "copy_device": lambda x: hot.copy_device(mine, 0, x, 0, 64),
        "launch": launch_with,
    }
    held = reg.enter(4)                                # an operation of task 4 in progress
    r = threading.Thread(target=lambda: reg.release(4), daemon=True)
    r.start()
    try:
        deadline = time.monotonic() + 10
        while 4 in reg.leases and time.monotonic() < deadline:
            time.sleep(0.001)
        for name, call in calls.items():
            if name == "launch":                       # its handle is live until the release drops it
                continue
            with pytest.raises(UnknownTask, match=f"{name}: device buffer handle {h:#x}: its task 4 is being released"):
                call(h)
    finally:
        reg.leave(held)
    r.join(10)
    assert not r.is_alive()
    for name, call in calls.items():                   # the release took it
        with pytest.raises(UnknownTask, match=f"{name}: device buffer handle {h:#x} was released with its task 4"):
            call(h)
        with pytest.raises(InvalidArgument, match=f"{name}: device buffer handle {gone:#x} is not live"):
            call(gone)
    service.synchronize(5)
    assert service.release_task(5).leaks_reclaimed == 1


class _Injected(Exception):
    """What the test injects (PyThreadState_SetAsyncExc) into a thread inside a hot path call."""


def _checkpoint() -> None:
    """A Python call: entering it raises an injected exception still pending."""


@pytest.mark.parametrize("fast_path", TWINS)
def test_asynchronous_exceptions_inside_hot_path_calls_never_strand_a_lease(service, fast_path):
    """Every hot path method enters its buffer's (or task's) lease as the registry's
    "Interruptions" section says (the append the first statement of the ``try``, the remove the
    first of its ``finally``), so an exception injected anywhere in the call leaves the thread
    recorded inside no lease: the task's release then never waits for it. The calls here enter
    the lease and are refused inside it (a range outside the buffer), or allocate and free."""
    import ctypes
    hot = _hot(service, fast_path)
    service.bind_task(9)
    h, _ = hot.allocate(9, 4096)
    other, _ = hot.allocate(9, 4096)
    data = memoryview(bytearray(64))
    ops = [lambda: hot.memset(h, 4090, 0, 64), lambda: hot.copy_in(h, 4090, data),
           lambda: hot.copy_out(h, 4090, data), lambda: hot.copy_device(h, 0, other, 4090, 64),
           lambda: hot.copy_in_address(h, 4090, 4096, data), lambda: hot.free(hot.allocate(9, 512)[0])]
    armed, ident, hits, errors = [False], [0], [0], []
    stop = threading.Event()
    set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async.argtypes = (ctypes.c_ulong, ctypes.py_object)

    def worker() -> None:
        ident[0] = threading.get_ident()
        rng = random.Random(9)
        while not stop.is_set():
            try:
                try:
                    armed[0] = True
                    rng.choice(ops)()
                except InvalidArgument:
                    pass
                except _Injected:
                    raise
                except Exception as exc:   # noqa: BLE001 - any other error is the defect
                    errors.append(exc)
                armed[0] = False
                _checkpoint()   # an exception injected before the line above is raised here
            except _Injected:
                hits[0] += 1

    t = threading.Thread(target=worker)
    t.start()
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        if armed[0]:   # read and injected under the GIL (pythonapi keeps it): the thread is in a call
            armed[0] = False
            set_async(ident[0], _Injected)
        time.sleep(0.0001)
    stop.set()
    t.join(30)
    assert not t.is_alive()
    assert not errors, errors[:3]
    assert hits[0] > 50, hits
    lease = service.registry.leases.get(9)
    stranded = list(lease.inside)
    lease.inside.clear()   # so that a failure here does not hang the release below
    assert stranded == [], f"{len(stranded)} stranded lease entries after {hits[0]} injections"
    service.release_task(9)


def test_the_handles_releases_took_are_remembered_up_to_a_bound():
    """What a free racing a release needs is kept, not every handle ever released: the newest
    RELEASED_KEPT, in the order the releases took them."""
    from cudabridge.jvm.handles import RELEASED_KEPT, HandleTable

    class Live:
        alive = True

    table = HandleTable()
    n = RELEASED_KEPT + 1000
    for h in range(1, n + 1):
        table.insert(h << 6, Live())
    assert table.forget([h << 6 for h in range(1, n + 1)], released_with=3) == [h << 6 for h in range(1, n + 1)]
    assert table.released_remembered == RELEASED_KEPT
    assert table.released_with(1 << 6) is None and table.released_with(n << 6) == 3
    assert table.released_with(1001 << 6) == 3 and table.released_with(1000 << 6) is None
    assert table.forget([5 << 6], released_with=4) == []   # not live: not taken, not remembered
    assert table.released_with(5 << 6) is None and len(table) == 0
