"""The emulated device must behave like a CUDA device where the service's correctness depends on it.

(About 950 lines, on purpose: one contract, CUDA's semantics as the model keeps them, a section per
call family in the order of device/emulated_backend.py; the race detector's and the driver
table's have files of their own, test_race_detector.py and test_emulated_driver.py.)

Timing assertions use sleeps in stream workers ("spins") and wide margins, so that a loaded
2-core machine does not make them flaky: each bound is at least ~0.2 s away from what a correct
emulation gives, and what a wrong one would give lies on the other side of it.
"""

from __future__ import annotations

import threading
import time

import pytest
from device_kernels import fill_u32_async, spin_async

from cudabridge.device import (
    DEFAULT_STREAM,
    LEGACY_STREAM,
    PER_THREAD_STREAM,
    DeviceAllocationFailed,
    EmulatedBackend,
    open_backend,
)
from cudabridge.errors import CudaError

MiB = 1 << 20
GRANULE = 2 * MiB  # cudaMalloc's (and the emulation's) page


@pytest.fixture
def be():
    backend = EmulatedBackend(devices=1, memory_bytes=64 * MiB)
    yield backend
    backend.close()
    assert not backend.races, backend.races  # the suite runs with the race detector on


@pytest.fixture
def be2():
    backend = EmulatedBackend(devices=2, memory_bytes=64 * MiB)
    yield backend
    backend.close()
    assert not backend.races, backend.races


def read(backend, ptr, nbytes, stream=LEGACY_STREAM):
    out = bytearray(nbytes)
    backend.copy_from_device_async(out, ptr, stream)
    backend.stream_synchronize(stream)
    return bytes(out)


def u32(value, count):
    return value.to_bytes(4, "little") * count


