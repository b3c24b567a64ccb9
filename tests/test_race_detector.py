"""The emulated device's stream-ordering race detector (emulated_backend.py, ``race_check``).

Each ordering mechanism is tested twice, with it and without it: the access is legal with it,
a race without it, so that each test fails if the mechanism is ignored or if it is wrongly
taken for an ordering. The detector works at enqueue time, so no test depends on timing; the
few sleeps only make an unordered access *look* safe (the earlier work has long finished).
"""

from __future__ import annotations

import threading
import time

import pytest
from device_kernels import fill_u32_async, spin_async

from cudabridge.device import LEGACY_STREAM, PER_THREAD_STREAM, EmulatedBackend, open_backend
from cudabridge.errors import InvalidArgument, StreamOrderRace

MiB = 1 << 20
GRANULE = 2 * MiB


@pytest.fixture
def be():
    backend = EmulatedBackend(devices=1, memory_bytes=64 * MiB, race_check=True)
    yield backend
    backend.close()


def until(predicate, timeout=10.0):
    """Poll ``predicate`` until it is true (it is a query: polling is what the host does)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def label(stream):
    return f"pool stream {stream:#x}"


def expect_race(backend, fn, kind):
    before = len(backend.races)
    with pytest.raises(StreamOrderRace) as info:
        fn()
    assert info.value.kind == kind, str(info.value)
    assert backend.races[before:] == [info.value]
    return info.value


# each ordering makes the access legal; without it, the same access is a race -------------------

@pytest.mark.parametrize("ordered", [True, False], ids=["same-stream", "two-streams"])
def test_stream_order(be, ordered):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p, 1024, 1, a, delay_s=0.05)
    later = a if ordered else b
    if ordered:
        fill_u32_async(be, p, 1024, 2, later)                    # WAW on one stream
        be.copy_from_device_async(bytearray(4096), p, later)     # RAW on one stream
        be.memset_async(p, 3, 4096, later)                       # WAR on one stream
        assert be.races == []
    else:
        expect_race(be, lambda: fill_u32_async(be, p, 1024, 2, later), "write-after-write")


@pytest.mark.parametrize("ordered", [True, False], ids=["waited", "not-waited"])
def test_event_record_and_stream_wait_event(be, ordered):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    ev = be.event_create()
    fill_u32_async(be, p, 1024, 1, a, delay_s=0.05)
    be.event_record(ev, a)
    if ordered:
        be.stream_wait_event(b, ev)
        out = be.alloc_pinned(4096)
        be.copy_from_device_async(out, p, b)
        be.stream_synchronize(b)
        assert bytes(out) == (1).to_bytes(4, "little") * 1024
        be.free_pinned(out)
        assert be.races == []
    else:
        expect_race(be, lambda: be.copy_from_device_async(be.alloc_pinned(4096), p, b), "read-after-write")


@pytest.mark.parametrize("ordered", [True, False], ids=["synchronized", "other-stream-synchronized"])
def test_stream_synchronize(be, ordered):
    a, b, c = be.stream_create(), be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p, 1024, 1, a)
    be.stream_synchronize(a if ordered else c)
    if ordered:
        fill_u32_async(be, p, 1024, 2, b)
        assert be.races == []
    else:
        expect_race(be, lambda: fill_u32_async(be, p, 1024, 2, b), "write-after-write")


@pytest.mark.parametrize("ordered", [True, False], ids=["synchronized", "not-synchronized"])
def test_event_synchronize(be, ordered):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    ev = be.event_create()
    fill_u32_async(be, p, 1024, 1, a)
    be.event_record(ev, a)
    if ordered:
        be.event_synchronize(ev)
        fill_u32_async(be, p, 1024, 2, b)
        assert be.races == []
    else:
        time.sleep(0.05)   # long done, but nobody looked
        expect_race(be, lambda: fill_u32_async(be, p, 1024, 2, b), "write-after-write")


@pytest.mark.parametrize("ordered", [True, False], ids=["query-true", "query-false"])
def test_event_query(be, ordered):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    ev = be.event_create()
    fill_u32_async(be, p, 1024, 1, a)
    be.event_record(ev, a)
    if ordered:
        until(lambda: be.event_query(ev))
        fill_u32_async(be, p, 1024, 2, b)
        assert be.races == []
    else:
        spin_async(be, a, 0.5)
        ev2 = be.event_create()
        be.event_record(ev2, a)
        assert be.event_query(ev2) is False   # a query that says "not yet" orders nothing
        expect_race(be, lambda: fill_u32_async(be, p, 1024, 2, b), "write-after-write")


@pytest.mark.parametrize("ordered", [True, False], ids=["query-true", "query-false"])
def test_stream_query(be, ordered):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p, 1024, 1, a)
    if ordered:
        until(lambda: be.stream_query(a))
        fill_u32_async(be, p, 1024, 2, b)
        assert be.races == []
    else:
        spin_async(be, a, 0.5)
        assert be.stream_query(a) is False
        expect_race(be, lambda: fill_u32_async(be, p, 1024, 2, b), "write-after-write")


def test_stream_query_true_covers_only_what_was_queued_before_it(be):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    until(lambda: be.stream_query(a))   # idle, seen so; then the write
    fill_u32_async(be, p, 1024, 1, a)
    expect_race(be, lambda: fill_u32_async(be, p, 1024, 2, b), "write-after-write")


@pytest.mark.parametrize("ordered", [True, False], ids=["device-synchronized", "not"])
def test_device_synchronize(be, ordered):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p, 512, 1, a)
    fill_u32_async(be, p + 2048, 512, 1, PER_THREAD_STREAM)
    if ordered:
        be.device_synchronize()
        be.memset_async(p, 0, 4096, b)
        assert be.races == []
    else:
        expect_race(be, lambda: be.memset_async(p, 0, 4096, b), "write-after-write")


def test_device_synchronize_covers_destroyed_streams(be):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p, 1024, 1, a)
    be.stream_destroy(a)   # returns at once in CUDA: no ordering by itself
    expect_race(be, lambda: fill_u32_async(be, p, 1024, 2, b), "write-after-write")
    be.device_synchronize()
    fill_u32_async(be, p, 1024, 2, b)
    assert len(be.races) == 1


@pytest.mark.parametrize("ordered", [True, False], ids=["pageable", "pinned"])
def test_copy_back_to_pageable_memory_is_a_host_synchronization(be, ordered):
    a, b = be.stream_create(), be.stream_create()
    p, q = be.malloc(4096), be.malloc(4096)
    fill_u32_async(be, q, 1024, 7, a)    # a write on a
    host = bytearray(4096) if ordered else be.alloc_pinned(4096)
    be.copy_from_device_async(host, p, a)  # returns after completion only when pageable
    if ordered:
        fill_u32_async(be, q, 1024, 8, b)  # ordered after all of a up to the copy
        fill_u32_async(be, p, 1024, 8, b)  # and after the copy's read
        assert be.races == []
    else:
        expect_race(be, lambda: fill_u32_async(be, q, 1024, 8, b), "write-after-write")
        expect_race(be, lambda: fill_u32_async(be, p, 1024, 8, b), "write-after-read")


def test_host_knowledge_is_shared_by_host_threads(be):
    """One host thread synchronizes; another queues after it and is ordered (the pool passes
    "this stream has passed that block" between threads in plain memory)."""
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p, 1024, 1, a)
    t = threading.Thread(target=be.stream_synchronize, args=(a,))
    t.start()
    t.join(timeout=10)
    fill_u32_async(be, p, 1024, 2, b)
    assert be.races == []


def test_ordering_is_transitive(be):
    """a -> (event) -> b -> (event) -> c: c is ordered after a's write though it never waited on a."""
    a, b, c = be.stream_create(), be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    e1, e2 = be.event_create(), be.event_create()
    fill_u32_async(be, p, 1024, 1, a)
    be.event_record(e1, a)
    be.stream_wait_event(b, e1)
    be.event_record(e2, b)
    be.stream_wait_event(c, e2)
    fill_u32_async(be, p, 1024, 2, c)
    # and a host synchronize of c covers a too
    be.stream_synchronize(c)
    fill_u32_async(be, p, 1024, 3, LEGACY_STREAM)
    assert be.races == []


