"""A function over column batches (Spark's ``mapBatches``): the user's function takes a dict of
column name -> device array (one batch of rows) and returns a dict of column name -> array.

:func:`batch_function` wraps it for the call path, which passes arrays positionally: the wrapper
gets the input columns' arrays in the order of its input names, calls the function with them as
a dict, and returns the output columns in the order of its output names, each checked: present,
one-dimensional, of the output schema's element type, and all of one length (the rows out may be
fewer or more than the rows in: a filter, a per-batch reduction).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import InvalidArgument
from .dtypes import DTYPES, dtype_of_typestr


def _array_dtype(v: Any, what: str) -> str:
    interface = getattr(v, "__cuda_array_interface__", None) or getattr(v, "__array_interface__", None)
    if interface is None:
        raise InvalidArgument(f"{what} is a {type(v).__name__}, not an array")
    return dtype_of_typestr(interface["typestr"], what)


def batch_function(fn: Callable[[dict], Any], name: str, inputs: Sequence[str], outputs: Sequence[tuple[str, str]]
                   ) -> Callable[..., list]:
    """``fn`` over dicts as a positional function of the input columns (module docstring);
    ``outputs``: (name, dtype) per output column, in the output schema's order."""
    inputs, outputs = tuple(inputs), tuple(outputs)
    if len(set(inputs)) != len(inputs) or len({n for n, _ in outputs}) != len(outputs):
        raise InvalidArgument(f"{name}: column names must be distinct: inputs {inputs}, outputs {[n for n, _ in outputs]}")
    for column, dtype in outputs:
        if dtype not in DTYPES:
            raise InvalidArgument(f"{name}: output column {column!r} has element type {dtype!r} (supported: "
                                  f"{', '.join(DTYPES)})")

    def run(*arrays: Any) -> list:
        if len(arrays) != len(inputs):
            raise InvalidArgument(f"{name}: {len(arrays)} arrays for {len(inputs)} input columns")
        out = fn(dict(zip(inputs, arrays)))
        if not isinstance(out, dict):
            raise InvalidArgument(f"{name} returned a {type(out).__name__}: a batch function returns a dict of column "
                                  f"name -> array")
        missing = [c for c, _ in outputs if c not in out]
        if missing:
            raise InvalidArgument(f"{name} returned no column {', '.join(map(repr, missing))} (it returned "
                                  f"{', '.join(map(repr, out))})")
        columns, rows = [], None
        for column, dtype in outputs:
            v = out[column]
            what = f"{name}: output column {column!r}"
            got = _array_dtype(v, what)
            if got != dtype:
                raise InvalidArgument(f"{what} is {got}; the output schema says {dtype} (cast it: .astype({dtype!r}))")
            shape = tuple(v.shape)
            if len(shape) != 1:
                raise InvalidArgument(f"{what} has shape {shape}; a column is one-dimensional")
            if rows is None:
                rows = shape[0]
            elif shape[0] != rows:
                raise InvalidArgument(f"{what} has {shape[0]} rows; the columns before it have {rows}")
            columns.append(v)
        return columns

    run.__qualname__ = run.__name__ = f"batches of {name}"
    return run
