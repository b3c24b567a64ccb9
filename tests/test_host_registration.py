"""Off-heap memory from Java by address, and host registration (issue 16 item 3), through the Java
hot path on the emulated device: a registered region's copies are asynchronous (as from pinned
memory), other memory's are staged; overlapping registrations, unknown unregistrations, address 0
and copies into an unregistered range are refused and change nothing."""

from __future__ import annotations

import ctypes
import threading

import pytest

from cudabridge.config import ServiceConfig
from cudabridge.errors import InvalidArgument
from cudabridge.jvm.hot_path import JavaHotPath
from cudabridge.service import CudaBridgeService


@pytest.fixture(params=["python", "native"])
def hot(request):
    service = CudaBridgeService(ServiceConfig(backend="emulated", emulated_memory="64m", streams_per_gpu=2,
                                              high_priority_streams=0))
    yield JavaHotPath(service, fast_path=request.param), service
    service.close()


def raw(address: int, n: int) -> memoryview:
    """What the JNI library hands over: a view of n bytes at a raw address."""
    return memoryview((ctypes.c_char * n).from_address(address)).cast("B")


def test_copies_by_address_round_trip_registered_or_not(hot):
    hp, service = hot
    service.bind_task(1)
    h, _ = hp.allocate(1, 1 << 16)
    src = (ctypes.c_char * 4096)(*b"abcd" * 1024)
    dst = (ctypes.c_char * 4096)()
    a_src, a_dst = ctypes.addressof(src), ctypes.addressof(dst)
    hp.copy_in_address(h, 100, a_src, raw(a_src, 4096))        # pageable: staged
    hp.copy_out_address(h, 100, a_dst, raw(a_dst, 4096))
    assert dst.raw == src.raw
    hp.register_host(a_src, 4096)
    hp.register_host(a_dst, 4096)
    src[0:4] = b"WXYZ"
    hp.copy_in_address(h, 0, a_src, raw(a_src, 4096))          # registered: asynchronous
    hp.copy_out_address(h, 0, a_dst + 8, raw(a_dst + 8, 64))   # an interior range of a registered region
    hp.synchronize(1)
    assert dst.raw[8:72] == src.raw[:64]
    assert hp.counters["copies_address"] == 4
    hp.unregister_host(a_src)
    hp.unregister_host(a_dst)
    hp.free(h)
    service.release_task(1)


def test_bad_registrations_and_copies_are_refused_and_change_nothing(hot):
    hp, service = hot
    service.bind_task(1)
    h, _ = hp.allocate(1, 4096)
    mem = (ctypes.c_char * 8192)()
    base = ctypes.addressof(mem)
    hp.register_host(base, 4096)
    for address, n, message in [(base + 100, 10, "overlaps"), (base - 10, 20, "overlaps"), (0, 10, "non-zero"),
                                (base + 5000, 0, "positive"), (base + 5000, -1, "positive")]:
        with pytest.raises(InvalidArgument, match=message):
            hp.register_host(address, n)
    pinned, _ = hp.alloc_pinned(4096)
    with pytest.raises(InvalidArgument, match="overlaps"):
        hp.register_host(pinned, 16)
    with pytest.raises(InvalidArgument, match="not a pinned buffer"):
        hp.free_pinned(base)                                   # a registration is not a pinned buffer
    with pytest.raises(InvalidArgument, match="not the start of a registered region"):
        hp.unregister_host(base + 8)
    hp.register_host(base + 4096, 4096)                        # adjacent: fine
    hp.unregister_host(base)
    with pytest.raises(InvalidArgument, match="unregistered"):
        hp.copy_in_address(h, 0, base + 16, raw(base + 16, 32))
    with pytest.raises(InvalidArgument, match="unregistered"):
        hp.copy_out_address(h, 0, base, raw(base, 32))
    hp.register_host(base, 4096)                               # registered again: copies are fine again
    hp.copy_in_address(h, 0, base, raw(base, 32))
    hp.unregister_host(base)
    hp.unregister_host(base + 4096)
    hp.free_pinned(pinned)
    hp.free(h)
    service.release_task(1)
    assert hp.live_handles == 0


def test_a_range_a_task_unregistered_is_refused_to_that_task_until_its_release(hot):
    """Past the task that closed a registration, the range may be a new allocation (an allocator
    reusing freed memory): other tasks copy it, and so does anyone after the task's release."""
    hp, service = hot
    service.bind_task(1)
    service.bind_task(2)
    h1, _ = hp.allocate(1, 4096)
    h2, _ = hp.allocate(2, 4096)
    mem = (ctypes.c_char * 4096)(*b"abcd")
    base = ctypes.addressof(mem)
    hp.register_host(base, 4096)
    with pytest.raises(InvalidArgument, match="task"):
        hp.unregister_host(base, "1")                          # refused: still registered
    hp.unregister_host(base, 1)
    with pytest.raises(InvalidArgument, match="unregistered .*by task 1"):
        hp.copy_in_address(h1, 0, base, raw(base, 32))
    with pytest.raises(InvalidArgument, match="unregistered .*by task 1"):
        hp.copy_out_direct(h1, 0, base, raw(base, 32))          # a direct ByteBuffer over it: the same
    before = hp.counters["copies_address"]
    hp.copy_in_address(h2, 0, base, raw(base, 32))              # another task: its own (pageable) memory
    assert hp.counters["copies_address"] == before + 1
    hp.free(h1)
    service.release_task(1)
    service.bind_task(3)
    h3, _ = hp.allocate(3, 4096)
    hp.copy_in_address(h3, 0, base, raw(base, 32))              # task 1 is gone: no longer refused
    out = (ctypes.c_char * 32)()
    hp.copy_out_address(h3, 0, ctypes.addressof(out), raw(ctypes.addressof(out), 32))
    assert out.raw[:4] == b"abcd"
    for task, h in ((2, h2), (3, h3)):
        hp.free(h)
        service.release_task(task)


