"""The cases a hostile sweep of the Python API found slipping through or getting the wrong error.

The rule: a size, stream handle, owner or task attempt id is any ``operator.index()`` type except
``bool`` (``True`` and ``1.0`` would otherwise act on 1: a dict takes them for it); every bad
value gets a typed error (a subclass of CudaBridgeError) and changes nothing. Byte settings: a
bare integer is bytes, a number with a decimal point a fraction in (0, 1], a suffix bytes; byte
limits below 2 MiB and anything at 2**63 or more are refused.
"""

from __future__ import annotations

import threading

import pytest

from cudabridge.config import SERVICE, ServiceConfig
from cudabridge.errors import CudaBridgeError, InvalidArgument, InvalidFree, PoolClosed
from cudabridge.memory import StreamOrderedMemoryPool, native
from cudabridge.service import CudaBridgeService

MiB = 1 << 20
FAST_PATHS = ["python"] + (["native"] if native.load() is not None else [])


class Index:
    """An integer-like type that is not an int (as numpy.int64 or a JPype JLong can be)."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v


class SubInt(int):
    pass


@pytest.fixture(params=FAST_PATHS)
def pool(request, emulated):
    streams = [emulated.stream_create() for _ in range(2)]
    p = StreamOrderedMemoryPool(emulated, 0, streams, limit_bytes=64 * MiB, fast_path=request.param)
    assert p.fast_path == request.param
    p.test_streams = streams
    yield p
    p.close()


def state(pool):
    s = pool.statistics()
    return (s.live_allocations, s.in_use_bytes, s.allocations, s.reserved_bytes)


@pytest.mark.parametrize("limit", [1 << 63, 1 << 64, 1 << 80])
@pytest.mark.parametrize("fast_path", FAST_PATHS)
def test_a_pool_limit_of_2_63_or_more_is_refused_typed(emulated, limit, fast_path):
    with pytest.raises(InvalidArgument, match="limit_bytes"):
        StreamOrderedMemoryPool(emulated, 0, [], limit_bytes=limit, fast_path=fast_path)


def test_the_largest_limit_is_accepted_and_reserves_address_space_for_the_device_only(emulated):
    s = emulated.stream_create()
    with StreamOrderedMemoryPool(emulated, 0, [s], limit_bytes=(1 << 63) - 1) as p:
        a = p.allocate(4 * MiB, s)   # a segment: its reservation follows the device's size
        a.free()


@pytest.mark.parametrize("owner", [[], {}, "task", 1.0, True, None.__class__])
def test_a_bad_owner_is_refused_before_anything_is_lent(pool, owner):
    before = state(pool)
    with pytest.raises(InvalidArgument, match="owner"):
        pool.allocate(64, pool.test_streams[0], owner=owner)
    assert state(pool) == before


@pytest.mark.parametrize("size", [64.0, True, "64", None])
def test_sizes_that_are_not_ints_are_refused(pool, size):
    before = state(pool)
    with pytest.raises(InvalidArgument, match="allocation size must be an int"):
        pool.allocate(size, pool.test_streams[0])
    assert state(pool) == before


@pytest.mark.parametrize("stream", [1.0, True, 0.0, False, [1]])
def test_streams_that_are_not_ints_are_refused_even_where_they_equal_a_default_stream(pool, stream):
    before = state(pool)
    with pytest.raises(InvalidArgument, match="stream must be an int handle"):
        pool.allocate(64, stream)
    assert state(pool) == before


def test_index_types_are_accepted_and_stored_as_ints(pool):
    s = pool.test_streams[0]
    a = pool.allocate(SubInt(4096), Index(s), owner=Index(7))
    assert a.size == 4096 and a.stream.__class__ is int and a.owner.__class__ is int
    assert f"stream={s:#x}" in repr(a)
    assert pool.owned_by(7) == [a]
    pool.free(a, stream=Index(s))
    b = pool.allocate(Index(64), 1)   # the legacy stream, given as an index type
    assert b.stream == 1 and repr(b)
    b.free()


def test_an_int_subclass_too_large_says_so_and_one_that_fits_is_served(pool):
    with pytest.raises(InvalidArgument, match="exceeds the pool limit"):
        pool.allocate(SubInt(1 << 40), pool.test_streams[0])
    pool.allocate(SubInt(100), pool.test_streams[0]).free()


@pytest.mark.parametrize("stream", [True, 1.0])
def test_free_with_a_stream_that_is_not_an_int_is_refused_and_the_allocation_stays_live(pool, stream):
    a = pool.allocate(64, pool.test_streams[0])
    with pytest.raises(InvalidArgument, match="stream must be an int handle"):
        pool.free(a, stream=stream)
    assert a.alive and pool.statistics().live_allocations == 1
    a.free()


@pytest.mark.parametrize("handle", [-5, 1 << 64, 1 << 70, 2.5, True, "0x10"])
def test_register_stream_refuses_what_is_no_stream_handle(pool, handle):
    before = pool.statistics().streams_accepted
    with pytest.raises(InvalidArgument):
        pool.register_stream(handle)
    assert pool.statistics().streams_accepted == before


def test_statistics_after_close_report_nothing_in_use(pool):
    held = [pool.allocate(4096, pool.test_streams[0]) for _ in range(3)]
    pool.allocate(5 * MiB, pool.test_streams[1])
    held[0].free()
    pool.close()
    s = pool.statistics()
    assert (s.in_use_bytes, s.live_allocations, s.reserved_bytes) == (0, 0, 0)
    assert s.peak_in_use_bytes > 0


def test_statistics_after_a_close_under_load_report_nothing_in_use(emulated):
    streams = [emulated.stream_create() for _ in range(4)]
    pool = StreamOrderedMemoryPool(emulated, 0, streams, limit_bytes=256 * MiB)
    stop = threading.Event()

    def worker(k: int) -> None:
        s = streams[k % 4]
        while not stop.is_set():
            try:
                a = pool.allocate((4096, 5 * MiB)[k % 2], s)
                a.free()
            except (PoolClosed, InvalidFree):
                return
            except CudaBridgeError:
                return

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    threading.Event().wait(0.2)
    pool.close()
    stop.set()
    for t in threads:
        t.join(10)
    s = pool.statistics()
    assert (s.in_use_bytes, s.live_allocations, s.reserved_bytes) == (0, 0, 0)


# the service ----------------------------------------------------------------------------------
@pytest.fixture
def service():
    svc = CudaBridgeService(ServiceConfig(backend="emulated", emulated_memory="256m", pool_limit="64m",
                                          streams_per_gpu=2, high_priority_streams=0, log_level="WARNING"))
    yield svc
    svc.close()


@pytest.mark.parametrize("task", [True, 1.0, "1", None])
def test_task_ids_that_are_not_ints_never_act_on_task_1(service, task):
    service.bind_task(1)
    a = service.allocate(1, 4096)
    with pytest.raises(InvalidArgument, match="task attempt id must be an int"):
        service.allocate(task, 4096)
    with pytest.raises(InvalidArgument, match="task attempt id must be an int"):
        service.release_task(task)
    with pytest.raises(InvalidArgument, match="task attempt id must be an int"):
        service.bind_task(task)
    assert service.registry.bound_tasks() == [1] and a.alive
    assert service.memory_pool(0).statistics().live_allocations == 1
    assert service.release_task(Index(1)).leaks_reclaimed == 1


@pytest.mark.parametrize("level", [None, 5, "LOUD", ""])
def test_a_bad_log_level_is_refused_typed(level):
    with pytest.raises(InvalidArgument, match="spark.cudabridge.logLevel"):
        ServiceConfig(log_level=level)


@pytest.mark.parametrize("key,value", [("pool_limit", "1"), ("pool_limit", "255"), ("pool_limit", "2097151"),
                                       ("pool_limit", "1.5"), ("pool_limit", "0.0"), ("pool_limit", "-1"),
                                       ("pool_limit", str(1 << 63)), ("pool_limit", "8388608t"),
                                       ("emulated_memory", "0"), ("emulated_memory", "1m")])
def test_byte_settings_below_2_mib_or_absurd_are_refused(key, value):
    with pytest.raises(InvalidArgument, match=SERVICE[key].spark_key):
        ServiceConfig(**{key: value})


@pytest.mark.parametrize("value,expected", [("1.0", (None, 1.0)), ("0.5", (None, 0.5)), (".25", (None, 0.25)),
                                            ("2m", (2 * MiB, 1.0)), ("2097152", (2 * MiB, 1.0)),
                                            ("8g", (8 << 30, 1.0))])
def test_byte_settings_follow_the_rule(value, expected):
    assert ServiceConfig(pool_limit=value).pool_limit == expected


@pytest.mark.parametrize("size", [0, -1, 64.0, 1 << 70])
def test_a_refused_size_on_the_per_thread_stream_creates_no_arena(pool, size):
    from cudabridge.device import PER_THREAD_STREAM

    before = pool.statistics().streams_accepted
    with pytest.raises(InvalidArgument):
        pool.allocate(size, PER_THREAD_STREAM)
    assert pool.statistics().streams_accepted == before
