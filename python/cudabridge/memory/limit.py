"""The pool's reservation limit: the most it takes from the device, and what it has taken.

A part of its own, as RMM's ``limiting_resource_adaptor`` wraps an upstream: the upstreams ask
it before they reserve (:meth:`allows`) and charge it after (:meth:`charge`). Guarded by the
pool's lock, like the upstreams that use it.
"""

from __future__ import annotations


class ReservationLimit:
    __slots__ = ("limit", "reserved", "peak_reserved")

    def __init__(self, limit: int) -> None:
        self.limit = limit            # bytes the pool may reserve in all
        self.reserved = 0             # bytes reserved now (chunks, mapped pieces, spare pieces)
        self.peak_reserved = 0

    def room(self) -> int:
        """Bytes that may still be reserved."""
        return self.limit - self.reserved

    def allows(self, nbytes: int) -> bool:
        return self.reserved + nbytes <= self.limit

    def charge(self, nbytes: int) -> None:
        self.reserved += nbytes
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved

    def clear(self) -> None:
        """Everything was returned to the device (the pool closed)."""
        self.reserved = 0
