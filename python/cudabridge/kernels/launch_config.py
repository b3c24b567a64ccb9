"""A kernel launch's shape: grid and block dimensions and dynamic shared memory, checked once.

The device limits are checked at launch (they depend on the GPU and the kernel); here only what
holds everywhere: three positive dimensions each, a non-negative shared-memory size."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument, index_int

MAX_DIM = (1 << 31) - 1   # grid x of every CUDA device; the tighter limits are the device's


def _dims(value: object, what: str) -> tuple[int, int, int]:
    if isinstance(value, (tuple, list)):
        dims = tuple(index_int(v, f"{what} dimension") for v in value)
    else:
        dims = (index_int(value, what),)
    if not 1 <= len(dims) <= 3:
        raise InvalidArgument(f"{what} takes 1 to 3 dimensions, got {len(dims)}")
    dims = dims + (1,) * (3 - len(dims))
    for d in dims:
        if not 1 <= d <= MAX_DIM:
            raise InvalidArgument(f"{what} dimensions must be positive ints below 2**31, got {dims}")
    return dims   # type: ignore[return-value]


@dataclass(frozen=True)
class LaunchConfig:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0

    def __init__(self, grid: object, block: object, shared_bytes: object = 0) -> None:
        shared = index_int(shared_bytes, "shared_bytes")
        if shared < 0:
            raise InvalidArgument(f"shared_bytes must not be negative, got {shared}")
        object.__setattr__(self, "grid", _dims(grid, "grid"))
        object.__setattr__(self, "block", _dims(block, "block"))
        object.__setattr__(self, "shared_bytes", shared)

    @property
    def threads_per_block(self) -> int:
        x, y, z = self.block
        return x * y * z
