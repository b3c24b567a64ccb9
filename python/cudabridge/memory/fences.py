"""Epochs and events: what the pool knows each stream has passed.

Each arena stamps its frees with its epoch (stream_arena.py). To learn that a stream has passed
its stamps, the pool *covers* them: it advances the epoch, then records one pooled event on the
stream (or sees it idle with one stream query); the event, once complete, vouches for every
earlier stamp. ``fences`` of an arena are its recorded (stamp, event) pairs, oldest first;
``completed`` is the highest stamp known passed. A block freed behind several streams carries a
dict arena -> stamp (``Block.extra``); it is safe once every one of them is done.

Everything here runs with the pool's lock held, except :meth:`Fences.record_eager` and
:meth:`Fences.stamps_for_free`, which a freeing thread runs on its own per-thread stream (device
work only: nothing of the pool changes there).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable

from ..device import PER_THREAD_STREAM, DeviceBackend
from ..errors import CudaError
from .block import Block
from .event_pool import EventPool
from .host_wait import HostWait
from .stream_arena import StreamArena

if TYPE_CHECKING:
    from .allocation import Allocation

log = logging.getLogger(__name__)


class Fences:
    __slots__ = ("backend", "device", "events", "wait", "counters")

    def __init__(self, backend: DeviceBackend, device: int, events: EventPool, wait: HostWait,
                 counters: dict[str, int]) -> None:
        self.backend = backend
        self.device = device
        self.events = events
        self.wait = wait
        self.counters = counters

    @staticmethod
    def advance(arena: StreamArena) -> int:
        """Start a new epoch; returns the one that ended (every free stamped so far has it or less)."""
        cur = arena.epoch
        arena.epoch = cur + 1
        return cur

    def cover(self, arena: StreamArena) -> None:
        """Make the arena's current stamps known-complete or fenced by an event."""
        cur = self.advance(arena)
        self.counters["stream_polls"] += 1
        if self.backend.stream_query(arena.handle):
            arena.completed = max(arena.completed, cur)
            return
        self.fence(arena, cur, arena.handle)
        self.counters["events_recorded"] += 1

    def fence(self, arena: StreamArena, stamp: int, handle: int) -> None:
        """Record a pooled event on ``handle`` covering ``arena``'s work up to ``stamp``. An event
        that fails to record goes back to the pool (never recorded: as good as new)."""
        ev = self.events.get()
        try:
            self.backend.event_record(ev, handle)
        except BaseException:
            self.events.put(ev)
            raise
        arena.fences.append((stamp, ev))

    def poll(self, arena: StreamArena) -> None:
        """Retire the arena's completed fences, oldest first, raising ``completed``."""
        fences = arena.fences
        while fences:
            stamp, ev = fences[0]
            self.counters["event_polls"] += 1
            if not self.backend.event_query(ev):
                return
            fences.popleft()
            if stamp > arena.completed:
                arena.completed = stamp
            self.events.put(ev)

    def done(self, user: StreamArena, stamp: int) -> bool:
        """Whether ``user``'s work up to ``stamp`` is known complete, covering it if need be."""
        if stamp <= user.completed:
            return True
        self.poll(user)
        if stamp > user.completed and stamp >= user.epoch and user.can_record():
            self.cover(user)
        return stamp <= user.completed

    def record_eager(self, arena: StreamArena) -> int:
        """On the owning thread: advance, then record one event on its per-thread stream."""
        backend = self.backend
        prev = backend.get_device()
        if prev != self.device:
            backend.set_device(self.device)
        try:
            cur = self.advance(arena)
            self.fence(arena, cur, PER_THREAD_STREAM)
        finally:
            if prev != self.device:
                backend.set_device(prev)
        return cur

    def stamps_for_free(self, a: Allocation, arena: StreamArena) -> dict[StreamArena, int]:
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
                    stamps[user] = self.record_eager(user)
                except CudaError as exc:
                    # No fence now: the block is reusable at once on this stream only, elsewhere
                    # once this thread's next fence (which covers every earlier stamp) completes.
                    log.warning("GPU %d: free of %r on %s could not record its event (%s)", self.device, a,
                                user.name, exc)
                    stamps[user] = user.epoch
            else:
                stamps[user] = user.epoch
        return stamps

    @staticmethod
    def of(blk: Block) -> dict[StreamArena, int]:
        """A free block's fences: arena -> stamp that must be passed before another stream uses it."""
        if blk.extra:
            return dict(blk.extra)
        if isinstance(blk.state, StreamArena):
            return {blk.state: blk.epoch}
        return {}

    @staticmethod
    def waitable(fences: dict[StreamArena, int], consumer: StreamArena) -> bool:
        """Whether ``consumer`` can wait for ``fences`` on the device: a stamp that no event
        covers yet can be covered now, unless only another thread can."""
        return all(
            user is consumer or stamp <= user.completed or user.can_record()
            or any(s >= stamp for s, _ in list(user.fences))
            for user, stamp in fences.items()
        )

    def event_for(self, user: StreamArena, stamp: int) -> int | None:
        """An event whose completion means ``user`` passed ``stamp`` (covering it now if no
        recorded one does), or None: it is known passed."""
        ev = next((e for s, e in list(user.fences) if s >= stamp), None)
        if ev is None:
            self.cover(user)
            if stamp <= user.completed:
                return None
            ev = user.fences[-1][1]
        return ev

    def host_sync(self, arenas: Iterable[StreamArena], pending: list[Block]) -> None:
        """The last resort: block until every stream with blocks in flight has passed them, each
        wait bounded by ``host_wait_timeout`` (HostWaitTimeout names the stream)."""
        self.counters["host_syncs"] += 1
        for arena in list(arenas):
            if not (arena.recent or arena.fences) and not any(arena in b.extra for b in pending):
                continue
            if arena.can_record():
                cur = self.advance(arena)
                self.wait.stream(arena.handle, f"stream {arena.name}")
                arena.completed = max(arena.completed, cur)
                self.poll(arena)
            elif arena.fences:
                # Another thread's per-thread stream: only that thread can name it. Its own frees
                # recorded fences (record_eager), so its latest fence covers them; a block freed
                # there from another thread (a release, say) has no fence and stays until the
                # owner thread records again (a known limitation, in the README).
                self.wait.event(arena.fences[-1][1], f"stream {arena.name}")
                self.poll(arena)
