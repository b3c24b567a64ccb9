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
thread's ident from ``lease.inside`` (on every way out of the operation). Release takes the
lease out of the table (it moves to the releasing table), *then* sets ``open`` False, then waits
until ``inside`` is empty, and only then calls its listeners and reclaims the task's memory.
Invariants: a lease in the table is open; a closed lease never opens again and is never put back
(a re-bound task gets a new lease), so an operation that entered an old lease is refused even
when its task id is bound again meanwhile; once a release's wait has returned, no operation of
the task is in progress and none can start. Only the registry writes the table and ``open``; the
hot paths only append and remove their own idents.

Interruptions
-------------
An asynchronous exception (``KeyboardInterrupt`` from a signal, ``PyThreadState_SetAsyncExc``)
is raised at the next check of the interpreter's eval breaker: on entry to a Python function and
after a call returns, never inside a call to a built-in. So a step that must not be cut in two is
one built-in call, and an operation enters its lease with ``lease.inside.append(me)`` as the first
statement of a ``try`` whose ``finally`` first calls ``lease.inside.remove(me)`` (both built-ins
called inline: a helper function's entry is itself a check, so :meth:`TaskLeases.enter` and
:meth:`TaskLeases.leave` are for callers no interruption reaches). The C twin's steps are C. Bind and release are a few
such single steps (``dict.setdefault``, ``dict.pop``), with no lock: under the GIL each is atomic,
so 16 threads binding and releasing at once never queue on a lock whose holder the GIL switched
out. A release cut short by an interruption leaves its task in the releasing table, and the next
:meth:`TaskRegistry.release` of that task (or :meth:`TaskRegistry.close`) finishes it.
"""

from __future__ import annotations

import logging
import threading
import time
from threading import get_ident
from dataclasses import dataclass
from itertools import count
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, NamedTuple

from .errors import CudaError, InvalidArgument, KernelFault, PoolClosed, UnknownTask, index_int
from .kernels.launch_config import check_launch_request
from .kernels.launch_log import LaunchLog
from .kernels.params import DevicePointer
from .memory import Allocation
from .memory.native import load as load_native
from .stream_pool import StreamPolicy

if TYPE_CHECKING:
    from .kernels import LaunchConfig
    from .kernels.host_kernels import Launchable
    from .memory import StreamOrderedMemoryPool
    from .stream_pool import StreamPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuResources:
    """What one GPU of the executor owns."""

    ordinal: int
    address: str
    streams: "StreamPool"
    memory: "StreamOrderedMemoryPool"


class TaskBinding(NamedTuple):
    """A task's place on the executor (immutable; a tuple, so that binding costs no more than
    the stream it hands out)."""

    task_id: int
    gpu: int          # CUDA ordinal
    address: str      # Spark's address for it
    stream: int
    priority: str


class ReleaseReport(NamedTuple):
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


class _LeaseSlots:
    """The fields of a lease; replaced by the registry C twin's identical ``LeaseBase`` when it
    is built, so that its bind can fill them without running ``__init__``."""

    __slots__ = ("binding", "inside", "open")


_core = load_native("cudabridge._registry_core")


class TaskLease(_core.LeaseBase if _core is not None else _LeaseSlots):  # type: ignore[misc]
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

    __slots__ = ()

    def __init__(self, binding: "TaskBinding") -> None:
        self.binding = binding
        self.inside: list[int] = []
        self.open = True


_PLAIN_LEASE = TaskLease   # the C twin fills its slots itself; a subclass gets its __init__ run


class TaskLeases:
    """Task attempt id -> :class:`TaskLease` of every bound task: the lease protocol's table
    (module docstring). Readable by anyone (``get``, ``in``, ``[]``, iteration, ``len``);
    written only by its :class:`TaskRegistry`."""

    __slots__ = ("_by_id", "get")

    def __init__(self) -> None:
        self._by_id: dict[int, TaskLease] = {}
        # The lookup of the protocol: the dict's own bound ``get`` (exact int ids only).
        self.get = self._by_id.get

    # reading -----------------------------------------------------------------------------------
    @property
    def table(self) -> dict[int, TaskLease]:
        """Task id -> lease: the protocol's table itself, for the C twins that look leases up."""
        return self._by_id

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

    # writing (the registry only; each step one atomic dict operation) -------------------------
    def _insert(self, lease: TaskLease) -> TaskLease:
        """Put ``lease`` in the table unless its task id is there: returns the lease that is
        there now (``lease`` itself when it went in)."""
        return self._by_id.setdefault(lease.binding.task_id, lease)

    def _take_out(self, task_id: int, lease: TaskLease) -> None:
        """Take ``lease`` out of the table, then close it (the order readers rely on: a lease in
        the table is open). The caller holds the task's release claim, so nothing else removes
        the entry meanwhile and no bind can put another lease under its id."""
        if self._by_id.get(task_id) is lease:
            self._by_id.pop(task_id, None)
        lease.open = False


