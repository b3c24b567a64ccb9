"""Python functions the tests call from Java and from Python (tests/test_python_functions.py,
PythonFunctionTest): on the emulated device their arrays are numpy arrays over device memory; on
a GPU, CuPy arrays (``array_module`` picks the library)."""

from __future__ import annotations

import threading
import time

from cudabridge.functions import array_module

kept: list = []
calls = {"n": 0}
_lock = threading.Lock()


def add(a, b):
    return a + b


def echo(*args):
    return list(args) if len(args) != 1 else args[0]


def kinds(*args):
    """The Python type name of each argument."""
    return ",".join(type(a).__name__ for a in args)


def scale(x, factor):
    """In place: x *= factor (the caller's buffer changes)."""
    x *= factor
    return None


def total(x):
    xp = array_module(x)
    return float(xp.sum(x))


def shape_of(x):
    return ",".join(map(str, x.shape)) + ":" + str(x.dtype)


def squares(n):
    """A new array 0, 1, 4, ... (n elements, float64)."""
    import numpy as np

    return np.arange(n, dtype=np.float64) ** 2


def squares_like(x):
    """x * x as a new array of x's library (CuPy on a GPU: the plug-in's memory, handed over)."""
    return x * x


def two_arrays(x):
    return [x + 1, x.sum(keepdims=True)]


def fail(message):
    raise ValueError(message)


def exits():
    raise SystemExit(3)


def returns_a_set():
    return {1, 2}


def huge_int():
    return 1 << 70


def text(s):
    return s.upper() + " \u00e9\U0001F600"


def reverse_bytes(b):
    return bytes(b)[::-1]


def view_sum(view):
    return sum(view)


def write_view(view):
    view[0] = 42


def keep_view(view):
    import numpy as np

    kept.append(np.frombuffer(view, dtype=np.uint8))


def count_calls(seconds=0.0):
    """Counts calls (under a lock: functions must be thread-safe); sleeps a while (GIL released)."""
    with _lock:
        calls["n"] += 1
    if seconds:
        time.sleep(seconds)
    return calls["n"]


def release_then_call(x):
    return x


def hold_gil_until_entering(want, seconds):
    """Holds the GIL (a switch interval longer than the wait, a loop that never lets it go) until
    the bridge reports a Java thread inside a call for task ``want`` (-1: of unknown task), at most
    ``seconds``. Returns the tasks it saw then (-1 for unknown). Every 50 ms the GIL goes for a
    moment, so that the threads' calls go on.
    """
    import sys

    from cudabridge.jvm.bootstrap import running_service

    memory_waits = running_service().pressure.memory_waits
    target = None if want < 0 else want
    interval = sys.getswitchinterval()
    end = time.monotonic() + seconds
    seen = memory_waits.entering()
    while target not in seen and time.monotonic() < end:
        sys.setswitchinterval(seconds + 5)
        try:
            burst = time.monotonic() + 0.05
            while target not in seen and time.monotonic() < burst:
                seen = memory_waits.entering()
        finally:
            sys.setswitchinterval(interval)
        if target not in seen:
            time.sleep(0.001)   # the GIL goes: threads inside their calls finish them
    return ",".join(str(-1 if t is None else t) for t in seen)


# over column batches (GpuPython.mapBatches) ------------------------------------------------------
def per_row(columns):
    """y = 2x + 1 and a flag x > 0, for each row."""
    x = columns["x"]
    xp = array_module(x)
    return {"id": columns["id"], "y": x * 2.0 + 1.0, "positive": x > 0}


def per_batch_sum(columns):
    """One row per batch: the number of rows and the sum of x."""
    x = columns["x"]
    xp = array_module(x)
    return {"rows": xp.asarray([x.shape[0]], dtype=xp.int64), "sum": xp.asarray([x.sum()], dtype=xp.float64)}


def wrong_type(columns):
    return {"y": columns["x"].astype("int32")}


not_a_function = 42


def main_thread_alive():
    """Whether ``threading``'s main thread (the interpreter's main thread state) is alive."""
    return threading.main_thread().is_alive()
