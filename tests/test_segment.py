"""Expandable segments (memory/segment.py) and the emulated device's virtual-memory model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from device_kernels import fill_u32_async

from cudabridge.device import DeviceAllocationFailed, EmulatedBackend
from cudabridge.errors import CudaError, InvalidArgument
from cudabridge.memory import StreamOrderedMemoryPool
from cudabridge.memory.block import UNMAPPED

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import spark_trace  # noqa: E402  (the benchmark's seeded trace, parameters fixed in the repository)

MiB = 1 << 20
G = 2 * MiB


@pytest.fixture
def backend():
    b = EmulatedBackend(devices=1, memory_bytes=1 << 30)
    yield b
    b.close()


# the emulated model -------------------------------------------------------------------------
def test_reserve_map_access_unmap(backend):
    s = backend.stream_create()
    va = backend.va_reserve(8 * G)
    assert backend.mem_get_info()[0] == 1 << 30            # address space costs no memory
    h = backend.phys_create(2 * G)
    assert backend.mem_get_info()[0] == (1 << 30) - 2 * G
    with pytest.raises(CudaError, match="illegal|unmapped"):
        backend.memset_async(va, 1, 16, s)                   # nothing mapped yet
    backend.mem_map(va + G, 2 * G, h)
    backend.memset_async(va + G, 7, 2 * G, s)
    out = bytearray(16)
    backend.copy_from_device_async(out, va + 2 * G, s)
    assert out == b"\x07" * 16
    with pytest.raises(CudaError, match="unmapped"):
        backend.memset_async(va + G - 256, 0, 512, s)        # straddles into an unmapped page
    with pytest.raises(CudaError, match="overlaps"):
        backend.mem_map(va + 2 * G, 2 * G, backend.phys_create(2 * G))
    with pytest.raises(CudaError, match="still has"):
        backend.va_release(va, 8 * G)
    with pytest.raises(CudaError, match="cuts a mapping"):
        backend.mem_unmap(va + G, G)
    with pytest.raises(CudaError, match="reservation"):
        backend.free(va)
    backend.mem_unmap(va + G, 2 * G)
    with pytest.raises(CudaError, match="unmapped"):
        backend.copy_from_device_async(out, va + 2 * G, s)
    backend.phys_release(h)
    backend.va_release(va, 8 * G)
    backend.stream_destroy(s)


def test_bad_virtual_memory_calls(backend):
    with pytest.raises(CudaError, match="multiple"):
        backend.va_reserve(G + 1)
    with pytest.raises(CudaError, match="multiple"):
        backend.phys_create(100)
    with pytest.raises(DeviceAllocationFailed):
        backend.phys_create(2 << 30)
    with pytest.raises(CudaError, match="not a live"):
        backend.phys_release(12345)
    va = backend.va_reserve(4 * G)
    h = backend.phys_create(G)
    with pytest.raises(CudaError, match="aligned"):
        backend.mem_map(va + 4096, G, h)
    with pytest.raises(CudaError, match="handle"):
        backend.mem_map(va, 2 * G, h)                        # size differs from the handle's
    backend.mem_map(va, G, h)
    backend.phys_release(h)                                  # deferred until unmapped, as in CUDA
    assert backend.mem_get_info()[0] == (1 << 30) - G
    backend.mem_unmap(va, G)
    assert backend.mem_get_info()[0] == 1 << 30
    backend.va_release(va, 4 * G)


# the pool on segments -----------------------------------------------------------------------
def _replay(backend, growth):
    events = spark_trace.generate()
    streams = [backend.stream_create() for _ in range(spark_trace.STREAMS)]
    pool = StreamOrderedMemoryPool(backend, 0, streams, limit_bytes=12 << 30, growth=growth)
    live = {}
    for ev in events:
        if ev[0] == "alloc":
            live[ev[1]] = pool.allocate(ev[2], streams[ev[3]])
        else:
            live.pop(ev[1]).free()
    st = pool.statistics()
    pool.close()
    for s in streams:
        backend.stream_destroy(s)
    return st.peak_reserved_bytes / spark_trace.peak_requested(events), st


def test_segments_keep_the_trace_within_the_fragmentation_target():
    backend = EmulatedBackend(devices=1, memory_bytes=16 << 30)
    seg_ratio, seg = _replay(backend, "segment")
    chunk_ratio, _ = _replay(backend, "chunks")
    backend.close()
    assert seg.pieces_moved > 0
    assert seg_ratio <= 1.15, seg_ratio          # the target
    assert chunk_ratio > seg_ratio               # what separate chunks give on the same trace


def test_moved_pieces_never_touch_live_data(backend):
    _moved_pieces_scenario(backend, 1 << 30)


@pytest.mark.gpu
def test_moved_pieces_never_touch_live_data_on_the_gpu(cuda_backend):
    _moved_pieces_scenario(cuda_backend, None)


@pytest.mark.gpu
def test_segments_on_the_gpu_meet_the_fragmentation_target(cuda_backend):
    seg_ratio, seg = _replay(cuda_backend, "segment")
    chunk_ratio, _ = _replay(cuda_backend, "chunks")
    assert seg.pieces_moved > 0
    assert seg_ratio <= 1.15 and chunk_ratio > seg_ratio, (seg_ratio, chunk_ratio)


def _moved_pieces_scenario(backend, total):
    free_before = backend.mem_get_info()[0]
    s = backend.stream_create()
    pool = StreamOrderedMemoryPool(backend, 0, [s], limit_bytes=160 * MiB, growth="segment")
    assert pool.growth == "segment"
    blocks = [pool.allocate(40 * MiB, s) for _ in range(3)]
    for i, a in enumerate(blocks):
        fill_u32_async(backend, a.ptr, a.size // 4, 0xA0 + i, s)
    blocks[1].free()
    backend.stream_synchronize(s)
    # 70 MiB fits no hole: the pool must move the middle block's pieces to the end, not grow.
    big = pool.allocate(70 * MiB, s)
    st = pool.statistics()
    assert st.pieces_moved > 0 and st.reserved_bytes <= 160 * MiB
    fill_u32_async(backend, big.ptr, big.size // 4, 0xEE, s)
    for i in (0, 2):
        out = bytearray(blocks[i].size)
        backend.copy_from_device_async(out, blocks[i].ptr, s)
        assert out == (0xA0 + i).to_bytes(4, "little") * (len(out) // 4)
    chunk = blocks[0]._block.chunk
    states = []
    b = chunk.head
    while b is not None:
        states.append(b.state)
        b = b.next
    assert UNMAPPED in states
    for a in (blocks[0], blocks[2], big):
        a.free()
    pool.close()
    if total is not None:
        assert backend.mem_get_info()[0] == free_before == total   # every piece and spare went back
    else:   # a real GPU: other processes may move the number a little; ours is 160 MiB
        assert abs(backend.mem_get_info()[0] - free_before) < 64 * MiB
    backend.stream_destroy(s)


def test_growth_modes_are_checked(backend):
    with pytest.raises(InvalidArgument, match="growth"):
        StreamOrderedMemoryPool(backend, 0, [], limit_bytes=MiB, growth="elastic")

    class NoVmm(EmulatedBackend):
        def vmm_granularity(self) -> int:
            return 0

    plain = NoVmm(devices=1, memory_bytes=64 * MiB)
    with pytest.raises(InvalidArgument, match="virtual memory"):
        StreamOrderedMemoryPool(plain, 0, [], limit_bytes=MiB, growth="segment")
    pool = StreamOrderedMemoryPool(plain, 0, [], limit_bytes=32 * MiB)
    assert pool.growth == "chunks"
    pool.close()
    plain.close()


def test_a_spare_piece_too_big_for_the_room_left_is_not_an_error(backend):
    """Near the end of a reservation a spare piece may not fit; growth makes a piece that does."""
    from cudabridge.memory.segment import PIECE, PhysicalPieces, Segment

    spares = PhysicalPieces(backend)
    seg = Segment(backend, PIECE + 4 * G, G)
    start, mapped, created = seg.extend(PIECE, spares)
    assert (mapped, created) == (PIECE, PIECE)
    released = seg.release_within(start, start + PIECE, spares)     # now a spare of PIECE bytes
    assert released == [(start, PIECE)] and spares.bytes == PIECE
    _, mapped2, created2 = seg.extend(2 * G, spares)    # 4 G of room left: the spare cannot go there
    assert (mapped2, created2) == (2 * G, 2 * G) and spares.bytes == PIECE
    seg.close()
    spares.close()
    assert backend.mem_get_info()[0] == 1 << 30
