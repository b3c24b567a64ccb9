"""Kernels by id, owned by the service (``service.kernels``): a front that cannot hold a Python
kernel object (Java's ``CudaKernel``, by a long) names it by its id here, one id per kernel object
(a module keeps one object per kernel, so each task asking again gets the same id), never reused
while the service lives. The Java hot path hands each id's kernel to its C twin once."""

from __future__ import annotations

import itertools
import threading
from typing import Any


class KernelTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, Any] = {}
        self._id_of: dict[Any, int] = {}
        self._ids = itertools.count(1)

    def add(self, kernel: Any) -> int:
        """The id of ``kernel``, given the first time it is added."""
        with self._lock:
            kid = self._id_of.get(kernel)
            if kid is None:
                kid = next(self._ids)
                self._by_id[kid] = kernel
                self._id_of[kernel] = kid
            return kid

    def get(self, kid: int) -> Any | None:
        """The kernel of id ``kid``, or None."""
        return self._by_id.get(kid)

    def __len__(self) -> int:
        return len(self._by_id)
