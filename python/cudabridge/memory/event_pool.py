"""CUDA events, recycled instead of created per use.

An event goes back to the pool only when it has completed and nothing refers to it: a
``cudaStreamWaitEvent`` captures the record that was latest at the time of the call, so once a
record has completed the event may be recorded again without disturbing earlier waits.
"""

from __future__ import annotations

from ..device import DeviceBackend


class EventPool:
    __slots__ = ("_backend", "_free", "created", "_all")

    def __init__(self, backend: DeviceBackend) -> None:
        self._backend = backend
        self._free: list[int] = []
        self._all: list[int] = []
        self.created = 0

    def get(self) -> int:
        """An event handle; the caller has the pool's device current."""
        try:
            return self._free.pop()
        except IndexError:
            ev = self._backend.event_create()
            self._all.append(ev)
            self.created += 1
            return ev

    def put(self, event: int) -> None:
        self._free.append(event)

    def close(self) -> None:
        """Destroy every event; each is tried, the first error raised once all were."""
        first: BaseException | None = None
        for ev in self._all:
            try:
                self._backend.event_destroy(ev)
            except Exception as exc:   # noqa: BLE001 - the rest are destroyed all the same
                first = first or exc
        self._all.clear()
        self._free.clear()
        if first is not None:
            raise first
