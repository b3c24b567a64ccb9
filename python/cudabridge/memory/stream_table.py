"""The streams a pool accepts, each with its arena (stream_arena.py).

``by_handle`` maps a stream handle to its arena: the legacy default stream (as 0 and 1), the
GPU's pool streams, and registered external streams; the fast paths (Python and C) look a
stream up there with one dict lookup. Each thread's per-thread default stream
(``cudaStreamPerThread``, handle 2) names a different stream per thread, so its arena lives in
a thread-local and is made on the thread's first use. ``all`` lists every arena, per-thread ones
included, for the slow path's polling; it changes under the pool's lock only.
"""

from __future__ import annotations

import threading
from typing import Iterable

from ..device import LEGACY_STREAM, PER_THREAD_STREAM
from ..errors import InvalidArgument, PoolClosed, UnknownStream, index_int
from .stream_arena import StreamArena

MAX_HANDLE = (1 << 64) - 1      # stream handles are pointers (cudaStream_t)


def stream_handle(value: object) -> int:
    """A stream handle: an int in [0, 2**64) (0, 1 and 2 are the default streams)."""
    h = index_int(value, "stream", "an int handle")
    if not 0 <= h <= MAX_HANDLE:
        raise InvalidArgument(f"stream handle {h} is not a cudaStream_t (an address in [0, 2**64))")
    return h


class StreamTable:
    __slots__ = ("device", "arena_type", "lock", "by_handle", "all", "closed", "_local")

    def __init__(self, device: int, arena_type: type[StreamArena], lock: threading.Lock,
                 streams: Iterable[int] = ()) -> None:
        self.device = device
        self.arena_type = arena_type
        self.lock = lock                  # the pool's lock: ``all`` changes under it
        self.by_handle: dict[int, StreamArena] = {}
        self.all: list[StreamArena] = []
        self.closed = False
        self._local = threading.local()
        legacy = arena_type(f"gpu{device}/legacy", LEGACY_STREAM, "legacy")
        self.by_handle[LEGACY_STREAM] = legacy
        self.by_handle[0] = legacy
        self.all.append(legacy)
        for handle in streams:
            self.add(handle, "pool")

    def add(self, handle: int, kind: str) -> StreamArena:
        """Accept one more stream (lock held, or during construction)."""
        handle = stream_handle(handle)
        if handle in (0, LEGACY_STREAM, PER_THREAD_STREAM):
            raise InvalidArgument(f"stream handle {handle!r} cannot be added: 0, 1 and 2 are the default streams")
        if handle in self.by_handle:
            raise InvalidArgument(f"stream {handle:#x} is already accepted by the pool of GPU {self.device}")
        arena = self.arena_type(f"gpu{self.device}/{kind}/{handle:#x}", handle, kind)
        self.by_handle[handle] = arena
        self.all.append(arena)
        return arena

    def remove(self, arena: StreamArena) -> None:
        """Stop accepting a stream (lock held); its arena must hold no blocks."""
        del self.by_handle[arena.handle]
        self.all.remove(arena)

    def accepts(self, stream: int) -> bool:
        return stream in self.by_handle or stream == PER_THREAD_STREAM

    def resolve(self, stream: object, call: str) -> StreamArena:
        """The arena of ``stream`` for ``call`` (its name, for errors): the fast paths' fallback
        when their dict lookup misses, and the one place that says why a stream is refused."""
        try:
            stream = stream_handle(stream)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{call}: {exc}") from None
        arena = self.by_handle.get(stream)
        if arena is not None:
            return arena
        if self.closed:
            raise PoolClosed(f"{call} on the memory pool of GPU {self.device} after close()")
        if stream == PER_THREAD_STREAM:
            arena = getattr(self._local, "ptds", None)
            if arena is None:
                name = threading.current_thread().name
                arena = self.arena_type(f"gpu{self.device}/per-thread/{name}", PER_THREAD_STREAM, "per-thread",
                                        eager=True)
                with self.lock:
                    self.all.append(arena)
                self._local.ptds = arena
            return arena
        raise UnknownStream(f"{call}: stream {stream:#x} is not a stream of GPU {self.device}'s pool, the "
                            f"legacy or per-thread default stream, or a registered stream")

    def forget_blocks(self) -> None:
        """Empty every arena (the pool closed: its memory went back to the device)."""
        for arena in self.all:
            arena.fences.clear()
            arena.bins.clear()
            arena.recent.clear()

    def close(self) -> None:
        """Refuse every stream from now on (lock held): later fast-path lookups all miss."""
        self.closed = True
        self.by_handle.clear()
