"""Python functions that Java calls, each resolved once per executor and kept by id.

Two ways to name one:

* a **reference**, ``"package.module:function"`` (an attribute path after the colon:
  ``"pkg.mod:Class.method"``), imported from the executor's Python path and from the search
  paths the caller adds (the files Spark ships with the job: ``--py-files``). A search path is
  trusted only as the module cache is (kernels/module_store.py): it must belong to the executor's
  user and be writable by that user alone, so that no other user's code runs in the executor;
* a **pickled function** (PySpark's functions defined on the driver), made by
  :func:`pickle_function`: a header naming the Python version that pickled it, then cloudpickle's
  bytes. A pickle of another Python version is refused before it is loaded (cloudpickle's output
  is tied to the interpreter's bytecode); the same bytes are loaded once.

Failures raise :class:`~cudabridge.errors.FunctionNotFound` and cache nothing: the next ask
tries again (a module fixed and shipped anew, say).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import stat
import sys
import threading
import traceback
from dataclasses import dataclass
from itertools import count
from typing import Any, Callable, Iterable

from ..errors import FunctionNotFound

_REFERENCE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\Z")
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
PICKLE_MAGIC = b"cudabridge-function\x00"


@dataclass(frozen=True)
class PythonFunction:
    """A resolved function: its id (what Java calls it by), a name for messages, the callable."""

    id: int
    name: str
    fn: Callable[..., Any]


def _python_version() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def _cloudpickle() -> Any:
    try:   # PySpark ships its copy; the package of its own where PySpark is absent
        from pyspark import cloudpickle
    except ImportError:
        try:
            import cloudpickle  # type: ignore[no-redef]
        except ImportError:
            raise FunctionNotFound("pickled functions need cloudpickle (pyspark ships it) in the executor's "
                                   "Python") from None
    return cloudpickle


def pickle_function(fn: Callable[..., Any]) -> bytes:
    """``fn`` as bytes for :meth:`FunctionTable.resolve_pickled` (on the driver: PySpark's
    ``map_batches`` calls it), with the pickling Python's version in the header."""
    if not callable(fn):
        raise FunctionNotFound(f"only a callable can be pickled as a function, got {type(fn).__name__}")
    version = _python_version().encode()
    return PICKLE_MAGIC + bytes([len(version)]) + version + _cloudpickle().dumps(fn)


def distrust(path: str) -> str | None:
    """Why ``path`` may hold code another user wrote, or None: it must exist, belong to the
    executor's user (or root) and be writable by its owner alone, as must the folder holding it."""
    uid = os.geteuid()
    for p in (path, os.path.dirname(os.path.abspath(path))):
        try:
            st = os.stat(p)
        except OSError as exc:
            return f"{p}: {exc.strerror}"
        if st.st_uid not in (uid, 0):
            return f"{p} is owned by uid {st.st_uid}, not by the executor's user (uid {uid}) or root"
        if st.st_mode & _OTHERS_WRITE and not (p != path and st.st_mode & stat.S_ISVTX):
            return f"{p} is writable by group or others (mode {stat.S_IMODE(st.st_mode):#o})"
    return None


