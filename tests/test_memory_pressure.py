"""Memory pressure (pressure/): allocations that wait for other tasks' frees instead of failing,
the deadlock breaker (a hypothesis test over random wait graphs, then real threads on the emulated
device), admission of a GPU's tasks, and waiters that leave when their task is released."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cudabridge.config import ServiceConfig
from cudabridge.errors import OutOfDeviceMemory, UnknownTask
from cudabridge.pressure.breaker import victim
from cudabridge.pressure.waits import ADMISSION, ALLOCATION, Wait
from cudabridge.service import CudaBridgeService

MIB = 1 << 20


# the breaker over random wait graphs -------------------------------------------------------------
@st.composite
def graphs(draw):
    tasks = list(range(1, draw(st.integers(1, 7)) + 1))
    holders = {t: draw(st.sampled_from([0, 0, 256, 4096, MIB])) for t in tasks}
    waits = []
    for t in tasks:
        for _ in range(draw(st.integers(0, 2))):   # threads of the task waiting
            kind = draw(st.sampled_from([ALLOCATION, ALLOCATION, ADMISSION]))
            waits.append(Wait(kind, t, 0, 256 if kind == ALLOCATION else 0, draw(st.integers(1, 99)), 0.0, len(waits)))
    # running: a thread inside one of the task's operations that is not waiting (a copy, a launch,
    # a Python function)
    running = {t for t in tasks if draw(st.booleans()) and draw(st.booleans())}
    order = {t: draw(st.integers(0, 5)) for t in tasks}
    # threads waiting in the bridge for the gate or the GIL, on their way into an operation: of a
    # task (any, holder or not), or of no known task (a free names a handle)
    entering = draw(st.lists(st.sampled_from(tasks + [None]), max_size=3))
    return holders, waits, running, order, entering


@settings(max_examples=600, deadline=None)
@given(graphs())
def test_the_breaker_fails_only_when_every_holder_waits_and_then_the_youngest(graph):
    holders, waits, running, order, entering = graph
    picked = victim(holders, waits, running, order, entering)
    held = {t for t, n in holders.items() if n}
    waiting = {w.task for w in waits}
    alloc = {w.task for w in waits if w.kind == ALLOCATION}
    blocked = {t for t in held if t in waiting and t not in running and t not in entering}
    if picked is None:
        # never a hang: no allocation waits, or some holder can still give memory back (a thread of
        # no known task entering the bridge may be a holder's)
        assert not alloc or (held and (blocked != held or None in entering)) or (held and not (held & alloc))
        return
    task, reason = picked
    assert task in alloc
    if reason == "too_large":
        assert not held   # nothing any task could give back
        assert order.get(task, 0) == min(order.get(t, 0) for t in alloc)
    else:
        assert reason == "breaker"
        assert blocked == held, "a break while a holder runs, enters the bridge or is between operations"
        assert None not in entering, "a break while a thread that may be a holder's enters the bridge"
        assert task in held
        assert (order[task], task) == max((order[t], t) for t in held & alloc)   # the youngest waiting holder


def test_a_holder_running_alongside_its_waiting_thread_is_never_broken():
    """Task 1's thread waits while another of its threads runs (a copy): not blocked."""
    waits = [Wait(ALLOCATION, 1, 0, 256, 11, 0.0, 1), Wait(ALLOCATION, 2, 0, 256, 12, 0.0, 2)]
    assert victim({1: MIB, 2: MIB}, waits, {1}, {1: 1, 2: 2}) is None
    assert victim({1: MIB, 2: MIB}, waits, set(), {1: 1, 2: 2}) == (2, "breaker")


def test_a_holder_whose_thread_waits_in_the_bridge_for_the_gil_is_never_broken():
    """Both holders wait for memory, but a thread of task 2 waits in the bridge for the GIL (Java
    sees it RUNNABLE; Python not at all): it is on its way to a free, so no break. A thread of no
    known task (a free names a handle) may be either's. A non-holder's entering thread changes nothing."""
    waits = [Wait(ALLOCATION, 1, 0, 256, 11, 0.0, 1), Wait(ALLOCATION, 2, 0, 256, 12, 0.0, 2)]
    holders, order = {1: MIB, 2: MIB}, {1: 1, 2: 2}
    assert victim(holders, waits, set(), order, [2]) is None
    assert victim(holders, waits, set(), order, [None]) is None
    assert victim(holders, waits, set(), order, [3]) == (2, "breaker")


# real threads on the emulated device --------------------------------------------------------------
@pytest.fixture
def make_service(emulated):
    made = []

    def make(**conf):
        svc = CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=8, high_priority_streams=0,
                                              pool_limit="8m", **conf), backend=emulated)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


