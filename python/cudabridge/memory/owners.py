"""Which live allocations each owner (a Spark task attempt) holds, so that releasing the owner
reclaims its leaks.

``by_owner`` maps an owner to an insertion-ordered dict of its allocations (a dict, not a set:
O(1) removal and a stable order). It is the part's interface to the fast paths: the Python and
the C allocate add with one ``setdefault`` and one store, and free removes with one ``pop``;
each step is a single container operation, atomic under the GIL, so no lock is needed there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .allocation import Allocation


class OwnerTracker:
    __slots__ = ("by_owner",)

    def __init__(self) -> None:
        self.by_owner: dict[int, dict[Allocation, None]] = {}

    def add(self, a: Allocation) -> None:
        owned = self.by_owner.get(a.owner)
        if owned is None:
            owned = self.by_owner.setdefault(a.owner, {})
        owned[a] = None

    def discard(self, a: Allocation) -> None:
        owned = self.by_owner.get(a.owner)
        if owned is not None:
            owned.pop(a, None)

    def release(self, owner: int | None, reclaim: Callable[[Allocation], bool]) -> tuple[int, int]:
        """Stop tracking ``owner`` and hand each allocation it still holds to ``reclaim``, which
        frees it and says True, or says False (the owner's own thread freed it meanwhile).
        Returns (allocations, bytes requested) reclaimed: the owner's leaks."""
        owned = self.by_owner.pop(owner, None)
        count = nbytes = 0
        while owned:
            try:
                a, _ = owned.popitem()
            except KeyError:   # emptied meanwhile by a free on the owner's thread
                break
            if reclaim(a):
                count += 1
                nbytes += a.size
        return count, nbytes

    def owned_by(self, owner: int | None) -> list[Allocation]:
        return list(self.by_owner.get(owner, {}))

    def clear(self) -> None:
        self.by_owner.clear()
