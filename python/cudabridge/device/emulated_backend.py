"""A faithful CPU model of a CUDA device, for machines without a GPU.

What is modelled, because the service's correctness depends on it:

* Device memory is host memory (anonymous ``mmap``, zero-filled lazily) behind fake device
  addresses. Chunks are never adjacent in the address space, so a pool that coalesces across
  two ``malloc`` results is caught. Every access is bounds-checked against one allocation.
* Each stream is an ordered work queue run by its own worker thread. Work on different streams
  runs concurrently and in no particular order relative to each other.
* An event completes exactly when the work queued on its stream before its latest record has
  run. An event that was never recorded queries as complete. ``stream_wait_event`` waits for the
  record that was latest *at the time of the call*, as ``cudaStreamWaitEvent`` does.
* ``PER_THREAD_STREAM`` names the calling thread's own stream: the same handle is a different
  stream on every thread. ``LEGACY_STREAM`` (and ``0``) is one stream per device.
* The current device is per thread; ``malloc`` allocates on it; an event and the stream it is
  recorded on must belong to the same device.
* Virtual memory (``va_reserve`` / ``phys_create`` / ``mem_map`` / ``mem_unmap``): a reservation
  costs no memory, physical handles count against the device's memory, and touching a page of a
  reservation with nothing mapped is an illegal address. Unmapping discards the pages' contents.
  A handle can be mapped at one place at a time here (CUDA allows several; the pool never does).
* An error inside queued work (for example an out-of-bounds kernel write, or any exception a
  host twin raises, ``SystemExit`` and ``KeyboardInterrupt`` included) is sticky, as CUDA's are:
  every later call on that device raises it. The stream's worker goes on: what was queued behind
  the failed work still completes, so that synchronize and close return.
* Host registration refuses what ``cudaHostRegister`` refuses (memory that is not mapped readable
  and writable in the process, ranges that wrap or reach the kernel's half of the address space),
  with the driver's error codes, instead of accepting a range that a later copy would fault on.

Exceptions, asynchronous ones included (``PyThreadState_SetAsyncExc``, a SIGINT's
``KeyboardInterrupt``), landing anywhere in a thread that calls the device or in a stream's own
worker, leave no lock of the device held and no books of it half changed (see ``_EmuStream``,
``_EmuDevice``, ``_DeviceThread`` and the race detector for how); ``tests/test_emulated_interruptions.py``
injects them. A call cut short may have taken effect already, as a CUDA call interrupted after it
reached the driver: work it queued runs, memory it allocated stays allocated, and a stream it made
may be left unreachable (its worker idle).

Race detector (``race_check=True``, or ``CUDABRIDGE_EMULATED_RACE_CHECK=1`` in the environment;
off by default, because it costs every queued call a lock and some bookkeeping): like
compute-sanitizer's racecheck, but for stream ordering. For each range of device addresses it
keeps the last write (stream, position in that stream) and the reads since it, and raises
:class:`~cudabridge.errors.StreamOrderRace` (naming both streams and the byte range, and also
appending it to ``backend.races``) for any access not ordered after a conflicting earlier one
(write after write, write after read, read after write). What orders two accesses: the same
stream; an event wait (``stream_wait_event`` orders after the record latest at call time); or a
host synchronization the host observed before queueing the later access: ``stream_synchronize``,
``event_synchronize``, ``device_synchronize``, an ``event_query`` or ``stream_query`` that said
done, a pageable ``copy_from_device_async`` (it returns only once complete). Destroying a stream
is not one (``cudaStreamDestroy`` does not wait). The check happens when the work is queued,
in the caller's thread and before anything is queued, so it does not depend on timing: a race
is reported even where the scheduling happened to hide it. Accesses: ``memcpy_async`` (writes
dst, reads src), ``copy_to_device_async`` (writes), ``copy_from_device_async`` (reads),
``memset_async`` and ``fill_u32_async`` (write); ``spin_async`` touches nothing. ``free``,
``mem_unmap`` and ``va_release`` forget their range's history. Host memory is not tracked.

Not modelled: the implicit synchronization of the legacy stream with blocking streams (the
service creates only non-blocking streams, and leaving it out only makes races easier to see),
and stream priorities (accepted and reported, not scheduled).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import mmap
import os
import queue
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable

from ..config import BY_KEY, check_value
from ..errors import CudaError, InvalidArgument, StreamOrderRace
from .backend import (
    DEFAULT_STREAM,
    LEGACY_STREAM,
    PER_THREAD_STREAM,
    DeviceAllocationFailed,
    DeviceBackend,
    host_view,
)

log = logging.getLogger(__name__)

_ERR_OUT_OF_MEMORY = (2, "cudaErrorMemoryAllocation")
_ERR_INVALID_VALUE = (1, "cudaErrorInvalidValue")
_ERR_HOST_ALREADY_REGISTERED = (712, "cudaErrorHostMemoryAlreadyRegistered")
_ERR_HOST_NOT_REGISTERED = (713, "cudaErrorHostMemoryNotRegistered")
_ERR_INVALID_DEVICE = (101, "cudaErrorInvalidDevice")
_ERR_INVALID_HANDLE = (400, "cudaErrorInvalidResourceHandle")
_ERR_ILLEGAL_ADDRESS = (700, "cudaErrorIllegalAddress")
_ERR_NOT_SUPPORTED = (801, "cudaErrorNotSupported")

# Fake address spaces: each device gets its own 1 TiB window, chunks are separated by a gap.
# The window is the most memory an emulated GPU may have: one constant, the emulatedMemory
# setting's max in settings.json (which the Java check reads too), so that the setting's bound
# and this layout cannot drift apart; a larger memory would let GPU n's buffers run into GPU n+1's
# window (and _device_of would name the wrong GPU).
_ADDRESS_BASE = 0x7F00_0000_0000
_DEVICE_WINDOW = BY_KEY["emulatedMemory"].max   # 1 << 40
_ALLOC_GRANULE = 1 << 21  # cudaMalloc rounds to 2 MiB pages; keep one page of gap too


def _fail(call: str, err: tuple[int, str], detail: str = "") -> CudaError:
    return CudaError(call, err[0], err[1], detail)


def _host_register_refusal(address: int, nbytes: int) -> CudaError | None:
    """What ``cudaHostRegister(address, nbytes, portable)`` refuses, as it answered on the H200
    (CUDA 13 runtime): a null address or no bytes, and a range that wraps past 2^64, are
    ``cudaErrorInvalidValue``; a range reaching into the upper half of the address space (where no
    process memory is: the kernel's half, or a length like 2^63-1) is ``cudaErrorNotSupported``;
    any byte that is not in memory the process has mapped readable and writable (unmapped,
    ``PROT_NONE``, read-only: a portable registration writes) is ``cudaErrorInvalidValue``. The
    driver pins every page; here nothing is pinned, so the pages are checked in /proc/self/maps."""
    call = "cudaHostRegister"
    end = address + nbytes
    if address <= 0 or nbytes <= 0 or end > 1 << 64:
        return _fail(call, _ERR_INVALID_VALUE, f"address {address:#x}, {nbytes} bytes")
    if end > 1 << 63:
        return _fail(call, _ERR_NOT_SUPPORTED, f"[{address:#x}, +{nbytes}) reaches into the upper (the "
                                               f"kernel's) half of the address space")
    try:
        with open("/proc/self/maps", "rb") as f:
            maps = f.read()
    except OSError:   # no /proc (not Linux): the pages go unchecked
        return None
    at = address      # [address, at) is readable and writable; the lines are in address order
    for line in maps.splitlines():
        span, perms = line.split(None, 2)[:2]
        lo, _, hi = span.partition(b"-")
        lo, hi = int(lo, 16), int(hi, 16)
        if hi <= at:
            continue
        if lo > at:
            break
        if perms[:2] != b"rw":
            return _fail(call, _ERR_INVALID_VALUE, f"[{address:#x}, +{nbytes}): {at:#x} is in memory mapped "
                                                   f"{perms.decode()}, not readable and writable")
        at = hi
        if at >= end:
            return None
    return _fail(call, _ERR_INVALID_VALUE, f"[{address:#x}, +{nbytes}): nothing is mapped at {at:#x}")


def _describe(exc: BaseException) -> str:
    """``repr(exc)`` for a fault's message. Never raises: whatever a twin raised, and whatever its
    ``repr`` (or its class's name) raises in turn, the worker must go on to the next op."""
    try:
        text = repr(exc)
        if text.__class__ is str:
            return text
    except BaseException:   # noqa: BLE001 - a repr that fails is described without it
        pass
    try:
        return f"{type(exc).__qualname__} (its repr() failed)"
    except BaseException:   # noqa: BLE001
        return "an exception that cannot be described (its repr() and its class's name failed)"


_STOP = object()   # close()'s last item: the worker ends when it takes it


class _DeviceThread:
    """The device's own thread: it starts the streams' worker threads and writes the device's log
    lines, so that neither a caller of the device nor a stream's worker (threads an exception can
    be injected into) runs code outside the device that takes a Python-level lock: ``Thread.start()``
    waits on a ``threading.Event`` (a ``Condition``) and ``logging`` takes its handlers' locks in
    Python methods, both of which an exception can leave held. Also, CPython gives a thread being
    started its starter's id until it runs, so that ``PyThreadState_SetAsyncExc`` aimed at the
    starter can land in the new thread before its first line and end it. Jobs are queued with one
    C call; a stream takes work before its worker has started, and the worker runs it once started."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def post(self, job: Callable[[], None]) -> None:
        self._q.put(job)
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    # the one start a caller makes, once per process (an exception in it leaves
                    # _thread unset: a later post starts another, which serves the same queue)
                    thread = threading.Thread(target=self._run, name="emulated-device", daemon=True)
                    thread.start()
                    self._thread = thread

    def settle(self, timeout: float = 5.0) -> bool:
        """Wait (up to ``timeout`` s) until every job posted so far has run: a stream's worker has
        started once its stream is made, so that threads come and go where the caller does. A
        lock acquired in C, not an Event: an exception cutting the wait short leaves nothing held
        (the job releases the gate later, unseen)."""
        if self._thread is not None and threading.current_thread() is self._thread:
            return False
        gate = threading.Lock()
        gate.acquire()
        self.post(gate.release)
        return gate.acquire(timeout=timeout)

    def _run(self) -> None:
        while True:
            job = self._q.get()
            try:
                job()
            except BaseException:   # noqa: BLE001 - a log line that failed (or an exception landing
                pass                # here): the next job still runs

    def forget(self) -> None:
        """In a forked child: the thread is the parent's; the child's first post starts its own."""
        self._q = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = None


_DEVICE_THREAD = _DeviceThread()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_DEVICE_THREAD.forget)


def _start_worker(worker: threading.Thread) -> None:
    """Start a stream's worker (a job of the device thread). While the process can start no thread,
    wait: the stream's work waits with it, as it would for a busy GPU."""
    while worker.ident is None:   # set once started
        try:
            worker.start()
        except RuntimeError as exc:
            log.warning("emulated device: cannot start %s yet: %s", worker.name, exc)
            time.sleep(0.05)


class _EmuStream:
    """An ordered queue of host callables, run by one worker thread.

    Safe under any exception in any thread, asynchronous ones included (``PyThreadState_SetAsyncExc``,
    a SIGINT's ``KeyboardInterrupt``), which the interpreter raises only at a call's return or a
    function's entry, and a loop's jump back, never between plain loads and stores:

    * No ``threading.Condition``: its Python-level ``__enter__`` and ``wait`` can take an exception
      between acquiring (or releasing) its lock and the ``try`` that undoes it, leaving the lock held
      for good (or released twice).
    * ``_lock`` is a plain ``_thread`` lock, only ever taken by ``with``: the interpreter acquires
      and releases it in C, and an exception raised anywhere inside the block releases it. Each
      block makes its calls before its first change and then changes state with plain stores, its
      one mutating call last, so that an exception finds its step done or not begun.
    * The queue is a ``queue.SimpleQueue``: ``put`` and ``get`` are single C operations.
    * A waiter needs no lock: it parks on a fresh lock of its own, registered in ``_waiters`` (one
      dict store); the worker releases it once the stream has passed its target.
    * The worker never ends but at close()'s ``_STOP``: an op's exception of any kind is the
      device's sticky fault, and an exception that lands in the worker's own steps (an injected one)
      is recovered from: ops taken from the queue and never run count as faulted, never run twice.
    """

    __slots__ = ("device", "handle", "priority", "_q", "_lock", "_waiters", "_enqueued", "_completed",
                 "_worker", "_closed", "kind", "label", "clock", "host_seen", "observed")

    def __init__(self, device: "_EmuDevice", handle: int, priority: int, kind: str) -> None:
        self.device = device
        self.handle = handle
        self.priority = priority
        self.kind = kind
        if kind == "per-thread":   # made on its owner thread, on first use there
            self.label = f"per-thread stream of thread {threading.current_thread().name!r} ({handle:#x})"
        elif kind == "legacy":
            self.label = f"legacy stream of GPU {device.ordinal} ({handle:#x})"
        else:
            self.label = f"{kind} stream {handle:#x}" + (f" of GPU {device.ordinal}" if device.ordinal else "")
        # race detector state (unused when it is off): the frontier clock, the host clock
        # version last joined into it, and the own position the host has last seen complete
        self.clock: dict[int, int] = {}
        self.host_seen = -1
        self.observed = -1
        self._q: queue.SimpleQueue = queue.SimpleQueue()   # (seq, op) in seq order, then _STOP
        self._lock = threading.Lock()                      # numbering + put; close's _STOP
        self._waiters: dict[Any, int] = {}                 # parked waiter's lock -> the seq it waits for
        self._enqueued = 0      # ops numbered so far (the last seq handed out)
        self._completed = 0     # every op up to this seq has run or faulted (only the worker writes it)
        self._closed = False
        self._worker = threading.Thread(
            target=self._run, name=f"emulated-gpu{device.ordinal}-stream-{kind}-{handle:#x}", daemon=True
        )
        _DEVICE_THREAD.post(functools.partial(_start_worker, self._worker))
        _DEVICE_THREAD.settle()   # its worker is running when the stream is made (thread counts stay put)

    def enqueue(self, op: Callable[[], None]) -> int:
        """Queue ``op``; returns its sequence number (1-based)."""
        with self._lock:
            if self._closed:
                raise _fail("stream", _ERR_INVALID_HANDLE, f"stream {self.handle:#x} was destroyed")
            seq = self._enqueued + 1
            item = (seq, op)
            self._enqueued = seq
            try:
                self._q.put(item)       # the block's one call, last: numbered and queued together
            except MemoryError:         # raised inside put (an asynchronous exception lands after it)
                self._enqueued = seq - 1
                raise
        return seq

    def marker(self) -> int:
        """The sequence number that the next completion check must reach (an event record)."""
        return self.enqueue(_noop)

    def completed(self, seq: int) -> bool:
        return self._completed >= seq

    def wait_for(self, seq: int, timeout: float = -1) -> bool:
        """Block until every op up to ``seq`` has run (or faulted), or ``timeout`` seconds have
        passed (-1: no end); whether it has run."""
        if self._completed >= seq:
            return True
        gate = threading.Lock()
        gate.acquire()
        self._waiters[gate] = seq
        # The worker stores _completed before it reads _waiters, and this thread stored its gate
        # before this read: either the worker sees the gate, or this sees the seq passed.
        if self._completed < seq:
            gate.acquire(timeout=timeout)
        # An exception that ends the wait early (a SIGINT during it), or the timeout, leaves the
        # gate registered: the worker releases and drops it once the stream passes seq.
        self._waiters.pop(gate, None)
        return self._completed >= seq

    def idle(self) -> bool:
        return self._completed >= self._enqueued

    def synchronize(self) -> None:
        self.wait_for(self._enqueued)

    def close(self, timeout: float | None = None) -> bool:
        """Let what is queued run, then end the worker; wait for that up to ``timeout`` seconds
        (None: no end; 0: return at once, as cudaStreamDestroy does). Whether the worker has
        ended. Repeatable: a close that an exception cut short can be called again, and finishes."""
        with self._lock:
            if not self._closed:
                self._closed = True          # no op is numbered after this ...
                self._q.put(_STOP)           # ... so _STOP comes after every op
        if threading.current_thread() is self._worker:   # (the worker cannot wait for itself)
            return False
        if timeout == 0:
            return not self._worker.is_alive() and self.idle()
        if not self.wait_for(self._enqueued, -1 if timeout is None else timeout):
            return False
        try:
            self._worker.join(timeout=5)
        except RuntimeError:   # not started yet: once the device thread starts it, it takes _STOP and ends
            pass
        return not self._worker.is_alive()

    # the worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        unsure = False   # whether an exception may have cut one of the worker's own steps short
        while True:
            try:
                if unsure:
                    if self._recover():
                        return
                    unsure = False
                self._serve()
                return
            except BaseException:   # noqa: BLE001 - only an asynchronous one gets here: recover
                # A second exception landing on the jump back to the ``try`` would still end the
                # worker: Python has no way to close that window of a few instructions.
                unsure = True

    def _serve(self) -> None:
        """Run the queue's ops in order until ``_STOP``."""
        get, device = self._q.get, self.device
        while True:
            item = get()
            if item is _STOP:
                return
            seq, op = item
            if seq != self._completed + 1:   # ops before it were taken, then lost to an exception here
                self._lost(seq - 1)
            try:
                op()
            except CudaError as exc:         # an emulated kernel's own fault (an access out of bounds)
                device.set_sticky(exc)
            except BaseException as exc:     # noqa: BLE001 - a host twin's exception, of any kind: the
                # device's fault, as docs/kernels.md says (not this thread's: a twin's SystemExit or
                # KeyboardInterrupt is not meant for the device's worker)
                device.set_sticky(_fail("kernel", _ERR_ILLEGAL_ADDRESS, _describe(exc)))
            item = op = None                 # the op's views of device memory go now, not at the next op
            self._completed = seq
            if self._waiters:
                self._wake()

    def _lost(self, upto: int) -> None:
        """Ops up to ``upto`` were taken from the queue and did not finish (an exception landed in this
        worker): they fault the device, as an interrupted kernel would, and count as done."""
        self.device.set_sticky(_fail("kernel", _ERR_ILLEGAL_ADDRESS, f"work on {self.label} was cut short "
                                                                     f"by an exception in its worker thread"))
        self._completed = upto

    def _recover(self) -> bool:
        """After an exception in the worker's own steps: count as faulted what was taken and not run,
        wake the waiters a cut-short wake-up missed; whether close()'s ``_STOP`` was taken."""
        with self._lock:   # not between an enqueue's numbering and its put: empty means all taken
            drained = self._q.empty()
            enqueued, closed = self._enqueued, self._closed
        if drained and self._completed < enqueued:
            self._lost(enqueued)
        # (not drained: the next op taken shows the gap, and _serve counts it)
        self._wake()
        return drained and closed

    def _wake(self) -> None:
        done = self._completed
        for gate, seq in list(self._waiters.items()):   # a snapshot in one C call
            if seq <= done:
                try:
                    gate.release()
                except RuntimeError:   # released already, by a pass that an exception cut short
                    pass
                self._waiters.pop(gate, None)


def _noop() -> None:
    return None


class _EmuEvent:
    __slots__ = ("device", "stream", "seq", "clock", "observed")

    def __init__(self, device: "_EmuDevice") -> None:
        self.device = device
        self.stream: _EmuStream | None = None
        self.seq = 0
        self.clock: dict[int, int] = {}   # race detector: the stream's frontier at the latest record
        self.observed = False             # ... and whether the host clock has it already

    def done(self) -> bool:
        stream = self.stream
        return stream is None or stream.completed(self.seq)


_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value; Python 3.11 lacks the name
_PHYS_HANDLES = itertools.count(0x5000_0001)


class _Reservation:
    __slots__ = ("base", "size", "pages", "mappings")

    def __init__(self, base: int, size: int) -> None:
        self.base = base
        self.size = size
        self.pages = bytearray(size // _ALLOC_GRANULE)   # 1 where a handle is mapped
        self.mappings: dict[int, tuple[int, int]] = {}   # start -> (size, handle)

    def accessible(self, ptr: int, nbytes: int) -> bool:
        p0 = (ptr - self.base) // _ALLOC_GRANULE
        p1 = -(-(ptr - self.base + max(nbytes, 1)) // _ALLOC_GRANULE)
        return self.pages.find(0, p0, p1) == -1


class _Physical:
    __slots__ = ("size", "mapped_at", "released")

    def __init__(self, size: int) -> None:
        self.size = size
        self.mapped_at: int | None = None
        self.released = False


class _EmuDevice:
    """One emulated GPU: its memory, virtual memory and sticky error.

    ``_lock`` is a plain ``_thread`` lock taken only by ``with``, so that no exception leaves it
    held; inside it each step makes its calls (``mmap``, ``bisect``, lookups, constructors) before
    its first change and then changes the books with plain stores, any one mutating call last: an
    exception, asynchronous ones included (they land only at calls and loops' jumps back), finds
    the step done or not begun, never the books half changed."""

    def __init__(self, ordinal: int, memory_bytes: int) -> None:
        self.ordinal = ordinal
        self.total = memory_bytes
        self.used = 0
        self.uuid = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"cudabridge-emulated-{ordinal}"))
        self._lock = threading.Lock()
        self._bases: list[int] = []          # sorted
        self._chunks: dict[int, mmap.mmap] = {}
        self._reservations: dict[int, _Reservation] = {}
        self._phys: dict[int, _Physical] = {}
        self._next = _ADDRESS_BASE + ordinal * _DEVICE_WINDOW
        # addresses are never reused (_next only grows), and all of them lie in this GPU's window:
        # an allocation past its end is refused, never placed in the next GPU's addresses
        self._window_end = _ADDRESS_BASE + (ordinal + 1) * _DEVICE_WINDOW
        self.sticky: CudaError | None = None
        self.context_created = False
        self.legacy: _EmuStream | None = None

    def set_sticky(self, exc: CudaError) -> None:
        if self.sticky is None:
            self.sticky = exc
            # logged by the device thread: a stream's worker (the usual caller) never takes logging's locks
            _DEVICE_THREAD.post(functools.partial(log.error, "emulated GPU %d: sticky error %s", self.ordinal, exc))

    def malloc(self, nbytes: int) -> int:
        span = -(-nbytes // _ALLOC_GRANULE) * _ALLOC_GRANULE
        with self._lock:
            if self.used + span > self.total:
                raise DeviceAllocationFailed(nbytes, f"emulated GPU {self.ordinal} has "
                                             f"{self.total - self.used} of {self.total} bytes free")
            base = self._next
            if base + span > self._window_end:
                raise DeviceAllocationFailed(nbytes, f"emulated GPU {self.ordinal} has used up its address "
                                             f"window ({_DEVICE_WINDOW} bytes of addresses, never reused)")
            chunk = mmap.mmap(-1, span)
            self._next = base + span + _ALLOC_GRANULE
            self._chunks[base] = chunk
            self.used += span
            self._bases.append(base)   # last; the largest base yet (_next only grows): still sorted
        return base

    # virtual memory: a reservation is one lazily committed host mapping; its pages are
    # accessible only while a physical handle is mapped over them (else: illegal address).
    def va_reserve(self, nbytes: int) -> int:
        if nbytes <= 0 or nbytes % _ALLOC_GRANULE:
            raise _fail("cuMemAddressReserve", _ERR_INVALID_VALUE,
                        f"size {nbytes} is not a positive multiple of {_ALLOC_GRANULE}")
        with self._lock:
            base = self._next
            if base + nbytes > self._window_end:
                raise _fail("cuMemAddressReserve", _ERR_OUT_OF_MEMORY,
                            f"emulated GPU {self.ordinal} has no {nbytes} bytes of addresses left in its window")
            chunk = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
            res = _Reservation(base, nbytes)
            self._next = base + nbytes + _ALLOC_GRANULE
            self._chunks[base] = chunk
            self._reservations[base] = res
            self._bases.append(base)   # last; the largest base yet (_next only grows): still sorted
        return base

    def _reservation_of(self, call: str, ptr: int, nbytes: int) -> "_Reservation":
        i = bisect.bisect_right(self._bases, ptr) - 1
        res = self._reservations.get(self._bases[i]) if i >= 0 else None
        if res is None or ptr + nbytes > res.base + res.size or nbytes <= 0:
            raise _fail(call, _ERR_INVALID_VALUE, f"[{ptr:#x}, +{nbytes}) is not inside one reservation "
                                                  f"of GPU {self.ordinal}")
        if (ptr - res.base) % _ALLOC_GRANULE or nbytes % _ALLOC_GRANULE:
            raise _fail(call, _ERR_INVALID_VALUE, f"[{ptr:#x}, +{nbytes}) is not aligned to {_ALLOC_GRANULE}")
        return res

    def va_release(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            res = self._reservations.get(ptr)
            if res is None or res.size != nbytes:
                raise _fail("cuMemAddressFree", _ERR_INVALID_VALUE, f"{ptr:#x}+{nbytes} is not a reservation")
            if res.mappings:
                raise _fail("cuMemAddressFree", _ERR_INVALID_VALUE,
                            f"reservation {ptr:#x} still has {len(res.mappings)} mapping(s)")
            chunk = self._chunks[ptr]
            i = bisect.bisect_left(self._bases, ptr)
            del self._reservations[ptr]
            del self._chunks[ptr]
            del self._bases[i]
        try:
            chunk.close()
        except BufferError:
            pass

    def phys_create(self, nbytes: int) -> int:
        if nbytes <= 0 or nbytes % _ALLOC_GRANULE:
            raise _fail("cuMemCreate", _ERR_INVALID_VALUE, f"size {nbytes} is not a positive multiple of {_ALLOC_GRANULE}")
        phys = _Physical(nbytes)
        handle = next(_PHYS_HANDLES)
        with self._lock:
            if self.used + nbytes > self.total:
                raise DeviceAllocationFailed(nbytes, f"emulated GPU {self.ordinal} has "
                                             f"{self.total - self.used} of {self.total} bytes free")
            self.used += nbytes
            self._phys[handle] = phys
        return handle

    def phys_release(self, handle: int) -> None:
        with self._lock:
            phys = self._phys.get(handle)
            if phys is None or phys.released:
                raise _fail("cuMemRelease", _ERR_INVALID_VALUE, f"{handle!r} is not a live memory handle")
            phys.released = True       # as in CUDA: the memory goes once its mapping is gone
            if phys.mapped_at is None:
                del self._phys[handle]
                self.used -= phys.size

    def mem_map(self, ptr: int, nbytes: int, handle: int) -> None:
        with self._lock:
            res = self._reservation_of("cuMemMap", ptr, nbytes)
            phys = self._phys.get(handle)
            if phys is None or phys.released or phys.size != nbytes:
                raise _fail("cuMemMap", _ERR_INVALID_VALUE, f"handle {handle!r} is not a live handle of {nbytes} bytes")
            if phys.mapped_at is not None:
                raise _fail("cuMemMap", _ERR_INVALID_VALUE, f"handle {handle!r} is mapped already (not modelled twice)")
            p0, p1 = (ptr - res.base) // _ALLOC_GRANULE, (ptr - res.base + nbytes) // _ALLOC_GRANULE
            if res.pages.find(1, p0, p1) != -1:
                raise _fail("cuMemMap", _ERR_INVALID_VALUE, f"[{ptr:#x}, +{nbytes}) overlaps a mapping")
            res.pages[p0:p1] = b"\x01" * (p1 - p0)
            res.mappings[ptr] = (nbytes, handle)
            phys.mapped_at = ptr

    def mem_unmap(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            res = self._reservation_of("cuMemUnmap", ptr, nbytes)
            spans = []
            at = ptr
            while at < ptr + nbytes:          # the range must be made of whole mappings
                m = res.mappings.get(at)
                if m is None:
                    raise _fail("cuMemUnmap", _ERR_INVALID_VALUE, f"{at:#x} does not start a mapping")
                spans.append((at, m))
                at += m[0]
            if at != ptr + nbytes:
                raise _fail("cuMemUnmap", _ERR_INVALID_VALUE, f"[{ptr:#x}, +{nbytes}) cuts a mapping")
            chunk = self._chunks[res.base]
            # One mapping at a time, each undone whole (an exception can land at the loop's jump
            # back): an unmap cut short leaves whole mappings, mapped or not, never half of one.
            for start, (size, handle) in spans:
                p0, p1 = (start - res.base) // _ALLOC_GRANULE, (start - res.base + size) // _ALLOC_GRANULE
                unmapped = bytes(p1 - p0)
                phys = self._phys[handle]
                del res.mappings[start]
                res.pages[p0:p1] = unmapped
                phys.mapped_at = None
                if phys.released:
                    del self._phys[handle]
                    self.used -= phys.size
                # The physical pages are gone: what a later mapping shows is not what was written.
                chunk.madvise(mmap.MADV_DONTNEED, start - res.base, size)

    def free(self, ptr: int) -> int:
        """Free a ``malloc`` result; returns the bytes it spanned."""
        if ptr in self._reservations:
            raise _fail("cudaFree", _ERR_INVALID_VALUE, f"{ptr:#x} is a reservation (cuMemAddressFree), not a cudaMalloc")
        with self._lock:
            chunk = self._chunks.get(ptr)
            if chunk is None:
                raise _fail("cudaFree", _ERR_INVALID_VALUE, f"{ptr:#x} is not an allocation of GPU {self.ordinal}")
            span = len(chunk)
            i = bisect.bisect_left(self._bases, ptr)
            del self._chunks[ptr]
            del self._bases[i]
            self.used -= span
        try:
            chunk.close()
        except BufferError:
            pass  # a view of it is still referenced (a finished op's closure); GC unmaps it
        return span

    def extent(self, call: str, ptr: int) -> int:
        """Bytes from ``ptr`` to the end of its allocation (in a reservation: of the mapped run
        that holds it): what a kernel given ``ptr`` may touch."""
        bases = self._bases
        i = bisect.bisect_right(bases, ptr) - 1
        if i >= 0:
            base = bases[i]
            chunk = self._chunks.get(base)
            if chunk is not None and ptr < base + len(chunk):
                res = self._reservations.get(base)
                if res is None:
                    return base + len(chunk) - ptr
                p0 = (ptr - base) // _ALLOC_GRANULE
                if res.pages[p0]:
                    p1 = res.pages.find(0, p0)
                    end = base + (len(res.pages) if p1 == -1 else p1) * _ALLOC_GRANULE
                    return end - ptr
                raise _fail(call, _ERR_ILLEGAL_ADDRESS, f"{ptr:#x} is in unmapped pages of a reservation on GPU "
                            f"{self.ordinal}")
        raise _fail(call, _ERR_INVALID_VALUE, f"{ptr:#x} is not inside an allocation of GPU {self.ordinal}")

    def view(self, call: str, ptr: int, nbytes: int) -> memoryview:
        """The host memory behind [ptr, ptr+nbytes), which must lie inside one allocation."""
        if nbytes < 0:
            raise _fail(call, _ERR_INVALID_VALUE, f"negative size {nbytes}")
        bases = self._bases
        i = bisect.bisect_right(bases, ptr) - 1
        if i >= 0:
            base = bases[i]
            chunk = self._chunks.get(base)
            if chunk is not None and ptr + nbytes <= base + len(chunk):
                res = self._reservations.get(base)
                if res is not None and not res.accessible(ptr, nbytes):
                    raise _fail(call, _ERR_ILLEGAL_ADDRESS,
                                f"[{ptr:#x}, +{nbytes}) touches unmapped pages of a reservation on GPU {self.ordinal}")
                off = ptr - base
                return memoryview(chunk)[off:off + nbytes]
        raise _fail(call, _ERR_INVALID_VALUE,
                    f"[{ptr:#x}, +{nbytes}) is not inside one allocation of GPU {self.ordinal}")


# race detector ---------------------------------------------------------------------------------

RACE_CHECK_ENV = BY_KEY["emulatedRaceCheck"].env_name   # CUDABRIDGE_EMULATED_RACE_CHECK


def race_check_from_env() -> bool:
    """``CUDABRIDGE_EMULATED_RACE_CHECK`` (a bool setting: true/1 on; false/0 or unset off)."""
    value = os.environ.get(RACE_CHECK_ENV, "").strip()
    try:
        return bool(value) and check_value("emulatedRaceCheck", value)
    except InvalidArgument:
        raise InvalidArgument(f"{RACE_CHECK_ENV}={value!r}: expected true or false (or 1 or 0)") from None


class _Seg:
    """A byte range [start, end) with one access history: the last write as (stream handle,
    position in that stream, call) or None, and the reads since it as {stream handle: (position,
    call)} or None. ``reads`` dicts are never changed once made, so segments may share them."""

    __slots__ = ("start", "end", "write", "reads")

    def __init__(self, start: int, end: int, write: tuple[int, int, str] | None,
                 reads: dict[int, tuple[int, str]] | None) -> None:
        self.start = start
        self.end = end
        self.write = write
        self.reads = reads


def _join(into: dict[int, int], clock: dict[int, int]) -> bool:
    """``into`` = elementwise max(into, clock); whether anything grew."""
    grew = False
    get = into.get
    for k, v in clock.items():
        if get(k, 0) < v:
            into[k] = v
            grew = True
    return grew


class _RaceDetector:
    """Stream-ordering race detection with vector clocks (see the module docstring).

    A clock maps a stream's handle to a position in that stream (its 1-based sequence number of
    queued work). Each stream has a frontier clock: everything that its next queued work is
    ordered after. An event carries a copy of its stream's frontier at record time. The host has
    one clock for all its threads: whatever any host thread saw complete (a synchronize, a query
    that said done, a pageable copy back). It is one clock, not one per thread, because the pool
    passes such knowledge between threads through plain shared memory under the GIL (a block's
    epoch, an arena's ``completed``), with no call the backend could see; a thread that queues
    work after another thread observed a completion is ordered after it, as the pool assumes.

    Work queued on a stream gets the clock join(stream frontier, host clock) and is checked then,
    in the caller's thread, against the last write and the reads since it of every byte it
    touches: deterministic, whatever the timing. Everything here runs under one lock, and work
    is queued on its stream inside it, so that clock positions are queue positions.

    Under an exception that cuts a step short (an asynchronous one lands at a call or a loop's
    jump back): the lock is a plain one taken by ``with``, so it is released; the interval map's
    two lists change together, with no call between; and a cut-short step leaves the detector
    knowing less than happened (an access or an ordering not recorded), never more, and never
    ordering that did not happen: work is queued before the clocks say so, and the host clock's
    version is bumped before it grows.
    """

    def __init__(self, races: list) -> None:
        self.lock = threading.Lock()
        self.races = races
        self.host: dict[int, int] = {}
        self.host_version = 0                       # bumped whenever the host clock grows
        self.labels: dict[int, str] = {}            # stream handle -> what the messages call it
        self.retired: dict[int, dict[int, int]] = {}  # GPU -> join of its destroyed streams' frontiers
        self.retiring: deque[tuple[int, dict[int, int]]] = deque()  # per-thread streams closed by GC
        self._starts: list[int] = []                # the interval map: segment starts, sorted ...
        self._segs: list[_Seg] = []                 # ... and the segments, disjoint

    def add_stream(self, s: "_EmuStream") -> None:
        self.labels[s.handle] = s.label

    # clocks ---------------------------------------------------------------------------------
    def _frontier(self, s: "_EmuStream") -> dict[int, int]:
        """The stream's frontier, caught up with the host clock (joined only when it changed)."""
        clock = s.clock
        if s.host_seen != self.host_version:
            _join(clock, self.host)
            s.host_seen = self.host_version
        return clock

    def _observe(self, clock: dict[int, int]) -> None:
        host = self.host
        for k, v in clock.items():
            if host.get(k, 0) < v:
                # bumped before the join: a join cut short leaves streams to join the host again
                self.host_version += 1
                _join(host, clock)
                return

    def observe(self, clock: dict[int, int]) -> None:
        with self.lock:
            self._observe(clock)

    # queueing -------------------------------------------------------------------------------
    def enqueue(self, s: "_EmuStream", op: Callable[[], None], call: str,
                reads: tuple[tuple[int, int], ...] = (), writes: tuple[tuple[int, int], ...] = (),
                keep_clock: bool = False) -> tuple[int, dict[int, int] | None]:
        """Check ``op``'s accesses ((address, bytes) pairs), queue it, record them. Returns its
        sequence number and, with ``keep_clock``, a copy of its clock."""
        with self.lock:
            clock = self._frontier(s)
            for ptr, n in reads:
                hit = self._conflict(clock, ptr, ptr + n, False)
                if hit is not None:
                    self._raise(s, call, "read", hit)
            for ptr, n in writes:
                hit = self._conflict(clock, ptr, ptr + n, True)
                if hit is not None:
                    self._raise(s, call, "write", hit)
            seq = s.enqueue(op)
            sid = s.handle
            clock[sid] = seq
            for ptr, n in reads:
                self._record_read(ptr, ptr + n, sid, (seq, call), clock)
            for ptr, n in writes:   # after the reads: a copy onto itself ends as a write
                self._record_write(ptr, ptr + n, (sid, seq, call))
            return seq, (dict(clock) if keep_clock else None)

    def record(self, ev: "_EmuEvent", s: "_EmuStream") -> None:
        with self.lock:
            clock = self._frontier(s)
            seq = s.marker()
            clock[s.handle] = seq
            ev.stream, ev.seq, ev.clock, ev.observed = s, seq, dict(clock), False

    def wait_event(self, s: "_EmuStream", ev: "_EmuEvent") -> None:
        with self.lock:
            source, seq, evclock = ev.stream, ev.seq, ev.clock  # the record latest at call time
            if source is None:
                return
            clock = self._frontier(s)
            seq_here = s.enqueue(lambda: source.wait_for(seq))   # the wait first, then the clocks
            _join(clock, evclock)
            clock[s.handle] = seq_here

    # host observations ----------------------------------------------------------------------
    def stream_idle(self, s: "_EmuStream") -> bool:
        """``cudaStreamQuery``: when it says done, the host has seen the stream's frontier."""
        with self.lock:   # nothing can be queued on s meanwhile: the frontier is what is done
            if not s.idle():
                return False
            own = s.clock.get(s.handle, 0)
            if s.observed != own:
                self._observe(s.clock)
                s.observed = own
            return True

    def stream_snapshot(self, s: "_EmuStream") -> tuple[dict[int, int], int] | None:
        """The frontier before a stream synchronize (None: the host has seen it already)."""
        with self.lock:
            own = s.clock.get(s.handle, 0)
            if s.observed == own:
                return None
            return dict(s.clock), own

    def stream_synchronized(self, s: "_EmuStream", snap: tuple[dict[int, int], int] | None) -> None:
        if snap is None:
            return
        with self.lock:
            self._observe(snap[0])
            if snap[1] > s.observed:
                s.observed = snap[1]

    def event_done(self, ev: "_EmuEvent") -> bool:
        with self.lock:   # no record can change the event meanwhile
            if not ev.done():
                return False
            if not ev.observed and ev.clock:
                self._observe(ev.clock)
                ev.observed = True
            return True

    def event_snapshot(self, ev: "_EmuEvent") -> tuple["_EmuStream | None", int, dict[int, int]]:
        with self.lock:
            return ev.stream, ev.seq, ev.clock

    def retire(self, s: "_EmuStream") -> None:
        """A destroyed stream: its frontier still counts for a device synchronize."""
        with self.lock:
            _join(self.retired.setdefault(s.device.ordinal, {}), s.clock)

    def device_snapshot(self, ordinal: int, streams: list["_EmuStream"]) -> dict[int, int]:
        with self.lock:
            while self.retiring:
                dev, clock = self.retiring[0]
                _join(self.retired.setdefault(dev, {}), clock)
                self.retiring.popleft()   # after the join: one cut short is joined again, never lost
            snap = dict(self.retired.get(ordinal, {}))
            for s in streams:
                _join(snap, s.clock)
            return snap

    # the interval map -----------------------------------------------------------------------
    def _first(self, a: int) -> int:
        """Index of the first segment that ends after ``a``."""
        i = bisect.bisect_right(self._starts, a) - 1
        if i < 0 or self._segs[i].end <= a:
            i += 1
        return i

    def _conflict(self, clock: dict[int, int], a: int, b: int, writing: bool) -> list | None:
        """The first conflict of an access of [a, b) with ``clock``: [kind, lo, hi, earlier],
        widened over the following segments that conflict with the same earlier access."""
        segs = self._segs
        get = clock.get
        found = None
        for i in range(self._first(a), len(segs)):
            seg = segs[i]
            if seg.start >= b:
                break
            hit = None
            w = seg.write
            if w is not None and get(w[0], 0) < w[1]:
                hit = ("write-after-write" if writing else "read-after-write", w)
            elif writing and seg.reads:
                for rsid, (rpos, rcall) in seg.reads.items():
                    if get(rsid, 0) < rpos:
                        hit = ("write-after-read", (rsid, rpos, rcall))
                        break
            if found is None:
                if hit is not None:
                    found = [hit[0], max(a, seg.start), min(b, seg.end), hit[1]]
            elif hit is not None and hit[0] == found[0] and hit[1] == found[3] and seg.start == found[2]:
                found[2] = min(b, seg.end)
            else:
                break
        return found

    def _raise(self, s: "_EmuStream", call: str, verb: str, found: list) -> None:
        kind, lo, hi, (osid, opos, ocall) = found
        other = self.labels.get(osid, f"stream {osid:#x}")
        other_verb = "read" if kind == "write-after-read" else "write"
        exc = StreamOrderRace(
            f"{kind} race on [{lo:#x}, {hi:#x}) ({hi - lo} bytes): {call} ({verb}) queued on {s.label} "
            f"is not ordered after {ocall} ({other_verb}, work #{opos} of that stream) on {other}: neither "
            f"stream order, nor an event wait, nor a host synchronization observed before queueing orders them")
        exc.kind = kind
        exc.address = lo
        exc.nbytes = hi - lo
        exc.stream = s.label
        exc.other_stream = other
        exc.call = call
        exc.other_call = ocall
        self.races.append(exc)
        raise exc

    def _splice(self, i: int, j: int, new: list[_Seg]) -> None:
        """Replace segments [i, j) by ``new``, merging touching equal ones among them.

        Touching segments are never equal (this keeps it so), and the segments an access
        gives its range all carry that access's own, new record, so the only merges possible
        are among ``new``: pieces of the range that had different histories before and the
        same one now (a read over two reads that it orders after, say)."""
        merged: list[_Seg] = []
        for seg in new:
            if merged:
                last = merged[-1]
                if last.end == seg.start and last.write == seg.write and last.reads == seg.reads:
                    last.end = seg.end
                    continue
            merged.append(seg)
        starts = [seg.start for seg in merged]
        self._segs[i:j] = merged        # the two lists change together: no call between
        self._starts[i:j] = starts

    def _span(self, a: int, b: int) -> tuple[int, int]:
        segs = self._segs
        i = j = self._first(a)
        n = len(segs)
        while j < n and segs[j].start < b:
            j += 1
        return i, j

    def _record_write(self, a: int, b: int, write: tuple[int, int, str]) -> None:
        i, j = self._span(a, b)
        new = []
        if i < j:
            first, last = self._segs[i], self._segs[j - 1]
            if i + 1 == j and first.start == a and first.end == b:   # the same range again
                first.write, first.reads = write, None
                return
            if first.start < a:
                new.append(_Seg(first.start, a, first.write, first.reads))
            new.append(_Seg(a, b, write, None))
            if last.end > b:
                new.append(_Seg(b, last.end, last.write, last.reads))
        else:
            new.append(_Seg(a, b, write, None))
        self._splice(i, j, new)

    def _record_read(self, a: int, b: int, sid: int, read: tuple[int, str], clock: dict[int, int]) -> None:
        own = {sid: read}
        i, j = self._span(a, b)
        new = []
        at = a
        for seg in self._segs[i:j]:
            if seg.start > at:
                new.append(_Seg(at, seg.start, None, own))
            if seg.start < a:
                new.append(_Seg(seg.start, a, seg.write, seg.reads))
            lo = seg.start if seg.start > a else a
            hi = seg.end if seg.end < b else b
            reads = own
            if seg.reads:
                # A read this one is ordered after can go: a write ordered after this read is
                # ordered after that one too. Usually this leaves only this read.
                keep = {k: v for k, v in seg.reads.items() if clock.get(k, 0) < v[0]}
                if keep:
                    keep[sid] = read
                    reads = keep
            new.append(_Seg(lo, hi, seg.write, reads))
            if seg.end > b:
                new.append(_Seg(b, seg.end, seg.write, seg.reads))
            at = hi
        if at < b:
            new.append(_Seg(at, b, None, own))
        self._splice(i, j, new)

    def forget(self, a: int, b: int) -> None:
        """The memory of [a, b) is gone (freed, unmapped): its history with it."""
        with self.lock:
            i, j = self._span(a, b)
            if i == j:
                return
            first, last = self._segs[i], self._segs[j - 1]
            new = []
            if first.start < a:
                new.append(_Seg(first.start, a, first.write, first.reads))
            if last.end > b:
                new.append(_Seg(b, last.end, last.write, last.reads))
            starts = [seg.start for seg in new]
            self._segs[i:j] = new           # the two lists change together: no call between
            self._starts[i:j] = starts

    def segments(self) -> list[tuple[int, int, tuple | None, dict | None]]:
        """The interval map, for tests: (start, end, write, reads) per segment."""
        with self.lock:
            return [(seg.start, seg.end, seg.write, seg.reads) for seg in self._segs]


class EmulatedBackend(DeviceBackend):
    """See the module docstring. ``devices`` emulated GPUs of ``memory_bytes`` each.

    ``race_check``: run the stream-ordering race detector (``None``: as
    ``CUDABRIDGE_EMULATED_RACE_CHECK`` says, off when unset). Races found are raised as
    :class:`~cudabridge.errors.StreamOrderRace` and also kept in :attr:`races`.
    """

    name = "emulated"

    def __init__(self, devices: int = 1, memory_bytes: int = 16 << 30, race_check: bool | None = None) -> None:
        if devices < 1:
            raise ValueError(f"an emulated backend needs at least one device, got {devices}")
        if memory_bytes > _DEVICE_WINDOW:   # each GPU's memory must fit its address window
            raise InvalidArgument(f"memory_bytes={memory_bytes}: an emulated GPU has at most {_DEVICE_WINDOW} bytes "
                                  f"(1 TiB, its address window; {BY_KEY['emulatedMemory'].name} is bounded by it)")
        if race_check is None:
            race_check = race_check_from_env()
        #: every race the detector found, in order (also raised); a test can check it is empty
        #: even where the code under test swallowed the exception
        self.races: list[StreamOrderRace] = []
        self._race: _RaceDetector | None = _RaceDetector(self.races) if race_check else None
        self._devices = [_EmuDevice(i, memory_bytes) for i in range(devices)]
        self._handles = itertools.count(0x1000, 0x10)
        self._streams: dict[int, _EmuStream] = {}
        self._events: dict[int, _EmuEvent] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._ptds: list[_EmuStream] = []
        self._destroyed: list[_EmuStream] = []   # destroyed streams whose work may still run
        self._pinned: dict[int, Any] = {}
        self._closed = False

    @property
    def race_check(self) -> bool:
        """Whether the stream-ordering race detector is on."""
        return self._race is not None

    # helpers -------------------------------------------------------------------------------
    def _current(self) -> _EmuDevice:
        dev = self._devices[getattr(self._local, "device", 0)]
        if dev.sticky is not None:
            raise dev.sticky
        dev.context_created = True
        return dev

    def _stream(self, call: str, handle: int) -> _EmuStream:
        if handle == PER_THREAD_STREAM:
            dev = self._current()
            per_thread = getattr(self._local, "ptds", None)
            if per_thread is None:
                per_thread = self._local.ptds = _PerThreadStreams(self)
            stream = per_thread.get(dev)
        elif handle in (LEGACY_STREAM, DEFAULT_STREAM):
            dev = self._current()
            stream = dev.legacy
            if stream is None:
                stream = self._legacy(dev)
        else:
            stream = self._streams.get(handle)
            if stream is None:
                raise _fail(call, _ERR_INVALID_HANDLE, f"no stream {handle:#x}")
        if stream.device.sticky is not None:
            raise stream.device.sticky
        return stream

    def _legacy(self, dev: _EmuDevice) -> _EmuStream:
        """The device's legacy stream, made on first use: made whole outside the lock (making one
        calls into ``threading``), then published under it with a plain store; a thread that lost
        the race closes its own."""
        fresh = _EmuStream(dev, next(self._handles), 0, "legacy")
        if self._race is not None:
            self._race.add_stream(fresh)
        with self._lock:
            if dev.legacy is None:
                dev.legacy = fresh
            stream = dev.legacy
        if stream is not fresh:
            fresh.close()
        return stream

    def _event(self, call: str, handle: int) -> _EmuEvent:
        ev = self._events.get(handle)
        if ev is None:
            raise _fail(call, _ERR_INVALID_HANDLE, f"no event {handle:#x}")
        return ev

    # devices -------------------------------------------------------------------------------
    def device_count(self) -> int:
        return len(self._devices)

    def set_device(self, ordinal: int) -> None:
        if not 0 <= ordinal < len(self._devices):
            raise _fail("cudaSetDevice", _ERR_INVALID_DEVICE, f"ordinal {ordinal} of {len(self._devices)} devices")
        self._local.device = ordinal

    def get_device(self) -> int:
        return getattr(self._local, "device", 0)

    def device_uuid(self, ordinal: int) -> str:
        if not 0 <= ordinal < len(self._devices):
            raise _fail("cudaGetDeviceProperties", _ERR_INVALID_DEVICE, f"ordinal {ordinal}")
        return self._devices[ordinal].uuid

    def vmm_granularity(self) -> int:
        self._current()
        return _ALLOC_GRANULE

    def va_reserve(self, nbytes: int) -> int:
        return self._current().va_reserve(nbytes)

    def va_release(self, ptr: int, nbytes: int) -> None:
        self._current().va_release(ptr, nbytes)
        if self._race is not None:
            self._race.forget(ptr, ptr + nbytes)

    def phys_create(self, nbytes: int) -> int:
        return self._current().phys_create(nbytes)

    def phys_release(self, handle: int) -> None:
        self._current().phys_release(handle)

    def mem_map(self, ptr: int, nbytes: int, handle: int) -> None:
        self._current().mem_map(ptr, nbytes, handle)

    def mem_unmap(self, ptr: int, nbytes: int) -> None:
        self._current().mem_unmap(ptr, nbytes)
        if self._race is not None:
            self._race.forget(ptr, ptr + nbytes)

    def mem_get_info(self) -> tuple[int, int]:
        dev = self._current()
        return dev.total - dev.used, dev.total

    def context_active(self, ordinal: int) -> bool:
        if not 0 <= ordinal < len(self._devices):
            raise _fail("cuDevicePrimaryCtxGetState", _ERR_INVALID_DEVICE, f"ordinal {ordinal}")
        return self._devices[ordinal].context_created

    def device_synchronize(self) -> None:
        dev = self._current()
        streams = [s for s in list(self._streams.values()) + list(self._ptds) + list(self._destroyed) + [dev.legacy]
                   if s is not None and s.device is dev]
        race = self._race
        snap = race.device_snapshot(dev.ordinal, streams) if race is not None else None
        for stream in streams:
            stream.synchronize()
        for stream in [d for d in list(self._destroyed) if d.idle()]:   # destroyed and done: forgotten
            try:
                self._destroyed.remove(stream)
            except ValueError:   # by another thread meanwhile
                pass
        if dev.sticky is not None:
            raise dev.sticky
        if snap is not None:
            race.observe(snap)

    # memory --------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        if nbytes <= 0:
            raise _fail("cudaMalloc", _ERR_INVALID_VALUE, f"size {nbytes}")
        return self._current().malloc(nbytes)

    def free(self, ptr: int) -> None:
        span = self._current().free(ptr)
        if self._race is not None:
            self._race.forget(ptr, ptr + span)

    # streams -------------------------------------------------------------------------------
    def stream_priority_range(self) -> tuple[int, int]:
        return 0, -5  # what an H100/H200 reports

    def stream_create(self, priority: int = 0) -> int:
        dev = self._current()
        handle = next(self._handles)
        stream = _EmuStream(dev, handle, max(-5, min(0, priority)), "pool")
        if self._race is not None:
            self._race.add_stream(stream)
        self._streams[handle] = stream
        return handle

    def stream_destroy(self, stream: int) -> None:
        """As cudaStreamDestroy: returns at once; the work queued on the stream still runs, and a
        device synchronize (or the backend's close) still waits for it."""
        s = self._streams.get(stream)
        if s is None:
            raise _fail("cudaStreamDestroy", _ERR_INVALID_HANDLE, f"no stream {stream:#x}")
        self._destroyed.append(s)   # first: a destroy cut short leaves it reachable, never lost
        s.close(timeout=0)
        # dropped after its close: a destroy cut short leaves a closed stream that a later destroy
        # (or the backend's close) finishes, never a live worker nobody can reach
        if self._streams.pop(stream, None) is s and self._race is not None:
            # Not a host synchronization (cudaStreamDestroy returns at once in CUDA), but its
            # work still counts for a later device synchronize.
            self._race.retire(s)

    def stream_query(self, stream: int) -> bool:
        s = self._stream("cudaStreamQuery", stream)
        if self._race is not None:
            return self._race.stream_idle(s)
        return s.idle()

    def stream_synchronize(self, stream: int) -> None:
        s = self._stream("cudaStreamSynchronize", stream)
        race = self._race
        snap = race.stream_snapshot(s) if race is not None else None
        s.synchronize()
        if s.device.sticky is not None:
            raise s.device.sticky
        if race is not None:
            race.stream_synchronized(s, snap)

    def stream_wait_event(self, stream: int, event: int) -> None:
        s = self._stream("cudaStreamWaitEvent", stream)
        ev = self._event("cudaStreamWaitEvent", event)
        if self._race is not None:
            self._race.wait_event(s, ev)
            return
        source, seq = ev.stream, ev.seq  # the record that is latest now, not at run time
        if source is None:
            return
        s.enqueue(lambda: source.wait_for(seq))

    # events --------------------------------------------------------------------------------
    def event_create(self) -> int:
        dev = self._current()
        handle = next(self._handles)
        self._events[handle] = _EmuEvent(dev)
        return handle

    def event_destroy(self, event: int) -> None:
        if self._events.pop(event, None) is None:
            raise _fail("cudaEventDestroy", _ERR_INVALID_HANDLE, f"no event {event:#x}")

    def event_record(self, event: int, stream: int) -> None:
        ev = self._event("cudaEventRecord", event)
        s = self._stream("cudaEventRecord", stream)
        if s.device is not ev.device:
            raise _fail("cudaEventRecord", _ERR_INVALID_HANDLE,
                        f"event of GPU {ev.device.ordinal} recorded on a stream of GPU {s.device.ordinal}")
        if self._race is not None:
            self._race.record(ev, s)
            return
        seq = s.marker()
        ev.stream, ev.seq = s, seq

    def event_query(self, event: int) -> bool:
        ev = self._event("cudaEventQuery", event)
        if ev.device.sticky is not None:
            raise ev.device.sticky
        if self._race is not None:
            return self._race.event_done(ev)
        return ev.done()

    def event_synchronize(self, event: int) -> None:
        ev = self._event("cudaEventSynchronize", event)
        race = self._race
        if race is not None:
            stream, seq, clock = race.event_snapshot(ev)
        else:
            stream, seq, clock = ev.stream, ev.seq, None
        if stream is not None:
            stream.wait_for(seq)
        if ev.device.sticky is not None:
            raise ev.device.sticky
        if clock:
            race.observe(clock)

    # copies --------------------------------------------------------------------------------
    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        s = self._stream("cudaMemcpyAsync", stream)
        if nbytes == 0:
            return
        d = self._device_of(dst).view("cudaMemcpyAsync", dst, nbytes)
        sv = self._device_of(src).view("cudaMemcpyAsync", src, nbytes)

        def copy() -> None:
            d[:] = sv
        if self._race is None:
            s.enqueue(copy)
        else:
            self._race.enqueue(s, copy, "cudaMemcpyAsync", reads=((src, nbytes),), writes=((dst, nbytes),))

    def alloc_pinned(self, nbytes: int) -> Any:
        import ctypes

        buf = (ctypes.c_char * nbytes)()
        self._pinned[id(buf)] = buf
        return buf

    def free_pinned(self, buffer: Any) -> None:
        if self._pinned.get(id(buffer)) is not buffer:
            raise _fail("cudaFreeHost", _ERR_INVALID_VALUE, "not a pinned buffer of this backend")
        del self._pinned[id(buffer)]

    def host_register(self, address: int, nbytes: int) -> Any:
        import ctypes

        refused = _host_register_refusal(address, nbytes)
        if refused is not None:
            raise refused
        region = (ctypes.c_char * nbytes).from_address(address)
        with self._lock:   # (checks first, then the one store)
            for buf in list(self._pinned.values()):
                base = ctypes.addressof(buf)
                if address < base + len(buf) and base < address + nbytes:
                    raise _fail("cudaHostRegister", _ERR_HOST_ALREADY_REGISTERED,
                                f"[{address:#x}, +{nbytes}) overlaps page-locked [{base:#x}, +{len(buf)})")
            self._pinned[id(region)] = region
        return region

    def host_unregister(self, region: Any) -> None:
        with self._lock:
            if self._pinned.get(id(region)) is not region:
                raise _fail("cudaHostUnregister", _ERR_HOST_NOT_REGISTERED, "not a registered region of this backend")
            del self._pinned[id(region)]

    def _is_pinned(self, view: memoryview) -> bool:
        obj = view.obj
        # A view over raw memory (PyMemoryView_FromMemory) has no exporter: never pinned.
        return obj is not None and self._pinned.get(id(obj)) is obj

    def copy_to_device_async(self, dst: int, host: Any, stream: int) -> None:
        view = host_view(host, writable=False)
        s = self._stream("cudaMemcpyAsync", stream)
        d = s.device.view("cudaMemcpyAsync", dst, len(view))
        if not self._is_pinned(view):
            view = memoryview(bytes(view))  # pageable: CUDA stages the data before returning

        def copy() -> None:
            d[:] = view
        if self._race is None:
            s.enqueue(copy)
        else:
            n = len(view)
            self._race.enqueue(s, copy, "cudaMemcpyAsync", writes=((dst, n),) if n else ())

    def copy_from_device_async(self, host: Any, src: int, stream: int) -> None:
        view = host_view(host, writable=True)
        s = self._stream("cudaMemcpyAsync", stream)
        sv = s.device.view("cudaMemcpyAsync", src, len(view))

        def copy() -> None:
            view[:] = sv
        pageable = not self._is_pinned(view)
        race = self._race
        if race is None:
            seq, clock = s.enqueue(copy), None
        else:
            n = len(view)
            seq, clock = race.enqueue(s, copy, "cudaMemcpyAsync", reads=((src, n),) if n else (),
                                      keep_clock=pageable)
        if pageable:
            s.wait_for(seq)  # pageable: CUDA returns only once the copy (and all before it) is done
            if s.device.sticky is not None:
                raise s.device.sticky
            if clock is not None:
                race.observe(clock)  # the host saw it complete

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        s = self._stream("cudaMemsetAsync", stream)
        if not 0 <= value <= 255:
            value &= 0xFF
        d = s.device.view("cudaMemsetAsync", ptr, nbytes)
        fill = bytes([value])

        def memset() -> None:
            d[:] = fill * len(d)
        if self._race is None:
            s.enqueue(memset)
        else:
            self._race.enqueue(s, memset, "cudaMemsetAsync", writes=((ptr, nbytes),) if nbytes else ())

    def _device_of(self, ptr: int) -> _EmuDevice:
        index = (ptr - _ADDRESS_BASE) // _DEVICE_WINDOW
        if 0 <= index < len(self._devices):
            return self._devices[index]
        raise _fail("cudaMemcpyAsync", _ERR_INVALID_VALUE, f"{ptr:#x} is not a device address")

    # kernels -------------------------------------------------------------------------------
    def fill_u32_async(self, ptr: int, count: int, value: int, stream: int, delay_s: float = 0.0) -> None:
        s = self._stream("cudaLaunchKernel(fill_u32)", stream)
        d = s.device.view("cudaLaunchKernel(fill_u32)", ptr, 4 * count)
        word = (value & 0xFFFFFFFF).to_bytes(4, "little")

        def kernel() -> None:
            if delay_s > 0:
                time.sleep(delay_s)
            d[:] = word * count
        if self._race is None:
            s.enqueue(kernel)
        else:
            self._race.enqueue(s, kernel, "cudaLaunchKernel(fill_u32)",
                               writes=((ptr, 4 * count),) if count > 0 else ())

    def launch_host_kernel(self, stream: int, twin: Any, config: Any, args: list[Any]) -> None:
        """Queue a user kernel's host twin (kernels/host_kernels.py) on ``stream``: checked now
        (argument count and kinds, every pointer inside an allocation), run in stream order on
        the stream's worker. The race detector counts it as reading and writing each pointer's
        buffer: a ``DevicePointer``'s extent, a plain address's allocation from there on; and as
        reading each module global bound to it (``twin.bound``), writing the non-constant ones."""
        from ..kernels.launch_config import DeviceLimits, KernelLimits, check_launch
        from ..kernels.params import DevicePointer, check_args   # kernels imports the backends' errors
        call = f"cuLaunchKernel({twin.name})"
        s = self._stream(call, stream)
        # the modelled device's limits (an H100's); a twin opts in to any dynamic shared memory
        check_launch(config, DeviceLimits(), KernelLimits(), twin.name)
        grid, block = config.grid, config.block
        kinds = twin.signature
        values = check_args(kinds, args, twin.name)
        views: list[Any] = []
        touched: list[tuple[int, int]] = []
        for i, (kind, value) in enumerate(zip(kinds, values)):
            if kind == "ptr":
                if value.__class__ is DevicePointer:
                    ptr, n = value
                    values[i] = ptr
                else:
                    ptr, n = value, s.device.extent(call, value)
                views.append(s.device.view(call, ptr, n))
                touched.append((ptr, n))
            else:
                views.append(None)
        # the module globals the twin reads (its module's copies): after the arguments, read-only
        # for a __constant__; a __device__ variable kernels write counts as written too
        global_views = [(s.device.view(call, g.address, g.nbytes), g.constant) for g in twin.bound]
        global_reads = tuple((g.address, g.nbytes) for g in twin.bound)
        global_writes = tuple((g.address, g.nbytes) for g in twin.bound if not g.constant)
        fn = twin.fn

        def kernel() -> None:
            import numpy as np
            arrays = [v if view is None else np.frombuffer(view, dtype=np.uint8) for v, view in zip(values, views)]
            for view, constant in global_views:
                array = np.frombuffer(view, dtype=np.uint8)
                if constant:
                    array.flags.writeable = False
                arrays.append(array)
            fn(grid, block, *arrays)
        if self._race is None:
            s.enqueue(kernel)
        else:
            accesses = tuple(touched)
            self._race.enqueue(s, kernel, call, reads=accesses + global_reads, writes=accesses + global_writes)

    def spin_async(self, stream: int, seconds: float) -> None:
        s = self._stream("cudaLaunchKernel(spin)", stream)
        if self._race is None:
            s.enqueue(lambda: time.sleep(seconds))
        else:  # touches no memory; queued through the detector so that positions stay exact
            self._race.enqueue(s, lambda: time.sleep(seconds), "cudaLaunchKernel(spin)")

    @property
    def race_check(self) -> bool:
        """Whether the race detector is on (``races`` stays empty when it is off)."""
        return self._race is not None

    def launch_host_func(self, stream: int, fn: Callable[[], None]) -> None:
        s = self._stream("cudaLaunchHostFunc", stream)
        if self._race is None:
            s.enqueue(fn)
        else:  # touches no device memory; queued through the detector so that positions stay exact
            self._race.enqueue(s, fn, "cudaLaunchHostFunc")

    # How long close() waits, in all, for the streams' queued work at most (the service passes its
    # hostWaitTimeout when shorter): a host twin that never returns (a hung kernel) must not hang
    # the service's close; its worker, a daemon thread, is left.
    CLOSE_WAIT_S = 5.0

    def close(self, timeout_s: float | None = None) -> None:
        if self._closed:
            return
        wait_s = self.CLOSE_WAIT_S if timeout_s is None else min(timeout_s, self.CLOSE_WAIT_S)
        end = time.monotonic() + wait_s
        streams = (list(self._streams.values()) + list(self._destroyed)
                   + [dev.legacy for dev in self._devices if dev.legacy is not None] + list(self._ptds))
        left = []
        for s in streams:   # each close is repeatable
            if not s.close(timeout=max(0.0, end - time.monotonic())):
                left.append(s.label)
        if left:
            log.warning("emulated device closed with work still running on %d stream(s) after %g s (%s): "
                        "their workers are left to finish", len(left), wait_s, ", ".join(left[:4]))
        self._streams.clear()
        self._destroyed.clear()
        self._closed = True   # last: a close cut short by an exception can be called again, and finishes


class _PerThreadStreams:
    """The calling thread's per-thread default streams, one per device, closed with the thread."""

    def __init__(self, backend: EmulatedBackend) -> None:
        self._backend = backend
        self._streams: dict[int, _EmuStream] = {}

    def get(self, dev: _EmuDevice) -> _EmuStream:
        stream = self._streams.get(dev.ordinal)
        if stream is None:
            stream = _EmuStream(dev, next(self._backend._handles), 0, "per-thread")
            if self._backend._race is not None:
                self._backend._race.add_stream(stream)
            # list.append and list.remove are single steps under the GIL (no lock needed): the
            # backend's list first, so that device synchronize and close see every published stream
            self._backend._ptds.append(stream)
            self._streams[dev.ordinal] = stream
        return stream

    def __del__(self) -> None:  # the owning thread ended: its default streams go with it
        for stream in list(self._streams.values()):
            try:
                stream.close()
                try:
                    self._backend._ptds.remove(stream)
                except ValueError:   # removed already
                    pass
                if self._backend._race is not None:
                    # no lock here (this may run inside any call, by GC): the detector takes
                    # it in at the next device synchronize
                    self._backend._race.retiring.append((stream.device.ordinal, stream.clock))
            except BaseException:  # noqa: BLE001 - interpreter shutdown, or an exception landing here:
                pass               # the thread's other streams still close (and the backend's close)
