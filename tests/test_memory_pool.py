"""Unit tests of the stream-ordered memory pool on the emulated device."""

import threading
from contextlib import contextmanager

import pytest
from device_kernels import spin_async

from cudabridge.device import LEGACY_STREAM, PER_THREAD_STREAM
from cudabridge.errors import InvalidArgument, InvalidFree, OutOfDeviceMemory, PoolClosed, UnknownStream
from cudabridge.memory import ALIGNMENT, StreamOrderedMemoryPool


@pytest.fixture
def streams(emulated):
    return [emulated.stream_create() for _ in range(3)]


@pytest.fixture
def pool(emulated, streams):
    p = StreamOrderedMemoryPool(emulated, 0, streams, limit_bytes=64 << 20)
    yield p
    p.close()


def snapshot(pool):
    s = pool.statistics().as_dict()
    for volatile in ("event_polls", "stream_polls", "events_recorded", "waiting_on_events_bytes"):
        s.pop(volatile)
    return s


def test_alignment_and_distinct_blocks(pool, streams):
    allocs = [pool.allocate(n, streams[0]) for n in (1, 255, 256, 257, 5000, 1 << 20, 3 << 20)]
    for a in allocs:
        assert a.ptr % ALIGNMENT == 0
    spans = sorted((a.ptr, a.ptr + a.size) for a in allocs)
    assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:]))
    assert len({a.id for a in allocs}) == len(allocs)
    for a in allocs:
        a.free()


def test_same_stream_reuse_is_immediate(pool, streams, emulated):
    a = pool.allocate(4096, streams[0])
    spin_async(emulated, streams[0], 0.2)  # the stream is busy: reuse on it is still safe
    ptr = a.ptr
    a.free()
    b = pool.allocate(4096, streams[0])
    assert b.ptr == ptr
    assert pool.statistics().host_syncs == 0
    b.free()


def test_other_stream_does_not_get_busy_block(pool, streams, emulated):
    a = pool.allocate(4096, streams[0])
    spin_async(emulated, streams[0], 0.3)
    ptr = a.ptr
    a.free()
    b = pool.allocate(4096, streams[1])
    assert b.ptr != ptr
    b.free()


def test_other_stream_gets_block_once_complete(pool, streams, emulated):
    a = pool.allocate(1 << 20, streams[0])
    ptr = a.ptr
    a.free()
    emulated.stream_synchronize(streams[0])
    # fill the safe index's smaller pieces so that only the freed block fits
    b = pool.allocate(1 << 20, streams[1])
    c = pool.allocate(1 << 20, streams[1])
    assert ptr in (b.ptr, c.ptr)
    assert pool.statistics().gpu_waits == 0
    b.free(); c.free()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "8", None, True, (64 << 20) + 1])
def test_bad_sizes_change_nothing(pool, streams, bad):
    before = snapshot(pool)
    with pytest.raises(InvalidArgument):
        pool.allocate(bad, streams[0])
    assert snapshot(pool) == before


def test_unknown_stream_refused(pool, emulated):
    foreign = emulated.stream_create()
    before = snapshot(pool)
    with pytest.raises(UnknownStream):
        pool.allocate(100, foreign)
    with pytest.raises(InvalidArgument):
        pool.allocate(100, "stream")
    assert snapshot(pool) == before


def test_double_free_and_foreign_handles(pool, streams, emulated):
    a = pool.allocate(100, streams[0])
    a.free()
    before = snapshot(pool)
    with pytest.raises(InvalidFree, match="double free"):
        pool.free(a)
    with pytest.raises(InvalidFree):
        pool.free(object())
    with pytest.raises(InvalidFree):
        pool.free(a.ptr)  # a bare pointer is not an allocation
    other = StreamOrderedMemoryPool(emulated, 0, [], limit_bytes=8 << 20)
    try:
        x = other.allocate(100, LEGACY_STREAM)
        with pytest.raises(InvalidFree, match="belongs to the pool"):
            pool.free(x)
        assert x.alive
        x.free()
    finally:
        other.close()
    assert snapshot(pool) == before


def test_free_on_unknown_stream_changes_nothing(pool, streams, emulated):
    a = pool.allocate(100, streams[0])
    before = snapshot(pool)
    with pytest.raises(UnknownStream):
        a.free(emulated.stream_create())
    assert a.alive and snapshot(pool) == before
    a.free()


