"""The element types of device arrays passed to and returned from Python functions: one table.

A dtype's code is its index in :data:`DTYPES` (what Java sends and receives: the build writes the
table into the jar as ``org/cudabridge/dtypes.txt`` and ``org.cudabridge.DType`` checks its
constants against it). Fixed-width numbers and bool only: what Spark's fixed-width columns hold.
"""

from __future__ import annotations

from ..errors import InvalidArgument

# name -> (item size in bytes, the array interface's typestr: little-endian, as CUDA devices are)
DTYPES: dict[str, tuple[int, str]] = {
    "bool": (1, "|b1"),
    "int8": (1, "|i1"),
    "uint8": (1, "|u1"),
    "int16": (2, "<i2"),
    "int32": (4, "<i4"),
    "int64": (8, "<i8"),
    "float32": (4, "<f4"),
    "float64": (8, "<f8"),
}
CODES = tuple(DTYPES)
_BY_TYPESTR = {typestr: name for name, (_, typestr) in DTYPES.items()}
# numpy also spells one-byte types with the byte-order mark "<"; and native "=" on little-endian hosts
_BY_TYPESTR.update({"<" + ts[1:]: n for ts, n in list(_BY_TYPESTR.items()) if ts[0] == "|"})


def dtype_of_code(code: int) -> str:
    if code.__class__ is not int or not 0 <= code < len(CODES):
        raise InvalidArgument(f"unknown dtype code {code!r} (known: {', '.join(f'{i}={n}' for i, n in enumerate(CODES))})")
    return CODES[code]


def itemsize(dtype: str) -> int:
    return DTYPES[dtype][0]


def dtype_of_typestr(typestr: str, what: str) -> str:
    """Our name for an array interface typestr (``"<f4"``); any other type is refused."""
    name = _BY_TYPESTR.get(typestr)
    if name is None:
        raise InvalidArgument(f"{what}: element type {typestr!r} is not supported (supported: {', '.join(CODES)})")
    return name
