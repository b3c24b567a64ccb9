"""Example (d)'s batch functions (spark-examples/map_batches_job.py): a dict of column name ->
device array in (CuPy on a GPU, numpy on the emulated device), a dict out. Shipped by reference
(``--py-files`` and ``"example_batches:transform"``) or pickled with the driver's function."""

from __future__ import annotations

import os

from cudabridge.functions import array_module


def transform(columns):
    """Per row: y = 0.5 x^2 + sqrt(|x|), positive = x > 0."""
    ids, x = columns["id"], columns["x"]
    xp = array_module(x)
    return {"id": ids, "y": 0.5 * x * x + xp.sqrt(xp.abs(x)), "positive": x > 0}


def reduce(columns):
    """Per batch (a whole partition when a batch holds it): its rows and the sum of y."""
    x = columns["x"]
    xp = array_module(x)
    y = 0.5 * x * x + xp.sqrt(xp.abs(x))
    return {"rows": xp.asarray([x.shape[0]], dtype=xp.int64), "sum_y": xp.asarray([y.sum()], dtype=xp.float64)}


def transform_failing_once(fail_id: int, marker: str):
    """:func:`transform`, whose first call over row ``fail_id`` raises (``marker`` records that it did)."""

    def run(columns):
        if bool((columns["id"] == fail_id).any()) and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError(f"planned failure of the first attempt of the task holding row {fail_id}")
        return transform(columns)

    return run
