"""Memory pressure without failed jobs: admission of a GPU's tasks, allocations that wait for
other tasks' frees instead of failing, and the deadlock breaker that is never fooled.

* :mod:`.waits`: the one table of waits, registered where they happen (never read off thread states);
* :mod:`.breaker`: which waiting task fails, a pure function of one snapshot;
* :mod:`.memory_waits`: the pools' out-of-memory handler (``oomWait``);
* :mod:`.admission`: at most ``concurrentGpuTasks`` tasks holding memory per GPU.

:class:`MemoryPressure` puts them on a service: it installs the handler on every pool, admits
tasks at their bind and lets them go at their release. docs/memory-pressure.md says what a task
sees.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Callable, Mapping, TypeVar

from ..errors import InvalidArgument, OutOfDeviceMemory

from .admission import Admission
from .memory_waits import MemoryWaits
from .waits import ADMISSION, ALLOCATION, WaitTable

if TYPE_CHECKING:
    from ..task_registry import GpuResources, TaskBinding, TaskRegistry

log = logging.getLogger(__name__)

__all__ = ["MemoryPressure", "PressureStatistics", "WaitTable", "with_retry"]

T = TypeVar("T")


def with_retry(block: Callable[[], T], attempts: int = 8, pressure: "MemoryPressure | None" = None) -> T:
    """``block()``, run again when the deadlock breaker failed one of its allocations
    (``OutOfDeviceMemory.reason == "breaker"``), after a short pause (10 ms, doubling to 1 s), at
    most ``attempts`` times in all; any other error, and the breaker's after the last attempt, is
    raised as it is. Java's GpuRetry.withRetry frees the block's buffers itself; in Python the block
    frees what it allocated when it fails (``try``/``finally``, or arrays it drops), so that what it
    held goes to the tasks that waited: with ``pressure`` (the service's), they are told at once."""
    if attempts < 1:
        raise InvalidArgument(f"with_retry: attempts must be at least 1, got {attempts}")
    pause = 0.01
    for attempt in range(1, attempts + 1):
        try:
            return block()
        except OutOfDeviceMemory as exc:
            if exc.reason != "breaker" or attempt == attempts:
                raise
        if pressure is not None:
            pressure.memory_returned()
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class PressureStatistics:
    """Waits for memory and for admission, executor-wide (docs/glossary.md)."""

    allocations_waiting: int        # allocations waiting for memory now
    allocation_waits: int           # allocations that did not fit and waited, ever
    allocation_wait_us_total: int   # their time
    oom_breaks: int                 # allocations the deadlock breaker failed
    oom_wait_timeouts: int          # allocations that waited oomWait and failed
    waits_ended_by_kill: int        # waiting allocations ended because Spark killed their task (KillWatch)
    tasks_waiting_admission: int    # tasks waiting for admission now
    admission_waits: int            # tasks that waited for admission, ever
    admission_wait_us_total: int    # their time
    tasks_admitted: int             # tasks holding a place now (0 when concurrentGpuTasks is unlimited)

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(PressureStatistics))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class MemoryPressure:
    """Admission and memory waits for one service's GPUs (``concurrent_gpu_tasks``: 0 is
    unlimited; ``oom_wait_s``: the most an allocation waits)."""

    def __init__(self, registry: "TaskRegistry", gpus: Mapping[int, "GpuResources"], concurrent_gpu_tasks: int,
                 oom_wait_s: float) -> None:
        self.waits = WaitTable()
        self._gpus = gpus
        self._retried: set[int] = set()   # retried attempts not yet released (admitted first)
        self.admission = {o: Admission(o, concurrent_gpu_tasks, self.waits) for o in gpus}
        self.memory_waits = MemoryWaits(registry, self.waits, oom_wait_s, self._holders)
        for res in gpus.values():
            res.memory.out_of_memory_handler = self.memory_waits.out_of_memory
        registry.on_release(self._released)

    @property
    def limited(self) -> bool:
        """Whether admission counts tasks (concurrentGpuTasks set)."""
        return any(a.limit for a in self.admission.values())

    def admit(self, task: int, gpu: int) -> bool:
        """Before ``task``'s bind on ``gpu``: waits for its place. False when it held one already
        (a second bind of a bound task, which the bind refuses: its place stays)."""
        return self.admission[gpu].admit(task, retried=task in self._retried)

    def retried(self, task: int) -> None:
        """``task`` is a retried attempt (Spark's attempt number above 0; the plugin says so at its
        start): its admission goes ahead of the first attempts waiting."""
        self._retried.add(task)

    def bind_failed(self, task: int, gpu: int) -> None:
        """The bind that followed :meth:`admit` failed: the place goes back."""
        self.admission[gpu].leave(task)

    def cancel_admission(self, task: int) -> bool:
        """``task`` ends before it was bound (its release while it waits for admission): it stops
        waiting. Whether it was waiting."""
        self._retried.discard(task)
        return any([a.cancel(task) for a in self.admission.values()])

    def memory_returned(self) -> None:
        """A task gave back what it held after the breaker failed it (GpuRetry, with_retry): the
        waiters re-check at once, ahead of its own retry, which pauses first."""
        self.waits.notify()

    def cancel(self, task: int) -> None:
        """``task`` was killed (Spark interrupted it; the plugin's kill watch says so): its waits end
        at once with UnknownTask (an allocation that would wait fails instead), so that it gets
        to its release; its place, if it waits for one, goes to the next."""
        self.memory_waits.cancel(task)
        self.cancel_admission(task)
        self.waits.notify()

    def _released(self, b: "TaskBinding") -> None:
        """The registry's release listener: the task's place goes to the next, and waiters re-check
        (its memory is about to come back)."""
        self.admission[b.gpu].leave(b.task_id)
        self._retried.discard(b.task_id)
        self.memory_waits.forget(b.task_id)
        self.waits.notify()
        waited = self.waits.task_waited(b.task_id)
        if waited:   # each task's wait time, where it waited at all
            log.info("task %d waited %.1f ms for admission and %.1f ms for memory on GPU %d", b.task_id,
                     1000 * waited.get(ADMISSION, 0.0), 1000 * waited.get(ALLOCATION, 0.0), b.gpu)

    def _holders(self, gpu: int) -> dict[int, int]:
        owners = self._gpus[gpu].memory._owner_tracker.by_owner
        out = {}
        for task, owned in list(owners.items()):
            if task is not None:
                held = sum(a.size for a in list(owned))
                if held:
                    out[task] = held
        return out

    def statistics(self) -> PressureStatistics:
        w = self.waits
        return PressureStatistics(
            allocations_waiting=w.waiting(ALLOCATION), allocation_waits=w.waits_total[ALLOCATION],
            allocation_wait_us_total=int(w.waited_s[ALLOCATION] * 1e6), oom_breaks=self.memory_waits.breaks,
            oom_wait_timeouts=self.memory_waits.timeouts, waits_ended_by_kill=self.memory_waits.killed,
            tasks_waiting_admission=w.waiting(ADMISSION),
            admission_waits=w.waits_total[ADMISSION], admission_wait_us_total=int(w.waited_s[ADMISSION] * 1e6),
            tasks_admitted=sum(a.admitted for a in self.admission.values()))

    def close(self) -> None:
        for res in self._gpus.values():
            res.memory.out_of_memory_handler = None
        self.waits.notify()
