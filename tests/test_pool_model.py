"""Model-based test: hypothesis drives the service's pool, task registry and streams against a plain
reference model, on one thread, deterministically (tests/latched_backend.py: a stream's work
completes only when a rule lets it), with the emulated device's race detector on.

After every step: no live block is handed out twice (live ranges are disjoint), bytes are
conserved (in use + free + waiting + spare == reserved, and every block of every chunk is in
exactly one state), the pool's numbers match the model's, and the race detector saw no access
that stream order does not allow (no block reused on another stream before the freeing stream's
work completed). Every refused call leaves the state unchanged.

Bounded for CI; ``CUDABRIDGE_MODEL_EXAMPLES=N`` runs N examples per fast path (default 40).
"""

from __future__ import annotations

import os

import pytest
from device_kernels import fill_u32_async
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule
from latched_backend import LatchedBackend

from cudabridge.config import ServiceConfig
from cudabridge.device import LEGACY_STREAM, PER_THREAD_STREAM, EmulatedBackend
from cudabridge.errors import InvalidArgument, InvalidFree, OutOfDeviceMemory, PoolClosed, UnknownStream, UnknownTask
from cudabridge.memory import native
from cudabridge.memory.block import LIVE, PENDING, SAFE, UNMAPPED
from cudabridge.memory.stream_arena import StreamArena
from cudabridge.service import CudaBridgeService

MiB = 1 << 20
EXAMPLES = int(os.environ.get("CUDABRIDGE_MODEL_EXAMPLES", "40"))
SIZES = st.sampled_from([1, 255, 256, 4000, 65536, 300_000, MiB, MiB + 1, 3 * MiB, 5 * MiB])
BAD_SIZES = st.sampled_from([0, -1, 1.0, True, "64", None, 1 << 70])


def rounded(size: int) -> int:
    return (size + 255) & -256


