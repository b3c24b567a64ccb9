"""The pool's two fast paths on every bad input: the same error, the same words, nothing changed
(issue 13, item 3).

Each case runs once on a pool with the Python reference fast path (python_fast_path.py) and once
on one with its C twin (``FastPath`` in memory/_fastpath.c), each on a fresh emulated device set
up identically, and must give the same outcome and leave the same state: statistics, the books
(tests/pool_books.py), every allocation's state, the owners' holdings. For a refused call that
state must also be what it was before the call. The outcome of a refusal is the exception type
and, for the pool's own errors, its message; a call that does not bind to the signature is a
TypeError on both (its wording is the interpreter's on one side and the extension's on the
other)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cudabridge.device import EmulatedBackend
from cudabridge.errors import CudaBridgeError
from cudabridge.memory import StreamOrderedMemoryPool, native
from pool_books import check_books

pytestmark = pytest.mark.skipif(native.load() is None, reason="the C fast path is not built or is switched off")

MiB = 1 << 20
LIMIT = 64 * MiB


def _world(fast_path: str) -> SimpleNamespace:
    backend = EmulatedBackend(devices=1, memory_bytes=256 * MiB)
    s, s2, outside = (backend.stream_create() for _ in range(3))
    pool = StreamOrderedMemoryPool(backend, 0, [s, s2], limit_bytes=LIMIT, fast_path=fast_path)
    assert pool.fast_path == fast_path
    w = SimpleNamespace(backend=backend, pool=pool, s=s, s2=s2, outside=outside)
    w.a = pool.allocate(1000, s, owner=7)
    w.b = pool.allocate(3 * MiB, s2)
    w.b.record_stream(s)
    w.freed = pool.allocate(4096, s)
    pool.free(w.freed)
    w.released = pool.allocate(512, s2, owner=9)
    assert pool.reclaim_owner(9) == (1, 512)
    w.foreign_pool = StreamOrderedMemoryPool(backend, 0, [s], limit_bytes=LIMIT, fast_path=fast_path)
    w.foreign = w.foreign_pool.allocate(256, s)
    return w


def _close(w: SimpleNamespace) -> None:
    w.foreign_pool.close()
    w.pool.close()
    w.backend.close()


def _state(w: SimpleNamespace) -> dict:
    pool = w.pool
    books = check_books(pool) if not pool.closed else None
    stats = pool.statistics().as_dict()
    return {
        "stats": stats, "books": books,
        "allocations": [(x.id, x.ptr, x.size, x.alive, repr(x)) for x in (w.a, w.b, w.freed, w.released)],
        "owners": {o: sorted(x.id for x in pool.owned_by(o)) for o in (7, 9)},
        "streams": [pool.accepts(h) for h in (w.s, w.s2, w.outside)],
    }


def _outcome(call, w: SimpleNamespace):
    try:
        result = call(w)
    except TypeError as exc:
        if isinstance(exc, CudaBridgeError):
            return type(exc).__name__, str(exc)
        return "TypeError", None
    except CudaBridgeError as exc:
        return type(exc).__name__, str(exc)
    if result is None or isinstance(result, (int, tuple, bool)):
        return "ok", result
    return "ok", repr(result)


class _Int(int):
    """An int subclass: the fast paths take only exact ints, the rest goes the normalizing way."""


REFUSED = {
    # allocate: size
    "size str": lambda w: w.pool.allocate("1000", w.s),
    "size bool": lambda w: w.pool.allocate(True, w.s),
    "size float": lambda w: w.pool.allocate(1.5, w.s),
    "size None": lambda w: w.pool.allocate(None, w.s),
    "size zero": lambda w: w.pool.allocate(0, w.s),
    "size negative": lambda w: w.pool.allocate(-256, w.s),
    "size over the limit": lambda w: w.pool.allocate(LIMIT + 1, w.s),
    "size past 64 bits": lambda w: w.pool.allocate(1 << 80, w.s),
    "size negative past 64 bits": lambda w: w.pool.allocate(-(1 << 80), w.s),
    "size zero, int subclass": lambda w: w.pool.allocate(_Int(0), w.s),
    # allocate: stream
    "stream unknown": lambda w: w.pool.allocate(10, w.outside),
    "stream negative": lambda w: w.pool.allocate(10, -1),
    "stream past 64 bits": lambda w: w.pool.allocate(10, 1 << 64),
    "stream str": lambda w: w.pool.allocate(10, "s"),
    "stream list": lambda w: w.pool.allocate(10, [1]),
    "stream bool": lambda w: w.pool.allocate(10, True),
    "stream float": lambda w: w.pool.allocate(10, 2.0),
    "stream unknown, int subclass": lambda w: w.pool.allocate(10, _Int(w.outside)),
    "size bad and stream unknown": lambda w: w.pool.allocate(0, w.outside),
    # allocate: owner
    "owner str": lambda w: w.pool.allocate(10, w.s, "task"),
    "owner bool": lambda w: w.pool.allocate(10, w.s, owner=True),
    "owner float": lambda w: w.pool.allocate(10, w.s, owner=1.0),
    "owner list": lambda w: w.pool.allocate(10, w.s, owner=[1]),
    # allocate: signature
    "allocate without stream": lambda w: w.pool.allocate(10),
    "allocate with 4 arguments": lambda w: w.pool.allocate(10, w.s, 7, 8),
    "allocate unknown keyword": lambda w: w.pool.allocate(10, w.s, colour=1),
    "allocate repeated keyword": lambda w: w.pool.allocate(10, w.s, size=10),
    # free
    "free not an allocation": lambda w: w.pool.free(object()),
    "free a list": lambda w: w.pool.free([1]),
    "free None": lambda w: w.pool.free(None),
    "free an int": lambda w: w.pool.free(5),
    "free on an unknown stream": lambda w: w.pool.free(w.a, w.outside),
    "free on a negative stream": lambda w: w.pool.free(w.a, -1),
    "free on a str stream": lambda w: w.pool.free(w.a, "s"),
    "free on a bool stream": lambda w: w.pool.free(w.a, True),
    "free not an allocation on a stream": lambda w: w.pool.free(object(), w.s),
    "double free": lambda w: w.pool.free(w.freed),
    "double free on a stream": lambda w: w.pool.free(w.freed, w.s2),
    "free after release": lambda w: w.pool.free(w.released),
    "free of another pool's": lambda w: w.pool.free(w.foreign),
    "free with 3 arguments": lambda w: w.pool.free(w.a, w.s, w.s),
    "free unknown keyword": lambda w: w.pool.free(w.a, strem=w.s),
    "free without allocation": lambda w: w.pool.free(),
    # the rest of the front
    "record_stream unknown": lambda w: w.pool.record_stream(w.a, w.outside),
    "record_stream of a freed one": lambda w: w.pool.record_stream(w.freed, w.s2),
    "reclaim_owner str": lambda w: w.pool.reclaim_owner("task"),
    "reclaim_owner bool": lambda w: w.pool.reclaim_owner(True),
    "register a default stream": lambda w: w.pool.register_stream(2),
    "register a pool stream": lambda w: w.pool.register_stream(w.s),
    "register a negative handle": lambda w: w.pool.register_stream(-5),
    "unregister a pool stream": lambda w: w.pool.unregister_stream(w.s),
    "unregister an unknown stream": lambda w: w.pool.unregister_stream(w.outside),
}

# Calls that succeed, or that fail only once the pool is closed: compared, not required unchanged.
ACCEPTED = {
    # out of memory: the slow path's refusal, after its ladder moved passed blocks to the safe index
    "out of memory": lambda w: w.pool.allocate(LIMIT - MiB, w.s),
    "size int subclass": lambda w: w.pool.allocate(_Int(1000), _Int(w.s), owner=_Int(7)).size,
    "free on an int subclass stream": lambda w: w.pool.free(w.a, _Int(w.s)),
    "free the recorded one": lambda w: w.pool.free(w.b),
    "double free of a recorded one": lambda w: (w.pool.free(w.b), w.pool.free(w.b)),
    "reclaim_owner none held": lambda w: w.pool.reclaim_owner(12345),
    "reclaim_owner twice": lambda w: (w.pool.reclaim_owner(7), w.pool.reclaim_owner(7)),
    "unregister with a live allocation": lambda w: (w.pool.register_stream(w.outside),
                                                   w.pool.allocate(10, w.outside),
                                                   w.pool.unregister_stream(w.outside)),
    "allocate after close": lambda w: (w.pool.close(), w.pool.allocate(10, w.s)),
    "free after close": lambda w: (w.pool.close(), w.pool.free(w.a)),
    "slow path after close": lambda w: (w.pool.close(), w.pool.allocate(5 * MiB, w.s)),
    "register after close": lambda w: (w.pool.close(), w.pool.register_stream(w.outside)),
    "reclaim_owner after close": lambda w: (w.pool.close(), w.pool.reclaim_owner(7)),
}


def _run_on_both(call, unchanged: bool) -> tuple[dict, dict]:
    """The call's outcome and the state it leaves, on each fast path; ``unchanged``: assert the
    state is what it was before the call."""
    outcomes, states = {}, {}
    for fast_path in ("python", "native"):
        w = _world(fast_path)
        try:
            before = _state(w) if unchanged else None
            outcomes[fast_path] = _outcome(call, w)
            states[fast_path] = after = _state(w)
            if unchanged:
                assert after == before, f"{fast_path}: the refused call changed the pool"
        finally:
            _close(w)
    return outcomes, states


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_both_fast_paths_refuse_alike_and_change_nothing(case):
    outcomes, states = _run_on_both(REFUSED[case], unchanged=True)
    assert outcomes["python"][0] != "ok", outcomes
    assert outcomes["native"] == outcomes["python"]
    assert states["native"] == states["python"]


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_both_fast_paths_agree_on_the_edges(case):
    outcomes, states = _run_on_both(ACCEPTED[case], unchanged=False)
    assert outcomes["native"] == outcomes["python"]
    assert states["native"] == states["python"]