# each conflict kind is caught ------------------------------------------------------------------

def test_write_after_write(be):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    be.copy_to_device_async(p, b"x" * 64, a)
    race = expect_race(be, lambda: be.memset_async(p, 0, 64, b), "write-after-write")
    assert race.call == "cudaMemsetAsync" and race.other_call == "cudaMemcpyAsync"


def test_write_after_read(be):
    a, b = be.stream_create(), be.stream_create()
    p, q = be.malloc(4096), be.malloc(4096)
    be.device_synchronize()
    be.memcpy_async(q, p, 4096, a)        # reads p, writes q
    race = expect_race(be, lambda: fill_u32_async(be, p, 1024, 1, b), "write-after-read")
    assert race.other_call == "cudaMemcpyAsync" and race.other_stream == label(a)
    expect_race(be, lambda: be.copy_from_device_async(be.alloc_pinned(16), q, b), "read-after-write")


def test_read_after_write(be):
    a, b = be.stream_create(), be.stream_create()
    p, q = be.malloc(4096), be.malloc(4096)
    be.memset_async(p, 1, 4096, a)
    race = expect_race(be, lambda: be.memcpy_async(q, p, 4096, b), "read-after-write")
    assert race.stream == label(b) and race.other_stream == label(a)


def test_reads_from_two_streams_do_not_conflict_but_both_count(be):
    a, b, c = be.stream_create(), be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p, 1024, 1, a)
    be.stream_synchronize(a)
    ev_a, ev_b = be.event_create(), be.event_create()
    be.copy_from_device_async(be.alloc_pinned(4096), p, a)
    be.event_record(ev_a, a)
    be.copy_from_device_async(be.alloc_pinned(4096), p, b)   # read, read: no conflict
    be.event_record(ev_b, b)
    assert be.races == []
    # A writer ordered after only one of the two readers still races with the other (the
    # earlier one as well as the later one: neither read replaces the other).
    be.stream_wait_event(c, ev_b)
    race = expect_race(be, lambda: be.memset_async(p, 0, 4096, c), "write-after-read")
    assert race.other_stream == label(a)
    d = be.stream_create()
    be.stream_wait_event(d, ev_a)
    race = expect_race(be, lambda: be.memset_async(p, 0, 4096, d), "write-after-read")
    assert race.other_stream == label(b)
    be.stream_wait_event(c, ev_a)
    be.memset_async(p, 0, 4096, c)
    assert len(be.races) == 2


