"""The per-GPU stream pool (python/cudabridge/stream_pool.py) on the emulated device."""

from __future__ import annotations

import os

import pytest
from device_kernels import fill_u32_async, spin_async

from cudabridge.device import EmulatedBackend
from cudabridge.errors import CudaError, InvalidArgument, PoolClosed
from cudabridge.stream_pool import (
    HARDWARE_QUEUE_LIMIT,
    MAX_CONNECTIONS_ENV,
    StreamPool,
    ensure_hardware_queues,
)

MiB = 1 << 20
BUSY_S = 0.6  # long enough that a stream spun up stays busy for the whole acquire sequence


class RecordingBackend(EmulatedBackend):
    """The emulated device, remembering the priority each stream was created with, and with a
    priority range of its own so that a pool hard-coding one is caught."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.created: dict[int, int] = {}
        self.destroyed: list[int] = []

    def stream_priority_range(self):
        return 0, -3

    def stream_create(self, priority=0):
        handle = super().stream_create(priority)
        self.created[handle] = priority
        return handle

    def stream_destroy(self, stream):
        super().stream_destroy(stream)
        self.destroyed.append(stream)


@pytest.fixture
def be():
    backend = RecordingBackend(devices=2, memory_bytes=16 * MiB)
    yield backend
    backend.close()


@pytest.fixture
def pool(be):
    p = StreamPool(be, 0, size=4, high_priority_size=2)
    yield p
    p.close()


@pytest.fixture
def idle_pool(be):
    p = StreamPool(be, 0, size=4, high_priority_size=0, policy="idle-first")
    yield p
    p.close()


# creation --------------------------------------------------------------------------------------

def test_sizes_created(be, pool):
    normal, high = pool.streams("normal"), pool.streams("high")
    assert len(normal) == 4 and len(high) == 2
    assert len(set(normal + high)) == 6
    assert pool.handles == normal + high
    assert set(be.created) == set(pool.handles)
    assert all(be.stream_query(h) for h in pool.handles)  # real, live streams
    assert all(pool.owns(h) for h in pool.handles)
    assert not pool.owns(1) and not pool.owns(2)


def test_high_streams_get_the_backends_greatest_priority(be, pool):
    least, greatest = be.stream_priority_range()
    assert pool.priority_values == {"normal": least, "high": greatest}
    assert [be.created[h] for h in pool.streams("high")] == [greatest] * 2
    assert [be.created[h] for h in pool.streams("normal")] == [least] * 4


def test_zero_high_priority_streams(be):
    with StreamPool(be, 0, size=2, high_priority_size=0) as p:
        assert p.streams("high") == []
        assert len(p.handles) == 2
        with pytest.raises(InvalidArgument):
            p.acquire("high")


def test_streams_are_created_on_the_pools_device_and_the_callers_device_is_kept(be):
    be.set_device(0)
    with StreamPool(be, 1, size=2, high_priority_size=1) as p:
        assert be.get_device() == 0
        be.set_device(1)
        ev1 = be.event_create()
        be.set_device(0)
        ev0 = be.event_create()
        for h in p.handles:
            be.event_record(ev1, h)  # a device-1 event fits a device-1 stream
            with pytest.raises(CudaError):
                be.event_record(ev0, h)
    assert be.get_device() == 0


@pytest.mark.parametrize("kwargs", [
    {"size": 0}, {"size": -1}, {"size": 1025}, {"size": True}, {"size": 2.0}, {"size": "4"},
    {"high_priority_size": -1}, {"high_priority_size": 1025}, {"high_priority_size": False},
    {"policy": "fifo"}, {"policy": None},
])
def test_bad_sizes_and_policies_raise_before_creating_streams(be, kwargs):
    with pytest.raises(InvalidArgument):
        StreamPool(be, 0, **kwargs)
    assert be.created == {}


def test_size_bounds_are_inclusive(be):
    with StreamPool(be, 0, size=1, high_priority_size=0) as p:
        assert len(p.handles) == 1


# acquire ---------------------------------------------------------------------------------------

def test_round_robin_cycles_through_every_stream(pool):
    normal = pool.streams("normal")
    got = [pool.acquire() for _ in range(3 * len(normal))]
    first = got[:len(normal)]
    assert sorted(first) == sorted(normal)  # every stream once per turn
    assert got == first * 3  # and in the same order every turn
    high = pool.streams("high")
    got_high = [pool.acquire("high") for _ in range(4)]
    assert sorted(got_high[:2]) == sorted(high)
    assert got_high[2:] == got_high[:2]


def test_round_robin_does_not_query_streams(be, pool):
    for h in pool.streams("normal"):
        spin_async(be, h, 0.2)
    pool.acquire()
    pool.acquire(policy="round-robin")
    assert pool.idle_queries == 0


def test_idle_first_prefers_an_idle_stream(be, idle_pool):
    handles = idle_pool.streams("normal")
    *busy, idle = handles
    for h in busy:
        spin_async(be, h, BUSY_S)
    assert idle_pool.acquire() == idle
    # From the round-robin position (the first stream) it queried every busy one, then the idle one.
    assert idle_pool.idle_queries == len(handles)
    assert idle_pool.acquire() == idle
    assert idle_pool.idle_queries == 2 * len(handles)
    assert all(not be.stream_query(h) for h in busy)  # they were busy throughout


def test_idle_first_takes_the_round_robin_stream_when_it_is_idle(idle_pool):
    handles = idle_pool.streams("normal")
    assert [idle_pool.acquire() for _ in handles] == handles
    assert idle_pool.idle_queries == len(handles)  # one query each


def test_idle_first_falls_back_when_all_are_busy(be, idle_pool):
    handles = idle_pool.streams("normal")
    for h in handles:
        spin_async(be, h, BUSY_S)
    got = [idle_pool.acquire() for _ in handles]
    assert all(h in handles for h in got)
    assert sorted(got) == sorted(handles)  # the fallback still spreads tasks over the pool
    assert idle_pool.idle_queries == len(handles) ** 2
    assert all(not be.stream_query(h) for h in handles)


def test_idle_first_as_a_per_call_policy(be, pool):
    handles = pool.streams("normal")
    for h in handles[:-1]:
        spin_async(be, h, BUSY_S)
    assert pool.acquire(policy="idle-first") == handles[-1]
    assert pool.idle_queries > 0


def test_bad_priority_and_per_call_policy_raise(pool):
    with pytest.raises(InvalidArgument):
        pool.acquire("urgent")
    with pytest.raises(InvalidArgument):
        pool.streams("urgent")
    with pytest.raises(InvalidArgument):
        pool.acquire(policy="fifo")
    # none of that moved the round-robin position
    assert pool.acquire() == pool.streams("normal")[0]


def test_acquire_after_close_raises_pool_closed(pool):
    pool.close()
    assert pool.closed
    with pytest.raises(PoolClosed):
        pool.acquire()
    with pytest.raises(PoolClosed):
        pool.acquire("high")
    with pytest.raises(PoolClosed):
        pool.acquire(policy="idle-first")


# close -----------------------------------------------------------------------------------------

def test_close_destroys_every_stream(be, pool):
    handles = pool.handles
    pool.close()
    assert sorted(be.destroyed) == sorted(handles)
    assert pool.handles == []
    for h in handles:
        with pytest.raises(CudaError):
            be.stream_query(h)
    pool.close()  # idempotent
    assert sorted(be.destroyed) == sorted(handles)


def test_close_drains_queued_work_first(be):
    p = StreamPool(be, 0, size=2, high_priority_size=0)
    ptr = be.malloc(4096)
    fill_u32_async(be, ptr, 4, 0x5A5A5A5A, p.streams()[0], delay_s=0.2)
    p.close()
    out = bytearray(16)
    be.copy_from_device_async(out, ptr, 1)
    be.stream_synchronize(1)
    assert out == (0x5A5A5A5A).to_bytes(4, "little") * 4


def test_close_of_a_pool_on_another_device_keeps_the_callers_device(be):
    p = StreamPool(be, 1, size=1, high_priority_size=0)
    be.set_device(0)
    p.close()
    assert be.get_device() == 0
    assert len(be.destroyed) == 1


def test_synchronize_waits_for_every_stream(be, pool):
    for h in pool.handles:
        spin_async(be, h, 0.1)
    pool.synchronize()
    assert all(be.stream_query(h) for h in pool.handles)


# hardware queues -------------------------------------------------------------------------------

@pytest.fixture
def no_max_connections(monkeypatch):
    # setenv first so that monkeypatch restores the variable's original state (even "unset")
    # after ensure_hardware_queues wrote it behind monkeypatch's back.
    monkeypatch.setenv(MAX_CONNECTIONS_ENV, "placeholder")
    monkeypatch.delenv(MAX_CONNECTIONS_ENV)
    yield monkeypatch


@pytest.mark.parametrize("streams, expected", [(12, "12"), (36, str(HARDWARE_QUEUE_LIMIT)), (0, "1"), (1, "1")])
def test_ensure_hardware_queues_sets_the_variable_when_unset(no_max_connections, streams, expected):
    assert ensure_hardware_queues(streams) == expected
    assert os.environ[MAX_CONNECTIONS_ENV] == expected


def test_ensure_hardware_queues_leaves_a_user_value_alone(monkeypatch):
    monkeypatch.setenv(MAX_CONNECTIONS_ENV, "4")
    assert ensure_hardware_queues(36) == "4"
    assert os.environ[MAX_CONNECTIONS_ENV] == "4"


def test_ensure_hardware_queues_second_call_keeps_the_first_value(no_max_connections):
    assert ensure_hardware_queues(8) == "8"
    assert ensure_hardware_queues(16) == "8"  # it is now set, so it is left as it is
    assert os.environ[MAX_CONNECTIONS_ENV] == "8"
