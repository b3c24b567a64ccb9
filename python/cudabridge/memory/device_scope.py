"""Make a pool's device current for a section of device calls, and restore the caller's."""

from __future__ import annotations

from ..device import DeviceBackend


class DeviceScope:
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
