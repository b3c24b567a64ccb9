"""Off-heap memory from Java by address, and host registration (issue 16 item 3), through the Java
hot path on the emulated device: a registered region's copies are asynchronous (as from pinned
memory), other memory's are staged; overlapping registrations, unknown unregistrations, address 0
and copies into an unregistered range are refused and change nothing."""

from __future__ import annotations

import ctypes
import threading

import pytest
from device_kernels import spin_async

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
    block = hp._regions.block(pinned)
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


@pytest.mark.parametrize("to_device", [True, False])
def test_unregister_waits_for_the_copies_queued_from_or_into_the_region(hot, to_device):
    """Issue 23 item 6.1, HostRegistration's Javadoc sequence: close the registration, then free the
    memory. A copy from (or into) the region still queued when close() is called must be done when
    it returns: close() returned at once, the copy then read the region after the memory was
    written again (or freed: SIGSEGV in the JVM). The task's stream is held by a gate here, as a
    long kernel before the copy would hold it."""
    hp, service = hot
    b = service.bind_task(1)
    n = 1 << 16
    h, _ = hp.allocate(1, n)
    hp.memset(h, 0, 0x55, n)
    mem = (ctypes.c_char * n)(*(b"\x11" * n))
    base = ctypes.addressof(mem)
    hp.register_host(base, n)
    gate = threading.Event()
    service.backend.launch_host_func(b.stream, lambda: gate.wait(30))   # the stream waits here
    if to_device:
        hp.copy_in_address(h, 0, base, raw(base, n))                      # queued behind the gate
    else:
        hp.copy_out_address(h, 0, base, raw(base, n))
    closed = threading.Event()
    t = threading.Thread(target=lambda: (hp.unregister_host(base, 1), closed.set()))
    t.start()
    try:
        assert not closed.wait(0.3), "unregister_host returned while a copy of the region was still queued"
    finally:
        gate.set()
    assert closed.wait(10)
    t.join(10)
    mem[:] = b"\x77" * n                            # the region's memory, written (or freed) after close()
    out = bytearray(n)
    hp.copy_out(h, 0, memoryview(out))
    if to_device:
        assert out == b"\x11" * n                    # the copy read the region before close() returned
    else:
        assert out == b"\x55" * n and mem.raw == b"\x77" * n   # and wrote it before, never after
    hp.free(h)
    service.release_task(1)


def test_unregistered_ranges_stay_few_and_a_copy_looks_them_up_by_bisection(hot):
    """Issue 23 item 6.12: ranges unregistered with no task bound were kept up to 1,024 and every
    copy by address scanned them all (5.4 us -> 189 us a copy). Touching ranges of one task are one
    range; scattered ones are kept up to UNREGISTERED_KEPT per task; a task's go at its release. And
    the lookup (one bisect per table) still finds the one range a copy touches among many."""
    hp, service = hot
    service.bind_task(1)
    h, _ = hp.allocate(1, 4096)
    n, step = 1200, 64                              # more than the 1,024 kept before
    mem = (ctypes.c_char * (n * step * 2))()
    base = ctypes.addressof(mem)
    for i in range(n):                              # a region re-registered as it moves along a buffer
        hp.register_host(base + i * step, step)
        hp.unregister_host(base + i * step)
    assert service.page_locked.unregistered_ranges == 1
    with pytest.raises(InvalidArgument, match=f"is in \\[{base:#x}, \\+{n * step}\\), unregistered .*the executor"):
        hp.copy_in_address(h, 0, base + 1000 * step + 8, raw(base + 1000 * step + 8, 16))
    far = base + n * step + step                    # scattered: one range each, up to the cap
    kept = service.page_locked.UNREGISTERED_KEPT
    for i in range(kept + 100):
        hp.register_host(far + i * 32, 16)
        hp.unregister_host(far + i * 32, 1)
    assert service.page_locked.unregistered_ranges == 1 + kept       # the oldest 100 of task 1's went first
    hp.copy_in_address(h, 0, far + 10 * 32, raw(far + 10 * 32, 4))   # one of those: forgotten
    probe = far + (kept + 50) * 32 + 4              # inside a recent one
    with pytest.raises(InvalidArgument, match="unregistered .*by task 1"):
        hp.copy_in_address(h, 0, probe, raw(probe, 4))
    probe = far + (kept + 50) * 32 + 16             # the gap after it: pageable, fine
    hp.copy_in_address(h, 0, probe, raw(probe, 16))
    hp.free(h)
    service.release_task(1)
    assert service.page_locked.unregistered_ranges == 1              # task 1's went with its release