def test_stale_handle_after_release_never_frees_new_owner(pool, streams):
    a = pool.allocate(4096, streams[0], owner=1)
    assert pool.reclaim_owner(1) == (1, 4096)
    assert not a.alive
    b = pool.allocate(4096, streams[0], owner=2)   # same stream: gets the very same block
    assert b.ptr == a.ptr
    with pytest.raises(InvalidFree, match="stale handle"):
        a.free()
    assert b.alive
    b.free()
    s = pool.statistics()
    assert s.leaks_reclaimed == 1 and s.leaked_bytes_reclaimed == 4096 and s.live_allocations == 0


def test_reclaim_owner_counts_only_what_is_left(pool, streams):
    keep = [pool.allocate(1000, streams[1], owner=17) for _ in range(5)]
    for a in keep[:3]:
        a.free()
    assert pool.reclaim_owner(17) == (2, 2000)
    assert pool.reclaim_owner(17) == (0, 0)
    assert pool.owned_by(17) == []


def test_out_of_memory_reports_numbers_and_keeps_working(emulated, streams):
    pool = StreamOrderedMemoryPool(emulated, 0, streams, limit_bytes=4 << 20)
    try:
        held = [pool.allocate(1 << 20, streams[0]) for _ in range(3)]
        with pytest.raises(OutOfDeviceMemory) as info:
            pool.allocate(2 << 20, streams[0])
        e = info.value
        assert e.requested_bytes == 2 << 20 and e.in_use_bytes == 3 << 20 and e.reserved_bytes <= 4 << 20
        assert e.limit_bytes == 4 << 20 and e.largest_free_block_bytes < 2 << 20
        s = pool.statistics()
        assert s.oom == 1 and s.host_syncs == 1
        for a in held:
            a.free()
        pool.allocate(2 << 20, streams[1]).free()  # coalesced after the frees complete
    finally:
        pool.close()


def test_coalescing_gives_back_whole_chunks(pool, streams, emulated):
    allocs = [pool.allocate(256 << 10, streams[i % 3]) for i in range(8)]  # one 2 MiB small chunk
    reserved = pool.statistics().reserved_bytes
    for a in allocs:
        a.free()
    for s in streams:
        emulated.stream_synchronize(s)
    big = pool.allocate(2 << 20, streams[0])  # large class: needs its own chunk
    big.free()
    whole = pool.allocate(1 << 20, streams[2])  # small class: served from the coalesced chunk
    s = pool.statistics()
    assert s.reserved_bytes <= reserved + (20 << 20)
    whole.free()
    # after everything is reclaimed, the small chunk is one free block again
    pool._core.reclaim_all()
    sizes = sorted(b.size for b in pool._safe.small.blocks())
    assert sizes == [2 << 20]


def test_record_stream_orders_free_behind_both(pool, streams, emulated):
    a = pool.allocate(1 << 20, streams[0])
    a.record_stream(streams[1])
    spin_async(emulated, streams[1], 0.3)  # the second user is still busy
    ptr = a.ptr
    a.free()
    b = pool.allocate(1 << 20, streams[0])  # even the allocating stream must not get it yet
    c = pool.allocate(1 << 20, streams[2])
    assert ptr not in (b.ptr, c.ptr)
    b.free(); c.free()
    emulated.stream_synchronize(streams[1])
    got = [pool.allocate(1 << 20, streams[2]) for _ in range(4)]
    assert ptr in [g.ptr for g in got]
    for g in got:
        g.free()


def test_per_thread_streams_keyed_by_thread(emulated):
    pool = StreamOrderedMemoryPool(emulated, 0, [], limit_bytes=64 << 20)
    try:
        a = pool.allocate(4096, PER_THREAD_STREAM)
        spin_async(emulated, PER_THREAD_STREAM, 0.3)
        ptr = a.ptr
        a.free()
        seen = []
        t = threading.Thread(target=lambda: seen.append(pool.allocate(4096, PER_THREAD_STREAM)))
        t.start(); t.join()
        assert seen[0].ptr != ptr     # another thread's default stream is another stream
        again = pool.allocate(4096, PER_THREAD_STREAM)
        assert again.ptr == ptr       # this thread's own stream: immediate reuse
        again.free(); seen[0].free()
    finally:
        pool.close()


