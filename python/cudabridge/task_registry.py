"""Spark task attempt id -> (GPU, stream), and release at task end.

A task is bound once (Spark's ``onTaskStart``); every thread of the task then gets the same
stream, whichever thread asks. Unbinding (``onTaskSucceeded`` / ``onTaskFailed``) frees,
asynchronously on the task's stream, whatever the task still holds, and reports it as leaks.
Bindings are keyed by task attempt id, never by thread: Spark reuses task threads.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from .errors import InvalidArgument, PoolClosed, UnknownTask

if TYPE_CHECKING:
    from .memory import Allocation, StreamOrderedMemoryPool
    from .stream_pool import StreamPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuResources:
    """What one GPU of the executor owns."""

    ordinal: int
    address: str
    streams: "StreamPool"
    memory: "StreamOrderedMemoryPool"


@dataclass(frozen=True)
class TaskBinding:
    task_id: int
    gpu: int          # CUDA ordinal
    address: str      # Spark's address for it
    stream: int
    priority: str


@dataclass(frozen=True)
class ReleaseReport:
    task_id: int
    leaked_allocations: int
    leaked_bytes: int


class TaskRegistry:
    def __init__(self, gpus: Mapping[int, GpuResources]) -> None:
        if not gpus:
            raise InvalidArgument("a task registry needs at least one GPU")
        self._gpus = dict(gpus)
        self._bindings: dict[int, TaskBinding] = {}
        self._stream_use: dict[int, int] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._closed = False
        self.tasks_bound_total = 0

    def gpu(self, ordinal: int) -> GpuResources:
        res = self._gpus.get(ordinal)
        if res is None:
            raise InvalidArgument(f"GPU ordinal {ordinal!r} is not owned by this executor "
                                  f"(owned: {sorted(self._gpus)})")
        return res

    def bind(self, task_id: int, gpu: int | None = None, priority: str = "normal") -> TaskBinding:
        """Bind a task to a stream of ``gpu`` (an ordinal; default: the only GPU)."""
        if isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 0:
            raise InvalidArgument(f"task attempt id must be a non-negative int, got {task_id!r}")
        if gpu is None:
            if len(self._gpus) != 1:
                raise InvalidArgument(f"task {task_id}: the executor owns GPUs {sorted(self._gpus)}; say which")
            gpu = next(iter(self._gpus))
        res = self.gpu(gpu)
        with self._lock:
            if self._closed:
                raise PoolClosed("bind after the task registry was closed")
            if task_id in self._bindings:
                raise InvalidArgument(f"task {task_id} is bound already (to GPU {self._bindings[task_id].gpu})")
            stream = res.streams.acquire(priority)
            binding = TaskBinding(task_id, res.ordinal, res.address, stream, priority)
            self._bindings[task_id] = binding
            self._stream_use[stream] = self._stream_use.get(stream, 0) + 1
            self.tasks_bound_total += 1
        return binding

    def binding(self, task_id: int) -> TaskBinding:
        b = self._bindings.get(task_id)
        if b is None:
            raise UnknownTask(f"task {task_id!r} is not bound")
        return b

    def stream(self, task_id: int) -> int:
        return self.binding(task_id).stream

    def attach(self, task_id: int) -> TaskBinding:
        """Make the calling thread work for the task: its current device is the task's GPU, and
        :meth:`current` returns the binding. Call on every thread that works for the task."""
        b = self.binding(task_id)
        self._gpus[b.gpu].memory.backend.set_device(b.gpu)
        self._local.task = task_id
        return b

    def detach(self) -> None:
        self._local.task = None

    def current(self) -> TaskBinding:
        task_id = getattr(self._local, "task", None)
        if task_id is None:
            raise UnknownTask("the calling thread is not attached to a task")
        return self.binding(task_id)

    def allocate(self, task_id: int, size: int) -> "Allocation":
        """Memory on the task's GPU, ordered on its stream, owned by the task."""
        b = self.binding(task_id)
        return self._gpus[b.gpu].memory.allocate(size, b.stream, owner=task_id)

    def unbind(self, task_id: int) -> ReleaseReport:
        """Release the task: free what it still holds (asynchronously, on its stream)."""
        with self._lock:
            b = self._bindings.pop(task_id, None)
            if b is None:
                raise UnknownTask(f"task {task_id!r} is not bound")
            n = self._stream_use[b.stream] - 1
            if n:
                self._stream_use[b.stream] = n
            else:
                del self._stream_use[b.stream]
        count, nbytes = self._gpus[b.gpu].memory.release_owner(task_id)
        if getattr(self._local, "task", None) == task_id:
            self._local.task = None
        return ReleaseReport(task_id, count, nbytes)

    @property
    def tasks_bound(self) -> int:
        return len(self._bindings)

    @property
    def streams_in_use(self) -> int:
        return len(self._stream_use)

    def bound_tasks(self) -> list[int]:
        return list(self._bindings)

    def close(self) -> list[ReleaseReport]:
        """Release every task still bound. Idempotent."""
        with self._lock:
            self._closed = True
            tasks = list(self._bindings)
        return [self.unbind(t) for t in tasks]
