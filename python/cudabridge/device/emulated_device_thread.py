"""The emulated device's own thread, one per process, that starts the streams' workers and writes
the device's log lines (:class:`_DeviceThread` says why no other thread may). The lowest part of
the emulated device: it imports none of the others."""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Callable

# The emulated device's one logger, whichever of its parts writes the line: named after the
# backend's module, the name a log configuration knows the emulated device by.
log = logging.getLogger(__package__ + ".emulated_backend")


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
