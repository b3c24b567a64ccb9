"""Kernel parameter kinds and how a launch's arguments are checked against them.

A kernel's parameters are a sequence of kinds (its signature): ``ptr`` (a device address: an
allocation, or an address inside one), and the scalars ``i8 i16 i32 i64 f32 f64 bool``. Sizes
alone cannot tell ``i32`` from ``f32`` (the driver reports offsets and sizes only), so the kinds
come from the PTX ``.entry`` or from a signature declared at load or by a host kernel.

Part of the device interface (a backend's launch takes the kinds and checks the arguments), so
it lives in the device layer; ``cudabridge.kernels.params`` re-exports it for task code.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Iterable, NamedTuple, Sequence

from ..errors import InvalidArgument

# kind -> (struct format, size, alignment)
PARAM_KINDS: dict[str, tuple[str, int]] = {
    "ptr": ("Q", 8), "i8": ("b", 1), "i16": ("h", 2), "i32": ("i", 4), "i64": ("q", 8),
    "f32": ("f", 4), "f64": ("d", 8), "bool": ("?", 1),
}
_INT_RANGE = {"i8": 8, "i16": 16, "i32": 32, "i64": 64}


class DevicePointer(NamedTuple):
    """A ``ptr`` argument whose extent is known: the buffer the kernel may touch is
    [address, address + nbytes). A plain int is a pointer whose extent is the rest of its
    allocation (the emulated device's race detector then counts all of that as touched)."""

    address: int
    nbytes: int


def signature(kinds: Iterable[str] | str) -> tuple[str, ...]:
    """A signature from kinds (a sequence, or a comma-separated string)."""
    if isinstance(kinds, str):
        kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    out = tuple(kinds)
    bad = [k for k in out if not isinstance(k, str) or k not in PARAM_KINDS]   # (a list in it is unhashable)
    if bad:
        raise InvalidArgument(f"unknown parameter kind(s) {bad}: the kinds are {', '.join(PARAM_KINDS)}")
    return out


def check_value(kind: str, value: Any, index: int, kernel: str) -> Any:
    """The argument as the kind needs it; InvalidArgument naming the kernel and the parameter."""
    where = f"kernel {kernel!r} parameter {index} ({kind})"
    if value is None:
        raise InvalidArgument(f"{where}: got None")
    if kind == "bool":
        if not isinstance(value, bool):
            raise InvalidArgument(f"{where}: expects a bool, got {type(value).__name__}")
        return value
    if kind in ("f32", "f64"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArgument(f"{where}: expects a number, got {type(value).__name__}")
        value = float(value)
        if kind == "f32" and math.isfinite(value) and abs(value) > 3.4028234663852886e38:
            raise InvalidArgument(f"{where}: {value} does not fit a float")
        return value
    if (isinstance(value, bool) or not isinstance(value, int)) and value.__class__ is not DevicePointer:
        raise InvalidArgument(f"{where}: expects an int, got {type(value).__name__}")
    if kind == "ptr":
        if value.__class__ is DevicePointer:
            if not (0 <= value.address < 1 << 64 and value.nbytes >= 0):
                raise InvalidArgument(f"{where}: {value} is not a device buffer")
            return value
        if not 0 <= value < 1 << 64:
            raise InvalidArgument(f"{where}: {value} is not a device address")
        return value
    if value.__class__ is DevicePointer:
        raise InvalidArgument(f"{where}: expects an int, got a device buffer")
    bits = _INT_RANGE[kind]
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise InvalidArgument(f"{where}: {value} does not fit {bits} bits")
    return value


def check_args(kinds: Sequence[str], values: Sequence[Any], kernel: str) -> list[Any]:
    """A launch's arguments, each as its kind needs it (check_value), after checking their count."""
    if len(values) != len(kinds):
        raise InvalidArgument(f"kernel {kernel!r} takes {len(kinds)} argument(s), got {len(values)}")
    return [check_value(kind, value, i, kernel) for i, (kind, value) in enumerate(zip(kinds, values))]


def param_layout(kinds: Sequence[str]) -> list[tuple[int, int]]:
    """Each parameter's (offset, size) in CUDA's parameter buffer: each at its natural alignment,
    as the compiler lays them out (``(float*, int, float)``: (0, 8), (8, 4), (12, 4))."""
    out, at = [], 0
    for kind in kinds:
        size = PARAM_KINDS[kind][1]
        at += -at % size
        out.append((at, size))
        at += size
    return out


def pack_params(kinds: Sequence[str], values: Sequence[Any], kernel: str) -> bytes:
    """The arguments laid out as a CUDA kernel's parameter buffer: each at its natural alignment."""
    layout = param_layout(kinds)
    out = bytearray(layout[-1][0] + layout[-1][1] if layout else 0)
    for kind, (offset, _), value in zip(kinds, layout, check_args(kinds, values, kernel)):
        struct.pack_into("<" + PARAM_KINDS[kind][0], out, offset,
                         value.address if value.__class__ is DevicePointer else value)
    return bytes(out)
