"""The stream-ordered memory pool with event-deferred frees, one per GPU.

The guarantee: work queued on a stream that receives a block can never touch it before the
work queued, before the free, on every stream that used the block has completed. The pool
knows that on the host (an event or stream query says so) or enforces it on the device (the
new stream waits on the event); ``free`` never blocks and never returns memory to the device.

An allocation comes from the requesting stream's own bin of that exact size (the fast path: no
lock, no CUDA call), else a block of that size another stream has passed, else the reuse ladder
of the stream-ordering core (stream_ordering.py), else OutOfDeviceMemory.

The pool is composed of parts, a file each: the streams' arenas (stream_table.py,
stream_arena.py), their epochs and events (fences.py), the safe free list (safe_free_index.py),
the upstream under its reservation limit (upstream.py, segment_growth.py, limit.py), the owners'
allocations (owners.py) and the usage ledger (statistics.py). This file is the front: options,
composition, owners, statistics and lifetime. The fast paths get a narrow interface
(fast_path_hooks.py): in C (native_fast_path.py) for the default composition, else in Python
(python_fast_path.py). They are single built-in container operations, atomic under the GIL, so
threads never queue on a lock there (with a lock, every thread convoys behind a holder the GIL
has switched out, and many threads make fewer pairs per second than one); every other step holds
the pool's lock, and on the C path runs on the pool's SerialWorker thread, which no interruption
reaches.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

from ..device import DeviceBackend
from ..errors import InvalidArgument, OutOfDeviceMemory, PoolClosed, UnknownStream, index_int
from .allocation import ALIVE, CLOSED, RELEASED, Allocation, free_refusal
from .block import Block
from .device_scope import DeviceScope
from .event_pool import EventPool
from .fast_path_hooks import FastPathHooks
from .fences import Fences
from .host_wait import HostWait
from .limit import ReservationLimit
from .native_fast_path import native_fast_path
from .owners import OwnerTracker
from .pool_options import DEFAULT_CACHE_FREES, DEFAULT_HOST_WAIT_TIMEOUT_S, FastPath, PoolGrowth, PoolOptions, owner_key
from .python_fast_path import PythonFastPath
from .safe_free_index import SafeBlocks
from .statistics import PoolStatistics, UsageLedger
from .stream_arena import StreamArena
from .stream_ordering import StreamOrderingCore
from .stream_table import StreamTable, stream_handle
from .upstream import ALIGNMENT, DeviceUpstream

__all__ = ["ALIGNMENT", "FastPath", "PoolGrowth", "PoolOptions", "StreamOrderedMemoryPool"]

log = logging.getLogger(__name__)


def _inline(fn, *args):
    """The Python path's serial section: the step runs on the calling thread, under the lock it
    takes itself (consistent for the errors the pool raises, not for an interruption)."""
    return fn(*args)


class StreamOrderedMemoryPool:
    """Device memory for one GPU, handed out per stream.

    ``streams``: handles of the streams the pool accepts besides the legacy default stream and
    each thread's per-thread default stream (normally the GPU's :class:`StreamPool` streams);
    more can be added with :meth:`register_stream`. ``limit_bytes``: the most the pool reserves
    from the device (``None``: ``limit_fraction`` of the device's free memory at creation).
    ``arena_type``: the class of the per-stream free lists (:class:`StreamArena`, the event-
    deferred one). It is the pool's extension point for tests: ``tests/naive_arena.py``'s arena
    ignores stream order, so that tests can show the race the default prevents (the service takes
    it from the ``testStreamArena`` setting). A pool of another arena type runs the Python path.
    """

    def __init__(
        self,
        backend: DeviceBackend,
        device: int = 0,
        streams: Iterable[int] = (),
        *,
        limit_bytes: int | None = None,
        limit_fraction: float = 0.9,
        initial_bytes: int = 0,
        arena_type: type[StreamArena] = StreamArena,
        fast_path: str = "auto",
        growth: str = "auto",
        host_wait_timeout_s: float | None = DEFAULT_HOST_WAIT_TIMEOUT_S,
        cache_frees: int = DEFAULT_CACHE_FREES,
    ) -> None:
        opts = PoolOptions(limit_bytes=limit_bytes, limit_fraction=limit_fraction, initial_bytes=initial_bytes,
                           arena_type=arena_type, fast_path=fast_path, growth=growth,
                           host_wait_timeout_s=host_wait_timeout_s, cache_frees=cache_frees)
        try:
            wait = HostWait(backend, host_wait_timeout_s)
        except ValueError as exc:
            raise InvalidArgument(f"host_wait_timeout_s: {exc}") from None
        self.backend = backend
        self.device = device
        self._lock = threading.Lock()
        self._closed = False
        with self._on_device():
            free, total = backend.mem_get_info()
            limit_bytes = opts.limit_bytes
            if limit_bytes is None:
                limit_bytes = max(ALIGNMENT, int(free * opts.limit_fraction) // ALIGNMENT * ALIGNMENT)
            granularity = backend.vmm_granularity() if opts.growth != "chunks" else 0
        if opts.initial_bytes > limit_bytes:
            raise InvalidArgument(f"initial_bytes {opts.initial_bytes} exceeds the pool limit {limit_bytes}")
        if opts.growth == "segment" and not granularity:
            raise InvalidArgument(f"growth='segment': GPU {device} has no virtual memory management")
        self._max_request = limit_bytes

        # The parts. A limit above the device's memory is allowed (growth fails there, then
        # OOM), but a segment reserves address space for what the device can hold.
        self.counters = dict.fromkeys(PoolStatistics.COUNTERS, 0)
        self._limit = ReservationLimit(limit_bytes)
        self._streams = StreamTable(device, opts.arena_type, self._lock, streams)
        self._fences = Fences(backend, device, EventPool(backend), wait, self.counters)
        self._safe = SafeBlocks()
        self._upstream = DeviceUpstream(backend, device, self._limit, self.counters, self._safe, granularity, total)
        steal_query = backend.stream_query if backend.device_count() == 1 else None
        self._core = StreamOrderingCore(self._streams, self._fences, self._safe, self._upstream, self.counters,
                                        steal_query, opts.cache_frees)
        self._owner_tracker = OwnerTracker()
        self._ledger = UsageLedger()

        self._live: set[Allocation] = set()
        self._holders: list[Callable[[], int]] = []   # add_holder: frees kept outside the pool
        self._oom_local = threading.local()            # this thread's allocation: whether they gave back

        # The fast paths: C for the default composition where the extension is built, else Python.
        hooks = FastPathHooks(
            pool=self, arenas=self._streams.by_handle, all_arenas=self._streams.all, live=self._live,
            owners=self._owner_tracker.by_owner, max_request=self._max_request,
            resolve_arena=self._streams.resolve, refuse_size=self._bad_size, refuse_free=self._bad_free,
            allocate_normalized=self._allocate_normalized, free_normalized=self._free_normalized,
            allocate_slow=self._allocate_slow, queue_waits=self._queue_waits, return_unwaited=self._return_unwaited,
            fence_stamps=self._fences.stamps_for_free, place_pending=self._place_pending,
            trim_recent=self._trim_recent, out_of_memory=self._out_of_memory, out_of_memory_error=OutOfDeviceMemory,
        )
        self._serial = _inline
        self._worker = None
        fast = None
        if opts.fast_path != "python" and opts.default_composition:
            fast = native_fast_path(hooks, stream_query=steal_query,
                                    cu_stream_query=backend.native_stream_query() if steal_query else 0,
                                    required=opts.fast_path == "native")
        if fast is not None:
            self._worker = fast.worker
            self._serial = self._worker.call   # every locked step runs on the worker's thread
            self._ledger = fast                # bytes in use are counted in C, exactly
        else:
            fast = PythonFastPath(hooks, steal=self._core.steal if steal_query else None,
                                  place_fenced=self._place_fenced, ledger=self._ledger)
        self._fast = fast
        self.allocate = fast.allocate  # type: ignore[method-assign]
        self.free = fast.free  # type: ignore[method-assign]
        self.reissue = fast.reissue  # type: ignore[method-assign]
        if opts.initial_bytes:
            with self._lock, self._on_device():
                blk = self._upstream.grow(opts.initial_bytes, small=False, exact=True)
                if blk is None:
                    raise InvalidArgument(f"could not reserve initial_bytes={opts.initial_bytes} on GPU {device}")
                self._safe.insert(blk)

    @property
    def fast_path(self) -> str:
        """"native" (the C extension) or "python"."""
        return "python" if isinstance(self._fast, PythonFastPath) else "native"

    @property
    def growth(self) -> str:
        """"segment" (large blocks from expandable segments) or "chunks"."""
        return self._upstream.growth

    @property
    def cache_frees(self) -> int:
        """How many of a stream's newest frees its bins keep until growth is refused
        (stream_ordering.py)."""
        return self._core.cache_frees

    @property
    def limit(self) -> int:
        return self._limit.limit

    @property
    def reserved(self) -> int:
        return self._limit.reserved

    # streams ---------------------------------------------------------------------------------
    def register_stream(self, handle: int) -> None:
        """Accept a stream the pool does not own (one CuPy or PyTorch created). It must outlive
        its registration; :meth:`unregister_stream` before destroying it."""
        self._check_open("register_stream")
        self._serial(self._register_stream, handle)

    def _register_stream(self, handle: int) -> None:
        with self._lock:
            self._streams.add(handle, "external")

    def unregister_stream(self, handle: int) -> None:
        """Stop accepting a registered stream: synchronizes it and keeps its free blocks (now
        safe). Refused while live allocations still name it as their stream."""
        self._check_open("unregister_stream")
        self._serial(self._unregister_stream, handle)

    def _unregister_stream(self, handle: int) -> None:
        with self._lock:
            arena = self._streams.by_handle.get(handle)
            if arena is None or arena.kind != "external":
                raise UnknownStream(f"stream {handle!r} is not a registered external stream of GPU {self.device}")
            users = sum(1 for a in list(self._live) if a._arena is arena or (a._extra and arena in a._extra))
            if users:
                raise InvalidArgument(f"stream {handle:#x} still has {users} live allocation(s); free them first")
            with self._on_device():
                self._core.retire_stream(arena)

    def accepts(self, stream: int) -> bool:
        return self._streams.accepts(stream)

    # allocate --------------------------------------------------------------------------------
    def allocate(self, size: int, stream: int, owner: int | None = None) -> Allocation:
        """``size`` bytes, 256-byte aligned, usable in stream order on ``stream``. ``owner`` (a
        task attempt id, say) lets :meth:`reclaim_owner` reclaim whatever it leaks. ``size``,
        ``stream`` and ``owner`` take any ``operator.index()`` type except ``bool``.

        The fast path's own ``allocate`` replaces this method on each pool (one call less)."""
        return self._fast.allocate(size, stream, owner)

    def _allocate_normalized(self, size: object, stream: object, owner: object) -> Allocation:
        """``allocate`` with arguments that are not exact ints: made exact (or refused, before
        anything changes), then the fast path again (C or Python, whichever is installed), which
        checks the rest (range, unknown stream) as for any call."""
        return self.allocate(index_int(size, "allocation size"), stream_handle(stream), owner_key(owner))

    def _free_normalized(self, a: Allocation, stream: object) -> None:
        """``free`` with a stream that is not an exact int: made exact or refused first."""
        return self.free(a, stream_handle(stream))

    def _bad_size(self, size: int) -> None:
        """Raise what an exact-int size out of range deserves (the fast paths call it)."""
        if size <= 0:
            raise InvalidArgument(f"allocation size must be positive, got {size}")
        raise InvalidArgument(f"allocation of {size} bytes exceeds the pool limit of {self._max_request} "
                              f"bytes on GPU {self.device}")

    def _allocate_slow(self, r: int, arena: StreamArena) -> "Block | tuple[Block, list]":
        """Steps 2-7 (takes the lock). Returns the block, or (block, waits) when the block must be
        waited for on a stream only the caller can name (its per-thread stream, when this runs on
        the C path's worker): the caller queues those waits (:meth:`_queue_waits`) before using it."""
        with self._lock:
            if self._closed:
                raise PoolClosed(f"allocate on the memory pool of GPU {self.device} after close()")
            self.counters["slow_allocations"] += 1
            blk = self._core.take(r, arena, self._on_device, self._ledger)
            waits = self._core.deferred_waits
            return (blk, waits) if waits else blk

    # What an allocation the slow path cannot serve does: by default it raises OutOfDeviceMemory;
    # the service installs its memory waits here (pressure/), which may wait for other owners'
    # frees and ask for the slow path again. Called on the allocating thread, no lock held, as
    # handler(pool, bytes, owner, exc, attempt, first_asked): attempt counts the allocation's
    # earlier calls, first_asked is the time.monotonic() of its first (this allocation's, never
    # one nested inside it: a deadline runs from it).
    out_of_memory_handler: "Callable[[StreamOrderedMemoryPool, int, object, OutOfDeviceMemory, int, float], bool] | None" = None

    def add_holder(self, give_back: Callable[[], int]) -> None:
        """Register ``give_back``, which makes in this pool the frees its caller keeps outside it
        (a library plug-in's queued frees, and those torch's compiled part keeps for reuse) and
        returns how many. An allocation the slow path cannot serve has every holder give back, on
        the allocating thread with no lock held, before each call of the out-of-memory handler
        (so also after each of its waits): memory freed but kept elsewhere is never what makes an
        allocation wait or fail."""
        self._holders.append(give_back)

    def remove_holder(self, give_back: Callable[[], int]) -> None:
        """Undo :meth:`add_holder` (a holder not registered: nothing happens)."""
        try:
            self._holders.remove(give_back)
        except ValueError:
            pass

    def _give_back(self) -> int:
        """Every holder's frees, made now: how many. A holder that fails is logged and skipped."""
        made = 0
        for give_back in list(self._holders):
            try:
                made += give_back()
            except Exception as exc:   # noqa: BLE001 - the allocation goes on to the handler
                log.warning("GPU %d: a holder's give-back failed (%s: %s)", self.device, type(exc).__name__, exc)
        return made

    def _out_of_memory(self, r: int, arena: StreamArena, owner: object, exc: OutOfDeviceMemory, attempt: int) -> bool:
        """The fast paths' hook when the slow path raised ``exc`` for ``r`` bytes of ``owner``
        (``attempt``: the times this allocation asked before): True runs the slow path again;
        False raises ``exc``; the handler may raise instead. Before each handler call the holders
        give back, and where they made any free the slow path runs again first; the handler
        counts its attempts from its own first call."""
        # This allocation's state: read on entry, written back on every way out, so that an
        # allocation nested inside (a holder's drain or the handler may allocate, a finalizer too)
        # keeps its own and leaves this one's as it was.
        local = self._oom_local
        handled, gave, first_asked = (0, False, 0.0) if attempt == 0 else (local.handled, local.gave, local.first_asked)
        try:
            if not gave and self._holders and self._give_back():
                gave = True
                return True
            gave = False
            handler = self.out_of_memory_handler
            if handler is None:
                return False
            if handled == 0:
                first_asked = time.monotonic()
            handled += 1
            return bool(handler(self, r, owner, exc, handled - 1, first_asked))
        finally:
            local.handled, local.gave, local.first_asked = handled, gave, first_asked

    def _queue_waits(self, arena: StreamArena, waits: list) -> None:
        """On the allocating thread: make its stream wait for the events the slow path found
        (``(user, stamp, event)``), before the block is used there."""
        with self._on_device():
            for _user, _stamp, ev in waits:
                self.backend.stream_wait_event(arena.handle, ev)

    def _return_unwaited(self, blk: Block, arena: StreamArena, waits: list) -> None:
        """The waits could not be queued: the block goes back, fenced by what it waited for."""
        stamps: dict[StreamArena, int] = {}
        for user, stamp, _ev in waits:
            stamps[user] = max(stamp, stamps.get(user, 0))
        self._place_pending(blk, arena, stamps)

    def _trim_recent(self, arena: StreamArena) -> None:
        # Inline, not on the worker: it runs every few hundred frees, and a thread hand-off there
        # costs many pairs' worth of time (bench/RESULTS.md, "Issue 13 before/after, H200
        # (2026-12-04, bench_core, interleaved trees)"). An interruption inside it can only drop
        # entries of the arena's reclaim queue (``recent``): their blocks stay in the stream's
        # bins, counted and reusable (own stream, steals, in-flight takes), just not moved to the
        # safe index early.
        with self._lock:
            arena.trim_recent()

    # free ------------------------------------------------------------------------------------
    def free(self, a: Allocation, stream: int | None = None) -> None:
        """Free asynchronously. Never blocks the host, never returns memory to the device.
        ``stream`` is where the last work using the buffer was queued (default: the stream it was
        allocated on, plus any recorded with :meth:`record_stream`). Replaced by the fast path's
        own ``free`` on each pool, as ``allocate``."""
        return self._fast.free(a, stream)

    def reissue(self, a: Allocation, stream: int) -> Allocation | None:
        """A free of ``a`` and an allocation of its block on ``stream`` in one step, for a holder
        that frees and allocates one size on one stream (the library allocators): a new handle of
        the same memory, owner and stream, or None with nothing changed where that would need
        ordering (another stream, a per-thread stream, a stream recorded on ``a``) or ``a`` is not
        live. The old handle is freed: its later free is refused. Replaced by the fast path's own
        ``reissue`` on each pool, as ``allocate``."""
        return self._fast.reissue(a, stream)

    def _bad_free(self, a: object) -> None:
        raise free_refusal(a, self)

    def _place_fenced(self, blk: Block, arena: StreamArena, stamps: dict[StreamArena, int]) -> None:
        """Put a freed block where its stamps say: one stream's bins (lock-free, as any free),
        else the pending list (a locked step)."""
        if len(stamps) == 1 and arena in stamps:
            blk.epoch = stamps[arena]
            arena.push(blk)
            return
        self._serial(self._place_pending, blk, arena, stamps)

    def _place_pending(self, blk: Block, arena: StreamArena, stamps: dict[StreamArena, int]) -> None:
        with self._lock:
            self._core.place_pending(blk, stamps)

    def record_stream(self, a: Allocation, stream: int) -> None:
        """Like PyTorch's ``Tensor.record_stream``: work on ``stream`` uses the buffer too, so its
        free is ordered behind that stream as well."""
        arena = self._streams.resolve(stream, "record_stream")
        if a not in self._live:
            self._bad_free(a)
        if arena is a._arena:
            return
        if a._extra is None:
            a._extra = [arena]
        elif arena not in a._extra:
            a._extra.append(arena)

    # owners ----------------------------------------------------------------------------------
    def disown(self, a: Allocation) -> bool:
        """``a`` is no owner's from now on, as if allocated with ``owner=None``: its owner's release
        neither reclaims it nor counts it as a leak; a free, or close, frees it. The caller keeps the
        owner's release out meanwhile (a task lease, as for an allocation). False, and nothing
        changed, where ``a`` is not one of this pool's live allocations."""
        if not isinstance(a, Allocation) or a._pool is not self or a._state != ALIVE:
            return False
        self._owner_tracker.discard(a)
        a.owner = None
        return True

    def reclaim_owner(self, owner: int) -> tuple[int, int]:
        """Free everything ``owner`` still holds, asynchronously on the streams it used, and
        return (allocations, bytes) reclaimed: the owner's leaks.

        The caller excludes allocations for ``owner`` while this runs (the TaskRegistry does,
        with its task leases): one made concurrently may be missed.

        An owner that holds nothing (a task that freed what it allocated, or never allocated)
        costs two dict steps on the calling thread: no locked step, no hand-off to the worker.
        The check is sound because no allocation for ``owner`` can start meanwhile (above) and
        a free only ever empties the owner's dict."""
        owner = owner_key(owner)
        by_owner = self._owner_tracker.by_owner
        if not by_owner.get(owner):
            by_owner.pop(owner, None)   # its empty dict, if any: one atomic step
            return 0, 0
        return self._serial(self._reclaim_owner, owner)

    def _reclaim_owner(self, owner: int | None) -> tuple[int, int]:
        count, nbytes = self._owner_tracker.release(owner, self._reclaim)
        if count:
            with self._lock:
                self.counters["leaks_reclaimed"] += count
                self.counters["leaked_bytes_reclaimed"] += nbytes
            log.debug("GPU %d: reclaimed %d allocation(s), %d bytes, still held by %r at release",
                      self.device, count, nbytes, owner)
        return count, nbytes

    def _reclaim(self, a: Allocation) -> bool:
        """Free a released owner's allocation as a free on its stream would; False if the owner's
        own thread freed it first."""
        try:
            self._live.remove(a)
        except KeyError:
            return False
        a._state = RELEASED
        blk = a._block
        size = blk.size   # before the block is visible to other threads (a taker may cut it)
        if a._extra is not None or a._arena.eager:
            self._place_fenced(blk, a._arena, self._fences.stamps_for_free(a, a._arena))
        else:
            blk.epoch = a._arena.epoch
            a._arena.push(blk)
        self._ledger.add(-size)
        return True

    @property
    def owner_table(self) -> dict:
        """Owner -> its live allocations (a dict each): read-only for callers, which may look an
        owner up to see that it holds nothing before calling :meth:`reclaim_owner` (the task
        registry's C twin does)."""
        return self._owner_tracker.by_owner

    def owned_by(self, owner: int) -> list[Allocation]:
        return self._owner_tracker.owned_by(owner_key(owner))

    # statistics ------------------------------------------------------------------------------
    def statistics(self) -> PoolStatistics:
        with self._lock:
            self._ledger.fold()
            core = self._core
            counters = dict(self.counters)
            counters["fast_steals"] = self._fast.steals + core.fast_steals
            counters["stream_polls"] += self._fast.stream_polls + core.fast_polls
            return PoolStatistics(
                device=self.device,
                # a closed pool lends nothing: close() dropped every allocation and returned all
                # memory; an allocate or free that raced the close may not have counted itself
                in_use_bytes=0 if self._closed else self._ledger.in_use,
                peak_in_use_bytes=self._ledger.peak,
                reserved_bytes=self._limit.reserved,
                peak_reserved_bytes=self._limit.peak_reserved,
                limit_bytes=self._limit.limit,
                free_safe_bytes=self._safe.bytes,
                free_in_streams_bytes=core.in_streams_bytes(),
                free_pending_bytes=core.pending_bytes(),
                spare_bytes=self._upstream.spare_bytes,
                waiting_on_events_bytes=core.waiting_bytes(),
                largest_free_block_bytes=core.largest_free(),
                allocations=self._fast.issued,
                live_allocations=0 if self._closed else len(self._live),
                events_created=self._fences.events.created,
                streams_accepted=len(self._streams.all),
                **counters,
            )

    # lifetime --------------------------------------------------------------------------------
    def _check_open(self, call: str) -> None:
        if self._closed:
            raise PoolClosed(f"{call} on the memory pool of GPU {self.device} after close()")

    def _on_device(self) -> DeviceScope:
        return DeviceScope(self.backend, self.device)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> int:
        """Wait for the device to pass every block, return all memory, destroy the events.
        Returns how many allocations were still live (they are dead now). Idempotent.

        Every step runs whatever the one before it met: after a sticky CUDA error (a kernel
        fault) or a stream still busy past the host wait's deadline, the pool still ends closed
        and holding nothing (``reserved_bytes`` 0); what the device still held then goes with its
        context, and the first error is raised at the end, once."""
        try:
            return self._serial(self._close)
        finally:
            if self._worker is not None:
                self._worker.stop()

    def _close(self) -> int:
        with self._lock:
            if self._closed:
                return 0
            self._closed = True
            self._streams.close()   # every later fast-path call now fails to resolve its stream
        live = list(self._live)
        self._live.clear()
        for a in live:
            a._state = CLOSED
        self._owner_tracker.clear()
        if live:
            log.warning("GPU %d: memory pool closed with %d live allocation(s)", self.device, len(live))
        errors: list[BaseException] = []
        with self._lock:
            idle = self._step(errors, self._wait_idle)
            if idle:   # cudaFree waits for the device: with a stream still busy it would hang here
                self._step(errors, self._upstream.close)
            else:
                log.error("GPU %d: memory pool closed without returning its %d reserved bytes to the device "
                          "(the device did not finish its work); they go with the CUDA context",
                          self.device, self._limit.reserved)
                self._upstream.forget()
            self._streams.forget_blocks()
            self._step(errors, self._fences.events.close)
        if errors:
            raise errors[0]
        return len(live)

    def _step(self, errors: list[BaseException], fn) -> bool:
        """Run one step of close on this GPU; an error is kept for the end, and the next step runs."""
        try:
            with self._on_device():
                fn()
            return True
        except Exception as exc:   # noqa: BLE001 - every step runs; the first error is raised by close
            errors.append(exc)
            return False

    def _wait_idle(self) -> None:
        """Wait, within the host wait's deadline, for the streams the pool knows, then for the
        device (the per-thread default streams can only be waited for that way)."""
        wait = self._fences.wait
        if wait.timeout_s is not None:
            for arena in list(self._streams.all):
                if arena.kind != "per-thread":
                    wait.stream(arena.handle, arena.name)
        self.backend.device_synchronize()

    def __enter__(self) -> "StreamOrderedMemoryPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
