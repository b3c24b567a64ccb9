"""The executor's page-locked host memory, owned by the service: pinned buffers from its pinned
pool (pinned_pool.py) and host memory its users registered (``cudaHostRegister``), which never
overlap; and, per task, the ranges it unregistered, into which copies are refused.

Every front reaches these through the service (``service.page_locked``): Python task code and the
Java bridge alike (jvm/hot_path.py is an adapter that adds Java's leases and counters). Copies
look a host range up here to learn whether it is page-locked (one asynchronous DMA) or pageable
(staged), and record the stream they queue on, which a buffer's reuse and an unregistration wait
for.

The C twin of the Java hot path reads the tables without calling into Python (``tables``, a
:class:`RegionTables`: jvm/hotcore_copies.h's find_region): that is the whole interface it has to
them, and these invariants are what it relies on:

* the tables are written under ``lock`` only, each step leaving them valid for a reader between
  two steps (a range grows before what it covers is taken out);
* a DMA from or into a region is queued, and its stream added to the region's ``streams``, only
  while the region is in the tables (under ``lock``, or in C with the GIL held and no Python code
  run between the lookup and the DMA's queueing); so once :meth:`unregister` has taken a region
  out, the streams it finds are all it must wait for;
* regions never overlap each other, unregistered ranges never overlap each other or a region:
  one bisect per table finds the one a range can touch.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any, NamedTuple

from ..errors import InvalidArgument
from .pinned_pool import PinnedBlock, PinnedHostPool


class RegisteredRegion:
    """A region :meth:`PageLockedRegions.register` page-locked: the streams asynchronous copies
    from or into it were queued on, which :meth:`PageLockedRegions.unregister` waits for before
    the memory is unlocked (a pinned block keeps the same set for its reuse)."""

    __slots__ = ("streams",)

    def __init__(self) -> None:
        self.streams: set[int] = set()


class RegionTables(NamedTuple):
    """What the C twin reads (module docstring): the same objects for the regions' life."""

    bases: list[int]              # the regions' first bytes, sorted
    memory: dict[int, Any]        # base -> its memory (len() is its size)
    users: dict[int, Any]         # base -> its PinnedBlock or RegisteredRegion (.streams)
    unregistered: dict[int, tuple[list[int], dict[int, int]]]   # task (0: none) -> (sorted bases, base -> size)


