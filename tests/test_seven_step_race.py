"""The seven-step race, guarded: the event-deferred pool keeps both tasks' data intact; a
deliberately naive reuse policy corrupts it in the same scenario (so the test can fail)."""

import pytest

from cudabridge.memory import StreamOrderedMemoryPool

from pool_scenarios import seven_step, seven_step_per_thread

NBYTES = 2 << 20          # a large-class request: one 2 MiB chunk holds exactly one
DELAY = 0.15


def _pool(backend, streams, **kw):
    return StreamOrderedMemoryPool(backend, 0, streams, **kw)


@pytest.mark.parametrize("limit", [None, NBYTES], ids=["can-grow", "must-reuse"])
def test_event_deferred_pool_keeps_both_tasks_intact(emulated, limit):
    sa, sb = emulated.stream_create(), emulated.stream_create()
    with _pool(emulated, [sa, sb], limit_bytes=limit) as pool:
        r = seven_step(emulated, pool, sa, sb, NBYTES, DELAY)
        stats = pool.statistics()
    assert r["a_intact"] and r["b_intact"], r
    if limit == NBYTES:
        # B had to take A's block while A's work was in flight: ordered on the device, no host block.
        assert r["same_block"]
        assert stats.gpu_waits == 1 and stats.host_syncs == 0
    else:
        assert not r["same_block"]  # growing is preferred over making B wait for A
        assert stats.gpu_waits == 0 and stats.host_syncs == 0


def test_naive_reuse_corrupts(emulated):
    sa, sb = emulated.stream_create(), emulated.stream_create()
    with _pool(emulated, [sa, sb], reuse_policy="naive") as pool:
        r = seven_step(emulated, pool, sa, sb, NBYTES, DELAY)
    assert r["same_block"]
    assert not (r["a_intact"] and r["b_intact"]), "the naive policy should have shown the race"


def test_per_thread_default_streams_are_distinct(emulated):
    with _pool(emulated, [], limit_bytes=NBYTES) as pool:
        r = seven_step_per_thread(emulated, pool, NBYTES, DELAY)
        stats = pool.statistics()
    assert r["a_intact"] and r["b_intact"], r
    assert r["same_block"] and stats.gpu_waits == 1
    assert stats.events_recorded == 0  # the per-thread free recorded on its own thread, eagerly
    assert stats.events_created >= 1


def test_per_thread_naive_corrupts(emulated):
    with _pool(emulated, [], reuse_policy="naive") as pool:
        r = seven_step_per_thread(emulated, pool, NBYTES, DELAY)
    assert r["same_block"]
    assert not (r["a_intact"] and r["b_intact"])


def test_legacy_and_per_thread_are_not_one_stream_zero(emulated):
    """A block freed on the legacy stream is not the per-thread stream's to reuse at once."""
    from cudabridge.device import LEGACY_STREAM, PER_THREAD_STREAM

    with _pool(emulated, [], limit_bytes=NBYTES) as pool:
        r = seven_step(emulated, pool, LEGACY_STREAM, PER_THREAD_STREAM, NBYTES, DELAY)
        assert pool.statistics().gpu_waits == 1
    assert r["a_intact"] and r["b_intact"] and r["same_block"]


@pytest.mark.gpu
@pytest.mark.parametrize("limit", [None, NBYTES], ids=["can-grow", "must-reuse"])
def test_gpu_event_deferred_pool_keeps_both_intact(cuda_backend, limit):
    sa, sb = cuda_backend.stream_create(), cuda_backend.stream_create()
    try:
        with _pool(cuda_backend, [sa, sb], limit_bytes=limit) as pool:
            r = seven_step(cuda_backend, pool, sa, sb, NBYTES, 0.05)
            stats = pool.statistics()
        assert r["a_intact"] and r["b_intact"], r
        if limit == NBYTES:
            assert r["same_block"] and stats.gpu_waits == 1 and stats.host_syncs == 0
    finally:
        cuda_backend.stream_destroy(sa)
        cuda_backend.stream_destroy(sb)


@pytest.mark.gpu
def test_gpu_naive_reuse_corrupts(cuda_backend):
    sa, sb = cuda_backend.stream_create(), cuda_backend.stream_create()
    try:
        with _pool(cuda_backend, [sa, sb], reuse_policy="naive") as pool:
            r = seven_step(cuda_backend, pool, sa, sb, NBYTES, 0.05)
        assert r["same_block"] and not (r["a_intact"] and r["b_intact"])
    finally:
        cuda_backend.stream_destroy(sa)
        cuda_backend.stream_destroy(sb)


@pytest.mark.gpu
def test_gpu_per_thread_streams(cuda_backend):
    with _pool(cuda_backend, [], limit_bytes=NBYTES) as pool:
        r = seven_step_per_thread(cuda_backend, pool, NBYTES, 0.05)
        assert pool.statistics().gpu_waits == 1
    assert r["a_intact"] and r["b_intact"] and r["same_block"]
    with _pool(cuda_backend, [], reuse_policy="naive") as pool:
        r = seven_step_per_thread(cuda_backend, pool, NBYTES, 0.05)
    assert r["same_block"] and not (r["a_intact"] and r["b_intact"])
