"""A stream arena that ignores stream order: the pool's test-only extension (``arena_type``).

It claims that its stream's work is always complete, so a block freed on it is handed to any
other stream at once (stolen, or reclaimed into the safe index) while the freeing stream's queued
work may still use it: the seven-step race (pool_scenarios.py's ``seven_step``). Tests use it to
show that the race can happen, so that the tests guarding against it can fail. It enters a pool as
``StreamOrderedMemoryPool(..., arena_type=NaiveArena)`` or, in a service or an executor, through
the ``testStreamArena`` setting (``naive_arena:NaiveArena``, with this folder on the Python path).
"""

from __future__ import annotations

from cudabridge.memory.stream_arena import StreamArena

EVERYTHING = 1 << 62   # "every stamp is known complete": larger than any epoch a test reaches


class NaiveArena(StreamArena):
    __slots__ = ()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.completed = EVERYTHING
