"""The Java hot path's C twin (jvm/_hotcore.c) against its Python reference (hot_path.py).

The JVM tests drive whichever is installed (the C one where built); here both run the same random
workloads on identical services and must agree on every result and every error, and the C one's
bad-input and race handling is checked call by call, from Python, without a JVM.
"""

from __future__ import annotations

import gc
import random
import threading
import time

import pytest

from cudabridge.config import ServiceConfig
from cudabridge.errors import InvalidArgument, InvalidFree, PoolClosed, UnknownTask
from cudabridge.jvm.hot_path import JavaHotPath
from cudabridge.memory import native
from cudabridge.service import CudaBridgeService

MiB = 1 << 20


def _core_built() -> bool:
    try:
        import cudabridge.jvm._hotcore  # noqa: F401
    except ImportError:
        return False
    return native.supported()[0]


needs_core = pytest.mark.skipif(not _core_built(), reason="jvm/_hotcore is not built or C fast paths are off")


def make_service(gpus: int = 1) -> CudaBridgeService:
    return CudaBridgeService(ServiceConfig(backend="emulated", emulated_devices=gpus, emulated_memory="256m",
                                           pool_limit="128m", streams_per_gpu=4, high_priority_streams=0))


@pytest.fixture
def service():
    svc = make_service()
    yield svc
    svc.close()


def test_dev_setup_builds_the_core():
    """Guards against the JVM suites silently running the Python hot path only."""
    if not native.supported()[0]:
        pytest.skip("C fast paths switched off")
    assert _core_built(), "dev/setup should build jvm/_hotcore (python -m cudabridge.memory.build_fastpath)"


def test_unknown_fast_path_is_refused(service):
    with pytest.raises(InvalidArgument, match="fast_path"):
        JavaHotPath(service, fast_path="turbo")


def test_python_choice_installs_nothing(service):
    hot = JavaHotPath(service, fast_path="python")
    assert hot.fast_path == "python"
    assert hot.allocate.__func__ is JavaHotPath.allocate


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # the type and the words must agree
        return ("error", type(exc).__name__, str(exc))


def _replay(fast_path: str, seed: int, gpus: int) -> list:
    svc = make_service(gpus)
    try:
        hot = JavaHotPath(svc, fast_path=fast_path)
        assert hot.fast_path == fast_path
        rng = random.Random(seed)
        tasks: list[int] = []
        handles: list[int] = []
        trace = []
        next_task = 100
        for _ in range(1500):
            op = rng.random()
            if op < 0.08 or not tasks:
                svc.registry.bind(next_task, gpu=rng.randrange(gpus))
                tasks.append(next_task)
                next_task += 1
            elif op < 0.12:
                t = tasks.pop(rng.randrange(len(tasks)))
                dropped = set(hot.forget_task(t))
                handles = [h for h in handles if h not in dropped]
                svc.registry.release(t)
                trace.append(("release", t, len(dropped)))
            elif op < 0.50:
                size = rng.choice([1, 256, 4096, 65536, MiB, 3 * MiB, 0, -5, 1 << 40])
                task = rng.choice(tasks + [999_999])
                r = _outcome(hot.allocate, task, size)
                trace.append(("allocate", task, size, r))
                if r[0] == "ok":
                    handles.append(r[1][0])
            elif op < 0.75 and handles:
                h = handles.pop(rng.randrange(len(handles)))
                trace.append(("free", h, _outcome(hot.free, h)))
            elif op < 0.80:
                trace.append(("free bad", _outcome(hot.free, rng.choice([12345 << 6, -1]))))
            elif op < 0.92 and handles:
                k = min(len(handles), rng.randrange(1, 20))
                batch = [handles.pop(rng.randrange(len(handles))) for _ in range(k)]
                trace.append(("free_many", tuple(batch), _outcome(hot.free_many, batch)))
            elif op < 0.96 and handles:
                batch = rng.sample(handles, min(len(handles), 3))
                bad = batch + [batch[0]] if rng.random() < 0.5 else batch + [777 << 6]
                trace.append(("free_many bad", _outcome(hot.free_many, bad)))
            else:
                trace.append(("stream", _outcome(hot.stream, rng.choice(tasks + [424242]))))
        trace.append(("counters", hot.counters, hot.live_handles))
        for t in list(tasks):
            hot.forget_task(t)
            svc.registry.release(t)
        trace.append(("after", hot.live_handles, [svc.memory_pool(g).statistics().live_allocations for g in range(gpus)]))
        return trace
    finally:
        svc.close()


