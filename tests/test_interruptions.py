"""The pool stays consistent whatever exception arrives, on the C path: the hostile sweep's case.

A KeyboardInterrupt every millisecond while the main thread allocates and frees 512 B - 5 MiB
(growth, segments, coalescing, out-of-memory and the slow path all run), and asynchronous
exceptions (``PyThreadState_SetAsyncExc``) injected into allocating threads. Before the fix this
left 43-294 blocks marked live with no owner, bytes in use at 92-176 MB with nothing live, and
later calls failing with raw ``IndexError`` / ``KeyError``. Afterwards: every block in exactly one
place (tests/pool_books.py), bytes in use 0 once everything was freed and the owner released,
no error but the interruptions and out-of-memory ever, and the pool still serves its whole limit.

The interruptions land only inside the pool's calls, never in the test's own bookkeeping (which
is not what is tested): tests/interruption_storms.py says how.
``CUDABRIDGE_INTERRUPT_SECONDS`` sets each test's length (default 6, as in the sweep).

The pure-Python path promises this only for the errors the pool raises itself (docs/memory-pool.md),
so these tests run on the C path.
"""

from __future__ import annotations

import os
import random

import pytest
from interruption_storms import async_storm, sigint_storm
from pool_books import check_books

from cudabridge.device import EmulatedBackend
from cudabridge.errors import OutOfDeviceMemory
from cudabridge.memory import StreamOrderedMemoryPool, native

MiB = 1 << 20
SECONDS = float(os.environ.get("CUDABRIDGE_INTERRUPT_SECONDS", "6"))
OWNER = 7

pytestmark = pytest.mark.skipif(native.load() is None, reason="the pool's C fast path is not built")


def _op(pool, stream, held, rng):
    """One allocate or free; the handle is kept (or dropped) by the caller's bookkeeping."""
    if held and (len(held) > 24 or rng.random() < 0.45):
        held.pop(rng.randrange(len(held))).free()
    else:
        held.append(pool.allocate(rng.randint(512, 5 * MiB), stream, OWNER))


def _settle(pool, held, backend) -> None:
    """Free what the test still holds, release the owner (what the interruptions made the test
    lose), and check the books."""
    for a in held:
        a.free()
    held.clear()
    pool.reclaim_owner(OWNER)
    backend.device_synchronize()
    check_books(pool)
    s = pool.statistics()
    assert (s.in_use_bytes, s.live_allocations) == (0, 0), s


def _serves_its_limit(pool, stream) -> None:
    """Nothing was lost: the pool can still lend (nearly) its whole limit, then give it back."""
    got = []
    try:
        while True:
            got.append(pool.allocate(MiB, stream))
    except OutOfDeviceMemory:
        pass
    assert len(got) * MiB >= pool.limit - 2 * MiB, (len(got), pool.limit)
    for a in got:
        a.free()
    check_books(pool)


def test_sigint_every_millisecond_on_the_main_thread():
    backend = EmulatedBackend(devices=1, memory_bytes=1 << 30)
    s = backend.stream_create()
    pool = StreamOrderedMemoryPool(backend, 0, [s], limit_bytes=48 * MiB, fast_path="native")
    rng = random.Random(13)
    held: list = []
    interrupts, calls, errors = sigint_storm(SECONDS, lambda: _op(pool, s, held, rng),
                                             expected=(OutOfDeviceMemory,))
    assert not errors, f"{len(errors)} errors besides the interruptions, first: {errors[0]!r}"
    assert interrupts > 20 and calls > 100, (interrupts, calls)
    _settle(pool, held, backend)
    _serves_its_limit(pool, s)
    pool.close()
    backend.close()


def test_async_exceptions_into_allocating_threads():
    backend = EmulatedBackend(devices=1, memory_bytes=1 << 30)
    streams = [backend.stream_create() for _ in range(4)]
    pool = StreamOrderedMemoryPool(backend, 0, streams, limit_bytes=64 * MiB, fast_path="native")
    held: list[list] = [[] for _ in streams]
    hits, errors, finished = async_storm(len(streams), SECONDS,
                                         lambda i, rng, mine: _op(pool, streams[i], mine, rng),
                                         expected=(OutOfDeviceMemory,), held=held)
    assert finished, "an allocating thread hung"
    assert not errors, f"{len(errors)} errors besides the interruptions, first: {errors[0]!r}"
    assert sum(hits) > 20, hits
    _settle(pool, [a for h in held for a in h], backend)
    _serves_its_limit(pool, streams[0])
    pool.close()
    backend.close()
