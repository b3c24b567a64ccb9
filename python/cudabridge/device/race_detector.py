"""The emulated device's stream-ordering race detector: like compute-sanitizer's racecheck, but for
stream ordering.

For each range of device addresses it keeps the last write (stream, position in that stream) and
the reads since it, and raises :class:`~cudabridge.errors.StreamOrderRace` (naming both streams and
the byte range, and also appending it to ``backend.races``) for any access not ordered after a
conflicting earlier one (write after write, write after read, read after write). What orders two
accesses: the same stream; an event wait (``stream_wait_event`` orders after the record latest at
call time); or a host synchronization the host observed before queueing the later access:
``stream_synchronize``, ``event_synchronize``, ``device_synchronize``, an ``event_query`` or
``stream_query`` that said done, a pageable ``copy_from_device_async`` (it returns only once
complete). Destroying a stream is not one (``cudaStreamDestroy`` does not wait). The check happens
when the work is queued, in the caller's thread and before anything is queued, so it does not
depend on timing: a race is reported even where the scheduling happened to hide it. Which calls
access what is the backend's to say (emulated_backend.py passes each op's reads and writes);
freed and unmapped memory forgets its history (``forget``). Host memory is not tracked.

Off by default (``race_check=True``, or ``CUDABRIDGE_EMULATED_RACE_CHECK=1`` in the environment),
because it costs every queued call a lock and some bookkeeping. It works on the streams and events
of emulated_streams.py and knows nothing of the backend above it.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import deque
from typing import TYPE_CHECKING, Callable

from ..config import BY_KEY, check_value
from ..errors import InvalidArgument, StreamOrderRace

if TYPE_CHECKING:
    from .emulated_streams import _EmuEvent, _EmuStream

RACE_CHECK_ENV = BY_KEY["emulatedRaceCheck"].env_name   # CUDABRIDGE_EMULATED_RACE_CHECK


def race_check_from_env() -> bool:
    """``CUDABRIDGE_EMULATED_RACE_CHECK`` (a bool setting: true/1 on; false/0 or unset off)."""
    value = os.environ.get(RACE_CHECK_ENV, "").strip()
    try:
        return bool(value) and check_value("emulatedRaceCheck", value)
    except InvalidArgument:
        raise InvalidArgument(f"{RACE_CHECK_ENV}={value!r}: expected true or false (or 1 or 0)") from None


class _Seg:
    """A byte range [start, end) with one access history: the last write as (stream handle,
    position in that stream, call) or None, and the reads since it as {stream handle: (position,
    call)} or None. ``reads`` dicts are never changed once made, so segments may share them."""

    __slots__ = ("start", "end", "write", "reads")

    def __init__(self, start: int, end: int, write: tuple[int, int, str] | None,
                 reads: dict[int, tuple[int, str]] | None) -> None:
        self.start = start
        self.end = end
        self.write = write
        self.reads = reads


def _join(into: dict[int, int], clock: dict[int, int]) -> bool:
    """``into`` = elementwise max(into, clock); whether anything grew."""
    grew = False
    get = into.get
    for k, v in clock.items():
        if get(k, 0) < v:
            into[k] = v
            grew = True
    return grew


class _RaceDetector:
    """Stream-ordering race detection with vector clocks (see the module docstring).

    A clock maps a stream's handle to a position in that stream (its 1-based sequence number of
    queued work). Each stream has a frontier clock: everything that its next queued work is
    ordered after. An event carries a copy of its stream's frontier at record time. The host has
    one clock for all its threads: whatever any host thread saw complete (a synchronize, a query
    that said done, a pageable copy back). It is one clock, not one per thread, because the pool
    passes such knowledge between threads through plain shared memory under the GIL (a block's
    epoch, an arena's ``completed``), with no call the backend could see; a thread that queues
    work after another thread observed a completion is ordered after it, as the pool assumes.

    Work queued on a stream gets the clock join(stream frontier, host clock) and is checked then,
    in the caller's thread, against the last write and the reads since it of every byte it
    touches: deterministic, whatever the timing. Everything here runs under one lock, and work
    is queued on its stream inside it, so that clock positions are queue positions.

    Under an exception that cuts a step short (an asynchronous one lands at a call or a loop's
    jump back): the lock is a plain one taken by ``with``, so it is released; the interval map's
    two lists change together, with no call between; and a cut-short step leaves the detector
    knowing less than happened (an access or an ordering not recorded), never more, and never
    ordering that did not happen: work is queued before the clocks say so, and the host clock's
    version is bumped before it grows.
    """

    def __init__(self, races: list) -> None:
        self.lock = threading.Lock()
        self.races = races
        self.host: dict[int, int] = {}
        self.host_version = 0                       # bumped whenever the host clock grows
        self.labels: dict[int, str] = {}            # stream handle -> what the messages call it
        self.retired: dict[int, dict[int, int]] = {}  # GPU -> join of its destroyed streams' frontiers
        self.retiring: deque[tuple[int, dict[int, int]]] = deque()  # per-thread streams closed by GC
        self._starts: list[int] = []                # the interval map: segment starts, sorted ...
        self._segs: list[_Seg] = []                 # ... and the segments, disjoint

    def add_stream(self, s: "_EmuStream") -> None:
        self.labels[s.handle] = s.label

    # clocks ---------------------------------------------------------------------------------
    def _frontier(self, s: "_EmuStream") -> dict[int, int]:
        """The stream's frontier, caught up with the host clock (joined only when it changed)."""
        clock = s.clock
        if s.host_seen != self.host_version:
            _join(clock, self.host)
            s.host_seen = self.host_version
        return clock

    def _observe(self, clock: dict[int, int]) -> None:
        host = self.host
        for k, v in clock.items():
            if host.get(k, 0) < v:
                # bumped before the join: a join cut short leaves streams to join the host again
                self.host_version += 1
                _join(host, clock)
                return

    def observe(self, clock: dict[int, int]) -> None:
        with self.lock:
            self._observe(clock)

    # queueing -------------------------------------------------------------------------------
    def enqueue(self, s: "_EmuStream", op: Callable[[], None], call: str,
                reads: tuple[tuple[int, int], ...] = (), writes: tuple[tuple[int, int], ...] = (),
                keep_clock: bool = False) -> tuple[int, dict[int, int] | None]:
        """Check ``op``'s accesses ((address, bytes) pairs), queue it, record them. Returns its
        sequence number and, with ``keep_clock``, a copy of its clock."""
        with self.lock:
            clock = self._frontier(s)
            for ptr, n in reads:
                hit = self._conflict(clock, ptr, ptr + n, False)
                if hit is not None:
                    self._raise(s, call, "read", hit)
            for ptr, n in writes:
                hit = self._conflict(clock, ptr, ptr + n, True)
                if hit is not None:
                    self._raise(s, call, "write", hit)
            seq = s.enqueue(op)
            sid = s.handle
            clock[sid] = seq
            for ptr, n in reads:
                self._record_read(ptr, ptr + n, sid, (seq, call), clock)
            for ptr, n in writes:   # after the reads: a copy onto itself ends as a write
                self._record_write(ptr, ptr + n, (sid, seq, call))
            return seq, (dict(clock) if keep_clock else None)

    def record(self, ev: "_EmuEvent", s: "_EmuStream") -> None:
        with self.lock:
            clock = self._frontier(s)
            seq = s.marker()
            clock[s.handle] = seq
            ev.stream, ev.seq, ev.clock, ev.observed = s, seq, dict(clock), False

    def wait_event(self, s: "_EmuStream", ev: "_EmuEvent") -> None:
        with self.lock:
            source, seq, evclock = ev.stream, ev.seq, ev.clock  # the record latest at call time
            if source is None:
                return
            clock = self._frontier(s)
            seq_here = s.enqueue(lambda: source.wait_for(seq))   # the wait first, then the clocks
            _join(clock, evclock)
            clock[s.handle] = seq_here

    # host observations ----------------------------------------------------------------------
    def stream_idle(self, s: "_EmuStream") -> bool:
        """``cudaStreamQuery``: when it says done, the host has seen the stream's frontier."""
        with self.lock:   # nothing can be queued on s meanwhile: the frontier is what is done
            if not s.idle():
                return False
            own = s.clock.get(s.handle, 0)
            if s.observed != own:
                self._observe(s.clock)
                s.observed = own
            return True

    def stream_snapshot(self, s: "_EmuStream") -> tuple[dict[int, int], int] | None:
        """The frontier before a stream synchronize (None: the host has seen it already)."""
        with self.lock:
            own = s.clock.get(s.handle, 0)
            if s.observed == own:
                return None
            return dict(s.clock), own

    def stream_synchronized(self, s: "_EmuStream", snap: tuple[dict[int, int], int] | None) -> None:
        if snap is None:
            return
        with self.lock:
            self._observe(snap[0])
            if snap[1] > s.observed:
                s.observed = snap[1]

    def event_done(self, ev: "_EmuEvent") -> bool:
        with self.lock:   # no record can change the event meanwhile
            if not ev.done():
                return False
            if not ev.observed and ev.clock:
                self._observe(ev.clock)
                ev.observed = True
            return True

    def event_snapshot(self, ev: "_EmuEvent") -> tuple["_EmuStream | None", int, dict[int, int]]:
        with self.lock:
            return ev.stream, ev.seq, ev.clock

    def retire(self, s: "_EmuStream") -> None:
        """A destroyed stream: its frontier still counts for a device synchronize."""
        with self.lock:
            _join(self.retired.setdefault(s.device.ordinal, {}), s.clock)

    def device_snapshot(self, ordinal: int, streams: list["_EmuStream"]) -> dict[int, int]:
        with self.lock:
            while self.retiring:
                dev, clock = self.retiring[0]
                _join(self.retired.setdefault(dev, {}), clock)
                self.retiring.popleft()   # after the join: one cut short is joined again, never lost
            snap = dict(self.retired.get(ordinal, {}))
            for s in streams:
                _join(snap, s.clock)
            return snap

    # the interval map -----------------------------------------------------------------------
    def _first(self, a: int) -> int:
        """Index of the first segment that ends after ``a``."""
        i = bisect.bisect_right(self._starts, a) - 1
        if i < 0 or self._segs[i].end <= a:
            i += 1
        return i

    def _conflict(self, clock: dict[int, int], a: int, b: int, writing: bool) -> list | None:
        """The first conflict of an access of [a, b) with ``clock``: [kind, lo, hi, earlier],
        widened over the following segments that conflict with the same earlier access."""
        segs = self._segs
        get = clock.get
        found = None
        for i in range(self._first(a), len(segs)):
            seg = segs[i]
            if seg.start >= b:
                break
            hit = None
            w = seg.write
            if w is not None and get(w[0], 0) < w[1]:
                hit = ("write-after-write" if writing else "read-after-write", w)
            elif writing and seg.reads:
                for rsid, (rpos, rcall) in seg.reads.items():
                    if get(rsid, 0) < rpos:
                        hit = ("write-after-read", (rsid, rpos, rcall))
                        break
            if found is None:
                if hit is not None:
                    found = [hit[0], max(a, seg.start), min(b, seg.end), hit[1]]
            elif hit is not None and hit[0] == found[0] and hit[1] == found[3] and seg.start == found[2]:
                found[2] = min(b, seg.end)
            else:
                break
        return found

    def _raise(self, s: "_EmuStream", call: str, verb: str, found: list) -> None:
        kind, lo, hi, (osid, opos, ocall) = found
        other = self.labels.get(osid, f"stream {osid:#x}")
        other_verb = "read" if kind == "write-after-read" else "write"
        exc = StreamOrderRace(
            f"{kind} race on [{lo:#x}, {hi:#x}) ({hi - lo} bytes): {call} ({verb}) queued on {s.label} "
            f"is not ordered after {ocall} ({other_verb}, work #{opos} of that stream) on {other}: neither "
            f"stream order, nor an event wait, nor a host synchronization observed before queueing orders them")
        exc.kind = kind
        exc.address = lo
        exc.nbytes = hi - lo
        exc.stream = s.label
        exc.other_stream = other
        exc.call = call
        exc.other_call = ocall
        self.races.append(exc)
        raise exc

    def _splice(self, i: int, j: int, new: list[_Seg]) -> None:
        """Replace segments [i, j) by ``new``, merging touching equal ones among them.

        Touching segments are never equal (this keeps it so), and the segments an access
        gives its range all carry that access's own, new record, so the only merges possible
        are among ``new``: pieces of the range that had different histories before and the
        same one now (a read over two reads that it orders after, say)."""
        merged: list[_Seg] = []
        for seg in new:
            if merged:
                last = merged[-1]
                if last.end == seg.start and last.write == seg.write and last.reads == seg.reads:
                    last.end = seg.end
                    continue
            merged.append(seg)
        starts = [seg.start for seg in merged]
        self._segs[i:j] = merged        # the two lists change together: no call between
        self._starts[i:j] = starts

    def _span(self, a: int, b: int) -> tuple[int, int]:
        segs = self._segs
        i = j = self._first(a)
        n = len(segs)
        while j < n and segs[j].start < b:
            j += 1
        return i, j

    def _record_write(self, a: int, b: int, write: tuple[int, int, str]) -> None:
        i, j = self._span(a, b)
        new = []
        if i < j:
            first, last = self._segs[i], self._segs[j - 1]
            if i + 1 == j and first.start == a and first.end == b:   # the same range again
                first.write, first.reads = write, None
                return
            if first.start < a:
                new.append(_Seg(first.start, a, first.write, first.reads))
            new.append(_Seg(a, b, write, None))
            if last.end > b:
                new.append(_Seg(b, last.end, last.write, last.reads))
        else:
            new.append(_Seg(a, b, write, None))
        self._splice(i, j, new)

    def _record_read(self, a: int, b: int, sid: int, read: tuple[int, str], clock: dict[int, int]) -> None:
        own = {sid: read}
        i, j = self._span(a, b)
        new = []
        at = a
        for seg in self._segs[i:j]:
            if seg.start > at:
                new.append(_Seg(at, seg.start, None, own))
            if seg.start < a:
                new.append(_Seg(seg.start, a, seg.write, seg.reads))
            lo = seg.start if seg.start > a else a
            hi = seg.end if seg.end < b else b
            reads = own
            if seg.reads:
                # A read this one is ordered after can go: a write ordered after this read is
                # ordered after that one too. Usually this leaves only this read.
                keep = {k: v for k, v in seg.reads.items() if clock.get(k, 0) < v[0]}
                if keep:
                    keep[sid] = read
                    reads = keep
            new.append(_Seg(lo, hi, seg.write, reads))
            if seg.end > b:
                new.append(_Seg(b, seg.end, seg.write, seg.reads))
            at = hi
        if at < b:
            new.append(_Seg(at, b, None, own))
        self._splice(i, j, new)

    def forget(self, a: int, b: int) -> None:
        """The memory of [a, b) is gone (freed, unmapped): its history with it."""
        with self.lock:
            i, j = self._span(a, b)
            if i == j:
                return
            first, last = self._segs[i], self._segs[j - 1]
            new = []
            if first.start < a:
                new.append(_Seg(first.start, a, first.write, first.reads))
            if last.end > b:
                new.append(_Seg(b, last.end, last.write, last.reads))
            starts = [seg.start for seg in new]
            self._segs[i:j] = new           # the two lists change together: no call between
            self._starts[i:j] = starts

    def segments(self) -> list[tuple[int, int, tuple | None, dict | None]]:
        """The interval map, for tests: (start, end, write, reads) per segment."""
        with self.lock:
            return [(seg.start, seg.end, seg.write, seg.reads) for seg in self._segs]