def _thread(fn):
    out = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as exc:   # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _until(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.002)


def test_an_allocation_waits_for_another_tasks_free_and_succeeds(make_service):
    svc = make_service(oom_wait=10)
    svc.bind_task(1)
    svc.bind_task(2)
    held = svc.allocate(1, 6 * MIB)
    t, out = _thread(lambda: svc.allocate(2, 4 * MIB))
    _until(lambda: svc.statistics().pressure.allocations_waiting == 1)
    time.sleep(0.05)
    assert t.is_alive()   # waiting, not failed: task 1 holds memory and is not waiting
    held.free()
    t.join(10)
    assert "error" not in out, out
    s = svc.statistics().pressure
    assert s.allocations_waiting == 0 and s.allocation_waits >= 1 and s.allocation_wait_us_total > 0
    out["result"].free()


def test_when_every_holder_waits_the_youngest_fails_with_the_breaker_and_the_other_proceeds(make_service):
    svc = make_service(oom_wait=30)
    svc.bind_task(1)
    svc.bind_task(2)   # bound later: the younger
    a1 = svc.allocate(1, 4 * MIB)
    a2 = svc.allocate(2, 3 * MIB)
    t1, out1 = _thread(lambda: svc.allocate(1, 4 * MIB))
    _until(lambda: svc.statistics().pressure.allocations_waiting == 1)
    t0 = time.monotonic()
    with pytest.raises(OutOfDeviceMemory) as info:
        svc.allocate(2, 4 * MIB)   # now both holders wait: task 2 (youngest) fails at once
    assert info.value.reason == "breaker" and time.monotonic() - t0 < 5
    assert "deadlock breaker" in str(info.value)
    a2.free()   # what a retry helper does: free what the block allocated
    t1.join(10)
    assert "error" not in out1, out1
    assert svc.statistics().pressure.oom_breaks == 1
    a1.free()
    out1["result"].free()


def test_a_wait_past_oom_wait_fails_with_timeout(make_service):
    svc = make_service(oom_wait=0.2)
    svc.bind_task(1)
    svc.bind_task(2)
    held = svc.allocate(1, 6 * MIB)   # task 1 holds and does nothing: not waiting, so no break
    t0 = time.monotonic()
    with pytest.raises(OutOfDeviceMemory) as info:
        svc.allocate(2, 4 * MIB)
    assert info.value.reason == "timeout" and 0.15 < time.monotonic() - t0 < 5
    assert svc.statistics().pressure.oom_wait_timeouts == 1
    held.free()


def test_a_waiting_allocation_leaves_at_once_when_its_task_is_released(make_service):
    svc = make_service(oom_wait=30)
    svc.bind_task(1)
    svc.bind_task(2)
    held = svc.allocate(1, 6 * MIB)
    t, out = _thread(lambda: svc.allocate(2, 4 * MIB))
    _until(lambda: svc.statistics().pressure.allocations_waiting == 1)
    t0 = time.monotonic()
    svc.release_task(2)   # a killed task: its release waits for its operations, which leave
    t.join(10)
    assert time.monotonic() - t0 < 5 and isinstance(out.get("error"), UnknownTask), out
    held.free()
    assert svc.memory_pool(0).statistics().in_use_bytes == 0


def test_no_task_holds_memory_and_the_request_cannot_fit_fails_at_once(make_service):
    svc = make_service(oom_wait=30)
    svc.bind_task(1)
    outside = svc.memory_pool(0).allocate(6 * MIB, svc.registry.binding(1).stream)   # the executor's: no task's
    with pytest.raises(OutOfDeviceMemory) as info:
        svc.allocate(1, 4 * MIB)
    assert info.value.reason == "too_large"
    with pytest.raises(OutOfDeviceMemory) as info:   # and the executor's own allocation never waits
        svc.memory_pool(0).allocate(4 * MIB, svc.registry.binding(1).stream)
    assert info.value.reason == "no_wait"
    outside.free()


def test_admission_bounds_the_tasks_and_admits_in_arrival_order(make_service):
    svc = make_service(concurrent_gpu_tasks=1)
    svc.bind_task(1)
    order = []
    threads = []
    for task in (2, 3, 4):
        t, out = _thread(lambda task=task: (svc.bind_task(task), order.append(task)))
        threads.append((t, out))
        _until(lambda n=len(threads): svc.statistics().pressure.tasks_waiting_admission == n)
    assert svc.statistics().pressure.tasks_admitted == 1
    svc.release_task(1)
    _until(lambda: order == [2])
    svc.release_task(2)
    _until(lambda: order == [2, 3])
    svc.release_task(3)
    _until(lambda: order == [2, 3, 4])
    for t, out in threads:
        t.join(5)
        assert "error" not in out, out
    s = svc.statistics().pressure
    assert s.admission_waits == 3 and s.tasks_waiting_admission == 0 and s.admission_wait_us_total > 0
    svc.release_task(4)


