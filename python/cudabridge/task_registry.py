"""Spark task attempt id -> (GPU, stream), and release at task end.

A task is bound once (Spark's ``onTaskStart``); every thread of the task then gets the same
stream, whichever thread asks. Releasing (``onTaskSucceeded`` / ``onTaskFailed``) frees,
asynchronously on the task's stream, whatever the task still holds, and reports it as leaks.
Bindings are keyed by task attempt id, never by thread: Spark reuses task threads.

Release excludes every operation that queues GPU work for the task (see :class:`TaskLease`):
once ``release`` has begun, no allocation, copy or kernel of the task is queued any more, and
what the release reclaims is everything the task will ever have held.

The lease protocol
------------------
The hot paths (this registry's own ``allocate``, the Java hot path ``jvm/hot_path.py`` and its C
twin ``jvm/_hotcore.c``) admit their operations through one contract, which is the API between
the registry and them; the C twin depends on it and on nothing else of this module:

* :class:`TaskLeases` (``TaskRegistry.leases``), the table of bound tasks' leases:

  - ``get(task_id)``: the :class:`TaskLease` of an *exact* ``int`` task id, or ``None``. It is the
    table's own ``dict.get`` (no Python frame when C calls it); callers make the id exact first
    (``True`` or ``1.0`` would find task 1), or leave other types to :meth:`TaskLeases.lease_of`
    and :meth:`TaskLeases.enter`, which normalize them with :func:`task_id_of`.
  - ``refusal(task_id, lease)``: the :class:`~cudabridge.errors.UnknownTask` to raise when a
    lookup found no lease (``lease`` is None: "task N is not bound") or found one whose release
    has begun ("task N is being released"). Both twins word their refusals through it.
  - ``enter(task_id)`` / ``leave(lease)`` and ``lease_of(task_id)``: the steps below, in Python.

* :class:`TaskLease`, whose three attributes are part of the API (the C twin reads them):
  ``binding`` (the :class:`TaskBinding`, never changes), ``inside`` (a ``list`` of the thread
  idents of the task's operations in progress; the same list object for the lease's life) and
  ``open`` (True until the release begins, then False for good).

Enter is: ``lease = get(task_id)``; None -> raise ``refusal(task_id, None)``; append this
thread's ident to ``lease.inside``; then read ``lease.open``; False -> remove that ident again and
raise ``refusal(task_id, lease)``; else the operation runs. Leave removes one occurrence of this
thread's ident from ``lease.inside`` (on every way out of the operation). Release (under the
registry's lock) removes the lease from the table, *then* sets ``open`` False, then (lock
released) waits until ``inside`` is empty, and only then calls its listeners and reclaims the
task's memory. Invariants: a lease in the table is open; a closed lease never opens again and is
never put back (a re-bound task gets a new lease), so an operation that entered an old lease is
refused even when its task id is bound again meanwhile; once a release's wait has returned, no
operation of the task is in progress and none can start. Only the registry writes the table and
``open``; the hot paths only append and remove their own idents.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

from .errors import CudaError, InvalidArgument, KernelFault, PoolClosed, UnknownTask, index_int
from .kernels.launch_log import LaunchLog

if TYPE_CHECKING:
    from .kernels import LaunchConfig
    from .kernels.host_kernels import Launchable
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
    leaks_reclaimed: int          # allocations the task still held, freed by the release
    leaked_bytes_reclaimed: int   # their bytes


def task_id_of(value: object) -> int:
    """A task attempt id from any ``operator.index()`` type except ``bool``; never negative.
    (``1.0`` or ``True`` would otherwise find task 1 in a dict.)"""
    value = index_int(value, "task attempt id")
    if value < 0:
        raise InvalidArgument(f"task attempt id must be non-negative, got {value}")
    return value


class TaskLease:
    """Admission of a bound task's operations; release closes it and waits until none is inside.

    Every operation that queues GPU work for the task (allocate, copies, memsets, kernels)
    runs between :meth:`TaskLeases.enter` and :meth:`TaskLeases.leave`. Invariant: once
    ``open`` is False and ``inside`` is empty, no operation of the task is in progress and none
    can start, so nothing is queued for it and nothing more will be owned by it.

    Lock-free under the GIL, so that the hot path never queues on a lock: ``inside`` holds the
    thread ident of each operation in progress (``list.append`` / ``list.remove`` are each one
    atomic operation) and ``open`` is a plain flag. Enter appends, then reads ``open``; release
    clears ``open``, then waits for ``inside`` to be empty. In any interleaving either the
    entering thread sees the lease closed (and backs out) or the release sees it inside (and
    waits for it). ``binding``, ``inside`` and ``open`` are the documented lease protocol (module
    docstring), which the C hot path (``jvm/_hotcore.c``) follows step for step.
    """

    __slots__ = ("binding", "inside", "open")

    def __init__(self, binding: "TaskBinding") -> None:
        self.binding = binding
        self.inside: list[int] = []
        self.open = True


class TaskLeases:
    """Task attempt id -> :class:`TaskLease` of every bound task: the lease protocol's table
    (module docstring). Readable by anyone (``get``, ``in``, ``[]``, iteration, ``len``);
    written only by its :class:`TaskRegistry`, under the registry's lock."""

    __slots__ = ("_by_id", "get")

    def __init__(self) -> None:
        self._by_id: dict[int, TaskLease] = {}
        # The lookup of the protocol: the dict's own bound ``get`` (exact int ids only).
        self.get = self._by_id.get

    # reading -----------------------------------------------------------------------------------
    def __contains__(self, task_id: object) -> bool:
        return task_id in self._by_id

    def __getitem__(self, task_id: int) -> TaskLease:
        return self._by_id[task_id]

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._by_id))

    def __len__(self) -> int:
        return len(self._by_id)

    @staticmethod
    def refusal(task_id: object, lease: TaskLease | None) -> UnknownTask:
        """What a lookup of ``task_id`` that found ``lease`` (None: nothing) is refused with."""
        if lease is None:
            return UnknownTask(f"task {task_id!r} is not bound")
        return UnknownTask(f"task {task_id!r} is being released")

    def lease_of(self, task_id: object) -> TaskLease:
        """The lease of a bound task (any ``operator.index`` id but bool), entered or not."""
        lease = self.get(task_id) if task_id.__class__ is int else self.get(task_id_of(task_id))
        if lease is None:
            raise self.refusal(task_id, None)
        return lease

    def enter(self, task_id: object) -> TaskLease:
        """Admit one operation of the task; pair with :meth:`leave`. Raises
        :class:`UnknownTask` if the task is not bound or its release has begun."""
        lease = self.get(task_id) if task_id.__class__ is int else self.get(task_id_of(task_id))
        if lease is None:
            raise self.refusal(task_id, None)
        inside = lease.inside
        me = threading.get_ident()
        inside.append(me)
        try:
            if lease.open:
                return lease
        except BaseException:
            inside.remove(me)
            raise
        inside.remove(me)
        raise self.refusal(task_id, lease)

    @staticmethod
    def leave(lease: TaskLease) -> None:
        lease.inside.remove(threading.get_ident())

    # writing (the registry only, under its lock) -----------------------------------------------
    def _add(self, lease: TaskLease) -> None:
        self._by_id[lease.binding.task_id] = lease

    def _close(self, task_id: int) -> TaskLease | None:
        """Take the task's lease out of the table, then close it (the order readers rely on:
        a lease in the table is open)."""
        lease = self._by_id.pop(task_id, None)
        if lease is not None:
            lease.open = False
        return lease