def run_in_thread(fn):
    """Run ``fn`` on a new thread; re-raise what it raised; return what it returned."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "helper thread hung"
    if "error" in box:
        raise box["error"]
    return box.get("value")


# opening ---------------------------------------------------------------------------------------

def test_open_backend_emulated_has_the_requested_shape():
    backend = open_backend("emulated", emulated_devices=3, emulated_memory_bytes=32 * MiB)
    try:
        assert isinstance(backend, EmulatedBackend)
        assert backend.name == "emulated"
        assert backend.device_count() == 3
        for ordinal in range(3):
            backend.set_device(ordinal)
            assert backend.mem_get_info() == (32 * MiB, 32 * MiB)
        assert len({backend.device_uuid(i) for i in range(3)}) == 3
        assert all(backend.device_uuid(i).startswith("GPU-") for i in range(3))
    finally:
        backend.close()


def test_zero_devices_refused():
    with pytest.raises(ValueError):
        EmulatedBackend(devices=0)


# stream ordering -------------------------------------------------------------------------------

def test_work_on_one_stream_runs_in_queue_order(be):
    s = be.stream_create()
    p = be.malloc(4096)
    # A slow writer queued first must not land after the fast one queued behind it.
    fill_u32_async(be, p, 256, 0xAAAAAAAA, s, delay_s=0.2)
    fill_u32_async(be, p, 256, 0x55555555, s)
    be.stream_synchronize(s)
    assert read(be, p, 1024) == u32(0x55555555, 256)


def test_spins_on_one_stream_are_serial(be):
    s = be.stream_create()
    t0 = time.monotonic()
    spin_async(be, s, 0.2)
    spin_async(be, s, 0.2)
    be.stream_synchronize(s)
    assert time.monotonic() - t0 >= 0.4


def test_work_on_two_streams_overlaps(be):
    s1, s2 = be.stream_create(), be.stream_create()
    t0 = time.monotonic()
    spin_async(be, s1, 0.4)
    spin_async(be, s2, 0.4)
    be.stream_synchronize(s1)
    be.stream_synchronize(s2)
    elapsed = time.monotonic() - t0
    assert 0.4 <= elapsed < 0.7  # serial execution would take at least 0.8 s


def test_spin_on_one_stream_does_not_delay_another(be):
    s1, s2 = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    spin_async(be, s1, 0.6)
    t0 = time.monotonic()
    fill_u32_async(be, p, 4, 7, s2)
    be.stream_synchronize(s2)
    assert time.monotonic() - t0 < 0.4
    assert be.stream_query(s1) is False  # the spin is really still running
    assert be.stream_query(s2) is True
    assert read(be, p, 16, s2) == u32(7, 4)


def test_stream_query_and_synchronize(be):
    s = be.stream_create()
    assert be.stream_query(s) is True  # nothing queued
    spin_async(be, s, 0.2)
    assert be.stream_query(s) is False
    be.stream_synchronize(s)
    assert be.stream_query(s) is True


def test_unknown_stream_handle_raises_naming_the_call(be):
    with pytest.raises(CudaError) as info:
        be.stream_query(0xDEAD0)
    assert info.value.call == "cudaStreamQuery"
    assert "cudaStreamQuery" in str(info.value)


def test_destroyed_stream_is_gone(be):
    s = be.stream_create()
    be.stream_destroy(s)
    with pytest.raises(CudaError):
        be.stream_query(s)
    with pytest.raises(CudaError):
        spin_async(be, s, 0.01)
    with pytest.raises(CudaError):
        be.stream_destroy(s)


def test_stream_destroy_drains_queued_work(be):
    s = be.stream_create()
    p = be.malloc(4096)
    fill_u32_async(be, p, 8, 0x1234, s, delay_s=0.2)
    be.stream_destroy(s)
    # cudaStreamDestroy does not wait for the work, so reading without this would be a race
    # (the race detector says so); a device synchronize covers destroyed streams' work too.
    be.device_synchronize()
    assert read(be, p, 32) == u32(0x1234, 8)


# events ----------------------------------------------------------------------------------------

def test_never_recorded_event_is_complete(be):
    ev = be.event_create()
    assert be.event_query(ev) is True
    t0 = time.monotonic()
    be.event_synchronize(ev)
    assert time.monotonic() - t0 < 0.5


def test_event_completes_when_work_before_its_record_has_run(be):
    s, other = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    ev = be.event_create()
    t0 = time.monotonic()
    fill_u32_async(be, p, 4, 0xC0FFEE, s, delay_s=0.3)
    be.event_record(ev, s)
    spin_async(be, s, 0.6)  # queued after the record: the event must not wait for it
    assert be.event_query(ev) is False
    be.event_synchronize(ev)
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.3
    assert be.event_query(ev) is True
    assert be.stream_query(s) is False  # the work after the record is still running
    assert read(be, p, 16, other) == u32(0xC0FFEE, 4)  # the work before it has landed
    assert elapsed < 0.3 + 0.6 - 0.15  # did not wait for the later spin


def test_event_tracks_its_latest_record(be):
    s1, s2 = be.stream_create(), be.stream_create()
    ev = be.event_create()
    be.event_record(ev, s1)
    be.stream_synchronize(s1)
    assert be.event_query(ev) is True
    spin_async(be, s2, 0.3)
    be.event_record(ev, s2)  # re-record: the first record's completion no longer counts
    assert be.event_query(ev) is False
    be.event_synchronize(ev)
    assert be.event_query(ev) is True


def test_unknown_event_raises(be):
    with pytest.raises(CudaError) as info:
        be.event_query(0xBEEF0)
    assert info.value.call == "cudaEventQuery"
    ev = be.event_create()
    be.event_destroy(ev)
    with pytest.raises(CudaError):
        be.event_query(ev)
    with pytest.raises(CudaError):
        be.event_destroy(ev)


def test_stream_wait_event_waits_for_the_record_latest_at_call_time(be):
    s1, s2, s3 = be.stream_create(), be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    ev = be.event_create()
    t0 = time.monotonic()
    spin_async(be, s1, 0.3)
    be.event_record(ev, s1)
    be.stream_wait_event(s2, ev)
    fill_u32_async(be, p, 4, 0xFEED, s2)
    assert be.stream_query(s2) is False  # held back by the wait
    # Re-recording after the wait was queued must not change what the wait waits for.
    spin_async(be, s3, 1.0)
    be.event_record(ev, s3)
    be.stream_synchronize(s2)
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.3  # it did wait for s1's spin
    assert elapsed < 0.85  # but not for s3's, which ends at >= 1.0 s
    assert be.event_query(ev) is False  # the latest record (on s3) is still pending
    assert read(be, p, 16, s2) == u32(0xFEED, 4)


def test_stream_wait_event_on_never_recorded_event_does_not_wait(be):
    s = be.stream_create()
    ev = be.event_create()
    be.stream_wait_event(s, ev)
    t0 = time.monotonic()
    be.stream_synchronize(s)
    assert time.monotonic() - t0 < 0.5


def test_wait_orders_a_reader_behind_a_slow_writer(be):
    writer, reader = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    ev = be.event_create()
    fill_u32_async(be, p, 64, 0xABCD, writer, delay_s=0.2)
    be.event_record(ev, writer)
    be.stream_wait_event(reader, ev)
    assert read(be, p, 256, reader) == u32(0xABCD, 64)


# default streams -------------------------------------------------------------------------------

def test_per_thread_stream_is_the_same_stream_within_a_thread(be):
    spin_async(be, PER_THREAD_STREAM, 0.3)
    assert be.stream_query(PER_THREAD_STREAM) is False
    be.stream_synchronize(PER_THREAD_STREAM)
    assert be.stream_query(PER_THREAD_STREAM) is True


def test_per_thread_stream_is_distinct_per_thread(be):
    spinning = threading.Event()
    may_exit = threading.Event()
    seen = {}

    def thread_a():
        spin_async(be, PER_THREAD_STREAM, 0.6)
        seen["a_busy"] = not be.stream_query(PER_THREAD_STREAM)
        spinning.set()
        may_exit.wait(timeout=10)
        be.stream_synchronize(PER_THREAD_STREAM)

    t = threading.Thread(target=thread_a)
    t.start()
    try:
        assert spinning.wait(timeout=10)
        assert seen["a_busy"] is True
        # The same handle on this thread is another stream: idle, and quick to use.
        assert be.stream_query(PER_THREAD_STREAM) is True
        p = be.malloc(4096)
        t0 = time.monotonic()
        fill_u32_async(be, p, 4, 99, PER_THREAD_STREAM)
        be.stream_synchronize(PER_THREAD_STREAM)
        assert time.monotonic() - t0 < 0.35
        assert read(be, p, 16, PER_THREAD_STREAM) == u32(99, 4)
    finally:
        may_exit.set()
        t.join(timeout=10)
    assert not t.is_alive()


def test_legacy_handles_0_and_1_are_one_stream(be):
    assert DEFAULT_STREAM == 0 and LEGACY_STREAM == 1
    p = be.malloc(4096)
    fill_u32_async(be, p, 4, 0x0BAD, DEFAULT_STREAM, delay_s=0.3)
    assert be.stream_query(LEGACY_STREAM) is False
    fill_u32_async(be, p, 4, 0x600D, LEGACY_STREAM)  # ordered behind the slow write on handle 0
    be.stream_synchronize(LEGACY_STREAM)
    assert be.stream_query(DEFAULT_STREAM) is True
    assert read(be, p, 16, DEFAULT_STREAM) == u32(0x600D, 4)


def test_legacy_stream_is_shared_by_threads(be):
    spin_async(be, LEGACY_STREAM, 0.5)
    assert run_in_thread(lambda: be.stream_query(0)) is False
    # ... whereas another thread's per-thread stream is not busy with it.
    assert run_in_thread(lambda: be.stream_query(PER_THREAD_STREAM)) is True


# devices ---------------------------------------------------------------------------------------

def test_current_device_is_per_thread(be2):
    assert be2.get_device() == 0
    be2.set_device(1)
    assert be2.get_device() == 1
    assert run_in_thread(be2.get_device) == 0
    assert be2.get_device() == 1


def test_set_device_out_of_range_raises(be2):
    for bad in (-1, 2):
        with pytest.raises(CudaError) as info:
            be2.set_device(bad)
        assert info.value.call == "cudaSetDevice"
    assert be2.get_device() == 0


def test_malloc_allocates_on_the_current_device(be2):
    be2.set_device(1)
    p = be2.malloc(4 * MiB)
    assert be2.mem_get_info() == (60 * MiB, 64 * MiB)
    be2.set_device(0)
    assert be2.mem_get_info() == (64 * MiB, 64 * MiB)
    # The pointer is device 1's: a copy on a device-0 stream cannot reach it ...
    with pytest.raises(CudaError):
        be2.copy_to_device_async(p, b"x" * 16, be2.stream_create())
    # ... one on a device-1 stream can, and freeing it returns device 1's memory.
    be2.set_device(1)
    s1 = be2.stream_create()
    be2.copy_to_device_async(p, b"y" * 16, s1)
    assert read(be2, p, 16, s1) == b"y" * 16
    be2.free(p)
    assert be2.mem_get_info() == (64 * MiB, 64 * MiB)


def test_event_of_one_device_recorded_on_a_stream_of_another_raises(be2):
    be2.set_device(0)
    ev0 = be2.event_create()
    s0 = be2.stream_create()
    be2.set_device(1)
    s1 = be2.stream_create()
    with pytest.raises(CudaError) as info:
        be2.event_record(ev0, s1)
    assert info.value.call == "cudaEventRecord"
    with pytest.raises(CudaError):
        be2.event_record(ev0, PER_THREAD_STREAM)  # device 1's per-thread stream, as current is 1
    be2.event_record(ev0, s0)  # the same device is fine, whatever the current device
    be2.event_synchronize(ev0)
    assert be2.event_query(ev0) is True


def test_legacy_stream_is_per_device(be2):
    be2.set_device(0)
    spin_async(be2, LEGACY_STREAM, 0.5)
    assert be2.stream_query(LEGACY_STREAM) is False
    be2.set_device(1)
    assert be2.stream_query(LEGACY_STREAM) is True


# memory ----------------------------------------------------------------------------------------

def test_copy_outside_an_allocation_raises_naming_the_call(be):
    s = be.stream_create()
    p = be.malloc(GRANULE)
    host = bytearray(16)
    with pytest.raises(CudaError) as info:
        be.copy_to_device_async(p + GRANULE - 8, host, s)  # runs 8 bytes past the end
    assert info.value.call == "cudaMemcpyAsync"
    assert "cudaMemcpyAsync" in str(info.value)
    with pytest.raises(CudaError) as info:
        be.copy_from_device_async(host, p - 8, s)  # starts before the allocation
    assert info.value.call == "cudaMemcpyAsync"
    with pytest.raises(CudaError) as info:
        be.memcpy_async(p, p + 8, GRANULE, s)
    assert info.value.call == "cudaMemcpyAsync"
    with pytest.raises(CudaError) as info:
        be.memset_async(p + GRANULE, 0, 1, s)
    assert info.value.call == "cudaMemsetAsync"
    with pytest.raises(CudaError) as info:
        fill_u32_async(be, p + GRANULE - 4, 2, 1, s)
    assert info.value.call == "cudaLaunchKernel(fill_u32)"
    # Exactly to the end is fine, and the refused calls are not sticky.
    be.copy_to_device_async(p + GRANULE - 16, bytes(range(16)), s)
    assert read(be, p + GRANULE - 16, 16, s) == bytes(range(16))


def test_two_mallocs_are_not_adjacent(be):
    s = be.stream_create()
    a = be.malloc(GRANULE)
    b = be.malloc(GRANULE)
    assert b != a + GRANULE and a != b + GRANULE
    lo, hi = min(a, b), max(a, b)
    # A copy spanning both (as a pool coalescing across chunks would issue) is refused,
    # and so is the first byte past the lower one.
    with pytest.raises(CudaError):
        be.memcpy_async(lo, lo + GRANULE, GRANULE, s)
    with pytest.raises(CudaError):
        be.memset_async(lo, 0, hi + GRANULE - lo, s)
    with pytest.raises(CudaError):
        be.memset_async(lo + GRANULE, 0, 1, s)


def test_free_of_a_non_allocation_raises(be):
    p = be.malloc(1024)
    with pytest.raises(CudaError) as info:
        be.free(p + 256)
    assert info.value.call == "cudaFree"
    be.free(p)
    with pytest.raises(CudaError):
        be.free(p)  # double free


def test_malloc_of_zero_bytes_raises(be):
    with pytest.raises(CudaError) as info:
        be.malloc(0)
    assert info.value.call == "cudaMalloc"


def test_malloc_beyond_capacity_raises_device_allocation_failed():
    backend = EmulatedBackend(devices=1, memory_bytes=8 * MiB)
    try:
        with pytest.raises(DeviceAllocationFailed) as info:
            backend.malloc(8 * MiB + 1)  # rounds up to 10 MiB
        assert info.value.nbytes == 8 * MiB + 1
        p = backend.malloc(6 * MiB)
        assert backend.mem_get_info() == (2 * MiB, 8 * MiB)
        q = backend.malloc(1)  # takes the last 2 MiB page
        with pytest.raises(DeviceAllocationFailed):
            backend.malloc(1)
        backend.free(q)
        backend.free(p)
        assert backend.mem_get_info() == (8 * MiB, 8 * MiB)
        backend.free(backend.malloc(8 * MiB))  # all of it fits again
    finally:
        backend.close()


def test_host_device_host_round_trip_is_exact(be):
    s = be.stream_create()
    data = bytes((i * 37 + 11) % 256 for i in range(3 * MiB + 5))
    p = be.malloc(len(data))
    q = be.malloc(len(data))
    be.copy_to_device_async(p, data, s)
    be.memcpy_async(q, p, len(data), s)
    out = bytearray(len(data))
    be.copy_from_device_async(out, q, s)
    be.stream_synchronize(s)
    assert out == data


def test_fresh_memory_is_zero(be):
    p = be.malloc(4096)
    assert read(be, p, 4096) == bytes(4096)


def test_memset_writes_exactly_its_range(be):
    s = be.stream_create()
    p = be.malloc(256)
    be.memset_async(p + 16, 0xAB, 32, s)
    be.stream_synchronize(s)
    assert read(be, p, 64, s) == bytes(16) + b"\xab" * 32 + bytes(16)
    be.memset_async(p, 0x1FF, 4, s)  # only the low byte counts, as in cudaMemsetAsync
    assert read(be, p, 4, s) == b"\xff" * 4


def test_pinned_copies_are_asynchronous_and_ordered_after_earlier_work(be):
    s = be.stream_create()
    p = be.malloc(64)
    src, out = be.alloc_pinned(64), be.alloc_pinned(64)
    try:
        src[:] = b"\x01" * 64
        t0 = time.monotonic()
        spin_async(be, s, 0.3)
        be.copy_to_device_async(p, src, s)
        be.copy_from_device_async(out, p, s)
        returned_at = time.monotonic() - t0
        if returned_at < 0.2:  # the calls certainly returned while the spin held the stream
            assert bytes(out) == bytes(64)
        assert be.stream_query(s) is False
        be.stream_synchronize(s)
        assert bytes(out) == b"\x01" * 64
    finally:
        be.free_pinned(src)
        be.free_pinned(out)


def test_pageable_copy_from_device_returns_once_the_copy_is_done(be):
    s = be.stream_create()
    p = be.malloc(64)
    fill_u32_async(be, p, 16, 0x01010101, s, delay_s=0.3)
    out = bytearray(64)
    t0 = time.monotonic()
    be.copy_from_device_async(out, p, s)  # waits for the slow fill queued before it
    assert time.monotonic() - t0 >= 0.25
    assert out == b"\x01" * 64


def test_pageable_copy_to_device_stages_the_data(be):
    s = be.stream_create()
    p = be.malloc(64)
    host = bytearray(b"\x02" * 64)
    spin_async(be, s, 0.3)
    be.copy_to_device_async(p, host, s)
    host[:] = b"\x03" * 64  # reusing the buffer at once must not change what lands
    be.stream_synchronize(s)
    assert read(be, p, 64, s) == b"\x02" * 64


def test_free_pinned_of_a_foreign_buffer_raises(be):
    buf = be.alloc_pinned(16)
    be.free_pinned(buf)
    with pytest.raises(CudaError):
        be.free_pinned(buf)
    with pytest.raises(CudaError):
        be.free_pinned(bytearray(16))


def test_fill_u32_with_delay_writes_after_the_delay():
    # The early read races with the slow write on purpose (it shows that the write has not
    # landed yet), so the race detector, which would refuse it, is off here.
    be = EmulatedBackend(devices=1, memory_bytes=64 * MiB, race_check=False)
    try:
        _fill_u32_with_delay_writes_after_the_delay(be)
    finally:
        be.close()


def _fill_u32_with_delay_writes_after_the_delay(be):
    s, other = be.stream_create(), be.stream_create()
    p = be.malloc(4096)
    delay = 0.5
    t0 = time.monotonic()
    fill_u32_async(be, p, 16, 0xDEADBEEF, s, delay_s=delay)
    early = read(be, p, 64, other)
    early_at = time.monotonic() - t0
    assert be.stream_query(s) is False
    if early_at < delay - 0.2:  # the early read certainly ran before the write could land
        assert early == bytes(64)
    be.stream_synchronize(s)
    assert time.monotonic() - t0 >= delay
    assert read(be, p, 64, other) == u32(0xDEADBEEF, 16)


def test_fill_u32_writes_count_words_little_endian(be):
    s = be.stream_create()
    p = be.malloc(64)
    fill_u32_async(be, p + 4, 3, 0x01020304, s)
    assert read(be, p, 20, s) == bytes(4) + b"\x04\x03\x02\x01" * 3 + bytes(4)


# sticky errors ---------------------------------------------------------------------------------

def test_error_inside_queued_work_is_sticky(be2):
    be2.set_device(0)
    s = be2.stream_create()
    p = be2.malloc(4096)
    ev = be2.event_create()
    be2.set_device(1)
    s1 = be2.stream_create()
    be2.set_device(0)
    # A negative spin makes the emulated kernel fault on the device, after the call returned.
    spin_async(be2, s, -1.0)
    with pytest.raises(CudaError) as info:
        be2.stream_synchronize(s)
    sticky = info.value
    for later in (
        lambda: be2.malloc(1024),
        lambda: be2.stream_create(),
        lambda: be2.event_create(),
        lambda: be2.stream_query(s),
        lambda: spin_async(be2, s, 0.01),
        lambda: be2.copy_to_device_async(p, b"x", s),
        lambda: be2.event_record(ev, s),
        lambda: be2.mem_get_info(),
        lambda: be2.device_synchronize(),
        lambda: be2.stream_synchronize(LEGACY_STREAM),
    ):
        with pytest.raises(CudaError) as again:
            later()
        assert again.value is sticky
    # The other device is unaffected.
    be2.set_device(1)
    spin_async(be2, s1, 0.01)
    be2.stream_synchronize(s1)
    assert be2.mem_get_info() == (64 * MiB, 64 * MiB)


def test_call_time_errors_are_not_sticky(be):
    s = be.stream_create()
    p = be.malloc(GRANULE)
    with pytest.raises(CudaError):
        be.memset_async(p + GRANULE, 0, 16, s)
    be.memset_async(p, 3, 16, s)
    be.stream_synchronize(s)
    be.device_synchronize()
    assert read(be, p, 16, s) == b"\x03" * 16


def test_device_synchronize_waits_for_every_stream(be):
    s1, s2 = be.stream_create(), be.stream_create()
    t0 = time.monotonic()
    spin_async(be, s1, 0.3)
    spin_async(be, s2, 0.2)
    spin_async(be, LEGACY_STREAM, 0.2)
    be.device_synchronize()
    assert time.monotonic() - t0 >= 0.3
    assert be.stream_query(s1) and be.stream_query(s2) and be.stream_query(LEGACY_STREAM)


def test_priority_range_is_greatest_numerically_lowest(be):
    least, greatest = be.stream_priority_range()
    assert greatest < least


# regressions of bugs found in review ------------------------------------------------------------

def test_negative_memset_size_is_refused(be):
    s = be.stream_create()
    p = be.malloc(GRANULE)
    with pytest.raises(CudaError):
        be.memset_async(p, 7, -5, s)
    be.stream_synchronize(s)
    assert read(be, p, 16, s) == bytes(16)


def test_context_active_of_a_bad_ordinal_raises_cuda_error(be):
    with pytest.raises(CudaError):
        be.context_active(5)


def test_views_without_an_exporter_are_pageable(emulated):
    """A memoryview over raw memory has ``obj is None``; it must not be taken for pinned memory
    (an asynchronous copy out of a buffer the caller reuses at once would corrupt data)."""
    import ctypes

    raw = (ctypes.c_char * 64)()
    from_memory = ctypes.pythonapi.PyMemoryView_FromMemory
    from_memory.restype, from_memory.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
    view = from_memory(ctypes.addressof(raw), 64, 0x200)   # PyBUF_WRITE: as the JNI bridge makes them
    assert view.obj is None
    assert not emulated._is_pinned(view)
    anon = memoryview(bytearray(8))
    assert not emulated._is_pinned(anon)
    pinned = emulated.alloc_pinned(64)
    assert emulated._is_pinned(memoryview(pinned).cast("B"))
    emulated.free_pinned(pinned)


# a host kernel that raises anything (issue 23, item 6.3) -------------------------------------------

def within(seconds, fn, what):
    """``fn()`` on a daemon thread: its value, or what it raised; a test failure naming ``what``
    if it has not returned after ``seconds`` (a hang is reported, never waited out)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            box["error"] = exc

    t = threading.Thread(target=target, name=f"within: {what}", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{what} hung: no return after {seconds} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class _ReprFails(Exception):
    def __repr__(self):
        raise RuntimeError("no repr")


class _ReprRaisesKeyboardInterrupt(Exception):
    def __repr__(self):
        raise KeyboardInterrupt


class _NoName(type):
    """A metaclass whose classes cannot even be named."""

    def __getattribute__(cls, name):
        if name in ("__name__", "__qualname__", "__module__"):
            raise RuntimeError("no name")
        return super().__getattribute__(name)


class _Anonymous(Exception, metaclass=_NoName):
    def __repr__(self):
        raise SystemExit("no repr either")


# by name: pytest itself must not hold (and describe) these exceptions in a failure's report
_RAISED = {"SystemExit": lambda: SystemExit(3), "KeyboardInterrupt": KeyboardInterrupt, "GeneratorExit": GeneratorExit,
           "BaseException": lambda: BaseException("base"), "repr-fails": _ReprFails,
           "repr-raises-KeyboardInterrupt": _ReprRaisesKeyboardInterrupt, "nothing-describes-it": _Anonymous}


@pytest.mark.parametrize("raised", sorted(_RAISED))
def test_a_twin_that_raises_anything_is_a_sticky_illegal_address_and_its_stream_lives_on(raised):
    """docs/kernels.md: an exception inside a host kernel is the device's sticky illegal-address
    error. Before the fix a BaseException that is not an Exception, or one whose repr() failed,
    ended the stream's worker thread: the synchronize hung, and so did everything queued after it
    and close()."""
    from cudabridge.kernels import LaunchConfig
    from cudabridge.kernels.host_kernels import HostKernel

    be = EmulatedBackend(devices=2, memory_bytes=64 * MiB)
    try:
        s = be.stream_create()
        p = be.malloc(4096)

        def twin(grid, block, ptr):
            raise _RAISED[raised]()
        release, after = threading.Event(), []
        be.launch_host_func(s, lambda: release.wait(10))       # all three are queued before the twin runs
        be.launch_host_kernel(s, HostKernel("raises", ("ptr",), twin, "test.raises"), LaunchConfig(1, 1), [p])
        be.launch_host_func(s, lambda: after.append("ran"))
        release.set()
        with pytest.raises(CudaError) as info:
            within(10, lambda: be.stream_synchronize(s), "stream_synchronize after the twin raised")
        sticky = info.value
        assert (sticky.code, sticky.name, sticky.sticky) == (700, "cudaErrorIllegalAddress", True)
        assert sticky.call == "kernel"
        assert after == ["ran"], "the work queued behind the twin never ran: the stream's worker ended"
        assert be._streams[s]._worker.is_alive()
        for later in (lambda: spin_async(be, s, 0), lambda: be.stream_synchronize(s), lambda: be.malloc(64),
                      lambda: be.device_synchronize(), lambda: be.launch_host_func(s, lambda: None)):
            with pytest.raises(CudaError) as again:
                within(10, later, "a call after the sticky error")
            assert again.value is sticky
        be.set_device(1)   # the other device is unaffected
        s1 = be.stream_create()
        spin_async(be, s1, 0)
        within(10, lambda: be.stream_synchronize(s1), "a synchronize on the other device")
    finally:
        within(10, be.close, "close after the twin raised")


def test_a_twin_that_raises_system_exit_is_described_by_its_repr():
    be = EmulatedBackend(devices=1, memory_bytes=64 * MiB)
    try:
        s = be.stream_create()

        def exits():
            raise SystemExit("twin says bye")
        be.launch_host_func(s, exits)
        with pytest.raises(CudaError, match=r"cudaErrorIllegalAddress \(700\): SystemExit\('twin says bye'\)"):
            within(10, lambda: be.stream_synchronize(s), "stream_synchronize")
    finally:
        within(10, be.close, "close")


@pytest.mark.parametrize("kernel", ["exits", "interrupts", "undescribable"])
def test_a_service_whose_twin_raised_reports_the_fault_and_closes(kernel):
    """The service's view of item 6.3: the task's synchronize reports the kernel's fault, the
    stream's other work runs, and close() returns (before the fix all three hung)."""
    from cudabridge.config import ServiceConfig
    from cudabridge.errors import KernelFault
    from cudabridge.kernels import LaunchConfig
    from cudabridge.service import CudaBridgeService

    service = CudaBridgeService(ServiceConfig(backend="emulated", emulated_kernels="host_kernels_that_raise",
                                              emulated_memory="64m", streams_per_gpu=1, high_priority_streams=0))
    try:
        service.registry.bind(1)
        x = service.registry.allocate(1, 4096)
        service.launch(1, service.host_kernels.get(kernel), LaunchConfig(1, 1), [x])
        with pytest.raises(KernelFault) as info:
            within(10, lambda: service.synchronize(1), "the task's synchronize after its twin raised")
        assert info.value.candidates == [kernel] and info.value.code == 700
    finally:
        try:
            within(15, service.close, "service.close() after a twin raised")
        except CudaError:   # the device is unusable: close may report the error again
            pass


# host registration refuses what cudaHostRegister refuses (issue 23, item 6.15) ------------------

def _pages(n: int, prot: int) -> int:
    """n fresh anonymous pages with protection ``prot`` (never freed: the test's process ends)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    address = libc.mmap(None, n * mmap.PAGESIZE, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    return address


def _hole_after_a_page() -> int:
    """The address of a readable, writable page whose next page is not mapped."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    base = _pages(3, mmap.PROT_READ | mmap.PROT_WRITE)
    assert libc.munmap(base + mmap.PAGESIZE, mmap.PAGESIZE) == 0
    return base


def test_host_registration_refuses_what_cuda_host_register_refuses(be):
    """What cudaHostRegister (portable) answered on the H200 for each case (a probe through
    cuda.bindings, its answers in the commit message): memory not mapped readable and writable is
    cudaErrorInvalidValue, as is a range that wraps past 2^64; a range reaching into the upper
    half of the address space is cudaErrorNotSupported. Before the fix the emulated device took
    them all, and a later copy from the range would have crashed the process."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    ok = (ctypes.c_char * (4 * page))()
    a = ctypes.addressof(ok)
    hole = _hole_after_a_page()
    cases = [
        (0x10000, 4096, 1, "the issue's case: nothing is mapped there"),
        (hole + page, page, 1, "an unmapped page"),
        (hole, 2 * page, 1, "a mapped page, then an unmapped one"),
        (hole + page - 16, 32, 1, "16 bytes either side of the hole's start"),
        (_pages(1, mmap.PROT_READ), page, 1, "read-only memory (portable registration writes)"),
        (_pages(1, 0), page, 1, "PROT_NONE: mapped, not accessible"),
        (a, (1 << 63) - 1, 801, "the issue's length"),
        (a, (1 << 64) - a + page, 1, "a range that wraps past 2^64"),
        (a, 1 << 64, 1, "more bytes than size_t holds"),
        (0xFFFF_8000_0000_0000, page, 801, "the kernel's half"),
        (0x0000_8000_0000_0000, page, 1, "just past the user half"),
    ]
    for address, nbytes, code, why in cases:
        with pytest.raises(CudaError) as info:
            be.host_register(address, nbytes)
        err = info.value
        assert (err.call, err.code, err.sticky) == ("cudaHostRegister", code, False), (why, err)
        assert f"{address:#x}" in str(err), (why, str(err))
    region = be.host_register(a, 4 * page)    # nothing was registered: the whole buffer still registers
    be.host_unregister(region)
    be.host_unregister(be.host_register(hole, page))   # the page before the hole is fine on its own
    be.host_unregister(be.host_register(a + 3, 100))   # an unaligned interior range is too (as on the H200)
    s = be.stream_create()
    spin_async(be, s, 0)
    be.stream_synchronize(s)                  # and the device is not sticky


def test_the_java_hot_path_passes_the_refusal_on_and_records_nothing():
    """registerHost's path (JavaHotPath.register_host): the device's refusal reaches the caller
    as the CudaError the CUDA backend raises, and the bridge records no region."""
    from cudabridge.config import ServiceConfig
    from cudabridge.jvm.hot_path import JavaHotPath
    from cudabridge.service import CudaBridgeService

    with CudaBridgeService(ServiceConfig(backend="emulated", emulated_memory="64m", streams_per_gpu=1,
                                         high_priority_streams=0)) as service:
        hp = JavaHotPath(service, fast_path="python")
        for address, nbytes in [(0x10000, 4096), (_hole_after_a_page(), 1 << 20)]:
            with pytest.raises(CudaError, match="cudaHostRegister failed: cudaErrorInvalidValue"):
                hp.register_host(address, nbytes)
            assert address not in service.page_locked.tables.memory
        import ctypes
        buf = (ctypes.c_char * 4096)()
        with pytest.raises(CudaError, match="cudaErrorNotSupported"):
            hp.register_host(ctypes.addressof(buf), (1 << 63) - 1)
        hp.register_host(ctypes.addressof(buf), 4096)
        hp.unregister_host(ctypes.addressof(buf))


def test_stream_destroy_returns_at_once_and_a_device_synchronize_still_waits_for_its_work():
    """As cudaStreamDestroy: the destroy does not wait for the stream's queued work (a hung kernel
    would otherwise hang whoever destroys its stream: the service's close), and a device
    synchronize still does."""
    be = EmulatedBackend(devices=1, memory_bytes=64 << 20)
    s = be.stream_create()
    spin_async(be, s, 0.4)
    start = time.monotonic()
    be.stream_destroy(s)
    assert time.monotonic() - start < 0.2
    be.device_synchronize()
    assert time.monotonic() - start >= 0.39
    be.close()


def test_close_waits_a_bounded_time_for_work_that_does_not_finish(monkeypatch):
    monkeypatch.setattr(EmulatedBackend, "CLOSE_WAIT_S", 0.3)
    be = EmulatedBackend(devices=1, memory_bytes=64 << 20)
    s = be.stream_create()
    spin_async(be, s, 10.0)  # a kernel that runs on and on
    start = time.monotonic()
    be.close()
    assert time.monotonic() - start < 2.0


def test_an_emulated_gpus_allocations_never_leave_its_address_window():
    """Addresses are never reused, so enough allocations would walk past a GPU's window into the
    next GPU's: refused instead (found by the issue-23 settings review)."""
    import cudabridge.device.emulated_backend as eb
    from cudabridge.device.backend import DeviceAllocationFailed

    be = EmulatedBackend(devices=2, memory_bytes=64 << 20)
    be.set_device(0)
    dev = be._devices[0]
    dev._next = dev._window_end - (4 << 20)   # as if most of the window had been handed out
    p = be.malloc(1 << 20)
    be.free(p)
    with pytest.raises(DeviceAllocationFailed, match="address window"):
        be.malloc(4 << 20)                    # would end past the window
    with pytest.raises(CudaError):
        be.va_reserve(4 << 20)
    be.set_device(1)
    q = be.malloc(1 << 20)
    assert (q - eb._ADDRESS_BASE) // eb._DEVICE_WINDOW == 1
    be.free(q)
    be.close()