def test_register_and_unregister_external_stream(pool, emulated):
    ext = emulated.stream_create()
    with pytest.raises(UnknownStream):
        pool.allocate(10, ext)
    pool.register_stream(ext)
    with pytest.raises(InvalidArgument):
        pool.register_stream(ext)
    a = pool.allocate(10, ext)
    with pytest.raises(InvalidArgument, match="live allocation"):
        pool.unregister_stream(ext)
    a.free()
    pool.unregister_stream(ext)
    with pytest.raises(UnknownStream):
        pool.allocate(10, ext)


def test_calls_after_close_refused(emulated, streams):
    pool = StreamOrderedMemoryPool(emulated, 0, streams, limit_bytes=8 << 20)
    a = pool.allocate(100, streams[0])
    assert pool.close() == 1
    assert pool.close() == 0
    for call in (lambda: pool.allocate(100, streams[0]), lambda: pool.allocate(100, PER_THREAD_STREAM),
                 lambda: a.free(), lambda: pool.register_stream(12345)):
        with pytest.raises(PoolClosed):
            call()


def test_bad_construction(emulated):
    for kw in ({"limit_bytes": 0}, {"limit_bytes": -5}, {"limit_fraction": 0.0}, {"limit_fraction": 1.5},
               {"initial_bytes": -1}, {"arena_type": "yolo"}, {"arena_type": int}, {"limit_bytes": 1 << 20, "initial_bytes": 2 << 20},
               {"cache_frees": -1}, {"cache_frees": 1.5}, {"cache_frees": (1 << 20) + 1}):
        with pytest.raises(InvalidArgument):
            StreamOrderedMemoryPool(emulated, 0, [], **kw)
    with pytest.raises(InvalidArgument):
        StreamOrderedMemoryPool(emulated, 0, [PER_THREAD_STREAM])


def test_initial_bytes_and_fraction_limit(emulated):
    free, _ = emulated.mem_get_info()
    pool = StreamOrderedMemoryPool(emulated, 0, [], limit_fraction=0.5, initial_bytes=8 << 20)
    try:
        s = pool.statistics()
        assert s.reserved_bytes == 8 << 20 and abs(s.limit_bytes - free // 2) < 4096
        a = pool.allocate(4 << 20, LEGACY_STREAM)
        assert pool.statistics().chunks_allocated == 1   # served from the initial chunk
        a.free()
    finally:
        pool.close()


def test_statistics_track_peak_and_counts(pool, streams):
    allocs = [pool.allocate(1 << 20, streams[0]) for _ in range(4)]
    for a in allocs:
        a.free()
    s = pool.statistics()
    assert s.peak_in_use_bytes == 4 << 20 and s.in_use_bytes == 0
    assert s.allocations == 4 and s.live_allocations == 0
    assert s.free_safe_bytes + s.free_in_streams_bytes == s.reserved_bytes


def test_statistics_balance_with_a_free_pending_behind_two_streams(pool, streams):
    """A block freed behind two streams (record_stream) is neither safe nor in one stream's bins:
    the statistics show it as free_pending_bytes, and the books still balance."""
    a = pool.allocate(1 << 20, streams[0])
    b = pool.allocate(4096, streams[0])
    a.record_stream(streams[1])
    a.free()
    s = pool.statistics()
    assert s.free_pending_bytes == 1 << 20
    assert s.in_use_bytes + s.free_safe_bytes + s.free_in_streams_bytes + s.free_pending_bytes + s.spare_bytes \
        == s.reserved_bytes
    b.free()


def test_context_manager_frees(pool, streams):
    with pool.allocate(100, streams[0]) as a:
        assert a.alive
    assert not a.alive
    assert pool.statistics().live_allocations == 0


@contextmanager
def _one_stream_pool(emulated, **options):
    """A pool of one stream of its own (``options``: the pool's keywords), closed afterwards."""
    s = emulated.stream_create()
    pool = StreamOrderedMemoryPool(emulated, 0, [s], **options)
    try:
        yield pool, s
    finally:
        pool.close()
        emulated.stream_destroy(s)


def test_a_disowned_allocation_is_no_owners_and_its_owners_release_leaves_it(emulated):
    # What a library allocator does with a block it sets aside (the address of another task's
    # reclaimed allocation): the task it was made for does not hold it, and its release leaves it.
    # (Both fast paths: this file runs again on the Python one, test_native_fast_path.py.)
    with _one_stream_pool(emulated) as (pool, s):
        kept, other = pool.allocate(4096, s, owner=7), pool.allocate(4096, s, owner=7)
        assert pool.disown(kept) and kept.owner is None
        assert pool.reclaim_owner(7) == (1, 4096)   # only the other one
        assert kept.alive and not other.alive
        assert pool.reclaim_owner(7) == (0, 0)
        kept.free()
        assert not pool.disown(kept) and not pool.disown(other) and not pool.disown(object())
        assert pool.statistics().in_use_bytes == 0


def test_stream_cache_is_coalesced_before_the_limit_refuses(emulated):
    # Growth is refused at the limit, so the stream's cached frees are coalesced for the request:
    # the cache never turns into an out-of-memory.
    with _one_stream_pool(emulated, limit_bytes=16 << 20) as (pool, s):
        blocks = [pool.allocate(2 << 20, s) for _ in range(6)]
        for a in blocks:
            a.free()   # six frees, all in the stream's cache
        whole = pool.allocate(12 << 20, s)
        assert pool.statistics().reserved_bytes <= 16 << 20
        whole.free()


def test_stream_cache_keeps_only_its_newest_frees(emulated):
    # A stream of ever-new sizes: what the slow path leaves in the stream's bins is its newest
    # cache_frees frees (and blocks its stream has not passed), not everything it ever freed.
    with _one_stream_pool(emulated, limit_bytes=256 << 20, cache_frees=4) as (pool, s):
        for i in range(40):
            pool.allocate((2 << 20) + i * 4096, s).free()
            emulated.stream_synchronize(s)
        arena = pool._streams.by_handle[s]
        assert len(list(arena.free_blocks())) <= 4 + 1


def test_the_pool_cache_setting_reaches_every_gpus_pool(emulated):
    from cudabridge.config import ServiceConfig
    from cudabridge.service import CudaBridgeService

    for value, expected in ((None, 256), (0, 0), (32, 32)):
        kw = {} if value is None else {"pool_cache_frees": value}
        with CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=2, high_priority_streams=0, **kw),
                               backend=emulated) as svc:
            assert [svc.memory_pool(o).cache_frees for o in svc.gpus] == [expected] * len(svc.gpus)


