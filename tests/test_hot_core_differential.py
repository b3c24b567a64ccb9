"""The Java hot path's two twins on every bad input and race: the same error, the same words,
nothing changed (issue 13, item 3).

Each case runs once through the Python reference (``JavaHotPath(service, fast_path="python")``)
and once through the C twin (``fast_path="native"``, ``jvm/_hotcore.c``), each on a fresh
emulated service set up identically, and must give the same outcome (result, or exception type
and message) and leave the same state: the handle table, the pool's in-use bytes and live
allocations, every bound task's lease (binding, operations inside, open), the counters. For the
bad inputs that state must also be what it was before the call.

The races are made deterministic with a test-only lease (``_HookedLease``, installed for the
test through the registry's ``TaskLease`` constructor): reading its ``inside`` list, the first
step of entering the lease after the lease was looked up, runs a hook once. The hook releases
the task (and re-binds it) at exactly the point where a Java thread's release would interleave
between the lookup and the admission. Before the fix the C twin answered a release there with
UnknownTask "not bound" and a re-bind with RuntimeError, and left its thread's ident in the new
lease, so that the re-bound task's release waited forever; the Python reference answered both
with UnknownTask "being released".
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from cudabridge import task_registry
from cudabridge.config import ServiceConfig
from cudabridge.jvm.hot_path import JavaHotPath
from cudabridge.memory import native
from cudabridge.service import CudaBridgeService

MiB = 1 << 20
TASK = 5          # bound, owns two allocations
IDLE = 7          # bound, owns nothing (the race cases release and re-bind it)
UNBOUND = 99


def _core_built() -> bool:
    try:
        import cudabridge.jvm._hotcore  # noqa: F401
    except ImportError:
        return False
    return native.supported()[0]


pytestmark = pytest.mark.skipif(not _core_built(), reason="jvm/_hotcore is not built or C fast paths are off")


class _HookedLease(task_registry.TaskLease):
    """A lease whose ``inside`` runs ``hook`` (once) when read: the first step of entering it."""

    __slots__ = ("_inside", "hook")

    def __init__(self, binding: Any) -> None:
        self.hook: Callable[[], None] | None = None
        super().__init__(binding)

    @property
    def inside(self) -> list[int]:   # type: ignore[override]
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return self._inside

    @inside.setter
    def inside(self, value: list[int]) -> None:
        self._inside = value


class Ctx:
    """One fresh service and hot path of one twin, set up the same way for every case."""

    def __init__(self, fast_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(task_registry, "TaskLease", _HookedLease)
        self.svc = CudaBridgeService(ServiceConfig(backend="emulated", emulated_memory="256m", pool_limit="128m",
                                                   streams_per_gpu=4, high_priority_streams=0,
                                                   log_level="WARNING"))
        self.reg = self.svc.registry
        self.hot = JavaHotPath(self.svc, fast_path=fast_path)
        assert self.hot.fast_path == fast_path
        self.reg.bind(TASK)
        self.reg.bind(IDLE)
        self.h1, _ = self.hot.allocate(TASK, 4096)
        self.h2, _ = self.hot.allocate(TASK, 3 * MiB)

    def lease(self, task: int) -> Any:
        return self.reg.leases[task]

    def state(self) -> tuple:
        pool = self.svc.memory_pool(0).statistics()
        handles = sorted((h, a.id, a.size, a.owner, a.alive) for h, a in self.hot._live.items())
        leases = sorted((t, self.lease(t).binding, tuple(self.lease(t).inside), self.lease(t).open)
                        for t in list(self.reg.leases))
        return handles, pool.in_use_bytes, pool.live_allocations, leases, self.hot.counters

    def close(self) -> None:
        for t in list(self.reg.leases):
            self.lease(t).inside.clear()   # a stale ident left by a bug must not hang close()
        self.svc.close()


def _outcome(fn: Callable[[], Any]) -> tuple:
    try:
        return ("ok", fn())
    except Exception as exc:  # the type and the words must agree
        return ("error", type(exc).__name__, str(exc))


def _run(fast_path: str, case: Callable[[Ctx], Any], monkeypatch: pytest.MonkeyPatch) -> tuple:
    """(outcome, state before, state after, the case's own findings)."""
    ctx = Ctx(fast_path, monkeypatch)
    try:
        before = ctx.state()
        findings: dict[str, Any] = {}
        out = _outcome(lambda: case(ctx, findings))
        after = ctx.state()
        return out, before, after, findings
    finally:
        ctx.close()


def _both(case, monkeypatch, counters: bool = True) -> tuple:
    py = _run("python", case, monkeypatch)
    c = _run("native", case, monkeypatch)
    assert c[0] == py[0], f"outcome: python {py[0]} != native {c[0]}"
    n = None if counters else -1   # a case that rebuilds the C twin loses the counts it kept
    assert c[2][:n] == py[2][:n], f"state after: python {py[2]} != native {c[2]}"
    assert c[3] == py[3], f"findings: python {py[3]} != native {c[3]}"
    return py


# Bad inputs: refused, the same way by both, and nothing changes --------------------------------
BAD = {
    "allocate: unknown task": lambda c, f: c.hot.allocate(UNBOUND, 4096),
    "allocate: task released before the call": lambda c, f: (c.reg.release(IDLE), c.hot.allocate(IDLE, 4096)),
    "allocate: task id bool": lambda c, f: c.hot.allocate(True, 4096),
    "allocate: task id float": lambda c, f: c.hot.allocate(float(TASK), 4096),
    "allocate: task id str": lambda c, f: c.hot.allocate(str(TASK), 4096),
    "allocate: task id None": lambda c, f: c.hot.allocate(None, 4096),
    "allocate: task id negative": lambda c, f: c.hot.allocate(-TASK, 4096),
    "allocate: task id huge": lambda c, f: c.hot.allocate(1 << 80, 4096),
    "allocate: size bool": lambda c, f: c.hot.allocate(TASK, True),
    "allocate: size float": lambda c, f: c.hot.allocate(TASK, 4096.0),
    "allocate: size str": lambda c, f: c.hot.allocate(TASK, "4096"),
    "allocate: size None": lambda c, f: c.hot.allocate(TASK, None),
    "allocate: size negative": lambda c, f: c.hot.allocate(TASK, -1),
    "allocate: size huge": lambda c, f: c.hot.allocate(TASK, 1 << 80),
    "allocate: too few arguments": lambda c, f: c.hot.allocate(TASK),
    "allocate: too many arguments": lambda c, f: c.hot.allocate(TASK, 64, 0),
    "free: unknown handle": lambda c, f: c.hot.free(c.h2 + (1 << 6)),
    "free: double free": lambda c, f: (c.hot.free(c.h1), c.hot.free(c.h1)),
    "free: handle bool": lambda c, f: c.hot.free(True),
    "free: handle float": lambda c, f: c.hot.free(float(c.h1)),
    "free: handle str": lambda c, f: c.hot.free(str(c.h1)),
    "free: handle list": lambda c, f: c.hot.free([c.h1]),
    "free: handle None": lambda c, f: c.hot.free(None),
    "free: handle negative": lambda c, f: c.hot.free(-c.h1),
    "free: handle huge": lambda c, f: c.hot.free(1 << 80),
    "free: no argument": lambda c, f: c.hot.free(),
    "free_many: one unknown": lambda c, f: c.hot.free_many([c.h1, c.h2 + (1 << 6)]),
    "free_many: repeated": lambda c, f: c.hot.free_many([c.h1, c.h2, c.h1]),
    "free_many: repeated, many": lambda c, f: c.hot.free_many([c.h1] + [c.h2] * 20),
    "free_many: float twin": lambda c, f: c.hot.free_many([c.h1, float(c.h1)]),
    "free_many: bool": lambda c, f: c.hot.free_many([c.h1, True]),
    "free_many: None": lambda c, f: c.hot.free_many([c.h1, None]),
    "free_many: unhashable": lambda c, f: c.hot.free_many([c.h1, [c.h2]]),
    "free_many: str of handles": lambda c, f: c.hot.free_many(str(c.h1)),
    "free_many: generator, repeated": lambda c, f: c.hot.free_many(h for h in (c.h1, c.h1)),
    "free_many: not iterable": lambda c, f: c.hot.free_many(42),
    "free_many: handles None": lambda c, f: c.hot.free_many(None),
    "free_many: freed already": lambda c, f: (c.hot.free(c.h1), c.hot.free_many([c.h2, c.h1])),
    "stream: unknown task": lambda c, f: c.hot.stream(UNBOUND),
    "stream: released task": lambda c, f: (c.reg.release(IDLE), c.hot.stream(IDLE)),
    "stream: task id bool": lambda c, f: c.hot.stream(True),
    "stream: task id float": lambda c, f: c.hot.stream(float(TASK)),
    "stream: task id str": lambda c, f: c.hot.stream(str(TASK)),
}
# the cases whose setup step itself legitimately changes the state before the refused call
SETUP_CHANGES = {"allocate: task released before the call", "free: double free", "free_many: freed already",
                 "stream: released task"}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_input_is_refused_alike_and_changes_nothing(name, monkeypatch):
    out, before, after, _ = _both(BAD[name], monkeypatch)
    assert out[0] == "error", f"{name}: accepted ({out})"
    if name not in SETUP_CHANGES:
        assert after == before, f"{name}: the refused call changed the state"


def test_the_refusals_keep_their_documented_types(monkeypatch):
    """Spot checks that the agreed errors are the documented ones (not merely equal)."""
    words = {name: _run("native", BAD[name], monkeypatch)[0] for name in (
        "allocate: unknown task", "allocate: task id bool", "free: double free", "free_many: repeated",
        "free_many: unhashable", "free_many: one unknown", "stream: unknown task", "free_many: not iterable")}
    assert words["allocate: unknown task"][1:] == ("UnknownTask", f"task {UNBOUND} is not bound")
    assert words["allocate: task id bool"][1] == "InvalidArgument"
    assert words["free: double free"][1] == "InvalidFree" and "is not live" in words["free: double free"][2]
    assert words["free_many: repeated"][1:] == (
        "InvalidFree", "free_many of 3 buffer(s): a handle appears twice; nothing was freed")
    assert words["free_many: unhashable"][1] == "InvalidFree" and "got list" in words["free_many: unhashable"][2]
    assert words["free_many: one unknown"][1] == "InvalidFree" and "1 not live" in words["free_many: one unknown"][2]
    assert words["stream: unknown task"][1:] == ("UnknownTask", f"task {UNBOUND} is not bound")
    assert words["free_many: not iterable"][1] == "TypeError"


# Good calls in the forms Python accepts (keywords) agree too ----------------------------------
GOOD = {
    "allocate with keywords": lambda c, f: c.hot.allocate(task=TASK, size=256),
    "free with a keyword": lambda c, f: c.hot.free(hid=c.h1),
    "free_many of a tuple": lambda c, f: c.hot.free_many((c.h1, c.h2)),
    "free_many of a generator": lambda c, f: c.hot.free_many(h for h in (c.h1, c.h2)),
    "free_many of nothing": lambda c, f: c.hot.free_many([]),
    "stream with a keyword": lambda c, f: c.hot.stream(task=TASK),
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_good_call_agrees(name, monkeypatch):
    out, *_ = _both(GOOD[name], monkeypatch)
    assert out[0] == "ok", out


# Races, made deterministic --------------------------------------------------------------------
def _released_between_lookup_and_admission(rebind: bool):
    def case(c: Ctx, found: dict) -> Any:
        old = c.lease(IDLE)

        def release_meanwhile() -> None:
            found["report"] = c.reg.release(IDLE)
            if rebind:
                c.reg.bind(IDLE)

        old.hook = release_meanwhile
        try:
            return c.hot.allocate(IDLE, 4096)
        finally:
            found["old lease inside"] = list(old.inside)
            if rebind:
                new = c.lease(IDLE)
                found["new lease inside"] = list(new.inside)
                new.inside.clear()           # a stale ident would hang the release below
                # the re-bound task works and releases at once
                h, _ = c.hot.allocate(IDLE, 512)
                done: list = []
                t = threading.Thread(target=lambda: done.append(c.reg.release(IDLE)), daemon=True)
                t.start()
                t.join(10)
                found["re-bound task released"] = bool(done) and done[0].leaks_reclaimed == 1
    return case


@pytest.mark.parametrize("rebind", [False, True], ids=["released", "released-and-rebound"])
def test_a_task_released_during_allocate_is_refused_alike(rebind, monkeypatch):
    out, before, after, found = _both(_released_between_lookup_and_admission(rebind), monkeypatch)
    assert out == ("error", "UnknownTask", f"task {IDLE} is being released")
    assert found["old lease inside"] == []
    if rebind:
        assert found["new lease inside"] == [], "the refused allocate left its thread inside the new lease"
        assert found["re-bound task released"]
    # nothing allocated: the handles and the pool are as they were
    assert after[:3] == before[:3]


def test_free_many_of_a_handle_freed_during_the_batch_is_refused_alike(monkeypatch):
    """Another Java thread frees a handle of the batch while the batch frees an earlier one (the
    pool's free ran Python code, so the other thread could run): the batch stops at that handle
    with InvalidFree, the handles after it stay live. (A KeyError from the reference before.)"""

    def case(c: Ctx, found: dict) -> Any:
        real = c.hot._frees[0]
        fired = []

        def free_and_let_another_thread_in(a):
            real(a)
            if not fired:
                fired.append(1)
                c.hot.free(c.h2)          # the "other thread"
        h3, _ = c.hot.allocate(TASK, 128)
        c.hot._frees[0] = free_and_let_another_thread_in
        if c.hot._core is not None:       # the C twin holds the frees it was built with: rebuild it
            c.hot._core = c.hot._native_core("native")
        try:
            return c.hot.free_many([c.h1, c.h2, h3])
        finally:
            found["h3 live"] = h3 in dict(c.hot._live.items())

    out, _, _, found = _both(case, monkeypatch, counters=False)
    assert out[:2] == ("error", "InvalidFree") and "is not live" in out[2], out
    assert found["h3 live"]
