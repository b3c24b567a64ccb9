"""CUDA modules: the code kernels are loaded from, loaded once per executor and GPU.

A :class:`ModuleSource` is what a module is made of: CUDA C++ source compiled at run time (NVRTC),
PTX text, or cubin/fatbin bytes built ahead of time, with the compile options, headers given as
strings, the C++ name expressions to keep (templates: NVRTC must be told before compiling), and
kernel signatures declared at load. :class:`ModuleCache` loads each distinct source once per GPU:
two tasks asking for the same source wait for one load; a failed load (a compile error) is kept
and raised again to every later ask, so a bad kernel does not compile once per task. The cache
key covers everything that changes the result: the source and every option, and the loader's
target (the GPU's architecture and the compiler's version on a real device).
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from ..errors import CudaBridgeError, InvalidArgument
from .params import signature as parse_signature

MODULE_KINDS = ("cuda", "ptx", "cubin")


class ModuleLoadError(CudaBridgeError):
    """A module could not be loaded (for source: the compiler's log says why)."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message + (f"\n{log}" if log else ""))
        self.summary = message
        self.log = log


@dataclass(frozen=True)
class ModuleSource:
    code: str | bytes
    kind: str = "cuda"
    options: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()          # (include name, text)
    name_expressions: tuple[str, ...] = ()
    signatures: tuple[tuple[str, tuple[str, ...]], ...] = ()   # (kernel, kinds) declared at load

    @classmethod
    def of(cls, code: str | bytes, kind: str = "cuda", *, options: Iterable[str] = (),
           headers: Mapping[str, str] | None = None, name_expressions: Iterable[str] = (),
           signatures: Mapping[str, Any] | None = None) -> "ModuleSource":
        """A checked source: every bad part refused with InvalidArgument before anything loads."""
        if kind not in MODULE_KINDS:
            raise InvalidArgument(f"module kind must be one of {', '.join(MODULE_KINDS)}, got {kind!r}")
        if kind == "cubin":
            if not isinstance(code, (bytes, bytearray)) or not code:
                raise InvalidArgument("a cubin module needs its bytes (non-empty)")
            code = bytes(code)
        elif not isinstance(code, str) or not code.strip():
            raise InvalidArgument(f"a {kind} module needs its text (a non-empty str)")
        opts = tuple(options)
        if not all(isinstance(o, str) and o for o in opts):
            raise InvalidArgument(f"compile options are non-empty strs, got {opts!r}")
        hdrs = tuple(sorted((headers or {}).items()))
        if not all(isinstance(n, str) and n and isinstance(t, str) for n, t in hdrs):
            raise InvalidArgument("headers map include names to their text (strs)")
        names = tuple(name_expressions)
        if not all(isinstance(n, str) and n for n in names):
            raise InvalidArgument(f"name expressions are non-empty strs, got {names!r}")
        if kind != "cuda" and (opts or hdrs or names):
            raise InvalidArgument(f"options, headers and name expressions are for CUDA source, not {kind}")
        sigs = tuple(sorted((k, parse_signature(v)) for k, v in (signatures or {}).items()))
        return cls(code, kind, opts, hdrs, names, sigs)

    def digest(self, target: str) -> str:
        """The cache key: this source and everything that changes the loaded result."""
        h = hashlib.sha256()
        for part in (self.kind, target, *self.options, *(f"{n}\0{t}" for n, t in self.headers),
                     *self.name_expressions, *(f"{k}:{','.join(v)}" for k, v in self.signatures)):
            h.update(part.encode())
            h.update(b"\0\1")
        h.update(self.code if isinstance(self.code, bytes) else self.code.encode())
        return h.hexdigest()

    def declared(self, kernel: str) -> tuple[str, ...] | None:
        return dict(self.signatures).get(kernel)


# PTX ".entry name(.param .u64 name_param_0, ...)": the kernel's parameter kinds.
_ENTRY = re.compile(r"\.(?:visible\s+)?\.entry\s+([\w$]+)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+[\w$]+(\[\d+\])?")
_PTX_KIND = {"u64": "ptr", "s64": "i64", "u32": "i32", "s32": "i32", "b32": "i32", "f32": "f32", "f64": "f64",
             "u16": "i16", "s16": "i16", "u8": "i8", "s8": "i8", "b8": "i8", "b64": "i64"}


def ptx_entries(ptx: str) -> dict[str, tuple[str, ...] | None]:
    """Each ``.entry`` of PTX text and its parameter kinds (None where one is not a plain scalar:
    a struct by value). A ``.u64`` is taken as a pointer (PTX does not tell them apart)."""
    out: dict[str, tuple[str, ...] | None] = {}
    for m in _ENTRY.finditer(ptx):
        kinds: list[str] = []
        for p in [p.strip() for p in m.group(2).split(",") if p.strip()]:
            pm = _PARAM.match(p)
            kind = _PTX_KIND.get(pm.group(1)) if pm and not pm.group(2) else None
            if kind is None:
                kinds = None   # type: ignore[assignment]
                break
            kinds.append(kind)
        out[m.group(1)] = tuple(kinds) if kinds is not None else None
    return out


# "__global__ void name(" in CUDA source: the kernels a source defines (extern "C" ones keep
# their names; others are reached through name expressions).
_GLOBAL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)\s*\(")


def source_kernels(code: str) -> set[str]:
    return set(_GLOBAL.findall(code))


class _Entry:
    __slots__ = ("done", "module", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.module: Any = None
        self.error: BaseException | None = None


class ModuleCache:
    """Loaded modules by (GPU, source digest): ``load(source, gpu)`` loads each once; concurrent
    callers for the same key wait for the first; failures are kept and raised again."""

    def __init__(self, loader: Callable[[ModuleSource, int], Any], target: Callable[[int], str]) -> None:
        self._loader = loader
        self._target = target
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, str], _Entry] = {}
        self.loads = 0          # loads run (compiles, on a real device)
        self.hits = 0           # asks served from the cache, or by waiting for a load
        self.failures = 0       # loads that failed (kept: asked again, they fail at once)

    def load(self, source: ModuleSource, gpu: int) -> Any:
        key = (gpu, source.digest(self._target(gpu)))
        with self._lock:
            entry = self._entries.get(key)
            first = entry is None
            if first:
                entry = self._entries[key] = _Entry()
                self.loads += 1
            else:
                self.hits += 1
        if first:
            try:
                entry.module = self._loader(source, gpu)
            except BaseException as exc:
                entry.error = exc
                with self._lock:
                    self.failures += 1
            finally:
                entry.done.set()
        else:
            entry.done.wait()
        if entry.error is not None:
            exc = entry.error
            if isinstance(exc, ModuleLoadError):
                raise ModuleLoadError(exc.summary, exc.log) from exc
            raise exc
        return entry.module

    def __len__(self) -> int:
        return len(self._entries)


class EmulatedModule:
    """A module on the emulated device: its kernels are the host twins of the names it defines
    (found in CUDA source or PTX; any twin for a cubin, whose names cannot be read here)."""

    def __init__(self, source: ModuleSource, twins: Any) -> None:
        self.source = source
        self._twins = twins
        if source.kind == "cuda":
            self.names: set[str] | None = source_kernels(source.code) | set(source.name_expressions)
        elif source.kind == "ptx":
            self.names = set(ptx_entries(source.code))
        else:
            self.names = None

    def kernel(self, name: str) -> Any:
        if self.names is not None and name not in self.names:
            raise InvalidArgument(f"the module defines no kernel {name!r} (it defines: "
                                  f"{', '.join(sorted(self.names)) or 'none'})")
        twin = self._twins.get(name)
        declared = self.source.declared(name)
        if declared is not None and declared != twin.signature:
            raise InvalidArgument(f"kernel {name!r}: the signature declared at load ({', '.join(declared)}) is not "
                                  f"its host twin's ({', '.join(twin.signature)}, {twin.origin})")
        return twin
