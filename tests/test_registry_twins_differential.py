"""The task registry's C twin (``_registry_core.c``) against its Python reference: the same calls
on two fresh services, one with each twin, give the same results, the same errors (type and
words) and the same state afterwards (bound tasks, their streams, counters, what the pool holds).
The C twin takes the common case and hands the rest to the reference; these cases cover both."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from cudabridge.config import ServiceConfig
from cudabridge.service import CudaBridgeService


def _service(twin: str, **kw: Any) -> CudaBridgeService:
    conf = dict(backend="emulated", emulated_memory="64m", pool_limit="32m", streams_per_gpu=3,
                high_priority_streams=1, log_level="WARNING")
    conf.update(kw)
    svc = CudaBridgeService(ServiceConfig(**conf))
    if twin == "python":
        svc.registry.bind, svc.registry.release = svc.registry._bind_reference, svc.registry._release_reference
    elif not svc.registry.native:
        pytest.skip("the registry's C twin is not built")
    return svc


def _state(svc: CudaBridgeService) -> tuple:
    reg = svc.registry
    leases = sorted((t, tuple(reg.leases[t].binding), reg.leases[t].open, tuple(reg.leases[t].inside))
                    for t in reg.leases)
    pools = {o: (s.live_allocations, s.in_use_bytes, s.leaks_reclaimed) for o, s in svc.statistics().memory.items()}
    return leases, reg.tasks_bound, reg.tasks_bound_total, reg.streams_in_use, reg.releases_in_progress(), pools


def _outcome(fn: Callable[[], Any]) -> tuple:
    try:
        r = fn()
        return ("ok", tuple(r) if isinstance(r, tuple) else r)
    except Exception as exc:   # the type and the words must agree
        return ("error", type(exc).__name__, str(exc))


def _both(script: Callable[[CudaBridgeService], list], **kw: Any) -> None:
    results = {}
    for twin in ("native", "python"):
        svc = _service(twin, **kw)
        try:
            results[twin] = (script(svc), _state(svc))
        finally:
            svc.close()
    assert results["native"] == results["python"]


CALLS: dict[str, Callable[[CudaBridgeService], list]] = {
    "bind, release, bind again": lambda s: [_outcome(lambda: s.registry.bind(t)) for t in (0, 1, 2, 3, 1 << 62)]
    + [_outcome(lambda: s.registry.release(1)), _outcome(lambda: s.registry.bind(1))],
    "gpu by ordinal and priorities": lambda s: [_outcome(lambda: s.registry.bind(5, 0)),
                                                _outcome(lambda: s.registry.bind(6, 0, "high")),
                                                _outcome(lambda: s.registry.bind(7, None, "normal")),
                                                _outcome(lambda: s.registry.bind(8, gpu=0, priority="high"))],
    "bad task ids": lambda s: [_outcome(lambda: s.registry.bind(v)) for v in (True, 1.0, -1, "3", None, 2 ** 64)]
    + [_outcome(lambda: s.registry.release(v)) for v in (True, 1.0, -1, "3", None)],
    "bad gpus and priorities": lambda s: [_outcome(lambda: s.registry.bind(1, 1)), _outcome(lambda: s.registry.bind(1, True)),
                                          _outcome(lambda: s.registry.bind(1, "0")),
                                          _outcome(lambda: s.registry.bind(1, 0, "urgent")),
                                          _outcome(lambda: s.registry.bind(1, 0, 3))],
    "bound twice, released twice, unknown": lambda s: [_outcome(lambda: s.registry.bind(4)),
                                                       _outcome(lambda: s.registry.bind(4)),
                                                       _outcome(lambda: s.registry.release(4)),
                                                       _outcome(lambda: s.registry.release(4)),
                                                       _outcome(lambda: s.registry.release(99))],
    "leaks reclaimed": lambda s: [_outcome(lambda: s.registry.bind(9)), _outcome(lambda: s.allocate(9, 4096).size),
                                  _outcome(lambda: s.allocate(9, 1 << 20).size), _outcome(lambda: s.registry.release(9))],
    "freed before the release": lambda s: [_outcome(lambda: s.registry.bind(9)),
                                           _outcome(lambda: s.allocate(9, 4096).free()),
                                           _outcome(lambda: s.registry.release(9))],
    "released from inside its own operation": lambda s: _inside_own(s),
    "a listener that fails": lambda s: _failing_listener(s),
    "bind after close": lambda s: [_outcome(lambda: s.registry.bind(1)), _outcome(lambda: s.registry.close()),
                                   _outcome(lambda: s.registry.bind(2)), _outcome(lambda: s.registry.release(1))],
    "the caller's attachment is cleared": lambda s: [_outcome(lambda: s.registry.bind(3)),
                                                      _outcome(lambda: s.registry.attach(3)),
                                                      _outcome(lambda: s.registry.release(3)),
                                                      _outcome(lambda: s.registry.current())],
}


def _inside_own(s: CudaBridgeService) -> list:
    s.registry.bind(2)
    lease = s.registry.leases[2]
    lease.inside.append(__import__("threading").get_ident())
    out = [_outcome(lambda: s.registry.release(2))]
    lease.inside.clear()
    return out + [_outcome(lambda: s.registry.release(2))]


def _failing_listener(s: CudaBridgeService) -> list:
    def listener(b):
        raise ValueError(f"listener for task {b.task_id}")
    s.registry.on_release(listener)
    s.registry.bind(6)
    s.allocate(6, 8192)
    out = [_outcome(lambda: s.registry.release(6)), _outcome(lambda: s.registry.releases_in_progress())]
    s.registry._release_listeners.clear()
    return out + [_outcome(lambda: s.registry.release(6)), _outcome(lambda: s.registry.bind(6))]


@pytest.mark.parametrize("case", list(CALLS))
def test_the_twins_agree(case):
    _both(CALLS[case])


def test_the_twins_agree_under_idle_first_and_two_gpus():
    _both(CALLS["bind, release, bind again"], stream_policy="idle-first")
    _both(lambda s: [_outcome(lambda: s.registry.bind(1)), _outcome(lambda: s.registry.bind(1, 1)),
                     _outcome(lambda: s.registry.bind(2, 0)), _outcome(lambda: s.registry.release(1)),
                     _outcome(lambda: s.registry.release(2))], emulated_devices=2)


def test_the_c_twin_takes_the_common_case():
    svc = _service("native")
    try:
        core = svc.registry._core
        svc.bind_task(1)
        svc.release_task(1)
        svc.registry.bind(2, 0, "normal")
        assert core.binds == 2 and svc.registry.tasks_bound_total == 2
    finally:
        svc.close()