@pytest.mark.parametrize("growth,sizes,request_,limit,later", [
    ("auto", [512 << 10] * 4, 1 << 20, 6 << 20, 3 << 20),         # small chunks: never given back
    ("chunks", [8 << 20, 8 << 20], 18 << 20, 50 << 20, 30 << 20),  # cudaMalloc chunks: never given back
])
def test_the_stream_cache_never_makes_the_pool_grow_for_good_where_joining_it_serves(emulated, growth, sizes,
                                                                                      request_, limit, later):
    # Growth that is for good (a small chunk, a cudaMalloc chunk) waits for a run of the stream's
    # cached blocks: grown instead, its room was gone when a later request needed it at the limit.
    with _one_stream_pool(emulated, limit_bytes=limit, growth=growth) as (pool, s):
        blocks = [pool.allocate(n, s) for n in sizes]
        reserved = pool.statistics().reserved_bytes
        for a in blocks:
            a.free()
        joined = pool.allocate(request_, s)   # served by the cached blocks joined
        assert pool.statistics().reserved_bytes == reserved
        joined.free()
        emulated.stream_synchronize(s)
        pool.allocate(later, s).free()   # needs the room a needless growth would have taken


def test_a_block_freed_again_stays_in_the_stream_cache_by_its_newest_free(emulated):
    # The fast path takes a block back and it is freed again: its older entry in the arena's free
    # order must not count as its place, or the cache gives up its newest frees first.
    size_a, size_b = 3 << 20, 5 << 20
    with _one_stream_pool(emulated, limit_bytes=512 << 20, cache_frees=4) as (pool, s):
        a, b = pool.allocate(size_a, s), pool.allocate(size_b, s)
        a.free()
        b.free()
        for o in [pool.allocate((7 << 20) + i * 4096, s) for i in range(10)]:
            o.free()
        for _ in range(3):   # a repeating step: A and B from the stream's bins, freed again
            a, b = pool.allocate(size_a, s), pool.allocate(size_b, s)
            a.free()
            b.free()
        emulated.stream_synchronize(s)
        pool.allocate(40 << 20, s).free()   # one allocation through the slow path
        slow = pool.statistics().slow_allocations
        pool.allocate(size_a, s).free()
        pool.allocate(size_b, s).free()
        assert pool.statistics().slow_allocations == slow


