"""Allocations that wait instead of failing: the pools' out-of-memory handler.

When a pool's slow path finds no memory for a task's allocation, the pool calls
:meth:`MemoryWaits.out_of_memory` on the allocating thread, with no lock held
(``StreamOrderedMemoryPool.out_of_memory_handler``). It registers the wait (waits.py) and waits,
at most ``oomWait`` in all, for memory to come back on that GPU: after each short wait, or at once
when a task is released, it returns True and the pool runs its slow path again. It stops waiting
with :class:`~cudabridge.errors.OutOfDeviceMemory` when

* the deadlock breaker (breaker.py) picks this task: every task holding memory on the GPU is
  waiting; the error's ``reason`` is ``"breaker"`` and the choice is logged with every waiter's state
  (``"too_large"`` when no task holds memory on the GPU at all: nothing it could wait for exists);
* ``oomWait`` has passed (``reason`` ``"timeout"``);

and with :class:`~cudabridge.errors.UnknownTask` when the task's release began meanwhile (a killed
task leaves at once). Allocations of no task (the executor's) fail at once, as before
(``reason`` ``"no_wait"``): nothing of theirs is released.

Frees do not notify (they are the pools' lock-free fast path); a waiter polls, from 1 ms doubling
to 16 ms, and releases wake it at once.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..errors import OutOfDeviceMemory, UnknownTask
from .breaker import victim
from .waits import ALLOCATION, WaitTable

if TYPE_CHECKING:
    from ..task_registry import TaskRegistry

log = logging.getLogger(__name__)

POLL_FIRST_S = 0.001

POLL_MAX_S = 0.016


def _nothing(_saved: int) -> None:
    pass


class MemoryWaits:
    """The out-of-memory handler of every pool of one service (one per service)."""

    def __init__(self, registry: "TaskRegistry", waits: WaitTable, oom_wait_s: float,
                 holders: Callable[[int], Mapping[int, int]]) -> None:
        self._leases = registry.leases
        self._waits = waits
        self._oom_wait_s = oom_wait_s
        self._holders = holders          # gpu -> {task: bytes held there}
        self._chosen: set[int] = set()   # tasks the breaker picked, whose waiting allocation fails next
        self._cancelled: set[int] = set()   # tasks killed: their allocations never wait (until their release)
        self._entering: Callable[[], list[int | None]] = list   # no bridge: no thread inside its calls
        self._entry_pause: Callable[[], int] = int             # ... and nothing to pause (0)
        self._entry_resume: Callable[[int], None] = _nothing
        self._before_wait: Callable[[], Any] | None = None
        self._after_wait: Callable[[Any], None] | None = None
        self.breaks = 0
        self.timeouts = 0
        self.killed = 0   # waiting allocations ended because their task was killed

    def around_wait(self, before: Callable[[], Any], after: Callable[[Any], None]) -> None:
        """What a front does around each wait of an allocation: ``after(before())``. The Java
        bridge lets its gate go (a JNI allocation holds it: the frees the wait is for must pass)."""
        self._before_wait, self._after_wait = before, after

    def entry_waits(self, entering: Callable[[], list[int | None]], pause: Callable[[], int],
                    resume: Callable[[int], None]) -> None:
        """The threads inside a front's calls of tasks (the Java bridge's, jvm/entry_waits.py):
        ``entering()`` gives each as its task, None where it is unknown; the breaker counts them
        running. ``pause()`` on a waiting thread takes its own entry out for the wait (what it
        returns goes to ``resume`` after), so that it counts as waiting, not running."""
        self._entering, self._entry_pause, self._entry_resume = entering, pause, resume

    def entering(self) -> list[int | None]:
        """The threads inside calls of tasks now, as :meth:`entry_waits`'s reader gives them."""
        return self._entering()

    def out_of_memory(self, pool: Any, r: int, owner: object, exc: OutOfDeviceMemory, attempt: int,
                      first_asked: float) -> bool:
        """The pool's handler (module docstring): True to run the slow path again. ``attempt``
        counts this allocation's earlier asks; its deadline runs from its first, at
        ``first_asked`` (the pool keeps both per allocation: an allocation nested in a holder's
        give-back between two asks has its own)."""
        if owner is None:
            exc.reason = "no_wait"
            return False
        lease = self._leases.get(owner)
        if lease is None or not lease.open:
            if attempt:   # it waited, and its task's release began meanwhile (a killed task): it leaves
                raise self._leases.refusal(owner, lease)
            exc.reason = "no_wait"   # not a bound task's (an owner of the pool's own): as before
            return False
        now = time.monotonic()
        deadline = first_asked + self._oom_wait_s
        pause = min(POLL_FIRST_S * (1 << min(attempt, 4)), POLL_MAX_S)
        w = self._waits.make(ALLOCATION, owner, pool.device, r, first=attempt == 0)   # type: ignore[arg-type]
        paused = 0
        try:
            self._waits.add(w)   # the first statement of the try (waits.py: never stranded)
            # registered as waiting: the thread's bridge call stops counting as running (in that
            # order, so that it is always seen as one or the other; the other order below)
            paused = self._entry_pause()
            if not lease.open:
                raise self._leases.refusal(owner, lease)
            if owner in self._cancelled:
                self.killed += 1
                raise UnknownTask(f"task {owner} was killed: its allocation of {r} bytes on GPU {pool.device} "
                                  f"does not wait")
            reason = self._break(pool.device, w)
            if reason is not None:
                self.breaks += reason == "breaker"
                exc.reason = reason
                raise exc
            if now >= deadline:
                self.timeouts += 1
                exc.reason = "timeout"
                log.warning("task %s: %d bytes on GPU %d did not fit within oomWait (%.1f s)", owner, r, pool.device,
                            self._oom_wait_s)
                raise exc
            held = self._before_wait() if self._before_wait is not None else None
            try:
                with self._waits.changed:
                    self._waits.changed.wait(min(pause, deadline - now))
            finally:
                if self._after_wait is not None:
                    self._after_wait(held)
        finally:
            try:
                self._entry_resume(paused)
            finally:
                self._waits.leave(w)
        if owner in self._chosen:   # picked while it waited
            return self.out_of_memory(pool, r, owner, exc, attempt + 1, first_asked)
        return True

    def _break(self, gpu: int, me: Any) -> str | None:
        """The reason this waiter's allocation fails now, or None: its task was picked by the
        breaker, now or earlier (by another waiter's check). Picking another task marks it and
        wakes its waiters."""
        if me.task in self._chosen:
            self._chosen.discard(me.task)
            return "breaker"
        # Read in the order a thread moves through them (inside a bridge call, inside an operation's
        # lease, waiting, or done), the waits last: a thread that moves on during the reads is seen
        # where it was or where it went, and waits only end during them (fewer blocked).
        entering = self.entering()
        inside = {t: list(lease.inside) for t, lease in list(self._leases.table.items())}
        holders = self._holders(gpu)
        waits = self._waits.snapshot(gpu)
        running = self._running(waits, inside)
        # bind order (larger: younger): the leases table's, a dict in the order its tasks were bound
        order = {t: i for i, t in enumerate(inside)}
        picked = victim(holders, waits, running, order, entering)
        if picked is None:
            return None
        chosen, reason = picked
        if reason == "too_large":
            return reason if chosen == me.task else None
        now = time.monotonic()
        log.warning("GPU %d: every task holding memory is waiting; failing task %d's allocation (the youngest "
                    "waiting holder). Holders (bytes): %s. Waits: %s. Threads in bridge calls (tasks): %s", gpu,
                    chosen, dict(holders), "; ".join(w.describe(now) for w in waits), entering or "none")
        if chosen != me.task:
            self._chosen.add(chosen)
            self._waits.notify()
            return None
        return reason

    @staticmethod
    def _running(waits: list, inside: Mapping[int, list[int]]) -> set[int]:
        """Tasks with a thread inside one of their operations (``inside``: task -> the threads
        inside its lease) that is not one of these waits."""
        waiting_threads: dict[int, list[int]] = {}
        for w in waits:
            waiting_threads.setdefault(w.task, []).append(w.thread)
        running = set()
        for task, threads in waiting_threads.items():
            # every entry of a waiting thread is that wait (a Python function's call holds the
            # lease around the allocation that waits: two entries, one thread, waiting)
            if any(t not in threads for t in inside.get(task, ())):
                running.add(task)
        return running

    def cancel(self, task: int) -> None:
        """``task`` was killed: its waiting allocations end (UnknownTask), and none waits again."""
        self._cancelled.add(task)

    def forget(self, task: int) -> None:
        """A released task is no longer the breaker's pick, nor killed."""
        self._chosen.discard(task)
        self._cancelled.discard(task)