def test_a_task_released_while_it_waits_for_admission_leaves(make_service):
    from cudabridge.jvm.control import BridgeControl
    from cudabridge.jvm.hot_path import JavaHotPath

    svc = make_service(concurrent_gpu_tasks=1)
    control = BridgeControl(svc, JavaHotPath(svc), {})
    svc.bind_task(1)
    t, out = _thread(lambda: svc.bind_task(2))
    _until(lambda: svc.statistics().pressure.tasks_waiting_admission == 1)
    assert control.release_task(2) == (0, 0)   # Java's release of a task whose bind waits
    t.join(5)
    assert isinstance(out.get("error"), UnknownTask), out
    assert svc.statistics().pressure.tasks_waiting_admission == 0
    svc.release_task(1)
    svc.bind_task(3)   # the place is free
    svc.release_task(3)


def test_a_killed_tasks_waits_end_at_once_and_it_never_waits_again_until_released(make_service):
    """MemoryPressure.cancel: what the plugin's kill watch calls when Spark interrupts a task."""
    svc = make_service(oom_wait=30)
    svc.bind_task(1)
    svc.bind_task(2)
    held = svc.allocate(1, 6 * MIB)
    t, out = _thread(lambda: svc.allocate(2, 4 * MIB))
    _until(lambda: svc.statistics().pressure.allocations_waiting == 1)
    t0 = time.monotonic()
    svc.pressure.cancel(2)
    t.join(5)
    assert time.monotonic() - t0 < 2 and isinstance(out.get("error"), UnknownTask), out
    assert "was killed" in str(out["error"])
    with pytest.raises(UnknownTask):   # killed: an allocation that does not fit fails at once
        svc.allocate(2, 4 * MIB)
    small = svc.allocate(2, MIB)   # one that fits is made as usual (the task may still be finishing)
    assert svc.statistics().pressure.waits_ended_by_kill == 2
    svc.release_task(2)
    svc.bind_task(2)   # a new binding of the id is not killed
    held.free()
    assert svc.allocate(2, 4 * MIB).size == 4 * MIB
    assert not small.alive


def test_interruptions_into_waiting_allocations_never_strand_a_wait_or_a_lease(make_service, caplog):
    """KeyboardInterrupt injected into threads whose allocations wait for each other's memory
    (async_storm, about every millisecond): afterwards no wait is left in the table, no lease
    entry stranded, and all memory comes back."""
    import logging

    from interruption_storms import async_storm

    # The breaker logs each break; CPython's logging is not safe against asynchronous exceptions (one
    # landing between a handler's acquire and its try strands the handler's lock), so it is quiet here.
    caplog.set_level(logging.CRITICAL, logger="cudabridge.pressure")   # restored after the test
    svc = make_service(oom_wait=0.3)
    tasks = [21, 22, 23, 24]
    for t in tasks:
        svc.bind_task(t)

    def op(i, rng, held):
        if len(held) < 2 and rng.random() < 0.6:
            held.append(svc.allocate(tasks[i], rng.choice((MIB, 2 * MIB, 3 * MIB))))   # 4 tasks over 8 MiB: waits
        elif held:
            held.pop().free()

    hits, errors, finished = async_storm(len(tasks), 3.0, op, expected=(OutOfDeviceMemory,))
    assert finished, "a worker thread hung"
    assert not errors, f"{len(errors)} errors besides the interruptions, first: {errors[0]!r}"
    assert sum(hits) > 20, hits
    assert svc.pressure.waits.snapshot() == [] and svc.statistics().pressure.allocations_waiting == 0
    stale = {t: len(svc.registry.leases[t].inside) for t in tasks if svc.registry.leases[t].inside}
    assert not stale, f"stale lease entries (task: count): {stale}"
    assert svc.statistics().pressure.allocation_waits > 0   # they did wait
    for t in tasks:
        svc.release_task(t)
    assert svc.memory_pool(0).statistics().in_use_bytes == 0