def test_a_full_pool_has_its_holders_give_back_once_before_its_out_of_memory_handler(emulated):
    # Frees kept outside the pool (a library plug-in's) come back before an allocation waits or
    # fails; the handler then counts its attempts from its own first call.
    with _one_stream_pool(emulated, limit_bytes=4 << 20) as (pool, s):
        held = [pool.allocate(4 << 20, s)]
        calls, attempts = [], []

        def give_back() -> int:
            calls.append(len(held))
            if not held:
                return 0
            held.pop().free()
            return 1

        def handler(p, r, owner, exc, attempt, first_asked) -> bool:
            attempts.append(attempt)
            return False

        pool.out_of_memory_handler = handler
        pool.add_holder(give_back)
        a = pool.allocate(2 << 20, s)   # served once the holder gave its 4 MiB back
        assert (calls, attempts) == ([1], [])
        held.append(pool.allocate(1 << 20, s))
        with pytest.raises(OutOfDeviceMemory):
            pool.allocate(3 << 20, s)   # the 1 MiB back is not enough: the handler, from its attempt 0
        assert (calls, attempts) == ([1, 1], [0])
        with pytest.raises(OutOfDeviceMemory):
            pool.allocate(3 << 20, s)   # nothing to give back
        assert (calls, attempts) == ([1, 1, 0], [0, 0])
        pool.remove_holder(give_back)
        pool.remove_holder(give_back)   # not registered: nothing happens
        with pytest.raises(OutOfDeviceMemory):
            pool.allocate(3 << 20, s)
        assert len(calls) == 3
        a.free()


def _outer_attempts(pool, s, holder) -> list:
    """The attempts the out-of-memory handler sees for a 2 MiB allocation of owner 1 that never
    fits (asked four times), with ``holder`` registered; owner 99's nested allocations fail at once."""
    attempts: list = []
    first: set = set()   # the outer's first ask's time, as each of its calls is told

    def handler(p, r, owner, exc, attempt, first_asked) -> bool:
        if owner == 99:
            return False
        attempts.append(attempt)
        first.add(first_asked)
        return len(attempts) < 4

    pool.out_of_memory_handler = handler
    pool.add_holder(holder)
    with pytest.raises(OutOfDeviceMemory):
        pool.allocate(2 << 20, s, owner=1)
    assert len(first) == 1, "a nested allocation's first ask replaced the outer's"
    return attempts


def test_an_allocation_nested_in_a_holder_leaves_the_outer_handlers_attempt_count_alone(emulated):
    # A holder's give-back (or the handler, or a finalizer) may allocate from the same pool on the
    # same thread; the nested allocation's own count and first ask must not replace the outer's (the
    # handler's deadline runs from that first ask), whether the nested one fails or a give-back serves it.
    with _one_stream_pool(emulated, limit_bytes=4 << 20) as (pool, s):
        full = pool.allocate(4 << 20, s)
        calls = {"n": 0}

        def failing_nested() -> int:
            calls["n"] += 1
            if calls["n"] == 3:   # the outer's give-back before its 2nd handler call
                with pytest.raises(OutOfDeviceMemory):
                    pool.allocate(1 << 20, s, owner=99)   # nested, same thread: fails at once
            return 0

        assert _outer_attempts(pool, s, failing_nested) == [0, 1, 2, 3]
        full.free()
    with _one_stream_pool(emulated, limit_bytes=4 << 20) as (pool, s):
        full, spare = pool.allocate(3 << 20, s), [pool.allocate(1 << 20, s)]
        calls, nested = {"n": 0}, []

        def served_nested() -> int:
            calls["n"] += 1
            if calls["n"] == 3:
                nested.append(pool.allocate(1 << 20, s, owner=99))   # nested: served by the give-back below
                return 0
            if calls["n"] == 4 and spare:
                spare.pop().free()
                return 1
            return 0

        assert _outer_attempts(pool, s, served_nested) == [0, 1, 2, 3]
        full.free()
        nested[0].free()
