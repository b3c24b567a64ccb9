"""The base of every mode list (``StreamPolicy``, ``Priority``, ``PoolGrowth``, ``Backend``, ...).

Each mode list is a :class:`Mode` defined in the module that owns it and imported everywhere
else; its values are the wire names (settings, Java, logs), and a test checks them against the
settings table's ``values``. A ``Mode`` is a ``str``, so it compares equal to its wire name.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from .errors import InvalidArgument

M = TypeVar("M", bound="Mode")


class Mode(StrEnum):
    @classmethod
    def parse(cls: type[M], value: object, what: str) -> M:
        """The member named by ``value`` (a member or its wire name), or InvalidArgument."""
        try:
            return cls(value)
        except ValueError:
            raise InvalidArgument(f"unknown {what} {value!r}; expected one of "
                                  f"{', '.join(m.value for m in cls)}") from None
