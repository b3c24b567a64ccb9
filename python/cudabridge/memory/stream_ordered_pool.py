"""The stream-ordered memory pool with event-deferred frees, one per GPU.

The guarantee: work queued on a stream that receives a block can never touch it before the
work queued, before the free, on every stream that used the block has completed. The pool
knows that on the host (an event or stream query says so) or enforces it on the device (the
new stream waits on the event); ``free`` itself never blocks and never returns memory to the
device.

Where an allocation comes from, cheapest first:

1. the requesting stream's own bin of that exact size (the fast path: no lock, no CUDA call);
   then, still without the lock, a block of that exact size another stream is known (or seen
   with one stream query) to have passed;
2. the safe index: blocks every user stream is known to have passed (best fit, coalesced);
3. blocks freed on other streams whose events have completed, found by polling
   (``cudaEventQuery`` / ``cudaStreamQuery``), moved to the safe index and coalesced; and any of
   the requesting stream's own blocks of other sizes;
4. more memory from the device, while under the limit (growing is preferred over a device-side
   wait, because such a wait makes unrelated tasks' streams depend on each other): blocks up to
   1 MiB from 2 MiB ``cudaMalloc`` chunks; larger ones from an expandable segment (segment.py),
   which maps only what its free tail lacks and first moves physical pieces out of free holes,
   so that fragmentation does not turn into growth;
5. a block still in flight on another stream, taken with ``cudaStreamWaitEvent`` on the
   requesting stream (no host block); adjacent free blocks of any state may be joined into one
   run, whose fences are the union of theirs;
6. one host synchronize of the streams with blocks in flight, then 2 and 3 again;
7. :class:`OutOfDeviceMemory`.

Concurrency: the fast paths are sequences of single built-in container operations (each
atomic), so threads never queue on a lock there; every other step holds one lock. A lock on
the fast path makes 16 threads convoy behind a holder the GIL has switched out (FIELD-NOTES:
1.05M pairs/s for one thread fell to 0.10M at 16).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from typing import Iterable

from ..device import LEGACY_STREAM, PER_THREAD_STREAM, DeviceAllocationFailed, DeviceBackend
from ..errors import CudaError, InvalidArgument, InvalidFree, OutOfDeviceMemory, PoolClosed, UnknownStream, index_int
from ..modes import Mode
from .allocation import ALIVE, CLOSED, FREED, RELEASED, Allocation
from .block import LIVE, PENDING, SAFE, UNMAPPED, Block, Chunk
from .event_pool import EventPool
from .host_wait import HostWait
from .native import load as load_native
from .native import supported as native_supported
from .safe_free_index import SafeFreeIndex
from .segment import PhysicalPieces, Segment
from .statistics import PoolStatistics, UsageLedger
from .stream_arena import StreamArena

log = logging.getLogger(__name__)

ALIGNMENT = 256
SMALL_REQUEST = 1 << 20          # requests up to 1 MiB come from small chunks
SMALL_CHUNK = 2 << 20            # as PyTorch's caching allocator: 2 MiB chunks for small blocks
LARGE_CHUNK = 20 << 20           # and 20 MiB chunks for medium ones
LARGE_EXACT = 10 << 20           # above this, a chunk is the request rounded to 2 MiB
CHUNK_GRANULE = 2 << 20



class FastPath(Mode):
    AUTO = "auto"       # the C extension where built, else Python
    NATIVE = "native"
    PYTHON = "python"


class PoolGrowth(Mode):
    """How blocks above SMALL_REQUEST get memory."""
    AUTO = "auto"         # segment where the GPU has virtual memory management
    SEGMENT = "segment"   # one expandable virtual-memory segment
    CHUNKS = "chunks"     # cudaMalloc chunks

FOLD_MASK = (1 << 14) - 1    # the Python path folds its usage ledger every 16384 allocations: a short deque
DEFAULT_HOST_WAIT_TIMEOUT_S = 300.0   # the longest the pool waits for a stream before OOM
MAX_BYTES = (1 << 63) - 1       # sizes and limits are signed 64-bit byte counts (C, Java)
MAX_HANDLE = (1 << 64) - 1      # stream handles are pointers (cudaStream_t)


def stream_handle(value: object) -> int:
    """A stream handle: an int in [0, 2**64) (0, 1 and 2 are the default streams)."""
    h = index_int(value, "stream", "an int handle")
    if not 0 <= h <= MAX_HANDLE:
        raise InvalidArgument(f"stream handle {h} is not a cudaStream_t (an address in [0, 2**64))")
    return h


def owner_key(value: object) -> int | None:
    """An owner: None or an int (a Spark task attempt id)."""
    return None if value is None else index_int(value, "owner (a task attempt id)")


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
    ) -> None:
        growth = PoolGrowth.parse(growth, "growth")
        fast_path = FastPath.parse(fast_path, "fast_path")
        if not (isinstance(arena_type, type) and issubclass(arena_type, StreamArena)):
            raise InvalidArgument(f"arena_type must be a StreamArena class, got {arena_type!r}")
        if arena_type is not StreamArena and fast_path == "native":
            raise InvalidArgument(f"fast_path='native' runs only the default composition, not arena_type={arena_type!r}")
        if limit_bytes is not None:
            limit_bytes = index_int(limit_bytes, "limit_bytes")
            if not 0 < limit_bytes <= MAX_BYTES:
                raise InvalidArgument(f"limit_bytes must be a positive int below 2**63, got {limit_bytes!r}")
        if isinstance(limit_fraction, bool) or not isinstance(limit_fraction, (int, float)) \
                or not 0.0 < limit_fraction <= 1.0:
            raise InvalidArgument(f"limit_fraction must be a number in (0, 1], got {limit_fraction!r}")
        initial_bytes = index_int(initial_bytes, "initial_bytes")
        if not 0 <= initial_bytes <= MAX_BYTES:
            raise InvalidArgument(f"initial_bytes must be a non-negative int below 2**63, got {initial_bytes!r}")
        try:
            self._wait = HostWait(backend, host_wait_timeout_s)
        except ValueError as exc:
            raise InvalidArgument(f"host_wait_timeout_s: {exc}") from None
        self.backend = backend
        self.device = device
        self._arena_type = arena_type
        self._lock = threading.Lock()
        self._closed = False
        with self._on_device():
            free, total = backend.mem_get_info()
            if limit_bytes is None:
                limit_bytes = max(ALIGNMENT, int(free * limit_fraction) // ALIGNMENT * ALIGNMENT)
        # A limit above the device's memory is allowed (growth fails there, then OOM), but
        # address space is reserved for what the device can hold, not for the limit.
        self._device_total = total
        if initial_bytes > limit_bytes:
            raise InvalidArgument(f"initial_bytes {initial_bytes} exceeds the pool limit {limit_bytes}")
        self.limit = limit_bytes
        self._max_request = limit_bytes

        self._events = EventPool(backend)
        self._arenas: dict[int, StreamArena] = {}   # by handle; per-thread arenas live in _local
        self._all_arenas: list[StreamArena] = []
        self._local = threading.local()
        legacy = arena_type(f"gpu{device}/legacy", LEGACY_STREAM, "legacy")
        self._arenas[LEGACY_STREAM] = legacy
        self._arenas[0] = legacy
        self._all_arenas.append(legacy)
        for handle in streams:
            self._add_arena(handle, "pool")

        self._live: set[Allocation] = set()
        self._owners: dict[int, dict[Allocation, None]] = {}
        self._ids = itertools.count(1)
        self._ledger = UsageLedger()
        self._ledger_add = self._ledger.add
        self._small = SafeFreeIndex()
        self._large = SafeFreeIndex()
        self._pending: list[Block] = []
        self._chunks: list[Chunk] = []
        self._segment_chunk: Chunk | None = None   # the segment that grows; made on first use
        self._spares = PhysicalPieces(backend)
        with self._on_device():
            granularity = backend.vmm_granularity() if growth != "chunks" else 0
        if growth == "segment" and not granularity:
            raise InvalidArgument(f"growth='segment': GPU {device} has no virtual memory management")
        self._granularity = granularity
        self.reserved = 0
        self.peak_reserved = 0
        self.counters = dict.fromkeys(PoolStatistics.COUNTERS, 0)
        self._fast_steals = 0   # _steal's counters (the C twin keeps its own)
        self._fast_polls = 0
        # _steal queries streams outside the slow path's device scope: only where there is
        # one device, so that the current device cannot be another GPU's.
        self._steal_ok = backend.device_count() == 1
        self._deferred_waits: list = []   # the current slow path's waits for the caller's stream
        self._worker = None   # the SerialWorker of the C path (see _native_fast_path)
        self._serial = _inline
        self._fast = self._native_fast_path(fast_path if arena_type is StreamArena else "python")
        if initial_bytes:
            with self._lock, self._on_device():
                blk = self._grow(initial_bytes, small=False, exact=True)
                if blk is None:
                    raise InvalidArgument(f"could not reserve initial_bytes={initial_bytes} on GPU {device}")
                self._to_safe(blk)

    def _native_fast_path(self, choice: str):
        """Install the C fast paths (``_fastpath.c``) as this pool's ``allocate`` / ``free``."""
        if choice == "python":
            return None
        module = load_native()
        if module is None:
            if choice == "native":
                ok, why = native_supported()
                raise InvalidArgument("fast_path='native' but the C extension is unavailable: "
                                      + (why or "not built (python -m cudabridge.memory.build_fastpath)"))
            return None
        if not (issubclass(Allocation, module.AllocationBase) and issubclass(Block, module.BlockBase)
                and issubclass(StreamArena, module.ArenaBase)):
            if choice == "native":
                raise InvalidArgument("fast_path='native': the pool's classes were defined before the extension was built")
            return None
        # On the C path every locked step runs on the worker's thread, where no signal handler or
        # async exception can interrupt it half done (see SerialWorker in _fastpath.c).
        self._worker = module.SerialWorker()
        self._serial = self._worker.call
        fast = module.FastPath(
            pool=self, worker=self._worker, arenas=self._arenas, live=self._live, owners=self._owners,
            alloc_type=Allocation,
            live_state=LIVE, alive=ALIVE, freed=FREED, max_request=self._max_request,
            first_id=1, all_arenas=self._all_arenas,
            stream_query=self.backend.stream_query if self._steal_ok else None,
            cu_stream_query=self.backend.native_stream_query() if self._steal_ok else 0,
        )
        # Bytes in use are counted in C from now on, exactly, in the UsageLedger's place.
        self._ledger = fast  # type: ignore[assignment]
        self._ledger_add = fast.add
        self.allocate = fast.allocate  # type: ignore[method-assign]
        self.free = fast.free  # type: ignore[method-assign]
        return fast

    @property
    def fast_path(self) -> str:
        """"native" (the C extension) or "python"."""
        return "native" if self._fast is not None else "python"

    # streams ---------------------------------------------------------------------------------
    def _add_arena(self, handle: int, kind: str) -> StreamArena:
        handle = stream_handle(handle)
        if handle in (0, LEGACY_STREAM, PER_THREAD_STREAM):
            raise InvalidArgument(f"stream handle {handle!r} cannot be added: 0, 1 and 2 are the default streams")
        if handle in self._arenas:
            raise InvalidArgument(f"stream {handle:#x} is already accepted by the pool of GPU {self.device}")
        arena = self._arena_type(f"gpu{self.device}/{kind}/{handle:#x}", handle, kind)
        self._arenas[handle] = arena
        self._all_arenas.append(arena)
        return arena

    def register_stream(self, handle: int) -> None:
        """Accept a stream the pool does not own (one CuPy or PyTorch created). It must outlive
        its registration; :meth:`unregister_stream` before destroying it."""
        self._check_open("register_stream")
        self._serial(self._register_stream, handle)

    def _register_stream(self, handle: int) -> None:
        with self._lock:
            self._add_arena(handle, "external")

    def unregister_stream(self, handle: int) -> None:
        """Stop accepting a registered stream: synchronizes it and keeps its free blocks (now
        safe). Refused while live allocations still name it as their stream."""
        self._check_open("unregister_stream")
        self._serial(self._unregister_stream, handle)

    def _unregister_stream(self, handle: int) -> None:
        with self._lock:
            arena = self._arenas.get(handle)
            if arena is None or arena.kind != "external":
                raise UnknownStream(f"stream {handle!r} is not a registered external stream of GPU {self.device}")
            users = sum(1 for a in list(self._live) if a._arena is arena or (a._extra and arena in a._extra))
            if users:
                raise InvalidArgument(f"stream {handle:#x} still has {users} live allocation(s); free them first")
            with self._on_device():
                cur = self._advance(arena)
                self._wait.stream(handle, f"stream {arena.name}")
                self.counters["host_syncs"] += 1
                arena.completed = cur
                self._reclaim(arena)
            for blk in arena.free_blocks():  # taken concurrently? no: nobody can use the handle now
                if arena.take(blk):
                    self._to_safe(blk)
            del self._arenas[handle]
            self._all_arenas.remove(arena)

    def accepts(self, stream: int) -> bool:
        return stream in self._arenas or stream == PER_THREAD_STREAM

    def _arena_of(self, stream: int, call: str) -> StreamArena:
        try:
            stream = stream_handle(stream)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{call}: {exc}") from None
        arena = self._arenas.get(stream)
        if arena is not None:
            return arena
        if self._closed:
            raise PoolClosed(f"{call} on the memory pool of GPU {self.device} after close()")
        if stream == PER_THREAD_STREAM:
            arena = getattr(self._local, "ptds", None)
            if arena is None:
                name = threading.current_thread().name
                arena = self._arena_type(f"gpu{self.device}/per-thread/{name}", PER_THREAD_STREAM, "per-thread",
                                         eager=True)
                with self._lock:
                    self._all_arenas.append(arena)
                self._local.ptds = arena
            return arena
        raise UnknownStream(f"{call}: stream {stream:#x} is not a stream of GPU {self.device}'s pool, the "
                            f"legacy or per-thread default stream, or a registered stream")

    # allocate --------------------------------------------------------------------------------
    def allocate(self, size: int, stream: int, owner: int | None = None) -> Allocation:
        """``size`` bytes, 256-byte aligned, usable in stream order on ``stream``. ``owner`` (a
        task attempt id, say) lets :meth:`release_owner` reclaim whatever it leaks. ``size``,
        ``stream`` and ``owner`` take any ``operator.index()`` type except ``bool``."""
        if size.__class__ is not int or stream.__class__ is not int or (owner is not None and owner.__class__ is not int):
            return self._allocate_normalized(size, stream, owner)
        if size <= 0 or size > self._max_request:   # before the stream: a refusal creates no arena
            self._bad_size(size)
        arena = self._arenas.get(stream)
        if arena is None:
            arena = self._arena_of(stream, "allocate")
        r = (size + 255) & -256
        lst = arena.bins.get(r)
        blk = None
        if lst:
            try:
                blk = lst.pop()
            except IndexError:
                pass
        if blk is None:
            blk = self._steal(r, arena) if self._steal_ok else None
            if blk is None:
                # on the calling thread, which names its own stream: never (block, waits)
                blk = self._allocate_slow(r, arena)
        blk.state = LIVE
        aid = next(self._ids)
        a = Allocation(blk.ptr, size, aid, stream, owner, blk, arena, self)
        self._live.add(a)
        if owner is not None:
            owned = self._owners.get(owner)
            if owned is None:
                owned = self._owners.setdefault(owner, {})
            owned[a] = None
        self._ledger_add(r)
        if not aid & FOLD_MASK:
            self._ledger.fold()
        return a

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

    def _trim_recent(self, arena: StreamArena) -> None:
        # Inline, not on the worker: it runs every few hundred frees, and a thread hand-off there
        # cost the H200's 1 MiB pair 2.4x. An interruption inside it can only drop entries of the
        # arena's reclaim queue (``recent``): their blocks stay in the stream's bins, counted and
        # reusable (own stream, steals, in-flight takes), just not moved to the safe index early.
        with self._lock:
            arena.trim_recent()

    def _steal(self, r: int, arena: StreamArena) -> Block | None:
        """Cross-stream reuse without the lock: a block of exactly ``r`` bytes in another
        stream's bin whose free that stream is known to have passed, or is seen to have passed
        by one stream query (advance-then-query, as ``_cover``; per-thread streams are never
        queried: only their owner can name them). At most one query per call. The C fast path
        has the same step; both must stay identical."""
        candidate = None
        for other in self._all_arenas:
            if other is arena:
                continue
            lst = other.bins.get(r)
            if not lst:
                continue
            blk = lst[-1]
            if blk.state is other and blk.epoch <= other.completed:
                if other.take(blk):
                    self._fast_steals += 1
                    return blk
            elif candidate is None and not other.eager:
                candidate = other
        if candidate is None:
            return None
        cur = candidate.epoch
        candidate.epoch = cur + 1
        self._fast_polls += 1
        if not self.backend.stream_query(candidate.handle):
            return None
        if cur > candidate.completed:
            candidate.completed = cur
        for blk in reversed(list(candidate.bins.get(r) or ())):
            if blk.state is candidate and blk.epoch <= cur and candidate.take(blk):
                self._fast_steals += 1
                return blk
        return None

    def _allocate_slow(self, r: int, arena: StreamArena) -> "Block | tuple[Block, list]":
        """Steps 2-7 (lock held). Returns the block, or (block, waits) when the block must be
        waited for on a stream only the caller can name (its per-thread stream, when this runs on
        the C path's worker): the caller queues those waits (:meth:`_queue_waits`) before using it."""
        with self._lock:
            if self._closed:
                raise PoolClosed(f"allocate on the memory pool of GPU {self.device} after close()")
            self.counters["slow_allocations"] += 1
            self._deferred_waits = waits = []
            small = r <= SMALL_REQUEST
            index = self._small if small else self._large
            blk = index.take_best_fit(r)
            if blk is None:
                with self._on_device():
                    blk = self._find(r, arena, small, index)
            blk = self._fit(blk, r)
            return (blk, waits) if waits else blk

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


    def _find(self, r: int, arena: StreamArena, small: bool, index: SafeFreeIndex) -> Block:
        # 3. poll every arena and move what has completed to the safe index.
        self._reclaim_all()
        blk = index.take_best_fit(r)
        if blk is not None:
            return blk
        own = self._own_best_fit(arena, r, small)
        if own is not None:
            return own
        # 4. grow.
        blk = self._grow(r, small)
        if blk is not None:
            return blk
        # 5. take a block in flight, waiting for it on the device.
        blk = self._take_in_flight(r, arena, small)
        if blk is not None:
            return blk
        # 6. block the host, once; then any size class will do (the split into small and large
        # chunks limits fragmentation, it must not cause an out-of-memory by itself).
        self._host_sync()
        self._reclaim_all()
        for cls in (small, not small):
            blk = ((self._small if cls else self._large).take_best_fit(r) or self._own_best_fit(arena, r, cls)
                   or self._take_in_flight(r, arena, cls))
            if blk is not None:
                return blk
        self.counters["oom"] += 1
        self._ledger.fold()
        raise OutOfDeviceMemory(
            requested_bytes=r, in_use_bytes=self._ledger.in_use, reserved_bytes=self.reserved,
            largest_free_block_bytes=max(self._small.largest(), self._large.largest(), self._largest_in_arenas()),
            waiting_on_events_bytes=self._waiting_bytes(), limit_bytes=self.limit, device=self.device,
        )

    def _fit(self, blk: Block, r: int) -> Block:
        """Cut ``blk`` (claimed, out of every container) to ``r`` bytes, placing the rest where
        its fences say. The block is marked live first, so the rest cannot merge back into it."""
        home = blk.state if isinstance(blk.state, StreamArena) else None
        blk.state = LIVE
        if blk.size - r >= ALIGNMENT:
            self._place(blk.split(r), home)
        blk.extra = None
        return blk

    def _place(self, blk: Block, home: StreamArena | None) -> None:
        """Return a free block, fenced as it was, to where it belongs (lock held)."""
        if blk.extra:
            blk.state = PENDING
            self._pending.append(blk)
        elif home is not None and blk.epoch > home.completed:
            home.push(blk)
        else:
            self._to_safe(blk)

    def _to_safe(self, blk: Block) -> None:
        (self._small if blk.chunk.small else self._large).insert(blk)

    def _own_best_fit(self, arena: StreamArena, r: int, small: bool) -> Block | None:
        """A block of another size in the requesting stream's own bins: usable at once."""
        sizes = sorted(size for size, lst in list(arena.bins.items()) if size >= r and lst)
        for size in sizes:
            lst = arena.bins[size]
            try:
                blk = lst.pop()
            except IndexError:
                continue  # the stream's other thread took it
            if blk.chunk.small == small:
                return blk  # still in the arena's state: _fit keeps the rest there
            lst.append(blk)
        return None

    @property
    def growth(self) -> str:
        """"segment" (large blocks from one expandable segment) or "chunks"."""
        return "segment" if self._granularity else "chunks"

    def _grow_segment(self, r: int) -> Block | None:
        """Memory for a large request at the end of the current segment: only what its free
        tail lacks, from spare physical pieces first, then pieces moved out of holes, then new
        memory under the limit (lock held)."""
        chunk = self._segment_chunk or self._new_segment(r)
        seg = chunk.segment
        tail = chunk.head
        while tail is not None and tail.next is not None:
            tail = tail.next
        free_tail = tail if tail is not None and tail.state is SAFE else None
        need = seg.round_up(r - (free_tail.size if free_tail is not None else 0))
        if need > seg.room():
            chunk = self._new_segment(r)
            seg, tail, free_tail = chunk.segment, None, None
            need = seg.round_up(r)
        if self._spares.bytes < need:
            self._release_holes(need - self._spares.bytes, free_tail)
        if self.reserved + max(0, need - self._spares.bytes) > self.limit:
            return None
        try:
            start, mapped, created = seg.extend(need, self._spares)
        except DeviceAllocationFailed as exc:
            log.info("GPU %d: segment growth by %d bytes failed (%s)", self.device, need, exc)
            return None
        self.reserved += created
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.counters["chunks_allocated"] += 1
        chunk.size = seg.end - seg.ptr
        blk = Block(start, mapped, chunk, tail, None)
        if tail is None:
            chunk.head = blk
        else:
            tail.next = blk
        if free_tail is not None and self._large.take(free_tail):
            free_tail.size += mapped
            free_tail.next = None
            blk = free_tail
        blk.state = SAFE
        if blk.size < r:      # the device ran out part way: keep what was mapped, report none
            self._to_safe(blk)
            return None
        return blk

    def _new_segment(self, r: int) -> Chunk:
        seg = Segment(self.backend, max(2 * min(self.limit, self._device_total), r), self._granularity)
        chunk = Chunk(seg.ptr, 0, False, seg)
        self._chunks.append(chunk)
        self._segment_chunk = chunk
        return chunk

    def _release_holes(self, want: int, keep: Block | None) -> int:
        """Unmap physical pieces that lie wholly inside free safe blocks of the segments, largest
        blocks first, until ``want`` bytes are spare; the holes become unmapped address space."""
        got = 0
        for blk in sorted((b for b in self._large.blocks() if b.chunk.segment is not None and b is not keep),
                          key=lambda b: -b.size):
            if got >= want:
                break
            if blk.size < self._granularity or not self._large.take(blk):
                continue
            blk.state = LIVE   # claimed while cut, so that nothing merges into it
            ranges = blk.chunk.segment.release_within(blk.ptr, blk.ptr + blk.size, self._spares)
            keep_parts: list[Block] = []
            cur: Block | None = blk
            for start, size in ranges:
                got += size
                if start > cur.ptr:
                    keep_parts.append(cur)
                    cur = cur.split(start - cur.ptr)
                rest = cur.split(size) if cur.size > size else None
                cur.state = UNMAPPED
                cur.extra = None
                cur = rest
                if cur is None:
                    break
            if cur is not None:
                keep_parts.append(cur)
            for part in keep_parts:
                self._to_safe(part)
            if ranges:
                self.counters["pieces_moved"] += len(ranges)
        return got

    def _grow(self, r: int, small: bool, exact: bool = False) -> Block | None:
        if not small and self._granularity:
            return self._grow_segment(r)
        if exact:
            size = -(-r // ALIGNMENT) * ALIGNMENT
        elif small:
            size = SMALL_CHUNK
        elif r <= LARGE_EXACT:
            size = LARGE_CHUNK
        else:
            size = -(-r // CHUNK_GRANULE) * CHUNK_GRANULE
        room = self.limit - self.reserved
        if size > room:
            size = room // ALIGNMENT * ALIGNMENT
        if size < r:
            return None
        try:
            ptr = self.backend.malloc(size)
        except DeviceAllocationFailed as exc:
            log.info("GPU %d: pool growth by %d bytes failed (%s)", self.device, size, exc)
            return None
        chunk = Chunk(ptr, size, small)
        self._chunks.append(chunk)
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.counters["chunks_allocated"] += 1
        blk = Block(ptr, size, chunk, None, None)
        chunk.head = blk  # the lowest block of a chunk is never merged away: runs start here
        blk.state = SAFE  # fresh memory: no stream has touched it
        return blk

    # free ------------------------------------------------------------------------------------
    def free(self, a: Allocation, stream: int | None = None) -> None:
        """Free asynchronously. Never blocks the host, never returns memory to the device.
        ``stream`` is where the last work using the buffer was queued (default: the stream it was
        allocated on, plus any recorded with :meth:`record_stream`)."""
        if stream is None:
            arena = a._arena if a.__class__ is Allocation else None
        elif stream.__class__ is not int:
            return self._free_normalized(a, stream)
        else:
            arena = self._arenas.get(stream)
            if arena is None:
                arena = self._arena_of(stream, "free")
        fenced = arena is not None and (a._extra is not None or arena.eager)
        if fenced:
            # device work first (a per-thread stream records now), while nothing has changed
            if not self._is_live(a):
                self._bad_free(a)
            stamps = self._fence_stamps(a, arena)
        try:
            self._live.remove(a)
        except (KeyError, TypeError):
            self._bad_free(a)
        a._state = FREED
        if a.owner is not None:
            owned = self._owners.get(a.owner)
            if owned is not None:
                owned.pop(a, None)
        blk = a._block
        nbytes = blk.size   # read before the block is visible to other threads: a taker may cut it
        if fenced:
            self._place_fenced(blk, arena, stamps)
        else:
            blk.epoch = arena.epoch
            blk.state = arena
            lst = arena.bins.get(nbytes)
            if lst is None:
                lst = arena.bins.setdefault(nbytes, [])
            lst.append(blk)
            arena.recent.append(blk)
            if arena.bins.get(nbytes) is not lst:   # its size class was dropped meanwhile (trim_recent)
                arena.rehome(blk, lst)
            if len(arena.recent) > arena.trim_at:
                self._trim_recent(arena)
        self._ledger_add(-nbytes)

    def _bad_free(self, a: object) -> None:
        if not isinstance(a, Allocation):
            raise InvalidFree(f"free expects an Allocation, got {type(a).__name__}")
        if a._pool is not self:
            raise InvalidFree(f"{a!r} belongs to the pool of GPU {a._pool.device}, not to this pool of GPU {self.device}")
        if self._closed:
            raise PoolClosed(f"free of {a!r} after the pool of GPU {self.device} was closed")
        why = {FREED: "double free", RELEASED: "stale handle: its owner was released and the pool reclaimed it",
               CLOSED: "the pool was closed"}.get(a._state, "not a live allocation of this pool")
        raise InvalidFree(f"free of {a!r}: {why}")

    def _is_live(self, a: object) -> bool:
        try:
            return a in self._live
        except TypeError:
            return False

    def _fence_stamps(self, a: Allocation, arena: StreamArena) -> dict[StreamArena, int]:
        """The stamps a free on ``arena`` must wait for: the freeing stream's and those of the
        streams given to ``record_stream``. A per-thread stream owned by the calling thread records
        its event now (device work only: nothing of the pool changes here)."""
        users = [arena]
        if a._extra:
            users.extend(x for x in a._extra if x is not arena)
        stamps: dict[StreamArena, int] = {}
        for user in users:
            if user.eager and user.owned_by_caller():
                try:
                    stamps[user] = self._record_eager(user)
                except CudaError as exc:
                    # No fence now: the block is reusable at once on this stream only, elsewhere
                    # once this thread's next fence (which covers every earlier stamp) completes.
                    log.warning("GPU %d: free of %r on %s could not record its event (%s)", self.device, a,
                                user.name, exc)
                    stamps[user] = user.epoch
            else:
                stamps[user] = user.epoch
        return stamps

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
            blk.epoch = 0
            blk.extra = stamps
            blk.state = PENDING
            self._pending.append(blk)

    def _record_eager(self, arena: StreamArena) -> int:
        """On the owning thread: advance, then record one event on its per-thread stream."""
        backend = self.backend
        prev = backend.get_device()
        if prev != self.device:
            backend.set_device(self.device)
        try:
            cur = arena.epoch
            arena.epoch = cur + 1
            self._fence(arena, cur, PER_THREAD_STREAM)
        finally:
            if prev != self.device:
                backend.set_device(prev)
        return cur

    def _fence(self, arena: StreamArena, stamp: int, handle: int) -> None:
        """Record a pooled event on ``handle`` covering ``arena``'s work up to ``stamp``. An event
        that fails to record goes back to the pool (never recorded: as good as new)."""
        ev = self._events.get()
        try:
            self.backend.event_record(ev, handle)
        except BaseException:
            self._events.put(ev)
            raise
        arena.fences.append((stamp, ev))

    def record_stream(self, a: Allocation, stream: int) -> None:
        """Like PyTorch's ``Tensor.record_stream``: work on ``stream`` uses the buffer too, so its
        free is ordered behind that stream as well."""
        arena = self._arena_of(stream, "record_stream")
        if a not in self._live:
            self._bad_free(a)
        if arena is a._arena:
            return
        if a._extra is None:
            a._extra = [arena]
        elif arena not in a._extra:
            a._extra.append(arena)

    # owners ----------------------------------------------------------------------------------
    def release_owner(self, owner: int) -> tuple[int, int]:
        """Free everything ``owner`` still holds, asynchronously on the streams it used, and
        return (allocations, bytes) reclaimed: the owner's leaks.

        The caller excludes allocations for ``owner`` while this runs (the TaskRegistry does,
        with its task leases): one made concurrently may be missed."""
        return self._serial(self._release_owner, owner_key(owner))

    def _release_owner(self, owner: int | None) -> tuple[int, int]:
        owned = self._owners.pop(owner, None)
        count = nbytes = 0
        if not owned:
            return 0, 0
        while owned:
            try:
                a, _ = owned.popitem()
            except KeyError:
                break
            try:
                self._live.remove(a)  # the owner's own thread may be freeing it right now
            except KeyError:
                continue
            a._state = RELEASED
            blk = a._block
            size = blk.size   # before the block is visible to other threads (a taker may cut it)
            if a._extra is not None or a._arena.eager:
                self._place_fenced(blk, a._arena, self._fence_stamps(a, a._arena))
            else:
                blk.epoch = a._arena.epoch
                a._arena.push(blk)
            self._ledger_add(-size)
            count += 1
            nbytes += a.size
        if count:
            with self._lock:
                self.counters["leaks_reclaimed"] += count
                self.counters["leaked_bytes_reclaimed"] += nbytes
            log.debug("GPU %d: reclaimed %d allocation(s), %d bytes, still held by %r at release",
                        self.device, count, nbytes, owner)
        return count, nbytes

    def owned_by(self, owner: int) -> list[Allocation]:
        return list(self._owners.get(owner_key(owner), {}))

    # polling and reclaiming (lock held) ------------------------------------------------------
    def _advance(self, arena: StreamArena) -> int:
        cur = arena.epoch
        arena.epoch = cur + 1
        return cur

    def _cover(self, arena: StreamArena) -> None:
        """Make the arena's current stamps known-complete or fenced by an event."""
        cur = self._advance(arena)
        self.counters["stream_polls"] += 1
        if self.backend.stream_query(arena.handle):
            arena.completed = max(arena.completed, cur)
            return
        self._fence(arena, cur, arena.handle)
        self.counters["events_recorded"] += 1

    def _poll(self, arena: StreamArena) -> None:
        fences = arena.fences
        while fences:
            stamp, ev = fences[0]
            self.counters["event_polls"] += 1
            if not self.backend.event_query(ev):
                return
            fences.popleft()
            if stamp > arena.completed:
                arena.completed = stamp
            self._events.put(ev)

    def _reclaim(self, arena: StreamArena) -> None:
        """Move the arena's completed blocks to the safe index, oldest first."""
        self._poll(arena)
        recent = arena.recent
        covered = False
        while recent:
            blk = recent[0]
            if blk.state is not arena:
                recent.popleft()  # stale: taken back since, or moved
                continue
            if blk.epoch > arena.completed:
                if covered or blk.epoch < arena.epoch or not arena.can_record():
                    return  # an event covers it already (or only the owner thread can): wait
                self._cover(arena)
                covered = True
                if blk.epoch > arena.completed:
                    return
                continue
            recent.popleft()
            if not arena.take(blk):
                continue
            if blk.epoch > arena.completed:   # freed again between the check and the claim
                arena.push(blk)
                return
            self._to_safe(blk)

    def _reclaim_all(self) -> None:
        for arena in list(self._all_arenas):
            if len(arena.bins) > arena.drop_at:
                arena.drop_empty()
            if arena.recent or arena.fences:
                self._reclaim(arena)
            elif arena.eager and not arena.owner_alive():
                self._all_arenas.remove(arena)  # a finished thread's empty per-thread arena
        if self._pending:
            still = []
            for blk in self._pending:
                if all(self._fence_done(user, stamp) for user, stamp in blk.extra.items()):
                    self._to_safe(blk)
                else:
                    still.append(blk)
            self._pending = still

    def _fence_done(self, user: StreamArena, stamp: int) -> bool:
        """Whether ``user``'s work up to ``stamp`` is known complete, covering it if need be."""
        if stamp <= user.completed:
            return True
        self._poll(user)
        if stamp > user.completed and stamp >= user.epoch and user.can_record():
            self._cover(user)
        return stamp <= user.completed

    def _take_in_flight(self, r: int, arena: StreamArena, small: bool) -> Block | None:
        """Best-fit block (or run of adjacent free blocks) still in flight elsewhere; the
        requesting stream waits for its fences on the device."""
        candidates: list[Block] = []
        for other in self._all_arenas:
            if other is arena:
                continue
            for size, lst in list(other.bins.items()):
                if size >= r and lst:
                    candidates.extend(b for b in list(lst) if b.state is other and b.chunk.small == small)
        candidates.extend(b for b in self._pending if b.size >= r and b.chunk.small == small)
        candidates.sort(key=lambda b: b.size)
        for blk in candidates:
            fences = self._fences_of(blk)
            if not self._waitable(fences, arena):
                continue
            if not self._claim(blk):
                continue
            self._wait_on(fences, arena)
            return blk  # _fit keeps its fences on the remainder
        return self._take_run(r, arena, small)

    @staticmethod
    def _fences_of(blk: Block) -> dict[StreamArena, int]:
        if blk.extra:
            return dict(blk.extra)
        if isinstance(blk.state, StreamArena):
            return {blk.state: blk.epoch}
        return {}

    @staticmethod
    def _waitable(fences: dict[StreamArena, int], consumer: StreamArena) -> bool:
        # A stamp that no event covers yet can be covered now, unless only another thread can.
        return all(
            user is consumer or stamp <= user.completed or user.can_record()
            or any(s >= stamp for s, _ in list(user.fences))
            for user, stamp in fences.items()
        )

    def _claim(self, blk: Block) -> bool:
        state = blk.state
        if isinstance(state, StreamArena):
            return state.take(blk)
        if state is PENDING:
            try:
                self._pending.remove(blk)
            except ValueError:
                return False
            return True
        if state is SAFE:
            return (self._small if blk.chunk.small else self._large).take(blk)
        return False

    def _wait_on(self, fences: dict[StreamArena, int], consumer: StreamArena) -> None:
        for user, stamp in fences.items():
            if user is consumer or stamp <= user.completed:
                continue
            ev = next((e for s, e in list(user.fences) if s >= stamp), None)
            if ev is None:
                self._cover(user)
                if stamp <= user.completed:
                    continue
                ev = user.fences[-1][1]
            if consumer.can_record():
                self.backend.stream_wait_event(consumer.handle, ev)
            else:   # another thread's per-thread stream: that thread queues it (_queue_waits)
                self._deferred_waits.append((user, stamp, ev))
            self.counters["gpu_waits"] += 1

    def _take_run(self, r: int, consumer: StreamArena, small: bool) -> Block | None:
        """Join adjacent free blocks of any state into one block of at least ``r`` bytes; its
        fences are the union of theirs."""
        for chunk in self._chunks:
            if chunk.small != small or chunk.size < r:
                continue
            run: list[Block] = []
            total = 0
            blk = chunk.head
            while blk is not None:
                if blk.state is not LIVE and blk.state is not UNMAPPED and self._waitable(self._fences_of(blk), consumer):
                    run.append(blk)
                    total += blk.size
                    if total >= r:
                        joined = self._join(run, consumer)
                        if joined is not None:
                            return joined
                        run, total = [], 0
                else:
                    run, total = [], 0
                blk = blk.next
        return None

    def _join(self, run: list[Block], consumer: StreamArena) -> Block | None:
        union: dict[StreamArena, int] = {}
        claimed: list[Block] = []
        for blk in run:
            fences = self._fences_of(blk)
            if not self._claim(blk):
                for b in claimed:   # lost a race: put the others back as they were
                    self._place(b, b.state if isinstance(b.state, StreamArena) else None)
                return None
            claimed.append(blk)
            for user, stamp in fences.items():
                union[user] = max(stamp, union.get(user, 0))
        self._wait_on(union, consumer)
        head = claimed[0]
        for blk in claimed[1:]:
            head.size += blk.size
            head.next = blk.next
            if blk.next is not None:
                blk.next.prev = head
        head.state = LIVE
        head.extra = union or None  # _fit passes the union on to the remainder
        self.counters["runs_joined"] += 1
        return head

    def _host_sync(self) -> None:
        """The last resort: block until every stream with blocks in flight has passed them, each
        wait bounded by ``host_wait_timeout`` (HostWaitTimeout names the stream)."""
        self.counters["host_syncs"] += 1
        for arena in list(self._all_arenas):
            if not (arena.recent or arena.fences) and not any(arena in b.extra for b in self._pending):
                continue
            if arena.can_record():
                cur = self._advance(arena)
                self._wait.stream(arena.handle, f"stream {arena.name}")
                arena.completed = max(arena.completed, cur)
                self._poll(arena)
            elif arena.fences:
                # Another thread's per-thread stream: only that thread can name it. Its own frees
                # recorded fences (_record_eager), so its latest fence covers them; a block freed
                # there from another thread (a release, say) has no fence and stays until the
                # owner thread records again (known limitation: see the closing notes / issue 13).
                self._wait.event(arena.fences[-1][1], f"stream {arena.name}")
                self._poll(arena)

    # statistics ------------------------------------------------------------------------------
    def _waiting_bytes(self) -> int:
        total = sum(b.size for b in self._pending)
        for arena in list(self._all_arenas):
            total += sum(b.size for b in arena.free_blocks() if b.epoch > arena.completed)
        return total

    def _largest_in_arenas(self) -> int:
        return max((b.size for arena in list(self._all_arenas) for b in arena.free_blocks()), default=0)

    def statistics(self) -> PoolStatistics:
        with self._lock:
            self._ledger.fold()
            free_in_arenas = sum(b.size for arena in self._all_arenas for b in arena.free_blocks())
            return PoolStatistics(
                device=self.device,
                # a closed pool lends nothing: close() dropped every allocation and returned all
                # memory; an allocate or free that raced the close may not have counted itself
                in_use_bytes=0 if self._closed else self._ledger.in_use,
                peak_in_use_bytes=self._ledger.peak,
                reserved_bytes=self.reserved,
                peak_reserved_bytes=self.peak_reserved,
                limit_bytes=self.limit,
                free_safe_bytes=self._small.bytes + self._large.bytes,
                free_in_streams_bytes=free_in_arenas,
                waiting_on_events_bytes=self._waiting_bytes(),
                largest_free_block_bytes=max(self._small.largest(), self._large.largest(), self._largest_in_arenas()),
                allocations=self._ids_issued(),
                live_allocations=0 if self._closed else len(self._live),
                events_created=self._events.created,
                streams_accepted=len(self._all_arenas),
                **self._counters_now(),
            )

    def _counters_now(self) -> dict[str, int]:
        out = dict(self.counters)
        steals, polls = (self._fast.steals, self._fast.stream_polls) if self._fast is not None else (0, 0)
        out["fast_steals"] = steals + self._fast_steals
        out["stream_polls"] += polls + self._fast_polls
        return out

    def _ids_issued(self) -> int:
        if self._fast is not None:
            return self._fast.issued
        return self._ledger.allocations

    # lifetime --------------------------------------------------------------------------------
    def _check_open(self, call: str) -> None:
        if self._closed:
            raise PoolClosed(f"{call} on the memory pool of GPU {self.device} after close()")

    def _on_device(self) -> "_DeviceScope":
        return _DeviceScope(self.backend, self.device)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> int:
        """Wait for the device to pass every block, return all memory, destroy the events.
        Returns how many allocations were still live (they are dead now). Idempotent."""
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
            self._arenas.clear()   # every later fast-path call now fails to resolve its stream
        live = list(self._live)
        self._live.clear()
        for a in live:
            a._state = CLOSED
        self._owners.clear()
        if live:
            log.warning("GPU %d: memory pool closed with %d live allocation(s)", self.device, len(live))
        with self._lock, self._on_device():
            self.backend.device_synchronize()
            for chunk in self._chunks:
                if chunk.segment is not None:
                    chunk.segment.close()
                else:
                    self.backend.free(chunk.ptr)
            self._segment_chunk = None
            self._spares.close()
            self._chunks.clear()
            self.reserved = 0
            for arena in self._all_arenas:
                arena.fences.clear()
                arena.bins.clear()
                arena.recent.clear()
            self._events.close()
        return len(live)

    def __enter__(self) -> "StreamOrderedMemoryPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _DeviceScope:
    """Make the pool's device current for a slow-path section, and restore the caller's."""

    __slots__ = ("backend", "device", "prev")

    def __init__(self, backend: DeviceBackend, device: int) -> None:
        self.backend = backend
        self.device = device
        self.prev = -1

    def __enter__(self) -> None:
        self.prev = self.backend.get_device()
        if self.prev != self.device:
            self.backend.set_device(self.device)

    def __exit__(self, *exc: object) -> None:
        if self.prev != self.device:
            self.backend.set_device(self.prev)