@needs_core
@pytest.mark.parametrize("seed,gpus", [(1, 1), (2, 1), (3, 2), (4, 3)])
def test_c_and_python_agree_on_random_workloads(seed, gpus):
    py = _replay("python", seed, gpus)
    c = _replay("native", seed, gpus)
    assert len(py) == len(c)
    for i, (a, b) in enumerate(zip(py, c)):
        assert a == b, f"step {i}: python {a} != native {b}"
    assert py[-1][1] == 0 and py[-1][2] == [0] * gpus


@needs_core
def test_bad_inputs_are_refused_and_change_nothing(service):
    hot = JavaHotPath(service, fast_path="native")
    service.registry.bind(7)
    h, ptr = hot.allocate(7, 4096)
    before = (dict(hot._live.items()), hot.counters, service.memory_pool(0).statistics().in_use_bytes)
    with pytest.raises(UnknownTask, match="not bound"):
        hot.allocate(8, 4096)
    with pytest.raises(InvalidArgument, match="task attempt id must be an int, got str"):
        hot.allocate("7", 4096)
    with pytest.raises(InvalidArgument):
        hot.allocate(7, -1)
    with pytest.raises(InvalidArgument):
        hot.allocate(7, "big")
    with pytest.raises(TypeError):
        hot.allocate(7)
    with pytest.raises(InvalidFree, match="not live"):
        hot.free(h + (1 << 6))
    with pytest.raises(InvalidFree, match="a device buffer handle is an int, got list"):
        hot.free([h])                 # not a handle: refused, typed
    with pytest.raises(InvalidFree, match="got float"):
        hot.free(float(h))            # 1.0 would find handle 1 in the dict
    with pytest.raises(InvalidFree, match="nothing was freed"):
        hot.free_many([h, float(h)])
    with pytest.raises(InvalidFree, match="appears twice; nothing was freed"):
        hot.free_many([h, h])
    with pytest.raises(InvalidFree, match="1 not live"):
        hot.free_many([h, 5 << 6])
    with pytest.raises(TypeError):
        hot.free_many(42)
    with pytest.raises(UnknownTask):
        hot.stream(8)
    assert (dict(hot._live.items()), hot.counters, service.memory_pool(0).statistics().in_use_bytes) == before
    hot.free(h)
    with pytest.raises(InvalidFree, match="not live"):
        hot.free(h)                   # a second free of the same handle
    assert hot.live_handles == 0


@needs_core
def test_free_many_of_many_checks_duplicates(service):
    hot = JavaHotPath(service, fast_path="native")
    service.registry.bind(1)
    hs = [hot.allocate(1, 512)[0] for _ in range(40)]
    with pytest.raises(InvalidFree, match="appears twice"):
        hot.free_many(hs + [hs[17]])
    assert hot.live_handles == 40
    assert hot.free_many(tuple(hs)) == 40
    assert hot.counters["batched_frees"] == 40 and hot.counters["batches"] == 1
    assert hot.free_many([]) == 0