class PoolModel(RuleBasedStateMachine):
    """One GPU, three pool streams plus the legacy and per-thread default streams."""

    fast_path = "python"
    allocations = Bundle("allocations")

    def __init__(self) -> None:
        super().__init__()
        self.backend = LatchedBackend(EmulatedBackend(devices=1, memory_bytes=64 * MiB, race_check=True))
        self.service = CudaBridgeService(
            # oomWait 1 ms: the model is one thread, so a task's allocation that does not fit while
            # another task holds memory (between its operations, for the breaker) would wait the
            # whole default 60 s for a free that never comes; it models the pool, not the waits
            # (tests/test_memory_pressure.py does)
            ServiceConfig(streams_per_gpu=3, high_priority_streams=0, pool_limit="12m", log_level="CRITICAL",
                          oom_wait=0.001),
            backend=self.backend)
        self.pool = self.service.memory_pool(0)
        self.pool._fences.wait.timeout_s = None   # no wall-clock deadline: the latches decide (see latched_backend)
        assert self.pool.fast_path == self.fast_path
        self.streams = list(self.service.stream_pool(0).handles) + [LEGACY_STREAM, PER_THREAD_STREAM]
        self.live: dict[int, tuple[object, int, int, int | None]] = {}   # id -> (allocation, ptr, size, owner)
        self.dead: list[object] = []
        self.last_user: dict[int, int] = {}   # allocation id -> stream of the last work queued on it
        self.tasks: set[int] = set()
        self.next_task = 1
        self.closed = False

    # helpers -----------------------------------------------------------------------------------
    def unchanged(self):
        s = self.pool.statistics()
        return (s.in_use_bytes, s.live_allocations, s.allocations, s.reserved_bytes, s.streams_accepted,
                s.free_safe_bytes + s.free_in_streams_bytes, len(self.live), self.service.registry.tasks_bound)

    def refused(self, errors, fn, *args, **kw):
        before = self.unchanged()
        with pytest.raises(errors):
            fn(*args, **kw)
        assert self.unchanged() == before

    # allocate / free -----------------------------------------------------------------------------
    @precondition(lambda self: not self.closed)
    @rule(target=allocations, size=SIZES, k=st.integers(0, 4))
    def allocate(self, size, k):
        try:
            a = self.pool.allocate(size, self.streams[k])
        except OutOfDeviceMemory:
            return None
        self.live[a.id] = (a, a.ptr, a.size, None)
        return a

    @precondition(lambda self: not self.closed and self.tasks)
    @rule(target=allocations, size=SIZES, pick=st.integers(0, 1 << 30))
    def allocate_for_task(self, size, pick):
        task = sorted(self.tasks)[pick % len(self.tasks)]
        try:
            a = self.service.allocate(task, size)
        except OutOfDeviceMemory:
            return None
        self.live[a.id] = (a, a.ptr, a.size, task)
        return a

    def use(self, a, stream, value, slow=False):
        """Queue work on ``stream`` that writes the block, ordered after the block's last user
        (as correct task code must be); a second stream is declared with ``record_stream`` so
        that the free waits for it too. The race detector checks the pool kept its side."""
        last = self.last_user.get(a.id, a.stream)
        if last != stream:
            ev = self.backend.event_create()
            self.backend.event_record(ev, last)
            self.backend.stream_wait_event(stream, ev)
            self.backend.event_destroy(ev)
        if stream != a.stream:
            a.record_stream(stream)
        if slow:
            fill_u32_async(self.backend, a.ptr, max(1, a.size // 4), value, stream)
        else:
            self.backend.memset_async(a.ptr, value, a.size, stream)
        self.last_user[a.id] = stream

    @precondition(lambda self: not self.closed)
    @rule(a=allocations, value=st.integers(0, 255), slow=st.booleans())
    def write(self, a, value, slow):
        """Work on the block's own stream."""
        if a is None or a.id not in self.live:
            return
        self.use(a, a.stream, value, slow)

    @precondition(lambda self: not self.closed)
    @rule(a=allocations, k=st.integers(0, 4))
    def use_on_another_stream(self, a, k):
        if a is None or a.id not in self.live:
            return
        self.use(a, self.streams[k], 1)

    @precondition(lambda self: not self.closed)
    @rule(a=consumes(allocations), switch=st.integers(0, 5))
    def free(self, a, switch):
        if a is None:
            return
        if a.id not in self.live:   # reclaimed by its task's release: a stale handle
            self.refused(InvalidFree, a.free)
            return
        if switch < 5:
            # The last work on the block was queued on another stream: free it there.
            self.use(a, self.streams[switch], 2)
            a.free(self.streams[switch])
        else:
            a.free()
        del self.live[a.id]
        self.dead.append(a)

    @precondition(lambda self: not self.closed and self.dead)
    @rule(pick=st.integers(0, 1 << 30))
    def double_free(self, pick):
        a = self.dead[pick % len(self.dead)]
        self.refused(InvalidFree, a.free)

    @precondition(lambda self: not self.closed)
    @rule(size=BAD_SIZES, k=st.integers(0, 4))
    def bad_allocate(self, size, k):
        self.refused(InvalidArgument, self.pool.allocate, size, self.streams[k])

    @precondition(lambda self: not self.closed)
    @rule(stream=st.sampled_from([3, 0xDEAD0, -5, 1.0, True, 1 << 70]))
    def bad_stream(self, stream):
        self.refused((UnknownStream, InvalidArgument), self.pool.allocate, 256, stream)

    @precondition(lambda self: not self.closed)
    @rule(owner=st.sampled_from([[], "t", 2.0, False]))
    def bad_owner(self, owner):
        self.refused(InvalidArgument, self.pool.allocate, 256, self.streams[0], owner=owner)

    # tasks ---------------------------------------------------------------------------------------
    @precondition(lambda self: not self.closed)
    @rule()
    def bind(self):
        self.service.bind_task(self.next_task)
        self.tasks.add(self.next_task)
        self.next_task += 1

    @precondition(lambda self: not self.closed and self.tasks)
    @rule(pick=st.integers(0, 1 << 30))
    def release(self, pick):
        task = sorted(self.tasks)[pick % len(self.tasks)]
        held = [aid for aid, (_, _, _, owner) in self.live.items() if owner == task]
        report = self.service.release_task(task)
        assert report.leaks_reclaimed == len(held)
        assert report.leaked_bytes_reclaimed == sum(self.live[aid][2] for aid in held)
        for aid in held:
            self.dead.append(self.live.pop(aid)[0])
        self.tasks.discard(task)

    @precondition(lambda self: not self.closed)
    @rule(task=st.sampled_from([0, 10_000, True, 1.0]))
    def bad_task(self, task):
        err = InvalidArgument if task.__class__ is not int else UnknownTask
        self.refused(err, self.service.allocate, task, 256)
        self.refused(err, self.service.release_task, task)

    # streams -------------------------------------------------------------------------------------
    @precondition(lambda self: not self.closed)
    @rule(k=st.integers(0, 4))
    def complete(self, k):
        self.backend.complete(self.streams[k])

    @precondition(lambda self: not self.closed)
    @rule()
    def close(self):
        self.service.close()
        self.closed = True
        for aid in list(self.live):
            self.dead.append(self.live.pop(aid)[0])
        self.tasks.clear()
        self.refused(PoolClosed, self.pool.allocate, 256, self.streams[0])

    @precondition(lambda self: self.closed)
    @rule(k=st.integers(0, 4))
    def after_close(self, k):
        self.refused(PoolClosed, self.pool.allocate, 256, self.streams[k])
        self.refused(PoolClosed, self.service.bind_task, self.next_task)
        if self.dead:
            self.refused((PoolClosed, InvalidFree), self.dead[k % len(self.dead)].free)

    # invariants ----------------------------------------------------------------------------------
    @invariant()
    def no_race(self):
        assert not self.backend.inner.races, self.backend.inner.races

    @invariant()
    def books_balance(self):
        s = self.pool.statistics()
        if self.closed:
            assert (s.in_use_bytes, s.live_allocations, s.reserved_bytes) == (0, 0, 0)
            return
        assert s.live_allocations == len(self.live)
        assert s.in_use_bytes == sum(rounded(size) for _, _, size, _ in self.live.values())
        pending = sum(b.size for b in self.pool._core.pending)
        spare = self.pool._upstream.spare_bytes
        assert (s.free_pending_bytes, s.spare_bytes) == (pending, spare)
        assert s.in_use_bytes + s.free_safe_bytes + s.free_in_streams_bytes + pending + spare == s.reserved_bytes
        # every block of every chunk in exactly one place, chunks tiled without gaps
        by_state = {"live": 0, "safe": 0, "stream": 0, "pending": 0}
        mapped = 0
        for chunk in self.pool._upstream.chunks:
            blk, at = chunk.head, chunk.ptr
            while blk is not None:
                assert blk.ptr == at, "blocks of a chunk must tile it"
                at += blk.size
                state = blk.state
                if state is UNMAPPED:
                    blk = blk.next
                    continue
                mapped += blk.size
                key = ("live" if state is LIVE else "safe" if state is SAFE else "pending" if state is PENDING
                       else "stream" if isinstance(state, StreamArena) else None)
                assert key is not None, f"block in an unknown state {state!r}"
                by_state[key] += blk.size
                blk = blk.next
        assert mapped + spare == s.reserved_bytes
        assert by_state["live"] == s.in_use_bytes
        assert by_state["safe"] == s.free_safe_bytes
        assert by_state["stream"] == s.free_in_streams_bytes
        assert by_state["pending"] == pending

    @invariant()
    def live_blocks_are_disjoint(self):
        ranges = sorted((ptr, rounded(size)) for _, ptr, size, _ in self.live.values())
        for (p0, n0), (p1, _) in zip(ranges, ranges[1:]):
            assert p0 + n0 <= p1, f"block {p1:#x} handed out twice (overlaps {p0:#x}+{n0})"

    def teardown(self):
        try:
            if not self.closed:
                self.service.close()
        finally:
            self.backend.close()
        assert not self.backend.inner.races, self.backend.inner.races


SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


class PythonPathModel(PoolModel):
    fast_path = "python"

    def __init__(self) -> None:
        os.environ[native.ENV_SWITCH] = "0"
        try:
            super().__init__()
        finally:
            os.environ.pop(native.ENV_SWITCH, None)


class NativePathModel(PoolModel):
    fast_path = "native"


TestPythonPath = PythonPathModel.TestCase
TestPythonPath.settings = SETTINGS
TestNativePath = NativePathModel.TestCase
TestNativePath.settings = SETTINGS
if native.load() is None:
    TestNativePath = pytest.mark.skip(reason="the pool's C fast path is not built")(TestNativePath)


def test_the_model_catches_a_pool_that_ignores_stream_order(monkeypatch):
    """The machine can fail: with the naive stream arena (tests/naive_arena.py: freed blocks go to any stream at once)
    it must find a sequence in which another stream's work touches a block too early."""
    from hypothesis.stateful import run_state_machine_as_test

    from cudabridge.errors import StreamOrderRace
    from cudabridge.memory import StreamOrderedMemoryPool

    real_init = StreamOrderedMemoryPool.__init__

    def naive_init(self, *args, **kw):
        from naive_arena import NaiveArena

        kw["arena_type"] = NaiveArena
        real_init(self, *args, **kw)

    monkeypatch.setattr(StreamOrderedMemoryPool, "__init__", naive_init)
    from hypothesis import Phase

    found = settings(SETTINGS, max_examples=300, database=None, derandomize=True, report_multiple_bugs=False,
                     phases=[Phase.generate])   # found is enough: no shrinking
    with pytest.raises((StreamOrderRace, AssertionError)) as info:
        run_state_machine_as_test(PythonPathModel, settings=found)
    assert "race" in str(info.value)