def test_unregistered_range_lookups_agree_with_a_plain_model(hot):
    """The bisected tables against a list scanned in full: random registrations, unregistrations by
    task 0, 1 or 2, pinned buffers and copies by tasks 1 and 2, the same refusals."""
    import random
    hp, service = hot
    rng = random.Random(23)
    service.bind_task(1)
    service.bind_task(2)
    hs = {1: hp.allocate(1, 4096)[0], 2: hp.allocate(2, 4096)[0]}
    unit, units = 64, 256
    mem = (ctypes.c_char * (unit * units))()
    base = ctypes.addressof(mem)
    registered: dict[int, int] = {}                 # address -> size
    model: list[tuple[int, int, int]] = []          # (start, end, task) of unregistered ranges
    for _ in range(3000):
        op = rng.random()
        if op < 0.35:
            a = base + rng.randrange(units) * unit
            size = rng.randrange(1, 4) * unit
            if a + size > base + units * unit:
                continue
            if any(a < r + s and r < a + size for r, s in registered.items()):
                continue
            hp.register_host(a, size)
            registered[a] = size
            # a registration lifts the refusal where it covers a range, not past it
            model = [piece for s, e, t in model
                     for piece in ([(s, e, t)] if not (s < a + size and a < e) else
                                   [(s, min(e, a), t), (max(s, a + size), e, t)]) if piece[0] < piece[1]]
        elif op < 0.6 and registered:
            a = rng.choice(sorted(registered))
            task = rng.choice((0, 1, 2))
            hp.unregister_host(a, task)
            model.append((a, a + registered.pop(a), task))
        else:
            task = rng.choice((1, 2))
            a = base + rng.randrange(units * unit - 200)
            size = rng.randrange(0, 200)
            inside = any(r <= a and a + size <= r + s for r, s in registered.items())
            across = size > 0 and not inside and any(a < r + s and r < a + size for r, s in registered.items())
            probe_end = a + max(size, 1)
            refused = not inside and any(s < probe_end and a < e and t in (0, task) for s, e, t in model)
            view = raw(a, size) if size else memoryview(b"")
            try:
                hp.copy_in_address(hs[task], 0, a, view)
                outcome = "ok"
            except InvalidArgument as exc:
                outcome = "past" if "runs past" in str(exc) else "unregistered"
            expected = "past" if across else "unregistered" if refused else "ok"
            assert outcome == expected, (a - base, size, task, sorted(registered.items()), model)
    for a in list(registered):
        hp.unregister_host(a)
    for task, h in hs.items():
        hp.free(h)
        service.release_task(task)


@pytest.mark.gpu
def test_on_a_gpu_unregister_waits_for_the_dma_queued_from_the_region():
    """Item 6.1 on the real device: cudaHostUnregister of memory a queued DMA still reads (a kernel
    ahead of it on the stream) only after that stream has passed it."""
    import time
    with CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=2, high_priority_streams=0)) as service:
        hp = JavaHotPath(service)
        b = service.bind_task(1)
        n = 8 << 20
        h, _ = hp.allocate(1, n)
        mem = (ctypes.c_char * n)(*(b"\x11" * n))
        base = ctypes.addressof(mem)
        hp.register_host(base, n)
        spin_async(service.backend, b.stream, 0.5)                # a long kernel ahead of the copy
        hp.copy_in_address(h, 0, base, raw(base, n))
        start = time.monotonic()
        hp.unregister_host(base, 1)
        waited = time.monotonic() - start
        ctypes.memset(base, 0x77, n)
        out = bytearray(4096)
        hp.copy_out(h, n - 4096, memoryview(out))
        assert out == b"\x11" * 4096, "data written to the region after unregister_host reached the device"
        assert waited > 0.2, waited
        hp.free(h)
        service.release_task(1)