def test_an_event_covers_only_the_work_before_its_record(be):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    ev = be.event_create()
    fill_u32_async(be, p, 512, 1, a)
    be.event_record(ev, a)
    fill_u32_async(be, p + 2048, 512, 1, a)      # after the record, before the wait
    be.stream_wait_event(b, ev)
    be.memset_async(p, 0, 2048, b)
    expect_race(be, lambda: be.memset_async(p + 2048, 0, 2048, b), "write-after-write")


def test_stream_wait_event_orders_only_up_to_the_record_at_call_time(be):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    ev = be.event_create()
    fill_u32_async(be, p, 512, 1, a)             # first half
    be.event_record(ev, a)
    be.stream_wait_event(b, ev)                  # waits for this record
    fill_u32_async(be, p + 2048, 512, 1, a)      # second half, after the record
    be.event_record(ev, a)                       # re-recorded: does not extend b's wait
    be.copy_from_device_async(be.alloc_pinned(2048), p, b)
    race = expect_race(be, lambda: be.copy_from_device_async(be.alloc_pinned(2048), p + 2048, b),
                       "read-after-write")
    assert (race.address, race.nbytes) == (p + 2048, 2048)
    be.stream_wait_event(b, ev)                  # a wait now takes the latest record
    be.copy_from_device_async(be.alloc_pinned(2048), p + 2048, b)
    assert len(be.races) == 1