class TaskRegistry:
    # How long a release waits for an operation of its task still in progress before it logs
    # that it is still waiting (it keeps waiting: the operations' own host waits have deadlines).
    DRAIN_WARN_S = 5.0

    def __init__(self, gpus: Mapping[int, GpuResources]) -> None:
        if not gpus:
            raise InvalidArgument("a task registry needs at least one GPU")
        self._gpus = dict(gpus)
        # task attempt id -> its lease (binding and admission): the lease protocol's table, read
        # without the lock by the hot paths (the C twin of the Java hot path included); written
        # here, under the lock.
        self._leases = TaskLeases()
        self._releasing: set[int] = set()   # released, not yet reclaimed: not bindable again yet
        self._release_listeners: list[Callable[[TaskBinding], None]] = []
        self._stream_use: dict[int, int] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._closed = False
        self.tasks_bound_total = 0
        self.launch_log = LaunchLog()   # per stream: the kernels since its last completed synchronize

    def gpu(self, ordinal: int) -> GpuResources:
        res = self._gpus.get(ordinal)
        if res is None:
            raise InvalidArgument(f"GPU ordinal {ordinal!r} is not owned by this executor "
                                  f"(owned: {sorted(self._gpus)})")
        return res

    @property
    def leases(self) -> TaskLeases:
        """The lease protocol's table (module docstring): what the hot paths, the Java hot
        path's C twin included, look leases up in and enter and leave them through."""
        return self._leases

    def on_release(self, listener: Callable[[TaskBinding], None]) -> None:
        """Call ``listener(binding)`` at every release, after the task's operations have drained
        and before its memory is reclaimed (the Java hot path drops its handles there)."""
        self._release_listeners.append(listener)

    def bind(self, task_id: int, gpu: int | None = None, priority: str = "normal") -> TaskBinding:
        """Bind a task to a stream of ``gpu`` (an ordinal; default: the only GPU)."""
        task_id = task_id_of(task_id)
        if gpu is None:
            if len(self._gpus) != 1:
                raise InvalidArgument(f"task {task_id}: the executor owns GPUs {sorted(self._gpus)}; say which")
            gpu = next(iter(self._gpus))
        res = self.gpu(gpu)
        with self._lock:
            if self._closed:
                raise PoolClosed("bind after the task registry was closed")
            if task_id in self._leases:
                raise InvalidArgument(f"task {task_id} is bound already (to GPU {self._leases[task_id].binding.gpu})")
            if task_id in self._releasing:
                raise InvalidArgument(f"task {task_id} is still being released; bind it again once that returns")
            stream = res.streams.acquire(priority)
            binding = TaskBinding(task_id, res.ordinal, res.address, stream, priority)
            self._leases._add(TaskLease(binding))
            self._stream_use[stream] = self._stream_use.get(stream, 0) + 1
            self.tasks_bound_total += 1
        return binding

    def binding(self, task_id: int) -> TaskBinding:
        return self._leases.lease_of(task_id).binding

    def enter(self, task_id: int) -> TaskLease:
        """Admit one operation of the task (see :class:`TaskLease`); pair with :meth:`leave`.
        Raises :class:`UnknownTask` if the task is not bound or its release has begun."""
        return self._leases.enter(task_id)

    leave = staticmethod(TaskLeases.leave)   # pairs with enter

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
        lease = self._leases.enter(task_id)
        try:
            b = lease.binding
            return self._gpus[b.gpu].memory.allocate(size, b.stream, owner=b.task_id)
        finally:
            TaskLeases.leave(lease)

    def synchronize(self, task_id: int) -> None:
        """Wait for the work queued on the task's stream. A kernel that faulted there is reported
        here, as :class:`~cudabridge.errors.KernelFault` naming the kernels launched on the stream
        since its last completed synchronize (the launch log); a completed synchronize clears that
        list."""
        b = self.binding(task_id)
        backend = self._gpus[b.gpu].memory.backend
        if len(self._gpus) > 1:
            backend.set_device(b.gpu)
        try:
            backend.stream_synchronize(b.stream)
        except CudaError as exc:
            if not exc.sticky:
                raise
            names, dropped = self.launch_log.candidates(b.stream)
            raise KernelFault(exc, names, dropped, LaunchLog.describe(names, dropped)) from exc
        self.launch_log.clear(b.stream)

    def launch(self, task_id: int, kernel: "Launchable", config: "LaunchConfig", args: list) -> None:
        """Queue ``kernel`` on the task's stream, inside the task's lease: no kernel of the task is
        queued once its release has begun (a block the release frees could otherwise go to another
        stream while the kernel still writes it). An :class:`~cudabridge.memory.Allocation`
        argument passes its address; it must be live, on the task's GPU and owned by the task
        (another task's buffer is refused: nothing would order this launch after its stream)."""
        lease = self._leases.enter(task_id)
        try:
            b = lease.binding
            gpu = getattr(kernel, "gpu", None)   # a loaded module's kernel belongs to one GPU
            if gpu is not None and gpu != b.gpu:
                raise InvalidArgument(f"kernel {kernel.name!r} is loaded on GPU {gpu}; task {b.task_id} runs on "
                                      f"GPU {b.gpu}: load the module on the task's GPU")
            pool = self._gpus[b.gpu].memory
            values = [self._kernel_arg(pool, b, i, a, kernel) for i, a in enumerate(args)]
            kernel.launch(pool.backend, b.stream, config, values)
            self.launch_log.record(b.stream, kernel.name)
        finally:
            TaskLeases.leave(lease)

    @staticmethod
    def _kernel_arg(pool: "StreamOrderedMemoryPool", b: "TaskBinding", index: int, arg: object,
                    kernel: "Launchable") -> object:
        from .kernels.params import DevicePointer
        from .memory import Allocation   # the memory package imports this module's errors
        offset = 0
        if arg.__class__ is tuple and len(arg) == 2 and arg[0].__class__ is Allocation:
            arg, offset = arg     # an address inside the buffer (Java's buffer.at(offset))
        elif arg.__class__ is not Allocation:
            return arg
        where = f"kernel {kernel.name!r} argument {index}"
        if not arg.alive:
            raise InvalidArgument(f"{where}: {arg!r} is not live")
        if arg._pool is not pool:
            raise InvalidArgument(f"{where}: {arg!r} is on GPU {arg.device}, the task's GPU is {b.gpu}")
        if arg.owner != b.task_id:
            raise InvalidArgument(f"{where}: {arg!r} belongs to task {arg.owner}, not to task {b.task_id}")
        if offset.__class__ is not int or not 0 <= offset <= arg.size:
            raise InvalidArgument(f"{where}: offset {offset!r} is outside its {arg.size} bytes")
        return DevicePointer(arg.ptr + offset, arg.size - offset)

    def release(self, task_id: int) -> ReleaseReport:
        """Release the task: refuse its new operations, wait for those in progress, then free
        what it still holds (asynchronously, on its stream)."""
        task_id = task_id_of(task_id)
        with self._lock:
            lease = self._leases.get(task_id)
            if lease is None:
                raise self._leases.refusal(task_id, None)
            if threading.get_ident() in lease.inside:
                raise InvalidArgument(f"task {task_id} cannot be released from inside one of its own "
                                      f"operations on this thread")
            self._leases._close(task_id)   # out of the table, then closed (the lease protocol)
            self._releasing.add(task_id)   # until reclaimed: its allocations carry this id as owner
            b = lease.binding
            n = self._stream_use[b.stream] - 1
            if n:
                self._stream_use[b.stream] = n
            else:
                del self._stream_use[b.stream]
        try:
            self._drain(lease)
            try:
                for listener in self._release_listeners:
                    listener(b)
            finally:   # the memory is reclaimed whatever a listener did
                count, nbytes = self._gpus[b.gpu].memory.release_owner(task_id)
        finally:
            with self._lock:
                self._releasing.discard(task_id)
        if getattr(self._local, "task", None) == task_id:
            self._local.task = None
        return ReleaseReport(task_id, count, nbytes)

    def _drain(self, lease: TaskLease) -> None:
        """Wait (GIL released) until no operation of the closed lease is in progress."""
        if not lease.inside:
            return
        start = time.monotonic()
        warn_at = start + self.DRAIN_WARN_S
        pause = 0.0
        while lease.inside:
            time.sleep(pause)
            pause = min(0.001, pause * 2 or 0.00002)
            now = time.monotonic()
            if now >= warn_at:
                log.warning("release of task %d: still waiting after %.0f s for operations in progress on "
                            "thread(s) %s", lease.binding.task_id, now - start, sorted(set(lease.inside)))
                warn_at = now + self.DRAIN_WARN_S

    @property
    def tasks_bound(self) -> int:
        return len(self._leases)

    @property
    def streams_in_use(self) -> int:
        return len(self._stream_use)

    def bound_tasks(self) -> list[int]:
        return list(self._leases)

    def close(self) -> list[ReleaseReport]:
        """Release every task still bound. Idempotent."""
        with self._lock:
            self._closed = True
            tasks = list(self._leases)
        reports = []
        for t in tasks:
            try:
                reports.append(self.release(t))
            except UnknownTask:
                pass  # released by its own thread meanwhile
        return reports