def test_enter_host_copy_says_which_copies_are_page_locked_and_refuses_what_the_copies_refuse(hot):
    """On a GPU the JNI side copies host memory outside the heap in C; what the C twin does not
    take goes to enter_host_copy, the reference: the buffer's lease entered (the caller leaves it),
    the copy counted under its own kind, and whether the range is page-locked (one asynchronous
    DMA; a pinned buffer then waits for the buffer's stream before its reuse) or pageable (the
    thread's staging ring); refusals in the words of the copy it stands for."""
    hp, service = hot
    service.bind_task(1)
    h, ptr = hp.allocate(1, 4096)
    mem = (ctypes.c_char * 8192)()
    base = ctypes.addressof(mem)
    pinned, _ = hp.alloc_pinned(4096)
    hp.register_host(base, 4096)

    def enter(*args):
        a, lease, pagelocked = hp.enter_host_copy(*args)
        assert threading.get_ident() in lease.inside    # entered: a release waits for the copy
        lease.inside.remove(threading.get_ident())
        return a, pagelocked

    before = hp.counters["copies_address"]
    a, pagelocked = enter(h, 0, base + 4096, 4096, True, False)   # pageable: staged
    assert (a.ptr, pagelocked) == (ptr, False)
    assert hp.counters["copies_address"] == before + 1
    assert enter(h, 0, base, 4096, False, False)[1] is True        # registered
    block = hp._pinned_blocks[pinned]
    block.streams.clear()
    assert enter(h, 0, pinned + 8, 64, True, False)[1] is True     # inside a pinned buffer
    assert block.streams == {a.stream}                             # its reuse waits for the copy's stream
    with pytest.raises(InvalidArgument, match="runs past the page-locked"):   # half in the region
        enter(h, 0, base + 4000, 200, False, False)
    with pytest.raises(InvalidArgument, match="runs past the page-locked"):   # from before it into it
        enter(h, 0, base - 8, 16, True, False)
    direct_before = hp.counters["copies_direct"]
    assert enter(h, 0, base + 4096, 64, True, True)[1] is False    # a direct buffer's: its own counter
    assert enter(h, 0, base, 64, True, True)[1] is True
    assert hp.counters["copies_direct"] == direct_before + 2
    for args, error in [((h, 4000, base, 200), "outside the buffer"), ((h + 99, 0, base, 16), "handle"),
                        ((h, -1, base, 16), "outside the buffer")]:
        with pytest.raises(InvalidArgument, match=error):
            enter(*args, True, False)
        with pytest.raises(InvalidArgument) as entered:         # the words of the copy it stands for
            enter(*args, False, True)
        with pytest.raises(InvalidArgument) as direct:
            hp.copy_out_direct(args[0], args[1], args[2], raw(args[2], args[3]) if args[3] > 0 else memoryview(b""))
        assert str(entered.value) == str(direct.value)
    hp.unregister_host(base, 1)
    with pytest.raises(InvalidArgument, match="copy_in: .*unregistered"):
        enter(h, 0, base, 64, True, False)
    assert hp.counters["copies_address"] == before + 3                  # the refusals counted nothing
    assert hp.counters["copies_direct"] == direct_before + 2
    assert not service.registry.leases.lease_of(1).inside               # and left no lease entered
    hp.free_pinned(pinned)
    hp.free(h)
    service.release_task(1)
    assert hp.live_handles == 0


@pytest.mark.gpu
def test_on_a_gpu_registered_memory_copies_asynchronously():
    with CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=2, high_priority_streams=0)) as service:
        hp = JavaHotPath(service)
        service.bind_task(1)
        n = 1 << 20
        h, _ = hp.allocate(1, n)
        src, dst = (ctypes.c_char * n)(*(bytes(range(256)) * (n // 256))), (ctypes.c_char * n)()
        a_src, a_dst = ctypes.addressof(src), ctypes.addressof(dst)
        hp.register_host(a_src, n)
        hp.register_host(a_dst, n)
        with pytest.raises(InvalidArgument, match="overlaps"):
            hp.register_host(a_src + 4096, 16)
        hp.copy_in_address(h, 0, a_src, raw(a_src, n))
        hp.copy_out_address(h, 0, a_dst, raw(a_dst, n))
        hp.synchronize(1)
        assert dst.raw == src.raw
        hp.unregister_host(a_src)
        hp.unregister_host(a_dst)
        hp.free(h)
        service.release_task(1)


def test_a_new_registration_over_an_unregistered_range_makes_it_copyable_again(hot):
    """An allocator reuses freed memory: a region registered inside one unregistered before (another
    base, another size) is copyable (a task retry with a new Arrow vector at a reused address)."""
    hp, service = hot
    service.bind_task(1)
    h, _ = hp.allocate(1, 4096)
    mem = (ctypes.c_char * 8192)()
    base = ctypes.addressof(mem)
    hp.register_host(base, 8192)
    hp.unregister_host(base)
    hp.register_host(base + 1024, 2048)
    hp.copy_in_address(h, 0, base + 1024, raw(base + 1024, 2048))
    hp.unregister_host(base + 1024)
    hp.free(h)
    service.release_task(1)