class FunctionTable:
    """The executor's Python functions by id (one table per service front: the Java bridge's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = count(1)
        self._by_id: dict[int, PythonFunction] = {}
        self._by_key: dict[str, int] = {}   # a reference, or "pickle:<sha256>"
        # id -> the callable, and id -> its name: what the C twin of a call reads (_call_core.c)
        self.callables: dict[int, Callable[..., Any]] = {}
        self.names: dict[int, str] = {}

    def get(self, function_id: int) -> PythonFunction:
        f = self._by_id.get(function_id) if function_id.__class__ is int else None
        if f is None:
            raise FunctionNotFound(f"no Python function {function_id!r} was resolved in this executor")
        return f

    def __len__(self) -> int:
        return len(self._by_id)

    def resolve(self, reference: str, search_paths: Iterable[str] = ()) -> PythonFunction:
        """The function ``reference`` names (``"package.module:function"``), imported once."""
        if not isinstance(reference, str) or not _REFERENCE.match(reference):
            raise FunctionNotFound(f"{reference!r} is not a function reference: expected 'package.module:function'")
        paths = [os.fspath(p) for p in search_paths]

        def imported() -> Callable[..., Any]:
            self._add_paths(reference, paths)
            return self._import(reference)

        return self.keep(reference, reference, imported)

    def resolve_pickled(self, payload: bytes) -> PythonFunction:
        """The function :func:`pickle_function` made ``payload`` of, loaded once per distinct bytes."""
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise FunctionNotFound(f"a pickled function is bytes, got {type(payload).__name__}")
        payload = bytes(payload)
        key = "pickle:" + hashlib.sha256(payload).hexdigest()
        found = self._by_key.get(key)
        if found is not None:
            return self._by_id[found]
        if not payload.startswith(PICKLE_MAGIC) or len(payload) < len(PICKLE_MAGIC) + 2:
            raise FunctionNotFound("these bytes are not a pickled function (made by cudabridge.functions.pickle_function)")
        n = payload[len(PICKLE_MAGIC)]
        start = len(PICKLE_MAGIC) + 1
        version = payload[start:start + n].decode("ascii", "replace")
        if version != _python_version():
            raise FunctionNotFound(f"the function was pickled by Python {version}; this executor runs Python "
                                   f"{_python_version()}: run the driver and the executors on one Python version")
        with self._lock:
            found = self._by_key.get(key)
            if found is not None:
                return self._by_id[found]
            try:
                fn = _cloudpickle().loads(payload[start + n:])
            except FunctionNotFound:
                raise
            except Exception as exc:   # noqa: BLE001 - whatever unpickling raised, said with its type
                raise FunctionNotFound(f"loading the pickled function failed: {type(exc).__name__}: {exc}\n"
                                       f"{traceback.format_exc()}") from exc
            if not callable(fn):
                raise FunctionNotFound(f"the pickled object is a {type(fn).__name__}, not a function")
            name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
            return self._keep(key, f"{getattr(fn, '__module__', '?')}:{name} (pickled)", fn)

    def keep(self, key: str, name: str, make: Callable[[], Callable[..., Any]]) -> PythonFunction:
        """The function kept under ``key``, made by ``make()`` the first time (a function derived
        from another: functions/batches.py)."""
        found = self._by_key.get(key)
        if found is not None:
            return self._by_id[found]
        with self._lock:
            found = self._by_key.get(key)
            if found is not None:
                return self._by_id[found]
            return self._keep(key, name, make())

    # -------------------------------------------------------------------------------------------
    def _keep(self, key: str, name: str, fn: Callable[..., Any]) -> PythonFunction:
        f = PythonFunction(next(self._ids), name, fn)
        self.callables[f.id] = fn
        self.names[f.id] = name
        self._by_id[f.id] = f
        self._by_key[key] = f.id
        return f

    @staticmethod
    def _add_paths(reference: str, paths: list[str]) -> None:
        """Checks every path first (one refused: none is added), then appends the new ones to
        ``sys.path`` (after the executor's own: shipped files never shadow installed modules)."""
        for p in paths:
            if not isinstance(p, str) or not p:
                raise FunctionNotFound(f"{reference}: a search path must be a non-empty path, got {p!r}")
            why = distrust(p)
            if why is not None:
                raise FunctionNotFound(f"{reference}: search path {p} is not trusted: {why}")
        for p in paths:
            if p not in sys.path:
                sys.path.append(p)

    @staticmethod
    def _import(reference: str) -> Callable[..., Any]:
        module_name, _, attributes = reference.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as exc:
            raise FunctionNotFound(f"{reference}: module {module_name!r} cannot be imported: {exc}") from exc
        except Exception as exc:   # noqa: BLE001 - the module itself raised while importing
            raise FunctionNotFound(f"{reference}: importing module {module_name!r} raised {type(exc).__name__}: "
                                   f"{exc}\n{traceback.format_exc()}") from exc
        for part in attributes.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise FunctionNotFound(f"{reference}: {module_name} has no attribute {attributes!r}") from None
        if not callable(obj):
            raise FunctionNotFound(f"{reference} is a {type(obj).__name__}, not a function")
        return obj