@pytest.mark.parametrize("fast_path", [pytest.param("native", marks=needs_core), "python"])
def test_release_waits_for_an_allocate_in_progress_and_refuses_later_ones(service, fast_path):
    """A release that begins while an allocate of its task is inside the pool (its slow path, say)
    waits for it, then reclaims it with the task; an allocate that comes after the release began
    is refused and changes nothing. Without the task lease the release reclaimed only what it
    saw, and the allocation finished afterwards belonged to nobody."""
    reg = service.registry
    pool = service.memory_pool(0)
    real = pool.allocate
    inside, go_on = threading.Event(), threading.Event()

    def slow_allocate(size, stream, owner=None):
        inside.set()
        go_on.wait(10)
        return real(size, stream, owner)

    hot = JavaHotPath(service, fast_path=fast_path)
    reg.bind(3)
    pool.allocate = slow_allocate
    hot._allocators[0] = slow_allocate
    if hot._core is not None:  # the C twin holds the allocator it was built with: rebuild it
        hot._core = hot._native_core(fast_path)
    got, reports = [], []
    t = threading.Thread(target=lambda: got.append(hot.allocate(3, 4096)))
    t.start()
    assert inside.wait(10)
    r = threading.Thread(target=lambda: reports.append(reg.release(3)))
    r.start()
    deadline = time.monotonic() + 10
    while 3 in reg.leases and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)
    assert not reports, "the release finished while an allocate of its task was in progress"
    with pytest.raises(UnknownTask):
        hot.allocate(3, 4096)      # the release has begun: refused
    go_on.set()
    t.join(10)
    r.join(10)
    pool.allocate = real
    assert len(got) == 1 and reports[0].leaks_reclaimed == 1   # reclaimed with the task
    assert hot.live_handles == 0
    assert pool.statistics().live_allocations == 0
    assert hot.counters["allocations"] == 1


@needs_core
def test_core_holds_no_references_after_close(service):
    hot = JavaHotPath(service, fast_path="native")
    service.registry.bind(5)
    for _ in range(1000):
        hot.free(hot.allocate(5, 64)[0])
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(5000):
        hot.free(hot.allocate(5, 64)[0])
        try:
            hot.free(1 << 6)
        except InvalidFree:
            pass
    gc.collect()
    assert len(gc.get_objects()) - before < 50


def test_release_many_releases_each_and_reports_failures_alone(service):
    """The lifecycle thread's batched release: every task released in order, its leaks counted;
    one task that cannot be released fails alone, with its message; the others still go."""
    from cudabridge.jvm.control import BridgeControl

    hot = JavaHotPath(service)
    control = BridgeControl(service, hot, {})
    for task in (1, 2, 3):
        control.native_bind(task, None, "normal")
    hot.allocate(1, 4096)
    hot.allocate(3, 100)
    hot.allocate(3, 200)
    counts, messages = control.native_release_many((1, 99, 2, 3))
    assert counts == (1, 4096, -1, -1, 0, 0, 2, 300)
    assert messages is not None and len(messages) == 4 and messages[0] is None and messages[2:] == (None, None)
    assert messages[1].startswith("UnknownTask") and "not bound" in messages[1]
    assert service.registry.tasks_bound == 0 and control.releases == 3
    assert control.native_release_many(()) == ((), None)
    control.shutdown()
    with pytest.raises(PoolClosed, match="releaseTasks after the cudabridge bridge was shut down"):
        control.native_release_many((5,))


def test_the_test_kernels_queue_nothing_once_the_release_has_begun(service):
    """fill_u32 and spin (the tools task code calls through callTool) run inside the task's lease
    like the copies: after the release began they are refused, nothing is queued."""
    from cudabridge.jvm import tools
    from cudabridge.jvm.control import BridgeControl

    hot = JavaHotPath(service)
    control = BridgeControl(service, hot, {})
    reg = service.registry
    reg.bind(4)
    h, _ = hot.allocate(4, 4096)
    tools.fill_u32(control, h, 7)              # bound: queued
    held = reg.enter(4)                        # an operation of the task in progress
    r = threading.Thread(target=lambda: reg.release(4), daemon=True)
    r.start()
    try:
        deadline = time.monotonic() + 10
        while 4 in reg.leases and time.monotonic() < deadline:
            time.sleep(0.001)
        stream = held.binding.stream
        before = service.backend._stream("query", stream)._enqueued
        with pytest.raises(UnknownTask, match="fill_u32: device buffer handle .* its task 4 is being released"):
            tools.fill_u32(control, h, 8)         # its task's release, not a bad free (issue 23 item 6.17)
        with pytest.raises(UnknownTask):
            tools.spin(control, 4, 0.0)
        assert service.backend._stream("query", stream)._enqueued == before, "work queued after the release began"
    finally:
        reg.leave(held)
    r.join(10)
    assert not r.is_alive()
