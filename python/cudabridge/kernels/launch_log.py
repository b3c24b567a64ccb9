"""Which kernels ran on each stream since its last completed synchronize: the candidates a fault
is attributed to.

A kernel that faults on the device (an illegal address) is not reported by its launch, which
returned long before: the error surfaces at the next call that waits for the stream, and from
then on every call in the process returns it (a sticky error). The log names the kernels queued
on that stream since its last synchronize that completed, the only ones that can have faulted
there; :meth:`TaskRegistry.synchronize` puts them in the :class:`~cudabridge.errors.KernelFault`
it raises, and clears a stream's list when a synchronize of it completes.

Both launch paths record here: the Python path through :meth:`record`, the Java hot path's C twin
by appending to ``recent[stream]`` in place while the list is shorter than ``2 * KEEP`` (and
through :meth:`record` otherwise), all under the GIL. The memory is bounded: past ``2 * KEEP``
names the oldest ``KEEP`` are dropped and counted.
"""

from __future__ import annotations

from collections import Counter


class LaunchLog:
    KEEP = 64   # the C twin's LOG_KEEP (jvm/_hotcore.c)

    def __init__(self) -> None:
        self.recent: dict[int, list[str]] = {}   # stream -> kernel names, oldest first
        self._dropped: dict[int, int] = {}       # stream -> names dropped from its list

    def record(self, stream: int, name: str) -> None:
        names = self.recent.get(stream)
        if names is None:
            names = self.recent[stream] = []
        names.append(name)
        if len(names) > 2 * self.KEEP:
            del names[:self.KEEP]
            self._dropped[stream] = self._dropped.get(stream, 0) + self.KEEP

    def clear(self, stream: int) -> None:
        """A synchronize of ``stream`` completed: nothing queued before it can fault any more."""
        self.recent.pop(stream, None)
        self._dropped.pop(stream, None)

    def candidates(self, stream: int) -> tuple[list[str], int]:
        """(the kernels launched on ``stream`` since its last completed synchronize, oldest first;
        how many earlier launches were dropped from the log)."""
        return list(self.recent.get(stream, ())), self._dropped.get(stream, 0)

    @staticmethod
    def describe(names: list[str], dropped: int) -> str:
        """'fill x3, histogram' (launch counts by name, in order of first launch)."""
        if not names and not dropped:
            return "no kernel was launched on this stream since its last completed synchronize"
        counts = Counter(names)
        text = ", ".join(n if c == 1 else f"{n} x{c}" for n, c in counts.items())
        if dropped:
            text += f" (and {dropped} earlier launch(es) not kept)"
        return "kernels launched on this stream since its last completed synchronize (the candidates): " + text