def test_retried_attempts_are_admitted_ahead_of_first_attempts(make_service):
    svc = make_service(concurrent_gpu_tasks=1)
    svc.bind_task(1)
    order = []
    threads = []
    for task in (2, 3):   # first attempts, waiting
        t, out = _thread(lambda task=task: (svc.bind_task(task), order.append(task)))
        threads.append(t)
        _until(lambda n=len(threads): svc.statistics().pressure.tasks_waiting_admission == n)
    svc.pressure.retried(4)   # what the plugin says at a retried attempt's start
    t, out = _thread(lambda: (svc.bind_task(4), order.append(4)))
    threads.append(t)
    _until(lambda: svc.statistics().pressure.tasks_waiting_admission == 3)
    for task, expected in ((1, [4]), (4, [4, 2]), (2, [4, 2, 3])):
        svc.release_task(task)
        _until(lambda expected=expected: order == expected)
    for t in threads:
        t.join(5)
    svc.release_task(3)


def test_with_retry_runs_a_block_again_after_the_breaker_only(make_service):
    from cudabridge.pressure import with_retry

    svc = make_service(oom_wait=30)
    svc.bind_task(1)
    calls = []

    def block():
        calls.append(1)
        a = svc.allocate(1, 6 * MIB)
        try:
            if len(calls) < 3:
                svc.allocate(1, 4 * MIB)   # the task's only holder waits for itself: the breaker
            return "done"
        finally:
            a.free()

    assert with_retry(block) == "done" and len(calls) == 3
    def never_fits():
        held = svc.allocate(1, 6 * MIB)
        try:
            return svc.allocate(1, 4 * MIB)
        finally:
            held.free()

    with pytest.raises(OutOfDeviceMemory) as info:   # the breaker's, after the last attempt
        with_retry(never_fits, attempts=2)
    assert info.value.reason == "breaker"
    with pytest.raises(ValueError):
        with_retry(lambda: (_ for _ in ()).throw(ValueError("not memory")))
    svc.release_task(1)


def test_the_breaker_picks_the_task_bound_last_not_the_largest_id(make_service):
    """Youngest is bind order (the registry's), whatever the ids: task 9 bound first, task 2 after."""
    svc = make_service(oom_wait=30)   # concurrentGpuTasks unlimited: no admission bookkeeping
    svc.bind_task(9)
    svc.bind_task(2)
    a9 = svc.allocate(9, 4 * MIB)
    a2 = svc.allocate(2, 3 * MIB)
    t, out = _thread(lambda: svc.allocate(9, 4 * MIB))
    _until(lambda: svc.statistics().pressure.allocations_waiting == 1)
    with pytest.raises(OutOfDeviceMemory) as info:
        svc.allocate(2, 4 * MIB)   # both wait: task 2, bound last, gives way
    assert info.value.reason == "breaker"
    a2.free()
    t.join(10)
    assert "error" not in out, out
    a9.free()
    out["result"].free()


def test_an_allocation_nested_in_a_holders_give_back_leaves_the_waiting_allocations_deadline_alone(make_service):
    """A holder's give-back runs before each of a waiting allocation's asks, on its thread, and may
    allocate itself (a library's drain, a finalizer); that nested allocation's own wait must not
    restart the outer one's oomWait (the deadline runs from the outer's first ask)."""
    svc = make_service(oom_wait=1.0)
    svc.bind_task(1)
    svc.bind_task(2)
    filler = svc.allocate(1, 6 * MIB)   # task 1 holds the pool and does nothing: no break
    spare = [svc.allocate(1, 2 * MIB)]
    state = {"nested": None, "nesting": False, "asks": 0, "start": None}

    def holder() -> int:
        if threading.current_thread().name != "waiter":
            return 0
        if state["nesting"]:   # the nested allocation's give-backs: its second makes room for it
            state["asks"] += 1
            if state["asks"] == 2:
                spare.pop().free()
                return 1
            return 0
        if state["nested"] is None and time.monotonic() - state["start"] > 0.8:
            state["nesting"] = True
            try:
                state["nested"] = svc.allocate(2, MIB)   # waits once (its own first ask), then fits
            finally:
                state["nesting"] = False
        return 0

    svc.memory_pool(0).add_holder(holder)

    out = {}

    def outer():
        svc.registry.attach(2)
        state["start"] = time.monotonic()
        try:
            svc.allocate(2, 4 * MIB)   # never fits: 1 MiB comes back, for the nested one
        except OutOfDeviceMemory as exc:
            out["error"] = exc
        state["end"] = time.monotonic()

    t = threading.Thread(target=outer, name="waiter")
    t.start()
    t.join(30)
    assert state["nested"] is not None and state["asks"] >= 2
    assert getattr(out.get("error"), "reason", None) == "timeout", out
    # oomWait (1 s) from the outer's first ask; restarted by the nested ask it would end past 1.8 s
    assert state["end"] - state["start"] < 1.6, state
    state["nested"].free()
    filler.free()