class TaskRegistry:
    # How long a release waits for an operation of its task still in progress before it logs
    # that it is still waiting (it keeps waiting: the operations' own host waits have deadlines).
    DRAIN_WARN_S = 5.0

    def __init__(self, gpus: Mapping[int, GpuResources]) -> None:
        if not gpus:
            raise InvalidArgument("a task registry needs at least one GPU")
        self._gpus = dict(gpus)
        self._sole = next(iter(self._gpus.values())) if len(self._gpus) == 1 else None
        # task attempt id -> its lease (binding and admission): the lease protocol's table, read
        # by the hot paths (the C twin of the Java hot path included), written only here.
        self._leases = TaskLeases()
        # task attempt id -> its closed lease, from the start of its release until its memory is
        # reclaimed (its allocations carry the id as owner: the id is not bindable until then).
        # A release cut short by an interruption leaves its entry here for the next release.
        self._releasing: dict[int, TaskLease] = {}
        # task attempt id -> the token of the release running for it: one release at a time
        # per task. Present only while a release() call runs (its ``finally`` takes it out).
        self._claims: dict[int, object] = {}
        self._release_listeners: list[Callable[[TaskBinding], None]] = []
        self._binds = count()   # next() is one atomic step; its repr says how many were taken
        self._local = threading.local()
        self._closed = False
        self.launch_log = LaunchLog()   # per stream: the kernels since its last completed synchronize
        # bind and release: the C twin where it is built (it hands what it does not take to the
        # references below), else the references themselves.
        self._core = None
        self.bind = self._bind_reference          # type: ignore[method-assign]
        self.release = self._release_reference    # type: ignore[method-assign]
        if _core is not None:
            self._core = _core.RegistryCore(
                table=self._leases._by_id, releasing=self._releasing, claims=self._claims,
                gpus={o: (o, r.address, r.streams.cycles if r.streams.policy == StreamPolicy.ROUND_ROBIN else None,
                          r.memory.owner_table, r.memory.reclaim_owner) for o, r in self._gpus.items()},
                binding_type=TaskBinding, report_type=ReleaseReport, lease_type=TaskLease,
                lease_direct=TaskLease is _PLAIN_LEASE, local=self._local,
                listeners=self._release_listeners, drain=self._drain, bind_ref=self._bind_reference,
                release_ref=self._release_reference, get_ident=get_ident)
            self.bind = self._core.bind
            self.release = self._core.release

    @property
    def native(self) -> bool:
        """Whether bind and release run in C (``_registry_core.c``)."""
        return self._core is not None

    def gpu_for(self, gpu: int | None) -> int:
        """The ordinal a bind on ``gpu`` (None: the executor's only GPU) takes; refused as the bind refuses it."""
        if gpu is None:
            if self._sole is None:
                raise InvalidArgument(f"the executor owns GPUs {sorted(self._gpus)}; say which")
            return self._sole.ordinal
        return self.gpu(gpu).ordinal

    def gpu(self, ordinal: int) -> GpuResources:
        res = self._gpus.get(ordinal) if ordinal.__class__ is int else None
        if res is None and ordinal.__class__ is not int:   # a bool would find GPU 0 or 1
            try:
                res = self._gpus.get(index_int(ordinal, "GPU ordinal"))
            except InvalidArgument:
                res = None
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
        and before its memory is reclaimed (the Java hot path drops its handles there). A release
        finished after an interruption may call it a second time for the same task."""
        self._release_listeners.append(listener)

    def bind(self, task_id: int, gpu: int | None = None, priority: str = "normal") -> TaskBinding:
        """Bind a task to a stream of ``gpu`` (an ordinal; default: the only GPU). Replaced on
        each registry by the C twin's ``bind`` or by :meth:`_bind_reference`."""
        return self._bind_reference(task_id, gpu, priority)

    def _bind_reference(self, task_id: int, gpu: int | None = None, priority: str = "normal") -> TaskBinding:
        """:meth:`bind` in Python, the reference of the C twin.

        No lock: the stream is taken first (a pool stream is never given back, so a refused
        bind loses nothing), then the lease goes in with one ``dict.setdefault``, and what could
        have begun between the checks and that step (a release of an earlier binding of the id,
        a close) is checked again after it, withdrawing the lease if so."""
        if task_id.__class__ is not int or task_id < 0:
            task_id = task_id_of(task_id)
        if gpu is None:
            res = self._sole
            if res is None:
                raise InvalidArgument(f"task {task_id}: the executor owns GPUs {sorted(self._gpus)}; say which")
        else:
            res = self.gpu(gpu)
        if self._closed:
            raise PoolClosed("bind after the task registry was closed")
        if task_id in self._releasing:
            raise self._still_releasing(task_id)
        held = self._leases.get(task_id)
        if held is not None:   # refused before a stream is taken, as the C twin does
            raise InvalidArgument(f"task {task_id} is bound already (to GPU {held.binding.gpu})")
        lease = TaskLease(TaskBinding(task_id, res.ordinal, res.address, res.streams.acquire(priority), priority))
        held = self._leases._insert(lease)
        if held is not lease:
            raise InvalidArgument(f"task {task_id} is bound already (to GPU {held.binding.gpu})")
        if task_id in self._releasing or self._closed:
            self._leases._take_out(task_id, lease)
            if self._closed:
                raise PoolClosed("bind after the task registry was closed")
            raise self._still_releasing(task_id)
        next(self._binds)
        return lease.binding

    @staticmethod
    def _still_releasing(task_id: int) -> InvalidArgument:
        return InvalidArgument(f"task {task_id} is still being released; bind it again once that returns")

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

    @property
    def attachments(self) -> threading.local:
        """The thread-local attachment (``attach``; its ``task``): read by the C twins that act
        for the calling thread's task (the registry's own, the library allocators')."""
        return self._local

    def attached_task(self) -> int | None:
        """The task the calling thread is attached to (:meth:`attach`), or None; never raises."""
        return self._local.__dict__.get("task")

    def task_on_stream(self, gpu: int, stream: int) -> int | None:
        """The one bound task whose stream on ``gpu`` is ``stream``; None when no task or several
        have it (a stream pool deals its streams round-robin, so one may serve two tasks at once).
        A library that names the stream but runs on a thread of its own, as PyTorch's autograd
        does, works for that task. O(tasks bound): for a thread not attached to a task."""
        found = None
        for lease in list(self._leases._by_id.values()):
            b = lease.binding
            if b.stream == stream and b.gpu == gpu:
                if found is not None:
                    return None
                found = b.task_id
        return found

    def current(self) -> TaskBinding:
        task_id = getattr(self._local, "task", None)
        if task_id is None:
            raise UnknownTask("the calling thread is not attached to a task")
        return self.binding(task_id)

    def allocate(self, task_id: int, size: int) -> "Allocation":
        """Memory on the task's GPU, ordered on its stream, owned by the task."""
        lease = self._leases.lease_of(task_id)
        me = get_ident()
        try:   # the lease's entry and exit are single built-in calls (module docstring)
            lease.inside.append(me)
            if not lease.open:
                raise self._leases.refusal(task_id, lease)
            b = lease.binding
            return self._gpus[b.gpu].memory.allocate(size, b.stream, owner=b.task_id)
        finally:
            lease.inside.remove(me)

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
        check_launch_request(kernel, config, args)   # the parts' types, before anything is entered
        lease = self._leases.lease_of(task_id)
        me = get_ident()
        try:   # the lease's entry and exit are single built-in calls (module docstring)
            lease.inside.append(me)
            if not lease.open:
                raise self._leases.refusal(task_id, lease)
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
            lease.inside.remove(me)

    @staticmethod
    def _kernel_arg(pool: "StreamOrderedMemoryPool", b: "TaskBinding", index: int, arg: object,
                    kernel: "Launchable") -> object:
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
        what it still holds (asynchronously, on its stream). One release runs per task at a time
        (another is refused as "being released"); one cut short by an interruption is finished
        by the next release of the task. Replaced on each registry by the C twin's ``release``
        or by :meth:`_release_reference`."""
        return self._release_reference(task_id)

    def _release_reference(self, task_id: int) -> ReleaseReport:
        """:meth:`release` in Python, the reference of the C twin."""
        if task_id.__class__ is not int or task_id < 0:
            task_id = task_id_of(task_id)
        claim = object()
        if self._claims.setdefault(task_id, claim) is not claim:
            raise self._leases.refusal(task_id, self._releasing.get(task_id) or self._leases.get(task_id)
                                       or _CLOSED_LEASE)
        try:
            lease = self._leases.get(task_id)
            if lease is not None:
                if get_ident() in lease.inside:
                    raise InvalidArgument(f"task {task_id} cannot be released from inside one of its own "
                                          f"operations on this thread")
                self._releasing[task_id] = lease    # first: until reclaimed, the id is in one table or both
                self._leases._take_out(task_id, lease)
            else:
                lease = self._releasing.get(task_id)   # a release of it was cut short: finish it
                if lease is None:
                    raise self._leases.refusal(task_id, None)
            b = lease.binding
            self._drain(lease)
            try:
                for listener in self._release_listeners:
                    listener(b)
            finally:   # the memory is reclaimed whatever a listener did
                count, nbytes = self._gpus[b.gpu].memory.reclaim_owner(task_id)
            self._releasing.pop(task_id, None)
        finally:
            self._claims.pop(task_id, None)
        local = self._local.__dict__   # this thread's (a getattr that misses costs a raised error)
        if local.get("task") == task_id:
            local["task"] = None
        return ReleaseReport(task_id, count, nbytes)

    def _drain(self, lease: TaskLease) -> None:
        """Wait (GIL released) until no operation of the closed lease is in progress. Every entry
        is some thread's operation in progress: the entries are made and removed by single
        built-in calls (module docstring), so none outlives its operation. (Whether a thread still
        lives cannot be told here: Java threads that call in have no ``threading`` object, and a
        thread's ident is reused once it ends.)"""
        inside = lease.inside
        if not inside:
            return
        start = time.monotonic()
        warn_at = start + self.DRAIN_WARN_S
        pause = 0.0
        while inside:
            time.sleep(pause)
            pause = min(0.001, pause * 2 or 0.00002)
            now = time.monotonic()
            if now >= warn_at:
                log.warning("release of task %d: still waiting after %.0f s for operations in progress on "
                            "thread(s) %s", lease.binding.task_id, now - start, sorted(set(inside)))
                warn_at = now + self.DRAIN_WARN_S

    @property
    def tasks_bound(self) -> int:
        return len(self._leases)

    @property
    def tasks_bound_total(self) -> int:
        """Binds that succeeded, ever: those of the reference (``count`` says in its repr the
        next number it gives) and those of the C twin."""
        return int(repr(self._binds)[6:-1]) + (self._core.binds if self._core is not None else 0)

    @property
    def streams_in_use(self) -> int:
        """Streams with at least one bound task (a task whose release has begun is not bound)."""
        return len({lease.binding.stream for lease in list(self._leases._by_id.values())})

    def bound_tasks(self) -> list[int]:
        return list(self._leases)

    def releases_in_progress(self) -> list[int]:
        """Tasks whose release has begun and not finished (running, or cut short)."""
        return list(self._releasing)

    def close(self, deadline_s: float | None = None) -> list[ReleaseReport]:
        """Release every task still bound, finish releases cut short, and wait (up to
        ``deadline_s``, default without end) for releases running on other threads. Idempotent."""
        self._closed = True
        if self._core is not None:
            self._core.closed = True
        reports = []
        for t in list(self._leases) + list(self._releasing):
            try:
                reports.append(self.release(t))
            except UnknownTask:
                pass  # released by another thread meanwhile, or running there now
        end = None if deadline_s is None else time.monotonic() + deadline_s
        while self._claims and (end is None or time.monotonic() < end):
            time.sleep(0.001)
        return reports


_CLOSED_LEASE = TaskLease(TaskBinding(-1, -1, "", 0, ""))   # "being released", for a refused claim
_CLOSED_LEASE.open = False
