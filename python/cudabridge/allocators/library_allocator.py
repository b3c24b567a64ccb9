"""One Python GPU library's allocations from the service's pools: what every plug-in shares.

A plug-in (``cupy.py``, ``torch.py``, ``numba.py``, ``rmm.py`` beside this file) adapts its
library's allocator interface to a :class:`LibraryAllocator`; the rules live here, once:

* **Whose.** On a thread attached to a task (:meth:`TaskRegistry.attach`: the Java bridge's task
  threads are, and Python task code attaches its own), an allocation is the task's: owned by it,
  counted in its GPU's pool and in this library's statistics, reclaimed at its release. A plug-in
  whose library allocates on threads of its own for a stream it names (PyTorch's autograd) finds
  the task by that stream (``by_stream``). Anything else is the executor's: allocated on the
  stream the library names, freed only when the library frees it, counted as
  ``allocations_outside_tasks``. Not refused, because libraries allocate outside tasks by design:
  at import and initialization (a context's first use, a BLAS workspace), in a driver-side
  Python, in a warm-up; refusing would break them, and nothing would be reclaimed anyway.
* **On which stream.** The one the library names (CuPy's current stream, PyTorch's, RMM's); a
  library that names none (Numba) gets the task's stream on a task thread, else the legacy
  default stream. It must be a stream the GPU's pool accepts (its own, the default streams, one
  registered with ``register_stream``): the pool orders a free after the work of the streams it
  records events on, and a stream it was never told of could be destroyed under it. Another is
  refused with :class:`~cudabridge.errors.UnknownStream`, inside the library's call.
* **Frees.** Libraries free from finalizers, on whatever thread drops the last reference, and a
  garbage collection can run such a finalizer inside the pool's locked slow path. So
  :meth:`free` only appends to a deque (one atomic step, no lock, no pool call); the frees are
  made by :meth:`drain`: at this library's next allocation, at each task's release (before the
  task's memory is reclaimed, so that what the task freed is not counted as leaked), in
  :meth:`statistics` and at :meth:`close`. Each is the pool's free: ordered after the stream the
  block was allocated on and every stream named through :meth:`record_stream`. A free of an
  allocation reclaimed at its task's release is counted (``frees_after_reclaim``) and dropped; a
  second free of one handle (the library's bug, or a stale free of a handle reissued since) is
  refused by the pool and counted (``double_frees``). One exception, the pair of a library that frees a temporary and allocates the next of the same
  size on its stream: the newest queued free is made by that allocation as one pool step, the
  pool's ``reissue`` (a new handle of the same block; the old handle freed), where it needs no
  ordering (same stream, none recorded, not a per-thread stream). A plug-in whose library frees
  without the GIL (torch's compiled part) keeps those frees until :attr:`pending_frees` hands them
  over, which every drain does first.
* **Pointers.** A library whose free names only the address (PyTorch, RMM) uses
  :meth:`allocate_pointer` / :meth:`free_pointer`. An address the library still holds is never
  handed to it again: when the pool hands out the address of a reclaimed allocation the library
  has not freed yet, the new allocation is set aside (held, not handed out, no task's) and another
  taken; it goes back to the pool when the library's late free of that address arrives. So a late free can
  never free memory that has gone to someone else since.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from itertools import count
from threading import get_ident
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from ..device import LEGACY_STREAM
from ..memory.native import load as load_native
from ..errors import InvalidArgument, InvalidFree, PoolClosed, UnknownStream
from ..memory.allocation import ALIVE, FREED, Allocation

if TYPE_CHECKING:
    from ..config import ServiceConfig
    from ..task_registry import GpuResources, TaskBinding, TaskRegistry


log = logging.getLogger(__name__)


def _read(counter: "count[int]") -> int:
    """How many numbers an itertools.count has handed out (its repr says the next one)."""
    return int(repr(counter)[6:-1])


def _allocation_base() -> type | None:
    """The C base of Allocation whose slots the C twin reads in place (allocation_layout.h), or
    None where Allocation derives from the Python fallback's (another layout)."""
    base = getattr(load_native(), "AllocationBase", None)
    return base if base is not None and issubclass(Allocation, base) else None


class Service(Protocol):
    """What the plug-ins need of the service (``CudaBridgeService`` is one; it imports this
    package to install the plug-ins the ``allocators`` setting names, not the other way round)."""

    registry: "TaskRegistry"
    gpus: "Mapping[int, GpuResources]"
    library_allocators: "dict[str, LibraryAllocator]"
    config: "ServiceConfig"


