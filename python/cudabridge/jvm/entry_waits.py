"""The Java threads waiting in the bridge to enter Python, read for the deadlock breaker.

The bridge library registers each Java thread while it waits for the gate or the GIL, with the
task its call names (bridge/entry_waits.h): Java sees such a thread as RUNNABLE and Python does
not see it at all, yet it is on its way into one of its task's operations. The breaker
(pressure/breaker.py) counts those tasks as running; a thread whose call names no task (a free or
a copy names a handle) may be any task's.
"""

from __future__ import annotations

import ctypes
from typing import Callable

READ_MAX = 256   # tasks read per call; threads beyond these are read as unknown


class EntryWaits:
    """``read(tasks, max) -> count``: the bridge's cb_entering. Calling the object gives the tasks of
    the threads waiting to enter now, None for one whose call names no task."""

    def __init__(self, read: Callable[..., int]) -> None:
        self._read = read

    def __call__(self) -> list[int | None]:
        buf = (ctypes.c_longlong * READ_MAX)()   # per call: the breaker runs on several threads
        n = self._read(buf, READ_MAX)
        return [None if t < 0 else int(t) for t in buf[:min(n, READ_MAX)]] + [None] * max(0, n - READ_MAX)
