"""Device faults (tests/faulty_backend.py) on the emulated device: the service reports a clear error
and loses no bookkeeping; after a transient fault the next operations work; a hung stream makes
an allocation fail after ``host_wait_timeout`` naming the stream instead of hanging; after a
sticky error every GPU call fails fast naming it, and the service says the GPU is unusable."""

from __future__ import annotations

import time

import pytest
from device_kernels import fill_u32_async, spin_async
from faulty_backend import FaultyBackend

from cudabridge.device import EmulatedBackend
from cudabridge.errors import CudaError, DeviceUnusable, HostWaitTimeout, OutOfDeviceMemory
from cudabridge.memory import StreamOrderedMemoryPool, native

MiB = 1 << 20
FAST_PATHS = ["python"] + (["native"] if native.load() is not None else [])


def books(pool):
    """What must not change when an operation fails."""
    s = pool.statistics()
    return dict(in_use=s.in_use_bytes, live=s.live_allocations, reserved=s.reserved_bytes,
                free=s.free_safe_bytes + s.free_in_streams_bytes)


def events_accounted(pool):
    """Every event the pool created is free in its event pool or fencing a stream: none lost."""
    in_fences = sum(len(a.fences) for a in pool._streams.all)
    assert len(pool._fences.events._free) + in_fences == pool.statistics().events_created


def conserved(pool):
    s = pool.statistics()
    assert s.free_pending_bytes == pool_pending(pool) and s.spare_bytes == pool._upstream.spare_bytes
    assert s.in_use_bytes + s.free_safe_bytes + s.free_in_streams_bytes + s.free_pending_bytes + s.spare_bytes \
        == s.reserved_bytes


def pool_pending(pool):
    return sum(b.size for b in pool._core.pending)


@pytest.fixture
def faulty():
    backend = FaultyBackend(EmulatedBackend(devices=1, memory_bytes=256 * MiB))
    yield backend
    backend.close()
    assert not backend.inner.races


@pytest.fixture(params=FAST_PATHS)
def make_pool(request, faulty):
    pools = []

    def make(streams=2, **kw):
        handles = [faulty.stream_create() for _ in range(streams)]
        kw.setdefault("limit_bytes", 64 * MiB)
        pool = StreamOrderedMemoryPool(faulty, 0, handles, fast_path=request.param, **kw)
        pools.append(pool)
        return pool, handles

    yield make
    for pool in pools:
        pool.close()


@pytest.mark.parametrize("call,size", [("malloc", 4096), ("phys_create", 4 * MiB)])
def test_a_growth_failure_is_out_of_memory_with_numbers_and_the_next_growth_works(make_pool, faulty, call, size):
    pool, (s, _) = make_pool()
    before = books(pool)
    faulty.fail_next(call)
    with pytest.raises(OutOfDeviceMemory) as info:
        pool.allocate(size, s)
    assert faulty.injected[call] == 1
    assert info.value.requested_bytes == size and info.value.reserved_bytes == before["reserved"]
    assert books(pool) == before
    a = pool.allocate(size, s)       # the fault was transient
    a.free()
    conserved(pool)


@pytest.mark.parametrize("call", ["event_record", "event_query", "stream_query"])
def test_a_transient_event_or_query_error_fails_the_allocation_clearly_and_loses_nothing(make_pool, faulty, call):
    # A block freed on stream a while a slow kernel still uses it; stream b needs it (the limit
    # leaves no room to grow), so b's allocation polls, queries and records events.
    pool, (a_s, b_s) = make_pool(limit_bytes=2 * MiB)
    blk = pool.allocate(2 * MiB, a_s)
    fill_u32_async(faulty, blk.ptr, 16, 7, a_s, delay_s=0.3)
    blk.free()
    before = books(pool)
    faulty.fail_next(call, times=1)
    with pytest.raises(CudaError, match="injected") as info:
        pool.allocate(MiB, b_s)
    assert info.value.call.startswith("cudaEvent") or info.value.call == "cudaStreamQuery"
    assert faulty.injected[call] == 1
    assert books(pool) == before
    events_accounted(pool)
    got = pool.allocate(MiB, b_s)   # transient: the next one works, in stream order
    faulty.memset_async(got.ptr, 0, got.size, b_s)   # the race detector checks the ordering
    got.free()
    faulty.device_synchronize()
    conserved(pool)
    events_accounted(pool)


