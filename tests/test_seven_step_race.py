"""The seven-step race, guarded: the event-deferred pool keeps both tasks' data intact; a
deliberately naive reuse policy corrupts it in the same scenario (so the test can fail).

The suite runs with the emulated device's race detector on (conftest.py): there the naive
policy is refused at the first unordered access, whatever the timing; with the detector off it
shows the corruption itself."""

import pytest
from naive_arena import NaiveArena

from cudabridge.device import EmulatedBackend
from cudabridge.errors import StreamOrderRace
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


@pytest.fixture
def unchecked():
    """An emulated device with the race detector off: the race runs and corrupts."""
    backend = EmulatedBackend(devices=1, memory_bytes=1 << 30, race_check=False)
    yield backend
    backend.close()


@pytest.fixture
def checked():
    """An emulated device with the race detector on, whose races the test inspects itself."""
    backend = EmulatedBackend(devices=1, memory_bytes=1 << 30, race_check=True)
    yield backend
    backend.close()


def test_naive_reuse_trips_the_race_detector(checked):
    sa, sb = checked.stream_create(), checked.stream_create()
    with _pool(checked, [sa, sb], arena_type=NaiveArena) as pool:
        with pytest.raises(StreamOrderRace) as info:
            seven_step(checked, pool, sa, sb, NBYTES, DELAY)
        checked.stream_synchronize(sa)
        checked.stream_synchronize(sb)
    race = info.value
    # Step 6: B's kernel writes the block that A's kernel (step 2) wrote, with nothing between.
    assert race.kind == "write-after-write"
    assert race.stream == f"pool stream {sb:#x}" and race.other_stream == f"pool stream {sa:#x}"
    assert f"pool stream {sa:#x}" in str(race) and f"pool stream {sb:#x}" in str(race)
    assert race.call == race.other_call == "cudaLaunchKernel(fill_u32)"
    assert race.nbytes == NBYTES and f"{race.address:#x}" in str(race)
    assert checked.races == [race]


def test_naive_reuse_corrupts(unchecked):
    sa, sb = unchecked.stream_create(), unchecked.stream_create()
    with _pool(unchecked, [sa, sb], arena_type=NaiveArena) as pool:
        r = seven_step(unchecked, pool, sa, sb, NBYTES, DELAY)
    assert r["same_block"]
    assert not (r["a_intact"] and r["b_intact"]), "the naive policy should have shown the race"
    assert unchecked.races == []  # off means off


def test_per_thread_default_streams_are_distinct(emulated):
    with _pool(emulated, [], limit_bytes=NBYTES) as pool:
        r = seven_step_per_thread(emulated, pool, NBYTES, DELAY)
        stats = pool.statistics()
    assert r["a_intact"] and r["b_intact"], r
    assert r["same_block"] and stats.gpu_waits == 1
    assert stats.events_recorded == 0  # the per-thread free recorded on its own thread, eagerly
    assert stats.events_created >= 1


def test_per_thread_naive_trips_the_race_detector(checked):
    with _pool(checked, [], arena_type=NaiveArena) as pool:
        with pytest.raises(StreamOrderRace) as info:
            seven_step_per_thread(checked, pool, NBYTES, DELAY)
    race = info.value
    assert race.kind == "write-after-write" and race.nbytes == NBYTES
    # Two threads' per-thread default streams: the same handle, two streams, both named.
    assert race.stream.startswith("per-thread stream of thread ")
    assert race.other_stream.startswith("per-thread stream of thread ")
    assert race.stream != race.other_stream
    assert checked.races == [race]


def test_per_thread_naive_corrupts(unchecked):
    with _pool(unchecked, [], arena_type=NaiveArena) as pool:
        r = seven_step_per_thread(unchecked, pool, NBYTES, DELAY)
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
        with _pool(cuda_backend, [sa, sb], arena_type=NaiveArena) as pool:
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
    with _pool(cuda_backend, [], arena_type=NaiveArena) as pool:
        r = seven_step_per_thread(cuda_backend, pool, NBYTES, 0.05)
    assert r["same_block"] and not (r["a_intact"] and r["b_intact"])
