"""The Java threads inside bridge calls of tasks, read for the deadlock breaker.

The bridge library publishes, for each Java thread inside a call that may give GPU memory back or
lead to it, what the call is for, from before it waits for the gate and the GIL until it leaves
(bridge/entry_waits.h): Java sees a thread waiting for the GIL as RUNNABLE and Python does not see
it at all until its operation registers itself. Each entry is a task, a buffer handle (a free, a
copy: its owner is the task), or unknown (a batch of frees or releases). The breaker
(pressure/breaker.py) counts those tasks as running, and an unknown entry as possibly any task's.
A thread that waits for memory inside its call pauses its entry for the wait (``pause`` and
``resume``): a registered wait is not a running call.
"""

from __future__ import annotations

import ctypes
from typing import Callable

READ_MAX = 256   # entries read per call; threads beyond these are read as unknown
KIND_SHIFT = 62
VALUE_MASK = (1 << KIND_SHIFT) - 1
TASK, HANDLE, UNKNOWN = 1, 2, 3   # the kinds (entry_waits.h: CB_ENTRY_TASK, _HANDLE, _UNKNOWN)


class EntryWaits:
    """Calling the object gives the tasks of the threads inside published calls now, None for one
    whose task is unknown. ``read(states, max) -> count`` is the bridge's cb_entering; ``owner``
    maps a buffer handle to its task (None: not live, read as unknown)."""

    def __init__(self, read: Callable[..., int], owner: Callable[[int], int | None]) -> None:
        self._read = read
        self._owner = owner

    def __call__(self) -> list[int | None]:
        buf = (ctypes.c_ulonglong * READ_MAX)()   # per call: the breaker runs on several threads
        n = self._read(buf, READ_MAX)
        out: list[int | None] = []
        for s in buf[:min(n, READ_MAX)]:
            kind, value = s >> KIND_SHIFT, s & VALUE_MASK
            out.append(value if kind == TASK else self._owner(value) if kind == HANDLE else None)
        return out + [None] * max(0, n - READ_MAX)
