"""The pinned host pool (issue 16 item 2) on the emulated device and a real GPU: reserved once, blocks carved and
coalesced, a freed block handed out again only once the streams its copies ran on have passed an
event recorded at its free (stream-ordered reuse), and the fallbacks (cudaHostAlloc, then pageable
memory) counted."""

from __future__ import annotations

import threading

import pytest
from device_kernels import spin_async

from cudabridge.device import EmulatedBackend
from cudabridge.errors import CudaError, InvalidArgument
from cudabridge.memory.pinned_pool import HOST_ALLOC, PAGEABLE, POOL, PinnedHostPool

KiB = 1 << 10


@pytest.fixture(params=["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def be(request):
    """Each pool test runs on the emulated device and, where one is visible, on a real GPU (its
    reservation is a real cudaHostAlloc, its events real CUDA events)."""
    if request.param == "cuda":
        yield request.getfixturevalue("cuda_backend")
        return
    b = EmulatedBackend(devices=1, memory_bytes=64 << 20)
    yield b
    b.close()


def test_blocks_come_from_one_reservation_and_coalesce(be):
    pool = PinnedHostPool(be, 64 * KiB)
    assert pool.reserved_bytes == 0                       # lazily: nothing reserved yet
    a, b, c = pool.allocate(1000), pool.allocate(16 * KiB), pool.allocate(1)
    assert {a.kind, b.kind, c.kind} == {POOL} and pool.reserved_bytes == 64 * KiB
    assert b.address == a.address + 1024 and c.address == b.address + 16 * KiB   # 256-aligned, first fit
    assert len(a.view) == 1000 and pool.in_use_bytes == 1024 + 16 * KiB + 256
    for blk in (b, a, c):
        pool.free(blk)                                      # no stream used them: back at once
    assert pool.in_use_bytes == 0 and pool.free_bytes() == 64 * KiB
    assert pool.allocate(64 * KiB).address == a.address     # coalesced into one block again


def test_a_block_is_reused_only_after_the_streams_that_used_it_passed(be):
    pool = PinnedHostPool(be, 8 * KiB)
    s = be.stream_create()
    blk = pool.allocate(8 * KiB)
    blk.view[:4] = b"data"
    ptr = be.malloc(8 * KiB)
    spin_async(be, s, 0.3)                                   # the stream is busy...
    be.copy_to_device_async(ptr, blk.view, s)                # ...so this copy of the block is pending
    blk.streams.add(s)
    pool.free(blk)
    again = pool.allocate(8 * KiB)                           # the copy has not run: not handed out
    assert again.kind == HOST_ALLOC and pool.fallbacks_host_alloc == 1
    be.stream_synchronize(s)
    third = pool.allocate(8 * KiB)                           # the event passed: the pool's block again
    assert third.kind == POOL and third.address == blk.address
    out = bytearray(4)
    be.copy_from_device_async(out, ptr, s)
    be.stream_synchronize(s)
    assert bytes(out) == b"data"                             # the copy read the block before its reuse
    pool.free(again)
    pool.free(third)
    be.free(ptr)
    be.stream_destroy(s)


def test_fallbacks_are_counted_and_bad_sizes_refused(be):
    pool = PinnedHostPool(be, 4 * KiB)
    big = pool.allocate(8 * KiB)                             # larger than the pool
    assert big.kind == HOST_ALLOC and big.pinned

    class NoPinned:    # a device whose pinned allocations all fail (the emulated one, wrapped)
        def __getattr__(self, name):
            return getattr(be, name)

        def alloc_pinned(self, nbytes):
            raise CudaError("cudaHostAlloc", 2, "cudaErrorMemoryAllocation")
    none = PinnedHostPool(NoPinned(), 4 * KiB)
    p = none.allocate(100)
    assert p.kind == PAGEABLE and not p.pinned and none.fallbacks_pageable == 1 and none.reserve_failed
    for bad in (0, -1, 1.5, None):
        with pytest.raises(InvalidArgument):
            pool.allocate(bad)
    with pytest.raises(InvalidArgument):
        PinnedHostPool(be, -1)
    off = PinnedHostPool(be, 0)                              # 0 disables the pool
    assert off.allocate(10).kind == HOST_ALLOC and off.reserved_bytes == 0
    for blk in (big,):
        pool.free(blk)
    none.free(p)
    assert pool.in_use_bytes == 0 and none.in_use_bytes == 0


def test_many_threads_share_a_small_pool_without_deadlock_and_nothing_overlaps(be):
    pool = PinnedHostPool(be, 64 * KiB)
    seen: list[tuple[int, int, str]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(i):
        try:
            work(i)
        except BaseException as exc:   # an assertion in a thread would otherwise vanish
            errors.append(exc)

    def work(i):
        for k in range(200):
            blk = pool.allocate(1 + (i * 997 + k * 131) % (12 * KiB))
            blk.view[0] = i
            with lock:
                live = [(a, n) for a, n, kind in seen if kind == POOL]
                assert not any(a < blk.address + blk.size and blk.address < a + n for a, n in live), "overlap"
                seen.append((blk.address, blk.size, blk.kind))
            assert blk.view[0] == i
            with lock:
                seen.remove((blk.address, blk.size, blk.kind))
            pool.free(blk)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert pool.in_use_bytes == 0 and pool.free_bytes() == 64 * KiB


@pytest.mark.parametrize("fast_path", ["python", "native"])
def test_a_tasks_pinned_buffers_are_reclaimed_at_its_release(fast_path):
    from cudabridge.config import ServiceConfig
    from cudabridge.errors import UnknownTask
    from cudabridge.jvm.hot_path import JavaHotPath
    from cudabridge.service import CudaBridgeService

    with CudaBridgeService(ServiceConfig(backend="emulated", emulated_memory="64m", streams_per_gpu=2,
                                         high_priority_streams=0, pinned_pool="1m", staging_slot_bytes="64k")) as service:
        hp = JavaHotPath(service, fast_path=fast_path)
        service.bind_task(1)
        owned, pinned = hp.alloc_pinned(4096, 1)
        assert pinned
        loose, _ = hp.alloc_pinned(4096)              # no owner: held until freed
        with pytest.raises(UnknownTask):
            hp.alloc_pinned(4096, 2)                  # task 2 is not bound: nothing allocated
        assert hp.pinned_pool.in_use_bytes == 8192
        service.release_task(1)
        assert hp.counters["pinned_reclaimed"] == 1 and hp.pinned_pool.in_use_bytes == 4096
        with pytest.raises(InvalidArgument, match="reclaimed with its task"):
            hp.free_pinned(owned)
        hp.free_pinned(loose)
        assert hp.pinned_pool.in_use_bytes == 0


def test_closing_with_blocks_still_held_keeps_the_memory(be):
    """Java may still write through a ByteBuffer over a held block after shutdown: the reservation
    is kept then (freed memory under it would crash the JVM), and released when none is held."""
    pool = PinnedHostPool(be, 8 * KiB)
    held = pool.allocate(100)
    pool.close()
    assert pool.reserved_bytes == 8 * KiB
    held.view[0] = 7                                         # still valid memory
    pool.free(held)
    pool.close()
    assert pool.reserved_bytes == 0
