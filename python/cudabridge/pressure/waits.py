"""Who is waiting, registered where the wait happens: the service's one table of waits.

A thread that waits for memory (an allocation that does not fit: memory_waits.py) or for
admission (admission.py) puts a :class:`Wait` here before it blocks and takes it out when it stops
waiting (``make``, ``add``, ``leave``). Nothing is guessed from thread states: a thread is waiting exactly while its entry is
here. The deadlock breaker (breaker.py) reads one snapshot of the table.

A wait's *kind* says what it waits for: ``allocation`` (memory held by other tasks on its GPU),
``admission`` (a place among the tasks that may hold memory on its GPU). Entries are added and
removed under the table's lock, which is never held while waiting.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

ALLOCATION = "allocation"
ADMISSION = "admission"
KINDS = (ALLOCATION, ADMISSION)


@dataclass
class Wait:
    """One thread waiting for ``task`` on GPU ``gpu``: ``nbytes`` asked for (0 for admission),
    since ``since`` (time.monotonic)."""

    kind: str
    task: int
    gpu: int
    nbytes: int
    thread: int
    since: float
    seq: int
    first: bool = True   # the first wait of its allocation (an allocation waits in several short waits)

    def describe(self, now: float) -> str:
        return (f"task {self.task} thread {self.thread}: {self.kind}"
                f"{f' of {self.nbytes} bytes' if self.kind == ALLOCATION else ''} for {1000 * (now - self.since):.0f} ms")


class WaitTable:
    """The waits of one service, all GPUs. ``changed`` is notified whenever memory may have come
    back or a wait ended (a task's release, a break), so that waiters re-check at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self._waits: dict[int, Wait] = {}   # seq -> wait
        self._seq = itertools.count(1)
        # statistics: waits ended and their time, per kind (counted when they end)
        self.waited_s = {ALLOCATION: 0.0, ADMISSION: 0.0}
        self.waits_total = {ALLOCATION: 0, ADMISSION: 0}
        self.by_task: dict[int, dict[str, float]] = {}   # task -> kind -> seconds waited, until its release

    def make(self, kind: str, task: int, gpu: int, nbytes: int, first: bool = True) -> Wait:
        """A wait of the calling thread, not yet in the table (no side effect): the caller puts it
        in with :meth:`add` as the first statement of a ``try`` whose ``finally`` calls
        :meth:`leave`, so that an interruption (an asynchronous exception) never strands it
        there, as the lease protocol's entries are never stranded (task_registry.py)."""
        return Wait(kind, task, gpu, nbytes, threading.get_ident(), time.monotonic(), next(self._seq), first)

    def add(self, w: Wait) -> None:
        self._waits[w.seq] = w   # one dict store: atomic, never half done

    def leave(self, w: Wait) -> float:
        """Ends the wait (one that never went in: nothing); returns how long it lasted (seconds)."""
        with self.lock:
            if self._waits.pop(w.seq, None) is None:
                return 0.0
            waited = time.monotonic() - w.since
            self.waits_total[w.kind] += w.first
            self.waited_s[w.kind] += waited
            mine = self.by_task.setdefault(w.task, {})
            mine[w.kind] = mine.get(w.kind, 0.0) + waited
            self.changed.notify_all()
            return waited

    def task_waited(self, task: int) -> dict[str, float]:
        """What ``task`` waited, by kind (seconds), forgotten now (at its release)."""
        with self.lock:
            return self.by_task.pop(task, {})

    def snapshot(self, gpu: int | None = None) -> list[Wait]:
        """The waits now (of one GPU, or all); call with the lock held or not (a copy is taken)."""
        return [w for w in list(self._waits.values()) if gpu is None or w.gpu == gpu]

    def notify(self) -> None:
        """Memory may have come back (a release, a break): every waiter re-checks."""
        with self.lock:
            self.changed.notify_all()

    def waiting(self, kind: str | None = None) -> int:
        return sum(1 for w in list(self._waits.values()) if kind is None or w.kind == kind)
