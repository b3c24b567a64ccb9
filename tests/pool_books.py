"""The pool's books, checked from its chunks: every block of every chunk in exactly one place.

A block is live (lent out), in one stream arena's bins, pending, in the safe index, or unmapped
address space of a segment; the blocks of a chunk tile it without gaps; and the bytes in each
place add up to what the pool's statistics report, with nothing left over: a block that fell out
of every container (the corruption an interruption half way through a step leaves) shows up as a
state that no container holds, or as bytes missing from the sum.
"""

from __future__ import annotations

from cudabridge.memory.block import LIVE, PENDING, SAFE, UNMAPPED
from cudabridge.memory.stream_arena import StreamArena


def check_books(pool) -> dict[str, int]:
    """Assert the books balance (the pool idle: no call in flight); returns bytes per place."""
    s = pool.statistics()
    by_state = {"live": 0, "safe": 0, "stream": 0, "pending": 0}
    mapped = 0
    in_bins = {id(b) for a in list(pool._streams.all) for lst in a.bins.values() for b in lst if b.state is a}
    safe = {id(b) for b in pool._safe.small.blocks()} | {id(b) for b in pool._safe.large.blocks()}
    pending = {id(b) for b in pool._core.pending}
    live = {id(a._block) for a in list(pool._live)}
    for chunk in pool._upstream.chunks:
        blk, at = chunk.head, chunk.ptr
        while blk is not None:
            assert blk.ptr == at, "the blocks of a chunk must tile it"
            at += blk.size
            state = blk.state
            if state is not UNMAPPED:
                mapped += blk.size
                if state is LIVE:
                    key, held = "live", id(blk) in live
                elif state is SAFE:
                    key, held = "safe", id(blk) in safe
                elif state is PENDING:
                    key, held = "pending", id(blk) in pending
                elif isinstance(state, StreamArena):
                    key, held = "stream", id(blk) in in_bins
                else:
                    raise AssertionError(f"{blk!r} is in an unknown state {state!r}")
                assert held, f"{blk!r} is {key} but no container holds it (lost)"
                by_state[key] += blk.size
            blk = blk.next
    spare = pool._upstream.spare_bytes
    assert mapped + spare == s.reserved_bytes, (mapped, spare, s.reserved_bytes)
    assert s.spare_bytes == spare and by_state["pending"] == s.free_pending_bytes, (by_state, s)
    assert by_state["live"] == s.in_use_bytes, (by_state, s)
    assert by_state["safe"] == s.free_safe_bytes, (by_state, s)
    assert by_state["stream"] == s.free_in_streams_bytes, (by_state, s)
    assert s.live_allocations == len(live)
    return by_state
