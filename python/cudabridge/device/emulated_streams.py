"""The emulated device's streams and events. A stream is an ordered queue of host callables run by
its own worker thread (started by the device thread, emulated_device_thread.py): work on one stream
runs in the order queued, work on different streams concurrently and in no particular order. An
event is a position in one stream: it completes exactly when the work queued on that stream before
its latest record has run, and one never recorded is complete.

An exception raised by queued work is its GPU's sticky error (``_EmuDevice.set_sticky``); the
worker goes on, so that what was queued behind it still completes and synchronize and close
return. :class:`_EmuStream` says how an exception landing anywhere, asynchronous ones included,
leaves no lock held and no op run twice.

The race detector's per-stream and per-event state (``clock``, ``host_seen``, ``observed``) lives
on these objects; nothing here reads or writes it (race_detector.py does).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ..errors import CudaError
from .emulated_device import _ERR_ILLEGAL_ADDRESS, _ERR_INVALID_HANDLE, _fail
from .emulated_device_thread import _DEVICE_THREAD, log

if TYPE_CHECKING:
    from .emulated_device import _EmuDevice


def _describe(exc: BaseException) -> str:
    """``repr(exc)`` for a fault's message. Never raises: whatever a host kernel raised, and whatever its
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
            except BaseException as exc:     # noqa: BLE001 - a host kernel's exception, of any kind: the
                # device's fault, as docs/kernels.md says (not this thread's: a host kernel's SystemExit or
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
