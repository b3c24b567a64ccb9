"""A kernel launch's shape: grid and block dimensions and dynamic shared memory, checked once;
what a GPU and a compiled kernel allow a launch, and the check of the one against the others.

Part of the device interface (``DeviceBackend`` reports the limits and launches with these), so
it lives in the device layer; ``cudabridge.kernels`` (and ``kernels/launch_config.py``) re-export
it for task code. The device limits are checked at launch (they depend on the GPU and the
kernel); a shape checks only what holds everywhere: three positive dimensions each, a
non-negative shared-memory size."""

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


@dataclass(frozen=True)
class DeviceLimits:
    """What a GPU allows a launch (cudaDeviceProp): the emulated device models an H100/H200."""

    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (MAX_DIM, 65535, 65535)
    shared_per_block: int = 48 << 10          # dynamic + static without opting in
    shared_per_block_optin: int = 227 << 10   # the most a kernel may opt in to


@dataclass(frozen=True)
class KernelLimits:
    """What a compiled kernel allows (cuFuncGetAttribute): its registers may lower the threads."""

    max_threads_per_block: int = 1024
    static_shared: int = 0
    max_dynamic_shared: int = 48 << 10        # raised by opting in (cuFuncSetAttribute)


def check_launch(config: LaunchConfig, device: DeviceLimits, kernel: KernelLimits, name: str) -> int | None:
    """Refuse a launch the device or the kernel cannot run, naming the limit; returns the dynamic
    shared memory the kernel must opt in to first (None: its current maximum suffices)."""
    where = f"launch of kernel {name!r}"
    for axis, (b, mb) in enumerate(zip(config.block, device.max_block)):
        if b > mb:
            raise InvalidArgument(f"{where}: block {config.block} exceeds the device's {device.max_block} on axis {'xyz'[axis]}")
    for axis, (g, mg) in enumerate(zip(config.grid, device.max_grid)):
        if g > mg:
            raise InvalidArgument(f"{where}: grid {config.grid} exceeds the device's {device.max_grid} on axis {'xyz'[axis]}")
    threads = config.threads_per_block
    limit = min(device.max_threads_per_block, kernel.max_threads_per_block)
    if threads > limit:
        raise InvalidArgument(f"{where}: {threads} threads per block; the kernel allows {kernel.max_threads_per_block}, "
                              f"the device {device.max_threads_per_block}")
    shared = config.shared_bytes
    if kernel.static_shared + shared > device.shared_per_block_optin:
        raise InvalidArgument(f"{where}: {shared} bytes of dynamic shared memory (plus {kernel.static_shared} static) "
                              f"exceed the device's {device.shared_per_block_optin} per block")
    return shared if shared > kernel.max_dynamic_shared else None