def test_disjoint_ranges_do_not_conflict_partial_overlaps_do(be):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    be.memset_async(p, 1, 256, a)
    be.memset_async(p + 256, 2, 256, b)          # adjacent, disjoint
    be.memset_async(p + 1024, 3, 1, a)
    be.memset_async(p + 1025, 3, 1, b)           # byte-adjacent
    assert be.races == []
    race = expect_race(be, lambda: be.memset_async(p + 128, 4, 200, b), "write-after-write")
    assert (race.address, race.nbytes) == (p + 128, 128)   # exactly the overlap with a's write
    race = expect_race(be, lambda: be.memset_async(p + 1000, 4, 26, b), "write-after-write")
    assert (race.address, race.nbytes) == (p + 1024, 1)


def test_the_range_reported_is_all_the_bytes_in_conflict_with_that_access(be):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p, 1024, 1, a)
    be.copy_from_device_async(be.alloc_pinned(1000), p + 1000, a)   # splits a's write in three
    assert len(be._race.segments()) == 3
    race = expect_race(be, lambda: be.memset_async(p + 8, 0, 4000, b), "write-after-write")
    assert (race.address, race.nbytes) == (p + 8, 4000)


def test_the_exception_names_both_streams_their_kinds_and_the_range(be):
    a = be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p + 64, 16, 1, a)
    race = expect_race(be, lambda: be.memset_async(p, 0, 4096, LEGACY_STREAM), "write-after-write")
    text = str(race)
    assert label(a) in text and "legacy stream of GPU 0" in text
    assert f"[{p + 64:#x}, {p + 128:#x})" in text and "64 bytes" in text
    assert "write-after-write" in text and "cudaLaunchKernel(fill_u32)" in text and "cudaMemsetAsync" in text
    assert race.stream.startswith("legacy stream of GPU 0 (") and race.other_stream == label(a)

    name = {}

    def other_thread():
        name["t"] = threading.current_thread().name
        fill_u32_async(be, p + 256, 16, 1, PER_THREAD_STREAM)

    t = threading.Thread(target=other_thread, name="writer-7")
    t.start()
    t.join(timeout=10)
    # The same handle on this thread is another stream: not ordered after the other thread's.
    race = expect_race(be, lambda: be.copy_from_device_async(be.alloc_pinned(64), p + 256, PER_THREAD_STREAM),
                       "read-after-write")
    assert race.other_stream.startswith("per-thread stream of thread 'writer-7' (0x")
    assert race.stream.startswith(f"per-thread stream of thread {threading.current_thread().name!r} (0x")
    assert race.other_stream in str(race) and race.stream in str(race)


def test_a_refused_access_changes_nothing_and_is_kept_even_if_swallowed(be):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p, 1024, 0x11111111, a, delay_s=0.1)
    segments = be._race.segments()
    try:
        fill_u32_async(be, p, 1024, 0x22222222, b)
    except StreamOrderRace:
        pass   # swallowed, as careless calling code might
    assert len(be.races) == 1 and isinstance(be.races[0], StreamOrderRace)
    assert be._race.segments() == segments
    assert be.stream_query(b) is True        # nothing was queued on b
    out = bytearray(4096)
    be.copy_from_device_async(out, p, a)
    assert out == (0x11111111).to_bytes(4, "little") * 1024


def test_detected_whatever_the_timing(be):
    a, b = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p, 1024, 1, a)
    time.sleep(0.1)   # long finished on the device; but nothing orders b after it
    expect_race(be, lambda: fill_u32_async(be, p, 1024, 2, b), "write-after-write")


# memory going away forgets -----------------------------------------------------------------

def test_free_forgets_its_range(be):
    a = be.stream_create()
    p, q = be.malloc(4096), be.malloc(4096)
    fill_u32_async(be, p, 1024, 1, a)
    fill_u32_async(be, q, 1024, 1, a)
    assert {s[0] for s in be._race.segments()} == {p, q}
    be.free(p)
    assert [s[0] for s in be._race.segments()] == [q]