class PageLockedRegions:
    """See the module docstring. ``pinned_pool_bytes``: the pinned pool's reservation."""

    UNREGISTERED_KEPT = 1024   # unregistered ranges remembered per task (0: none), to refuse copies into them

    def __init__(self, backend: Any, pinned_pool_bytes: int) -> None:
        self._backend = backend
        self.pinned_pool = PinnedHostPool(backend, pinned_pool_bytes)
        self.lock = threading.Lock()
        self._bases: list[int] = []
        self._memory: dict[int, Any] = {}
        self._users: dict[int, Any] = {}
        self._unregistered: dict[int, tuple[list[int], dict[int, int]]] = {}
        self._registered: set[int] = set()                 # bases in _memory that register added
        self._blocks: dict[int, PinnedBlock] = {}          # address -> block of alloc_pinned
        self._by_task: dict[int, set[int]] = {}            # owning task -> its blocks' addresses
        self.tables = RegionTables(self._bases, self._memory, self._users, self._unregistered)
        self.reclaimed = 0   # pinned buffers reclaimed at their tasks' releases

    # pinned buffers --------------------------------------------------------------------------
    def alloc_pinned(self, nbytes: int, owner: int = 0) -> PinnedBlock:
        """A pinned buffer of ``nbytes`` (page-locked, or the pool's pageable fallback: its
        ``pinned`` says which), reclaimed with task ``owner``'s release (0: never; the caller
        holds the owner's lease)."""
        block = self.pinned_pool.allocate(nbytes)   # refuses a bad size; falls back as the pool says
        with self.lock:
            self._blocks[block.address] = block
            if owner:
                block.owner = owner
                self._by_task.setdefault(owner, set()).add(block.address)
            if block.pinned:   # pageable memory is not looked up: its copies are staged
                self._drop_unregistered(block.address, block.address + block.size)
                self._users[block.address] = block
                self._memory[block.address] = block.view
                bisect.insort(self._bases, block.address)
        return block

    def free_pinned(self, address: int) -> None:
        """Back to the pinned pool, reused once the copies queued from or into it have passed."""
        with self.lock:
            block = self._blocks.pop(address, None)
            if block is None:
                raise InvalidArgument(f"free_pinned: {address!r} is not a pinned buffer of this bridge (freed "
                                      f"already, or reclaimed with its task)")
            owned = self._by_task.get(block.owner)
            if owned is not None:
                owned.discard(address)
            if block.pinned:
                del self._bases[bisect.bisect_left(self._bases, address)]
                del self._memory[address]
                del self._users[address]
        self.pinned_pool.free(block)

    @property
    def pinned_buffers(self) -> int:
        """Pinned buffers handed out and not freed."""
        return len(self._blocks)

    def block(self, address: int) -> PinnedBlock | None:
        """The pinned buffer at ``address``, or None."""
        return self._blocks.get(address)

    # registrations ---------------------------------------------------------------------------
    def register(self, address: int, nbytes: int) -> None:
        """Page-lock [address, address + nbytes) until :meth:`unregister` (``cudaHostRegister``):
        copies from and to it run asynchronously at the link's speed. Meant for long-lived regions:
        once per buffer, never per batch. A range overlapping a registered one (or a pinned
        buffer) is refused."""
        if address.__class__ is not int or nbytes.__class__ is not int or address <= 0 or nbytes <= 0:
            raise InvalidArgument(f"register_host: a non-zero address and a positive size, got {address!r}, {nbytes!r}")
        with self.lock:
            i = bisect.bisect_right(self._bases, address + nbytes - 1) - 1
            if i >= 0:
                base = self._bases[i]
                if base + len(self._memory[base]) > address:
                    raise InvalidArgument(f"register_host: [{address:#x}, +{nbytes}) overlaps the page-locked "
                                          f"[{base:#x}, +{len(self._memory[base])}) (registered or pinned already)")
            region = self._backend.host_register(address, nbytes)
            self._drop_unregistered(address, address + nbytes)   # registered again: copies are fine
            self._users[address] = RegisteredRegion()
            self._memory[address] = region
            self._registered.add(address)
            bisect.insort(self._bases, address)

    def unregister(self, address: int, task: int = 0) -> None:
        """Undo :meth:`register` of the region starting at ``address``, by ``task`` (0: none).
        First waits for the streams that copies from or into the region were queued on (its
        memory may be freed once this returns; nothing reads or writes it afterwards), then
        unlocks it. Copies by that task into the range are refused from then on until its
        release, a use after close in its own code; with no task, every copy is refused. Past the
        task the memory may be a new allocation of someone else's, which copies may use. Either
        way a new registration (or pinned buffer) lifts it where it covers it. Up to
        UNREGISTERED_KEPT ranges are remembered per task (the oldest go first)."""
        if task.__class__ is not int:
            raise InvalidArgument(f"unregister_host: the task is an int (0: none), got {task!r}")
        with self.lock:
            if address not in self._registered:
                raise InvalidArgument(f"unregister_host: {address!r} is not the start of a registered region")
            # out of the tables first: no copy queues a DMA from or into it after this step
            # (the module's invariant), so the streams recorded now are all that used it
            del self._bases[bisect.bisect_left(self._bases, address)]
            region = self._memory.pop(address)
            used = self._users.pop(address)
            self._registered.discard(address)
            self._remember_unregistered(task, address, len(region))
        # The DMAs queued from or into it run before the memory is unlocked (cudaHostUnregister of
        # memory a DMA still reads is undefined; its free afterwards crashed the JVM). A failed
        # wait (a sticky error) leaves it page-locked: the error is raised, the region stays out.
        for stream in sorted(used.streams):
            self._backend.stream_synchronize(stream)
        self._backend.host_unregister(region)

    def _remember_unregistered(self, task: int, base: int, size: int) -> None:
        """Add [base, base + size) to ``task``'s unregistered ranges (under lock), one range with
        those of the task it touches. It overlaps none (it was a registered region)."""
        table = self._unregistered.get(task)
        if table is None:
            table = self._unregistered[task] = ([], {})
        bases, sizes = table
        end = base + size
        i = bisect.bisect_left(bases, base)
        right = bases[i] if i < len(bases) and bases[i] == end else None
        if right is not None:
            end += sizes[right]
        # each step leaves the tables valid for a reader between two of them (the C twin's
        # find_region): a range grows before what it covers is taken out
        if i > 0 and bases[i - 1] + sizes[bases[i - 1]] == base:
            sizes[bases[i - 1]] = end - bases[i - 1]
        else:
            sizes[base] = end - base
            bases.insert(i, base)
            i += 1
        if right is not None:
            del bases[i]
            del sizes[right]
        while len(sizes) > self.UNREGISTERED_KEPT:
            oldest = next(iter(sizes))
            del bases[bisect.bisect_left(bases, oldest)]
            del sizes[oldest]

    def _drop_unregistered(self, start: int, end: int) -> None:
        """Forget what the unregistered ranges of every task hold of [start, end) (under lock):
        that memory is page-locked again, by a new registration or a pinned buffer. What lies
        outside it stays refused."""
        for task, (bases, sizes) in list(self._unregistered.items()):
            i = bisect.bisect_left(bases, end) - 1
            while i >= 0 and bases[i] + sizes[bases[i]] > start:
                b = bases[i]
                e = b + sizes[b]
                # each step leaves the tables valid for a reader between two of them, as above
                if e > end:   # what lies past it: a range of its own
                    sizes[end] = e - end
                    bases.insert(i + 1, end)
                if b < start:   # what lies before it: the range, shortened
                    sizes[b] = start - b
                else:
                    del bases[i]
                    del sizes[b]
                i -= 1
            if not sizes and task:
                del self._unregistered[task]

    @property
    def unregistered_ranges(self) -> int:
        """Unregistered ranges remembered, all tasks'."""
        return sum(len(sizes) for _, sizes in list(self._unregistered.values()))

    # copies ----------------------------------------------------------------------------------
    def lookup(self, call: str, address: int, nbytes: int, task: int) -> tuple[int, Any] | None:
        """(start, memory) of the pinned buffer or registered region [address, address + nbytes)
        lies in, or None (pageable memory); under ``lock``. Refused: a range that runs past (or
        into) such a region without lying inside it (host memory is either one region's or
        none's); a copy by ``task`` into a range it (or no task) unregistered (its memory may be
        freed). One bisect in each table: O(log n) in the regions and the unregistered ranges."""
        end = address + nbytes
        probe = address + max(nbytes, 1)   # the range's end, or its first byte when empty
        # regions never overlap: the one a range lies in, or one it overlaps without lying inside
        # it, is the last region starting before the range's end
        bases = self._bases
        i = bisect.bisect_left(bases, probe) - 1
        buf = self._memory.get(bases[i]) if i >= 0 else None
        if buf is not None:
            base, size = bases[i], len(buf)
            if base <= address and end <= base + size:
                return base, buf   # no unregistered range overlaps a page-locked region
            if nbytes > 0 and address < base + size:
                raise InvalidArgument(f"{call}: [{address:#x}, +{nbytes}) runs past the page-locked "
                                      f"[{base:#x}, +{size}) (a registered region or a pinned buffer): a "
                                      f"copy's host range lies inside one region or outside them all")
        for by in (task, 0) if task else (0,):
            table = self._unregistered.get(by)
            if table is None:
                continue
            ubases, sizes = table
            # they never overlap: the last starting before the range's end ends last of those
            j = bisect.bisect_left(ubases, probe) - 1
            if j >= 0 and ubases[j] + sizes[ubases[j]] > address:
                base, size = ubases[j], sizes[ubases[j]]
                raise InvalidArgument(f"{call}: [{address:#x}, +{nbytes}) is in [{base:#x}, +{size}), unregistered "
                                      f"(unregister_host) by {'task ' + str(by) if by else 'the executor'}: its "
                                      f"memory may have been freed (register it again if it is a new allocation)")
        return None

    def used_on(self, base: int, stream: int) -> None:
        """An asynchronous copy of the region at ``base`` is queued on ``stream`` (under ``lock``):
        a pinned buffer there is then reused only once that stream has passed it
        (PinnedHostPool.free), a registration unlocked only once it has (:meth:`unregister`)."""
        self._users[base].streams.add(stream)

    def view(self, address: int, nbytes: int, stream: int, region: tuple[int, Any]) -> memoryview:
        """The page-locked memory behind ``address`` (``region``, from :meth:`lookup`) for a copy
        of ``nbytes`` queued on ``stream``, its use recorded; under ``lock``."""
        base, buf = region
        self.used_on(base, stream)
        off = address - base
        return memoryview(buf).cast("B")[off:off + nbytes]

    # task end, close -------------------------------------------------------------------------
    def forget_task(self, task: int) -> int:
        """At ``task``'s release: its unregistered ranges go (past it their memory may be anyone's)
        and its pinned buffers are reclaimed. Returns how many buffers were."""
        if task in self._unregistered:
            with self.lock:
                self._unregistered.pop(task, None)
        reclaimed = 0
        for address in sorted(self._by_task.pop(task, ())):
            try:
                self.free_pinned(address)
                reclaimed += 1
                self.reclaimed += 1
            except InvalidArgument:   # freed on another thread meanwhile
                pass
        return reclaimed

    def close(self) -> None:
        """Give the pinned pool's memory back (at shutdown: the streams are drained)."""
        self.pinned_pool.close()
