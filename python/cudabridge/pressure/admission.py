"""Admission: at most ``concurrentGpuTasks`` tasks hold GPU memory on one GPU at once.

A task is admitted at its bind (with the plugin's default ``taskBind=lazy``, its first GPU call,
on its own thread: a task that never touches the GPU never waits) and leaves at its release. One
past the limit waits there, registered in the wait table (kind ``admission``), in arrival order,
retried attempts first (a task marked ``retried`` goes ahead of every first attempt waiting, after
the retried ones before it): each GPU keeps the two queues, and a task is admitted when a place is
free and it is first in line. Places count tasks, not bytes, so a small task never waits behind a
large one. A task whose release begins while it waits stops waiting (its bind fails with
UnknownTask).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from ..errors import UnknownTask
from .waits import ADMISSION, WaitTable

log = logging.getLogger(__name__)


class Admission:
    """The places of one GPU's tasks (``limit`` 0: unlimited, nothing is counted)."""

    def __init__(self, gpu: int, limit: int, waits: WaitTable) -> None:
        self.gpu = gpu
        self.limit = limit
        self._waits = waits
        self._admitted: set[int] = set()
        self._queue: deque[int] = deque()   # first attempts waiting, in arrival order
        self._retried: deque[int] = deque()   # retried attempts waiting (ahead of the first attempts)
        self._cancelled: set[int] = set()
        self.admitted_total = 0

    def _line(self, task: int) -> deque:
        return self._retried if task in self._retried else self._queue

    def _first(self) -> int | None:
        return self._retried[0] if self._retried else self._queue[0] if self._queue else None

    def admit(self, task: int, retried: bool = False) -> bool:
        """Waits for a place for ``task`` (at once when one is free and nobody waits before it);
        a ``retried`` attempt waits ahead of the first attempts. False when it holds one already
        (nothing changes)."""
        if self.limit == 0:
            return True
        cond = self._waits.changed
        with cond:
            if task in self._admitted:
                return False
            if len(self._admitted) < self.limit and self._first() is None:
                self._admitted.add(task)
                self.admitted_total += 1
                return True
            (self._retried if retried else self._queue).append(task)
        w = self._waits.make(ADMISSION, task, self.gpu, 0)
        admitted = False
        try:
            self._waits.add(w)   # the first statement of the try (waits.py: never stranded)
            with cond:
                while True:
                    if task in self._cancelled:
                        self._cancelled.discard(task)
                        raise UnknownTask(f"task {task} was released while it waited for admission on GPU {self.gpu}")
                    if self._first() == task and len(self._admitted) < self.limit:
                        self._line(task).popleft()
                        self._admitted.add(task)
                        self.admitted_total += 1
                        cond.notify_all()   # the next in line may fit too
                        break
                    cond.wait(0.05)
            admitted = True
        except BaseException:
            admitted = False
            with cond:
                line = self._line(task)
                if task in line:
                    line.remove(task)
                cond.notify_all()
            raise
        finally:
            self._waits.leave(w)
            if not admitted:
                self._waits.task_waited(task)   # never bound: no release will read it
        return True

    def leave(self, task: int) -> None:
        """``task`` ends (its release, or its bind failed): its place goes to the first waiting."""
        if self.limit == 0:
            return
        cond = self._waits.changed
        with cond:
            self._admitted.discard(task)
            cond.notify_all()

    def cancel(self, task: int) -> bool:
        """``task`` ends while it waits for a place (its release began before its bind): it stops
        waiting, with UnknownTask. Whether it was waiting."""
        cond = self._waits.changed
        with cond:
            if task not in self._queue and task not in self._retried:
                return False
            self._cancelled.add(task)
            cond.notify_all()
            return True

    @property
    def admitted(self) -> int:
        return len(self._admitted)

    @property
    def waiting(self) -> int:
        return len(self._queue) + len(self._retried)