def test_unmap_then_reuse_of_the_address_forgets(be):
    a, b = be.stream_create(), be.stream_create()
    base = be.va_reserve(2 * GRANULE)
    h1 = be.phys_create(GRANULE)
    be.mem_map(base, GRANULE, h1)
    fill_u32_async(be, base, GRANULE // 4, 1, a)
    # Still mapped: the same address on another stream races.
    expect_race(be, lambda: fill_u32_async(be, base, 16, 2, b), "write-after-write")
    be.mem_unmap(base, GRANULE)
    h2 = be.phys_create(GRANULE)
    be.mem_map(base, GRANULE, h2)
    fill_u32_async(be, base, GRANULE // 4, 2, b)  # new memory at the old address: no history
    be.stream_synchronize(b)
    assert len(be.races) == 1
    be.stream_synchronize(a)
    be.mem_unmap(base, GRANULE)
    assert be._race.segments() == []


def test_va_release_forgets(be):
    a = be.stream_create()
    base = be.va_reserve(GRANULE)
    h = be.phys_create(GRANULE)
    be.mem_map(base, GRANULE, h)
    be.memset_async(base, 1, GRANULE, a)
    be.stream_synchronize(a)
    be.mem_unmap(base, GRANULE)
    be.phys_release(h)
    be.va_release(base, GRANULE)
    assert be._race.segments() == []


# bookkeeping stays small -------------------------------------------------------------------

def test_ranges_are_merged_not_kept_per_byte(be):
    a = be.stream_create()
    p = be.malloc(GRANULE)
    for i in range(200):
        be.memset_async(p + 256 * i, 1, 256, a)
    assert len(be._race.segments()) == 200
    be.memset_async(p, 0, GRANULE, a)                  # one write over all of them
    assert len(be._race.segments()) == 1
    be.copy_from_device_async(be.alloc_pinned(GRANULE), p, a)   # one read of all of it
    (seg,) = be._race.segments()
    assert seg[:2] == (p, p + GRANULE) and len(seg[3]) == 1
    be.stream_synchronize(a)
    be.copy_from_device_async(be.alloc_pinned(GRANULE // 2), p, a)   # half of it read again
    segs = be._race.segments()
    assert [(s[0], s[1]) for s in segs] == [(p, p + GRANULE // 2), (p + GRANULE // 2, p + GRANULE)]
    assert all(len(s[3]) == 1 for s in segs)   # the older read by the same stream is dropped
    be.copy_from_device_async(be.alloc_pinned(GRANULE // 2), p + GRANULE // 2, a)
    assert len(be._race.segments()) == 2     # two reads by two operations: kept apart
    be.copy_from_device_async(be.alloc_pinned(GRANULE), p, a)   # one read of all: merged again
    (seg,) = be._race.segments()
    assert seg[:2] == (p, p + GRANULE) and list(seg[3]) == [a]
    # A read on another stream, ordered after a's read by an event, replaces it too (a write
    # ordered after it is ordered after a's read as well).
    b, ev = be.stream_create(), be.event_create()
    be.event_record(ev, a)
    be.stream_wait_event(b, ev)
    be.copy_from_device_async(be.alloc_pinned(GRANULE), p, b)
    (seg,) = be._race.segments()
    assert list(seg[3]) == [b]
    # ... whereas an unordered one is kept beside it.
    c = be.stream_create()
    be.copy_from_device_async(be.alloc_pinned(GRANULE), p, c)
    (seg,) = be._race.segments()
    assert len(seg[3]) == 2


# on and off --------------------------------------------------------------------------------

def test_off_means_no_checks():
    backend = EmulatedBackend(devices=1, memory_bytes=64 * MiB, race_check=False)
    try:
        assert backend.race_check is False
        a, b = backend.stream_create(), backend.stream_create()
        p = backend.malloc(4096)
        fill_u32_async(backend, p, 1024, 1, a)
        fill_u32_async(backend, p, 1024, 2, b)   # a race, unreported
        backend.copy_from_device_async(backend.alloc_pinned(4096), p, a)
        backend.device_synchronize()
        assert backend.races == []
    finally:
        backend.close()


@pytest.mark.parametrize("value, on", [(None, False), ("0", False), ("1", True), ("", False)])
def test_environment_variable_decides_when_not_given(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("CUDABRIDGE_EMULATED_RACE_CHECK", raising=False)
    else:
        monkeypatch.setenv("CUDABRIDGE_EMULATED_RACE_CHECK", value)
    for backend in (EmulatedBackend(devices=1, memory_bytes=8 * MiB),
                    open_backend("emulated", emulated_devices=1, emulated_memory_bytes=8 * MiB)):
        try:
            assert backend.race_check is on
        finally:
            backend.close()
    # an explicit argument wins over the environment
    for explicit in (True, False):
        backend = open_backend("emulated", emulated_devices=1, emulated_memory_bytes=8 * MiB, race_check=explicit)
        try:
            assert backend.race_check is explicit
        finally:
            backend.close()


def test_a_bad_environment_value_is_refused(monkeypatch):
    monkeypatch.setenv("CUDABRIDGE_EMULATED_RACE_CHECK", "yes")
    with pytest.raises(InvalidArgument, match="CUDABRIDGE_EMULATED_RACE_CHECK"):
        EmulatedBackend(devices=1, memory_bytes=8 * MiB)


def test_the_suite_runs_with_it_on(emulated):
    import os

    assert os.environ["CUDABRIDGE_EMULATED_RACE_CHECK"] == "1"
    assert emulated.race_check is True


def test_a_write_replaces_the_reads_before_it(be):
    a, b, c = be.stream_create(), be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    ev_b, ev_a = be.event_create(), be.event_create()
    fill_u32_async(be, p, 1024, 1, a)
    be.stream_synchronize(a)
    be.copy_from_device_async(be.alloc_pinned(4096), p, b)
    be.event_record(ev_b, b)
    be.stream_wait_event(a, ev_b)
    fill_u32_async(be, p, 1024, 2, a)       # ordered after b's read: the read is history now
    assert [(s[0], s[1], s[3]) for s in be._race.segments()] == [(p, p + 4096, None)]
    be.event_record(ev_a, a)
    be.stream_wait_event(c, ev_a)
    fill_u32_async(be, p, 1024, 3, c)       # ordered after a's write, hence after b's read
    assert be.races == []


# against a reference model -------------------------------------------------------------------

def test_agrees_with_a_per_byte_model_that_keeps_every_access(be):
    """Random work on three streams over 320 bytes (with gaps for a while), with random
    orderings in between. The model keeps every access of every byte and calls two accesses
    ordered when the later one's clock (taken from the detector's frontier and host clocks: the
    clock rules are tested above) has reached the earlier one's position; the detector keeps
    only the last write and the reads since it, in merged ranges, and must agree on every
    access."""
    import random

    rng = random.Random(1234)
    streams = [be.stream_create() for _ in range(3)]
    events = [be.event_create() for _ in range(3)]
    p = be.malloc(4096)
    size = 320
    history: list[list[tuple[int, int, bool]]] = [[] for _ in range(size)]   # (stream, pos, write)
    det = be._race
    emu = {h: be._streams[h] for h in streams}
    hits = misses = 0

    def op_clock(h):
        clock = dict(emu[h].clock)
        for k, v in det.host.items():
            clock[k] = max(clock.get(k, 0), v)
        return clock

    def conflicts(clock, lo, hi, write):
        return any(clock.get(sid, 0) < pos and (write or w)
                   for i in range(lo, hi) for sid, pos, w in history[i])

    for _ in range(800):
        h = rng.choice(streams)
        r = rng.random()
        if r < 0.55:
            lo = rng.randrange(size)
            hi = rng.randrange(lo + 1, min(size, lo + 24) + 1)
            write = rng.random() < 0.5
            clock = op_clock(h)
            expected = conflicts(clock, lo, hi, write)
            try:
                if write:
                    be.memset_async(p + lo, 1, hi - lo, h)
                else:
                    be.copy_from_device_async(be.alloc_pinned(hi - lo), p + lo, h)
            except StreamOrderRace:
                assert expected, "the detector found a race the model does not"
                hits += 1
                continue
            assert not expected, "the model found a race the detector missed"
            misses += 1
            pos = emu[h].clock[emu[h].handle]
            for i in range(lo, hi):
                history[i].append((emu[h].handle, pos, write))
        elif r < 0.75:
            k = rng.randrange(3)
            be.event_record(events[k], h)
        elif r < 0.9:
            be.stream_wait_event(h, rng.choice(events))
        elif r < 0.95:
            be.stream_synchronize(h)
        else:
            be.stream_query(h)
    assert hits > 50 and misses > 50, (hits, misses)   # both outcomes were exercised