def test_a_hung_stream_makes_the_allocation_fail_after_the_deadline_naming_the_stream(make_pool, faulty):
    pool, (a_s, b_s) = make_pool(limit_bytes=4 * MiB, host_wait_timeout_s=0.3)
    held = pool.allocate(3 * MiB, b_s)          # leaves room for nothing else to grow
    small = pool.allocate(MiB, a_s)
    release = faulty.hang(a_s)
    faulty.memset_async(small.ptr, 1, small.size, a_s)   # queued behind the hang
    small.free()
    before = books(pool)
    start = time.monotonic()
    with pytest.raises(HostWaitTimeout, match=f"0x{a_s:x}.*may be hung"):
        pool.allocate(2 * MiB, b_s)             # more than the in-flight block: a host wait
    assert 0.25 < time.monotonic() - start < 10
    assert books(pool) == before
    release()
    faulty.stream_synchronize(a_s)
    held.free()
    pool.allocate(2 * MiB, b_s).free()          # the stream moves again: served
    conserved(pool)


def test_the_host_wait_timeout_is_checked():
    backend = EmulatedBackend(devices=1, memory_bytes=64 * MiB)
    try:
        for bad in (0, -1, True, "5", float("nan")):
            with pytest.raises(ValueError, match="host_wait_timeout"):
                StreamOrderedMemoryPool(backend, 0, [], limit_bytes=8 * MiB, host_wait_timeout_s=bad)
    finally:
        backend.close()


def test_after_a_sticky_error_every_gpu_call_fails_fast_and_the_service_says_the_gpu_is_unusable(faulty):
    from cudabridge.config import ServiceConfig
    from cudabridge.service import CudaBridgeService

    svc = CudaBridgeService(ServiceConfig(streams_per_gpu=2, high_priority_streams=0, pool_limit="64m",
                                          log_level="CRITICAL"), backend=faulty)
    try:
        b = svc.bind_task(1)
        a = svc.allocate(1, 4096)
        assert svc.device_error() is None
        faulty.make_sticky(b.stream)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                faulty.stream_query(b.stream)
            except CudaError:
                break
            time.sleep(0.01)
        for call in (lambda: faulty.stream_query(b.stream), faulty.mem_get_info,
                     lambda: faulty.memset_async(a.ptr, 0, 64, b.stream), lambda: faulty.malloc(MiB)):
            start = time.monotonic()
            with pytest.raises(CudaError, match="cudaErrorIllegalAddress.*injected") as info:
                call()
            assert info.value.sticky and time.monotonic() - start < 1
        err = svc.device_error()
        assert err is not None and err.sticky
        with pytest.raises(DeviceUnusable, match="cudaErrorIllegalAddress"):
            svc.bind_task(2)
        with pytest.raises(DeviceUnusable, match="cudaErrorIllegalAddress"):
            svc.allocate(1, 4096)
        # The bookkeeping stays whole: the task releases (its buffer reclaimed as a leak).
        assert svc.release_task(1).leaks_reclaimed == 1
        assert svc.memory_pool(0).statistics().live_allocations == 0
    finally:
        try:
            svc.close()
        except CudaError:
            pass


@pytest.mark.gpu
def test_on_the_gpu_a_long_kernel_makes_the_host_wait_time_out_naming_the_stream(cuda_backend):
    """The real device: a 2 s spin kernel stands in for a hung stream."""
    a_s, b_s = cuda_backend.stream_create(), cuda_backend.stream_create()
    pool = StreamOrderedMemoryPool(cuda_backend, 0, [a_s, b_s], limit_bytes=4 * MiB, host_wait_timeout_s=0.3,
                                   growth="chunks")
    try:
        held = pool.allocate(3 * MiB, b_s)
        small = pool.allocate(MiB, a_s)
        spin_async(cuda_backend, a_s, 2.0)
        small.free()
        before = books(pool)
        with pytest.raises(HostWaitTimeout, match=f"0x{a_s:x}"):
            pool.allocate(2 * MiB, b_s)
        assert books(pool) == before
        cuda_backend.stream_synchronize(a_s)
        held.free()
        pool.allocate(2 * MiB, b_s).free()
    finally:
        pool.close()
        cuda_backend.stream_destroy(a_s)
        cuda_backend.stream_destroy(b_s)
