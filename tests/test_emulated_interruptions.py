"""The emulated device under asynchronous exceptions (issue 23, item 6.4): whatever exception lands
wherever in a thread doing stream work, no lock of the device stays held and no stream stops.

Before the fix an exception landing inside ``threading.Condition.__enter__`` (after the lock was
taken) in a stream's ``enqueue`` left that stream's lock held: every later call on the stream, the
stream's own worker and ``close()`` blocked for good; one landing in ``Condition.wait`` between its
release of the lock and its ``try`` made the caller's ``with`` release a lock it no longer held.
An exception landing in a stream's own worker thread ended it, and every synchronize of that
stream hung.

Three runs, each a share of ``CUDABRIDGE_INTERRUPT_SECONDS`` (default 6, as in
tests/test_interruptions.py): ``PyThreadState_SetAsyncExc`` into four threads calling every kind of
device step (the race detector on); a SIGINT every millisecond while the main thread does the
same, with a second thread beside it; and asynchronous exceptions into the streams' own worker
threads. Each thread's work touches only memory that it alone uses on that stream, so that any
race the detector reports, and any error but the injected ones, is a defect. Afterwards, each
under a deadline (a hang fails the test, it is never waited out): the threads finished, every
stream runs new work, synchronize returns, and close() returns.

As in tests/test_interruptions.py, the injections land only inside the device's calls, never in
the test's bookkeeping: a thread is targeted only while its ``armed`` flag says that it is inside
a call (read and injected under the GIL), and it passes a checkpoint before it leaves its ``try``.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import threading
import time

import pytest
from device_kernels import fill_u32_async, spin_async

from cudabridge.device import LEGACY_STREAM, PER_THREAD_STREAM, EmulatedBackend
from cudabridge.errors import CudaError

SECONDS = float(os.environ.get("CUDABRIDGE_INTERRUPT_SECONDS", "6"))
SIZE = 4096
GRANULE = 2 << 20
DEADLINE = 20.0   # seconds for each final check: far beyond what a working device needs

_set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async.argtypes = (ctypes.c_ulong, ctypes.py_object)


def _noop() -> None:
    return None


def _checkpoint() -> None:
    """A Python call: entering it raises an asynchronous exception that is still pending."""


def within(seconds, fn, what):
    """``fn()`` on a daemon thread: its value or what it raised; a failure naming ``what`` if it
    has not returned after ``seconds``."""
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
        pytest.fail(f"{what} hung: no return after {seconds} s (a lock of the device left held, or a "
                    f"stream's worker gone)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class _Work:
    """One thread's stream work: random calls of every kind the device has (queueing, events, waits,
    synchronizes, memory, virtual memory, host registration, streams made and destroyed), each on
    memory that only this thread touches, on one stream only."""

    def __init__(self, be: EmulatedBackend, streams: list[int], seed: int) -> None:
        self.be = be
        self.streams = streams
        self.rng = random.Random(seed)
        self.bufs = [be.malloc(SIZE) for _ in streams]   # this thread's buffer on each stream
        self.legacy = be.malloc(SIZE)                     # ... on the legacy stream (shared by all)
        self.ptd: int | None = None                       # ... on its per-thread stream, made there
        self.event = be.event_create()
        self.pinned = be.alloc_pinned(SIZE)
        self.host = bytearray(SIZE)
        self.registered: list = []   # kept alive: an interrupted registration may outlive its call

    def step(self) -> None:
        be, rng = self.be, self.rng
        i = rng.randrange(len(self.streams))
        s, b = self.streams[i], self.bufs[i]
        r = rng.randrange(18)
        if r == 0:
            be.memset_async(b, rng.randrange(256), SIZE, s)
        elif r == 1:
            be.copy_to_device_async(b, self.host, s)
        elif r == 2:
            be.copy_from_device_async(self.pinned, b, s)          # pinned: asynchronous
        elif r == 3:
            be.copy_from_device_async(bytearray(SIZE), b, s)      # pageable: waits for the stream
        elif r == 4:
            fill_u32_async(be, b, SIZE // 4, rng.randrange(1 << 32), s)
        elif r == 5:
            be.launch_host_func(s, _noop)
        elif r == 6:
            be.event_record(self.event, s)
        elif r == 7:
            be.stream_wait_event(rng.choice(self.streams), self.event)
        elif r == 8:
            be.event_query(self.event)
            be.event_synchronize(self.event)
        elif r == 9:
            be.stream_query(s)
            be.stream_synchronize(s)
        elif r == 10:
            if self.ptd is None:
                self.ptd = be.malloc(SIZE)
            be.memset_async(self.ptd, 1, SIZE, PER_THREAD_STREAM)
            be.stream_synchronize(PER_THREAD_STREAM)
        elif r == 11:
            be.memset_async(self.legacy, 2, SIZE, LEGACY_STREAM)
            be.stream_query(LEGACY_STREAM)
        elif r == 12:
            be.free(be.malloc(SIZE))
        elif r == 13:
            buf = (ctypes.c_char * SIZE)()
            self.registered.append(buf)
            be.host_unregister(be.host_register(ctypes.addressof(buf), SIZE))
        elif r == 14:
            extra = be.stream_create()
            spin_async(be, extra, 0)
            be.stream_destroy(extra)
        elif r == 15:
            va = be.va_reserve(GRANULE)
            h = be.phys_create(GRANULE)
            be.mem_map(va, GRANULE, h)
            be.memset_async(va, 3, SIZE, s)
            be.stream_synchronize(s)
            be.mem_unmap(va, GRANULE)
            be.phys_release(h)
            be.va_release(va, GRANULE)
        elif r == 16:
            spin_async(be, s, 0.0002)
        else:
            be.device_synchronize()


def _still_works(be: EmulatedBackend, streams: list[int]) -> None:
    """Every stream (the pool's, the legacy one, this thread's own) runs new work and synchronizes,
    the device synchronizes, and close() returns: each under a deadline."""
    for s in streams + [LEGACY_STREAM, PER_THREAD_STREAM]:
        ran = []
        within(DEADLINE, lambda: (be.launch_host_func(s, lambda: ran.append(1)), be.stream_synchronize(s)),
               f"new work on stream {s:#x} and its synchronize")
        assert ran == [1], f"stream {s:#x} did not run new work"
    within(DEADLINE, be.device_synchronize, "device_synchronize")
    within(DEADLINE, be.close, "close()")


def test_async_exceptions_into_threads_doing_stream_work():
    be = EmulatedBackend(devices=1, memory_bytes=4 << 30, race_check=True)
    streams = [be.stream_create() for _ in range(3)]
    n = 4
    works = [_Work(be, streams, seed) for seed in range(n)]
    armed, idents, hits = [False] * n, [0] * n, [0] * n
    calls = [0] * n
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(i):
        idents[i] = threading.get_ident()
        work = works[i]
        while not stop.is_set():
            try:
                try:
                    armed[i] = True
                    work.step()
                    calls[i] += 1
                except KeyboardInterrupt:
                    raise
                except Exception as exc:   # noqa: BLE001 - every other error is the defect
                    errors.append(exc)
                armed[i] = False
                _checkpoint()   # an exception injected before the line above is raised here
            except KeyboardInterrupt:
                hits[i] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True, name=f"stream work {i}") for i in range(n)]
    for t in threads:
        t.start()
    end = time.monotonic() + 0.35 * SECONDS
    rng = random.Random(7)
    while time.monotonic() < end:
        i = rng.randrange(n)
        if armed[i]:   # read and injected under the GIL: the thread is inside a device call
            armed[i] = False
            _set_async(idents[i], KeyboardInterrupt)
        time.sleep(rng.random() * 0.0005)
    stop.set()
    for t in threads:
        t.join(DEADLINE)
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"threads doing stream work hung (a lock of the device left held?): {hung}; " \
                     f"{sum(hits)} injections landed"
    assert not errors, f"{len(errors)} errors besides the injected ones, first: {errors[0]!r}"
    assert not be.races, f"races reported: {be.races[0]}"
    assert sum(hits) > 20 and sum(calls) > 200, (hits, calls)
    _still_works(be, streams)


def test_sigint_every_millisecond_while_the_main_thread_does_stream_work():
    assert threading.current_thread() is threading.main_thread()
    be = EmulatedBackend(devices=1, memory_bytes=4 << 30, race_check=False)
    streams = [be.stream_create() for _ in range(2)]
    mine, beside = _Work(be, streams, 1), _Work(be, streams, 2)
    armed = [False]
    errors: list[BaseException] = []
    stop = threading.Event()

    def on_sigint(signum, frame):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    def interrupter():
        main = threading.main_thread().ident
        while not stop.is_set():
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.001)

    def alongside():   # not interrupted: it blocks for good if the main thread leaves a lock held
        while not stop.is_set():
            try:
                beside.step()
            except Exception as exc:   # noqa: BLE001
                errors.append(exc)

    previous = signal.signal(signal.SIGINT, on_sigint)
    helper = threading.Thread(target=alongside, daemon=True, name="stream work beside the main thread")
    sender = threading.Thread(target=interrupter, daemon=True, name="SIGINT sender")
    interrupts = calls = 0
    try:
        helper.start()
        sender.start()
        end = time.monotonic() + 0.25 * SECONDS
        while time.monotonic() < end:
            try:
                try:
                    armed[0] = True
                    mine.step()
                    calls += 1
                except KeyboardInterrupt:
                    raise
                except Exception as exc:   # noqa: BLE001 - every other error is the defect
                    errors.append(exc)
                armed[0] = False
                _checkpoint()
            except KeyboardInterrupt:
                interrupts += 1
    finally:
        armed[0] = False
        stop.set()
        sender.join(DEADLINE)
        signal.signal(signal.SIGINT, previous)
    helper.join(DEADLINE)
    assert not helper.is_alive(), f"the thread beside the interrupted main thread hung ({interrupts} interrupts)"
    assert not errors, f"{len(errors)} errors besides the interruptions, first: {errors[0]!r}"
    assert interrupts > 20 and calls > 50, (interrupts, calls)
    _still_works(be, streams)


def test_async_exceptions_into_the_streams_own_workers():
    """An exception landing in a stream's worker, in an op or in the worker's own steps, is that
    stream's fault (the device's sticky error, as an interrupted kernel's would be); the worker
    lives on, runs no op twice, and counts every op as done (run or faulted). The test forgives
    each fault (clears the sticky error) so that injections keep landing in every part of the
    workers' loops."""
    be = EmulatedBackend(devices=1, memory_bytes=1 << 30, race_check=False)
    dev = be._devices[0]
    streams = [be.stream_create() for _ in range(3)]
    for s in streams:   # their workers run (they are started by a thread of the device's own)
        be.launch_host_func(s, _noop)
        be.stream_synchronize(s)
    workers = [be._streams[s]._worker for s in streams]
    ran: list[int] = []
    tokens = iter(range(1 << 62))
    errors: list[BaseException] = []
    faults = [0]
    stop = threading.Event()

    def caller(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            s = rng.choice(streams)
            try:
                if rng.random() < 0.9:
                    k = next(tokens)
                    be.launch_host_func(s, lambda k=k: ran.append(k))
                else:
                    be.stream_synchronize(s)
            except CudaError as exc:
                if exc.code != 700:
                    errors.append(exc)
                faults[0] += 1
            except Exception as exc:   # noqa: BLE001 - every other error is the defect
                errors.append(exc)

    callers = [threading.Thread(target=caller, args=(i,), daemon=True, name=f"caller {i}") for i in range(2)]
    for t in callers:
        t.start()
    rng = random.Random(3)
    injected = 0
    end = time.monotonic() + 0.25 * SECONDS
    while time.monotonic() < end:
        _set_async(rng.choice(workers).ident, KeyboardInterrupt)
        injected += 1
        time.sleep(rng.random() * 0.001)
        dev.sticky = None     # forgiven: later work queues and runs again
    stop.set()
    for t in callers:
        t.join(DEADLINE)
    assert not any(t.is_alive() for t in callers), "a caller hung"
    dead = [w.name for w in workers if not w.is_alive()]
    assert not dead, f"stream workers ended by an injected exception: {dead}"
    assert not errors, f"{len(errors)} errors besides the faults, first: {errors[0]!r}"
    assert len(ran) == len(set(ran)), "an op ran twice"
    assert injected > 30 and len(ran) > 200, (injected, len(ran))
    for s in streams:   # every op is done, run or faulted (a new one takes an injection still pending)
        dev.sticky = None
        try:
            within(DEADLINE, lambda: (be.launch_host_func(s, _noop), be.stream_synchronize(s)),
                   f"synchronize of stream {s:#x}")
        except CudaError as exc:
            assert exc.code == 700, exc
        dev.sticky = None
        stream = be._streams[s]
        assert stream._completed == stream._enqueued, (stream._completed, stream._enqueued)
    _still_works(be, streams)
