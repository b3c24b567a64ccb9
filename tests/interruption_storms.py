"""Interruptions for the tests that check a part stays consistent under them: a SIGINT every
millisecond on the main thread, and ``PyThreadState_SetAsyncExc`` into worker threads.

Either way an interruption lands only inside the operation under test, never in the test's own
bookkeeping: the SIGINT handler raises once per arming, and the injector targets a thread only
while its ``armed`` flag says that it is inside an operation (read and injected under the GIL);
a worker passes a checkpoint (a Python call, where a pending exception is raised) before it
leaves its ``try``. Every exception but the interruptions and the ``expected`` ones is collected
as a defect.
"""

from __future__ import annotations

import ctypes
import random
import signal
import threading
import time
from typing import Callable


def _checkpoint() -> None:
    """A Python call: entering it raises a pending asynchronous exception."""


def sigint_storm(seconds: float, op: Callable[[], None],
                 expected: tuple[type[BaseException], ...] = ()) -> tuple[int, int, list[BaseException]]:
    """Call ``op()`` on the main thread again and again for ``seconds`` while a SIGINT arrives
    every millisecond and raises KeyboardInterrupt inside it. Returns (interruptions, calls that
    returned, errors)."""
    assert threading.current_thread() is threading.main_thread()
    armed = [False]

    def on_sigint(signum, frame):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    main = threading.main_thread().ident
    stop = threading.Event()

    def interrupter():
        while not stop.is_set():
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.001)

    interrupts = calls = 0
    errors: list[BaseException] = []
    previous = signal.signal(signal.SIGINT, on_sigint)
    sender = threading.Thread(target=interrupter, daemon=True)
    sender.start()
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                try:
                    armed[0] = True
                    op()
                    calls += 1
                except expected:
                    pass
                except KeyboardInterrupt:
                    raise
                except Exception as exc:   # noqa: BLE001 - every other error is the defect
                    errors.append(exc)
                armed[0] = False
            except KeyboardInterrupt:
                interrupts += 1
    finally:
        stop.set()
        sender.join()
        armed[0] = False
        signal.signal(signal.SIGINT, previous)
    return interrupts, calls, errors


def async_storm(workers: int, seconds: float, op: Callable[[int, random.Random, list], None],
                expected: tuple[type[BaseException], ...] = (),
                held: list[list] | None = None) -> tuple[list[int], list[BaseException], bool]:
    """``workers`` threads call ``op(i, rng, held[i])`` again and again for ``seconds`` while
    KeyboardInterrupt is injected into whichever is inside an operation, about every millisecond
    (``held``: the lists the threads keep what they hold in, for the caller to settle; fresh ones
    by default). Returns (interruptions per thread, errors, whether every thread finished within a
    minute)."""
    held = held if held is not None else [[] for _ in range(workers)]
    armed = [False] * workers
    idents = [0] * workers
    hits = [0] * workers
    errors: list[BaseException] = []
    stop = threading.Event()
    set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async.argtypes = (ctypes.c_ulong, ctypes.py_object)

    def worker(i):
        idents[i] = threading.get_ident()
        rng = random.Random(i)
        while not stop.is_set():
            try:
                try:
                    armed[i] = True
                    op(i, rng, held[i])
                except expected:
                    pass
                except KeyboardInterrupt:
                    raise
                except Exception as exc:   # noqa: BLE001 - every other error is the defect
                    errors.append(exc)
                armed[i] = False
                _checkpoint()   # an exception injected before the line above is raised here
            except KeyboardInterrupt:
                hits[i] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        i = k % workers
        k += 1
        if armed[i]:   # read and injected under the GIL: the thread is inside an operation
            armed[i] = False
            set_async(idents[i], KeyboardInterrupt)
        time.sleep(0.001 / workers)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    return hits, errors, not any(t.is_alive() for t in threads)