@dataclass(frozen=True)
class LibraryStatistics:
    """One library's allocations through its plug-in (counts since the plug-in was installed)."""

    allocations: int                  # handed to the library
    allocations_outside_tasks: int    # of those, on threads working for no task (the executor's)
    frees: int                        # frees made: drained into the pool, or by a reissue of the block to
                                      # the next allocation of its size on its stream (allocate)
    frees_pending: int                # frees the library made that wait for the next drain
    frees_after_reclaim: int          # frees of allocations reclaimed at their task's release: dropped
    double_frees: int                 # frees of a handle freed already (the library's second free of it): refused
    in_use_bytes: int                 # handed out, neither freed nor reclaimed (the pool's peak_in_use_bytes
                                      # is the executor's peak, every library's and Java's together)
    leaks_reclaimed: int              # allocations still held at their task's release
    leaked_bytes_reclaimed: int
    allocations_set_aside: int        # held back now: their address is one the library still holds
    allocations_handed_over: int      # handed to their task as a function's result (hand_over): no longer the library's

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(LibraryStatistics))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class LibraryAllocator:
    """Allocations of one library (``library``: its name in statistics and errors) from
    ``service``'s pools. Plug-ins build one with :func:`cudabridge.allocators.allocator_for`, which
    keeps one per service and library; :meth:`close` drains and detaches it."""

    def __init__(self, service: Service, library: str, *, by_stream: bool = False,
                 register_streams: bool = False, fast_path: str = "auto") -> None:
        self.library = library
        self._registry = service.registry
        self._leases = service.registry.leases
        self._pools = {o: r.memory for o, r in service.gpus.items()}
        self._by_stream = by_stream
        self._register_streams = register_streams   # a stream the pool does not know is registered, not refused
        self._frees: deque = deque()            # (allocation, counted): appended by free, popped by drain
        self._by_owner: dict[Any, dict] = {}    # task id (None: the executor) -> its live allocations
        self._by_pointer: dict[int, "Allocation"] = {}   # pointer libraries: address -> allocation held
        self._set_aside: dict[int, "Allocation"] = {}    # address -> allocation held back for it
        # counts: itertools.count objects (one next() is one atomic step; read with _read)
        self._allocated, self._outside = count(), count()
        self._frees_made, self._after_reclaim, self._handed_over = count(), count(), count()
        self._double_frees = count()
        self._lock = threading.Lock()           # the leak totals below (a release at a time)
        self._leaks = self._leaked_bytes = 0
        self._closed = False
        # A plug-in whose library frees without the GIL keeps those frees outside Python until this
        # hands them to free / free_pointer (torch's compiled part: its flush); every drain calls it first.
        self.pending_frees: "Callable[[], None] | None" = None
        # A plug-in that keeps the library's frees and hands them back to its next allocations
        # itself (torch's compiled part: its reuses) says here how many it has, and how many of
        # them the executor's: each is counted as an allocation and as a free made.
        self.reused_frees: "Callable[[], tuple[int, int]] | None" = None
        self._attached_task = service.registry.attached_task
        self._lease_of = service.registry.leases.get
        # the C twin of allocate and allocate_pointer (_library_core.c) where it is built; these
        # methods stay its reference, which it hands every call it does not take
        self._core = None
        if fast_path not in ("auto", "native", "python"):
            raise InvalidArgument(f"fast_path={fast_path!r}: expected auto, native or python")
        core = load_native("cudabridge.allocators._library_core") if fast_path != "python" else None
        if core is None and fast_path == "native":
            raise InvalidArgument("fast_path='native': the library allocators' C twin is not built here")
        if core is not None:
            cls = type(self)
            self._core = core.LibraryCore(
                pool_allocate={o: p.allocate for o, p in self._pools.items()}, pools=dict(self._pools),
                pool_reissue={o: p.reissue for o, p in self._pools.items()},
                allocation_base=_allocation_base(),
                leases=self._leases.table,
                local=service.registry.attachments, by_owner=self._by_owner, by_pointer=self._by_pointer,
                frees=self._frees, allocated=self._allocated, allocate_ref=cls.allocate.__get__(self, cls),
                pointer_ref=cls.allocate_pointer.__get__(self, cls), hold_back=self._hold_back,
                unknown_stream=UnknownStream, invalid_free=(InvalidFree, PoolClosed), frees_made=self._frees_made,
                after_reclaim=self._after_reclaim, drain_ref=cls._drain_all.__get__(self, cls), set_aside=self._set_aside,
                free_pointer_ref=cls.free_pointer.__get__(self, cls), by_stream=by_stream,
                double_frees=self._double_frees, freed_state=FREED)
            self.allocate = self._core.allocate                   # type: ignore[method-assign]
            self.allocate_pointer = self._core.allocate_pointer   # type: ignore[method-assign]
            self.free = self._core.free                           # type: ignore[method-assign]
            self.free_pointer = self._core.free_pointer           # type: ignore[method-assign]
            self.allocate_pointer_owned = self._core.allocate_pointer_owned   # type: ignore[method-assign]
            self.owner_for = self._core.owner_for                 # type: ignore[method-assign]
        # last, once nothing above can refuse: a refused allocator leaves nothing registered
        for pool in self._pools.values():   # the frees this allocator keeps: made before a pool runs out
            pool.add_holder(self.drain)
        service.registry.on_release(self._task_released)

    @property
    def core(self) -> Any:
        """The C twin (``_library_core.LibraryCore``) these methods run on, or None (the Python
        path): the library plug-ins build their own C parts over it (cupy.py's malloc)."""
        return self._core

    @property
    def fast_path(self) -> str:
        """"native" (the C twin) or "python"."""
        return "python" if self._core is None else "native"

    # allocate ----------------------------------------------------------------------------------
    def allocate(self, size: int, device: int, stream: int | None = None) -> "Allocation":
        """:meth:`_allocate`: ``size`` bytes on GPU ``device`` for the calling thread's task."""
        return self._allocate(size, device, stream, False)

    def _allocate(self, size: int, device: int, stream: int | None, pointer: bool) -> "Allocation":
        """``size`` bytes on GPU ``device`` for the calling thread's task (module docstring: whose,
        which stream), ordered on ``stream`` (None: the task's stream, else the legacy default).

        The task's lease is entered as the registry's own allocate enters it (its protocol: one
        append, a check, one remove), so that a release either sees the allocation or refuses it.

        The library's newest queued free, when reusable here (:meth:`_reusable`: the pair of a
        library that frees and allocates one size on its stream), is handed out again under a new
        handle (the pool's ``reissue``) instead of being freed; every other queued free is made
        first. With ``pointer`` (:meth:`allocate_pointer`) the address is recorded as one the
        library holds inside the lease, so that a release (which reclaims the allocation) can never
        let the pool hand it to another allocation before it is."""
        pool = self._pools.get(device) if device.__class__ is int else None
        if pool is None or self._closed:
            if self._frees:
                self.drain()
            raise self._refusal(device)
        task = self._task_for(device, stream)
        frees = self._frees
        if frees:   # all but a newest this call may hand out again
            queued = len(frees)
            keep = task is not None and self._newest_reusable(size, stream, task, pool) is not None
            self._drain(queued - 1 if keep else -1)
        if task is None:
            a = self._take_unheld(pool, size, LEGACY_STREAM if stream is None else stream, None)
            self._own(a, None)
            if pointer:
                self._by_pointer[a.ptr] = a
            next(self._outside)
            next(self._allocated)
            return a
        lease = self._lease_of(task)
        if lease is None:
            raise self._leases.refusal(task, None)
        inside = lease.inside
        me = get_ident()
        inside.append(me)
        reissued = False
        try:
            if not lease.open:
                raise self._leases.refusal(task, lease)
            b: "TaskBinding" = lease.binding
            if b.gpu != device:
                raise InvalidArgument(f"{self.library} asked for memory on GPU {device} on a thread of task {task}, "
                                      f"which runs on GPU {b.gpu}: make the task's GPU current")
            on = b.stream if stream is None else stream
            # taken out of the queue only here: no release of the task can now drain it without it
            kept = self._take_newest(size, on, task, pool) if frees else None
            a = None
            if kept is not None:
                try:
                    a = pool.reissue(kept, on)
                finally:
                    if a is None:   # not after all (a per-thread stream): freed first, as the drain would
                        frees.append((kept, True))
                if a is None:
                    self._drain(-1)   # as the C twin: the queue only (the part flushed before calling)
                else:
                    reissued = True
                    owned = self._by_owner.get(task)
                    if owned is not None:
                        owned.pop(kept, None)   # the old handle: freed by the reissue
            if a is None:
                a = self._take_unheld(pool, size, on, task)   # inside the lease: see _hold_back
            self._own(a, task)   # inside the lease: the release's listener sees it, or it never happened
            if pointer:
                self._by_pointer[a.ptr] = a
        finally:
            inside.remove(me)
        next(self._allocated)
        if reissued:
            next(self._frees_made)   # the library's free is made: reissued
        return a

    def _task_for(self, device: int, stream: object) -> int | None:
        """The task an allocation on ``device`` ordered on ``stream`` (None: none named) by the calling
        thread is for: the thread's, else, with ``by_stream``, the one task whose stream it is
        (autograd's threads); None: no task's."""
        task = self._attached_task()
        if task is None and self._by_stream and stream is not None and len(self._leases):
            task = self._registry.task_on_stream(device, stream)
        return task

    @staticmethod
    def _reusable(a: "Allocation", size: object, stream: object, task: int, pool: Any) -> bool:
        """Whether ``a`` can be handed out again for ``size`` bytes on ``stream`` to ``task`` from
        ``pool``: live, that pool's, that task's, allocated on that stream with that size, no other
        stream recorded on it. Its last use was ordered on ``stream``, so work queued there from
        now on runs after it: the reuse the pool's own bin for that stream makes (the block just
        freed is the one it hands out next), without the free and the allocation. The pool's
        ``reissue`` decides last (it refuses a per-thread stream, whose handle names another
        stream on each thread)."""
        return (a._pool is pool and a._extra is None and a._state == ALIVE and a.owner == task
                and a.stream == stream and a.size == size)

    def _newest_reusable(self, size: object, stream: object, task: int, pool: Any) -> tuple | None:
        """The newest queued free, (allocation, counted), when its allocation is reusable for this
        call, else None; takes nothing out. Exact ints only: any other size or stream goes through
        the pool, which checks it."""
        if size.__class__ is not int or stream.__class__ is not int:
            return None
        try:
            newest = self._frees[-1]
        except IndexError:   # drained by another thread meanwhile
            return None
        a, counted = newest
        return newest if counted and self._reusable(a, size, stream, task, pool) else None

    def _take_newest(self, size: object, stream: object, task: int, pool: Any) -> "Allocation | None":
        """:meth:`_newest_reusable`'s allocation taken out of the queue, or None. Inside the task's
        lease only: from there to the leave no release of the task can drain the queue without it,
        so a free taken out is either handed out again or put back."""
        newest = self._newest_reusable(size, stream, task, pool)
        if newest is None:
            return None
        frees = self._frees
        try:
            popped = frees.pop()
        except IndexError:
            return None
        if popped is not newest:   # another was queued meanwhile: back in line, nothing taken
            frees.append(popped)
            return None
        return newest[0]

    def _refusal(self, device: object) -> InvalidArgument:
        if self._closed:
            return InvalidArgument(f"{self.library} allocation after its cudabridge allocator was closed")
        return InvalidArgument(f"{self.library} asked for memory on GPU {device!r}, which this executor does not "
                               f"own (owned: {sorted(self._pools)})")

    def _take(self, pool: Any, size: int, stream: int, owner: int | None) -> "Allocation":
        try:
            return pool.allocate(size, stream, owner)
        except UnknownStream:
            if not self._register_streams:
                raise
        self._accept(pool, stream)
        return pool.allocate(size, stream, owner)

    def _take_unheld(self, pool: Any, size: int, stream: int, owner: int | None) -> "Allocation":
        """:meth:`_take`, never at an address the library still holds (a reclaimed allocation it has
        not freed yet): such an allocation is set aside (:meth:`_hold_back`), before it is counted,
        and another taken."""
        a = self._take(pool, size, stream, owner)
        while self._by_pointer and a.ptr in self._by_pointer:
            self._hold_back(a)
            a = self._take(pool, size, stream, owner)
        return a

    @staticmethod
    def _accept(pool: Any, stream: int) -> None:
        """Register ``stream`` with ``pool`` (a plug-in whose library's streams are never destroyed:
        ``register_streams``); another thread registering it first is no error."""
        try:
            pool.register_stream(stream)
        except InvalidArgument:
            if not pool.accepts(stream):
                raise

    def _own(self, a: "Allocation", task: int | None) -> None:
        owned = self._by_owner.get(task)
        if owned is None:
            owned = self._by_owner.setdefault(task, {})
        owned[a] = None

    def allocate_pointer(self, size: int, device: int, stream: int | None = None) -> int:
        """:meth:`allocate` for a library that frees by address (:meth:`free_pointer`): the address."""
        return self._allocate(size, device, stream, True).ptr   # never an address the library still holds

    def allocate_pointer_owned(self, size: int, device: int, stream: int | None = None) -> tuple[int, int | None]:
        """:meth:`allocate_pointer`, and the owner it made the allocation for (the task's id; None: the
        executor's). For a plug-in that keeps the library's frees for reuse (torch's compiled part):
        it hands one back only to an allocation :meth:`owner_for` gives the same owner."""
        ptr = self.allocate_pointer(size, device, stream)
        return ptr, self._by_pointer[ptr].owner

    def owner_for(self, device: object, stream: object) -> int | None:
        """Whose an allocation on ``device`` ordered on ``stream`` by the calling thread would be,
        now, where :meth:`allocate` would make it as it stands (module docstring: whose): the task's
        id, its lease open and on that GPU; None, the executor's; -1 where it would be refused or
        made otherwise (a closed allocator, a GPU not owned, a lease closed or of another GPU).
        Reads only (the C twin's runs no Python code, so no release can begin inside it). What a
        plug-in that keeps frees asks before it hands one back (torch's compiled part)."""
        if self._closed or device.__class__ is not int or device not in self._pools:
            return -1
        task = self._task_for(device, stream)
        if task is None:
            return None
        lease = self._lease_of(task)
        if lease is None or not lease.open or lease.binding.gpu != device:
            return -1
        return task

    def _hold_back(self, a: "Allocation") -> None:
        """Set ``a`` aside (the module docstring's "Pointers"): its address is one the library still
        holds, of an allocation reclaimed at its task's release. It is no task's from now on (the
        pool's ``disown``; the caller is inside the task's lease, so no release reclaims it
        meanwhile): kept for a late free that never came to its own task, it is not this task's
        leak. Never counted as an allocation (allocate counts only what it hands out).

        The late free may come at any moment (a finalizer, another thread): set aside first, then
        looked for again; whichever of this and free_pointer takes the entry out of ``_set_aside``
        (one atomic pop) queues its free, so it is never set aside for a free that came already."""
        self._by_owner.get(a.owner, {}).pop(a, None)
        ptr = a.ptr
        self._set_aside[ptr] = a
        if a.owner is not None:
            a._pool.disown(a)
        if ptr not in self._by_pointer:   # the late free came meanwhile
            held = self._set_aside.pop(ptr, None)
            if held is not None:
                self._frees.append((held, False))

    # free --------------------------------------------------------------------------------------
    def free(self, a: "Allocation") -> None:
        """The library is done with ``a``: queued, made at the next drain. Safe in a finalizer, on
        any thread, inside the pool's own calls: one deque append."""
        self._frees.append((a, True))

    def hand_over(self, a: "Allocation") -> None:
        """The library lets go of ``a`` without freeing it: its task owns it from now on (a Python
        function's result array, handed to Java as a DeviceBuffer with no copy: functions/). Not
        the library's in use nor its leak from then on; the library must never free it (the
        plug-in detaches its own free first)."""
        owned = self._by_owner.get(a.owner)
        if owned is None or a not in owned:
            raise InvalidArgument(f"{self.library}: hand_over of {a!r}, which this allocator does not hold")
        owned.pop(a, None)
        next(self._handed_over)

    def free_pointer(self, ptr: int) -> None:
        """:meth:`free` by address, for what :meth:`allocate_pointer` handed out. An address it did
        not hand out (or freed already) raises :class:`~cudabridge.errors.InvalidFree` and changes
        nothing."""
        a = self._by_pointer.pop(ptr, None)
        if a is None:
            raise InvalidFree(f"{self.library} freed address {ptr!r}, which its cudabridge allocator does not hold "
                              f"(never handed out, or freed already)")
        self._frees.append((a, True))
        held = self._set_aside.pop(ptr, None)
        if held is not None:   # the late free of a reclaimed one: what was held back for it goes back
            self._frees.append((held, False))

    def record_stream(self, a: "Allocation", stream: int) -> None:
        """Work queued on ``stream`` uses ``a`` too: its free is ordered after that stream as well
        (PyTorch's ``Tensor.record_stream``). ``stream`` must be one the pool accepts (or is
        registered, with ``register_streams``)."""
        pool = a._pool
        if self._register_streams and not pool.accepts(stream):
            self._accept(pool, stream)
        pool.record_stream(a, stream)

    def record_stream_pointer(self, ptr: int, stream: int) -> None:
        """:meth:`record_stream` by address, for what :meth:`allocate_pointer` handed out."""
        a = self._by_pointer.get(ptr)
        if a is None:
            raise InvalidFree(f"{self.library}: record_stream of address {ptr:#x}, which its cudabridge allocator "
                              f"does not hold")
        self.record_stream(a, stream)

    def drain(self) -> int:
        """Make the queued frees in the pool; returns how many were made. Any thread, any time
        outside the pool's own calls (never from a finalizer). The frees a plug-in keeps outside
        Python (:attr:`pending_frees`) are queued first."""
        pending = self.pending_frees
        if pending is not None:
            pending()
        return self._drain(-1) if self._core is None else self._core.drain()

    def _drain_all(self) -> int:
        """The reference drain of the whole queue (the C twin's drain hands a free it cannot make to it)."""
        return self._drain(-1)

    def _drain(self, limit: int) -> int:
        """:meth:`drain` of the oldest ``limit`` queued frees (all when negative)."""
        made = taken = 0
        frees, by_owner = self._frees, self._by_owner
        while frees and taken != limit:
            taken += 1
            try:
                a, counted = frees.popleft()
            except IndexError:   # another thread drained it first
                break
            if counted:
                owned = by_owner.get(a.owner)
                if owned is not None:
                    owned.pop(a, None)
            try:
                a._pool.free(a)   # refuses an allocation reclaimed meanwhile (InvalidFree) or closed (PoolClosed)
            except (InvalidFree, PoolClosed):   # reclaimed at its task's release, or at close: nothing to do;
                if counted:                     # or freed already (the library's second free of it)
                    next(self._double_frees if a._state == FREED else self._after_reclaim)
                continue
            except Exception as exc:   # noqa: BLE001 - a sticky CUDA error, say: the pool keeps it (reclaimed
                # with its task, or at close); the drain goes on, and the caller's own call is not failed by it
                log.warning("%s: a queued free of %r failed (%s: %s); the pool keeps it until its task's release "
                            "or close", self.library, a, type(exc).__name__, exc)
                continue
            if counted:
                next(self._frees_made)
                made += 1
        return made

    # tasks ---------------------------------------------------------------------------------------
    def _task_released(self, binding: "TaskBinding") -> None:
        """The registry's release listener: the task's operations have drained and its memory is
        about to be reclaimed. The frees queued so far are made first (what the task freed is not a
        leak); what the task still holds of this library is counted as reclaimed."""
        self.drain()
        held = self._by_owner.pop(binding.task_id, None)
        if not held:
            return
        leaks = nbytes = 0
        for a in list(held):
            if a.alive:
                leaks += 1
                nbytes += a.size
        with self._lock:
            self._leaks += leaks
            self._leaked_bytes += nbytes

    # reading -------------------------------------------------------------------------------------
    def statistics(self) -> LibraryStatistics:
        """Drains first. ``in_use_bytes`` is summed over the live allocations (O(live), at each read
        rather than on each allocation)."""
        self.drain()
        in_use = sum(a.size for owned in list(self._by_owner.values()) for a in list(owned) if a.alive)
        with self._lock:
            leaks, leaked_bytes = self._leaks, self._leaked_bytes
        reused, reused_outside = self.reused_frees() if self.reused_frees is not None else (0, 0)
        return LibraryStatistics(
            allocations=_read(self._allocated) + reused,
            allocations_outside_tasks=_read(self._outside) + reused_outside,
            frees=_read(self._frees_made) + reused, frees_pending=len(self._frees),
            frees_after_reclaim=_read(self._after_reclaim),
            double_frees=_read(self._double_frees),
            in_use_bytes=in_use, leaks_reclaimed=leaks, leaked_bytes_reclaimed=leaked_bytes,
            allocations_set_aside=len(self._set_aside), allocations_handed_over=_read(self._handed_over))

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Make the queued frees and refuse further allocations (frees are still taken: a library
        drops its memory later); the service calls it before it closes its pools. Idempotent."""
        self._closed = True
        if self._core is not None:
            self._core.close()
        self.drain()
        for pool in self._pools.values():
            pool.remove_holder(self.drain)
