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
# (a template's instantiation is ".weak .entry": several translation units may each emit it)
_ENTRY = re.compile(r"\.(?:(?:visible|weak)\s+\.)?entry\s+([\w$]+)\s*\(([^)]*)\)", re.S)
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


# A module-scope ".global" or ".const" declaration of PTX text (not ".extern": defined elsewhere),
# e.g. ".visible .const .align 4 .f32 scale;" or ".global .align 4 .b8 table[64] = {...};". PTX
# instructions (ld.global...) never start a line with a dot.
_PTX_GLOBAL = re.compile(r"^[ \t]*(?:\.(?:visible|weak|common)[ \t]+)*\.(?:global|const)\b[^;=\n]*?"
                         r"([A-Za-z_$%][\w$]*)[ \t]*(?:\[[^\]]*\][ \t]*)*[;=]", re.M)


def ptx_globals(ptx: str) -> set[str]:
    """The names of the module globals (``__constant__`` / ``__device__`` variables) PTX defines,
    as the driver's ``cuModuleGetGlobal`` finds them (C++ names lowered)."""
    return set(_PTX_GLOBAL.findall(ptx))


# "__constant__ float scale;", "__device__ unsigned table[16] = {...};": the variables a CUDA source
# defines, read well enough for the emulated device (which has no compiler): after each
# __constant__ / __device__ / __managed__, the text up to the first "(", "{" or ";" is a variable's
# declaration when no "(" ends it before an initializer (a "(" with no "=" before it is a function).
_SPACE_QUALIFIER = re.compile(r"\b__(?:constant|device|managed)__\b")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_IDENT = re.compile(r"[A-Za-z_]\w*")


def source_globals(code: str) -> set[str]:
    text = _COMMENT.sub(" ", code)
    names: set[str] = set()
    for m in _SPACE_QUALIFIER.finditer(text):
        end = m.end()
        stop = min((i for i in (text.find(c, end) for c in "({;") if i >= 0), default=len(text))
        decl = text[end:stop]
        if stop < len(text) and text[stop] == "(" and "=" not in decl:
            continue                      # a function
        decl = decl.split("=", 1)[0]
        parts = decl.split(",") if "<" not in decl else [decl]   # int a, b; (not inside a template's <>)
        for part in parts:
            idents = _IDENT.findall(re.sub(r"\[[^\]]*\]", " ", part))
            if idents and not idents[-1].startswith("__"):
                names.add(idents[-1])
    return names


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
    (found in CUDA source or PTX; any twin for a cubin, whose names cannot be read here), and its
    globals are those it defines that the twins' modules declare (``host_global``), each given
    its own bytes of the device's memory at load (all of them in one allocation: one module, one
    ``malloc``), zero-filled or holding the declaration's ``initial`` bytes."""

    # each global's offset in the module's allocation is a multiple of this (CUDA aligns globals
    # to their type, at most 16 bytes for the built-in vector types)
    GLOBAL_ALIGN = 256

    def __init__(self, source: ModuleSource, twins: Any, backend: Any = None, gpu: int = 0) -> None:
        self.source = source
        self.gpu = gpu
        self._twins = twins
        self._kernels: dict[str, Any] = {}
        if source.kind == "cuda":
            self.names: set[str] | None = source_kernels(source.code) | set(source.name_expressions)
            defined: set[str] | None = source_globals(source.code) | {e.lstrip("&").strip()
                                                                      for e in source.name_expressions}
        elif source.kind == "ptx":
            self.names = set(ptx_entries(source.code))
            defined = ptx_globals(source.code)
        else:
            self.names = defined = None
        self.global_names = defined       # what the module defines (None: a cubin, not readable)
        self._globals: dict[str, Any] = {}
        decls = [twins.global_decl(n) for n in (twins.global_names() if defined is None else sorted(defined))]
        decls = [d for d in decls if d is not None]
        if decls:
            if backend is None:
                raise InvalidArgument("an emulated module with globals needs the device backend to hold them")
            self._globals = self._place(decls, backend, gpu)

    def _place(self, decls: list[Any], backend: Any, gpu: int) -> dict[str, Any]:
        from ..device.backend import LEGACY_STREAM
        from .module_globals import ModuleGlobal
        offsets, end = [], 0
        for d in decls:
            offsets.append(end)
            end += -(-d.nbytes // self.GLOBAL_ALIGN) * self.GLOBAL_ALIGN
        prev = backend.get_device()
        backend.set_device(gpu)
        try:
            base = backend.malloc(end)    # freed with the device: a loaded module lives as long
            if any(d.initial for d in decls):
                for d, off in zip(decls, offsets):
                    if d.initial:
                        backend.copy_to_device_async(base + off, d.initial, LEGACY_STREAM)
                backend.stream_synchronize(LEGACY_STREAM)   # in place before any task can use it
        finally:
            backend.set_device(prev)
        return {d.name: (ModuleGlobal(d.name, base + off, d.nbytes, gpu), d.constant) for d, off in zip(decls, offsets)}

    def global_(self, name: str) -> Any:
        """The module's global ``name`` (a ``ModuleGlobal``: its address and size)."""
        placed = self._globals.get(name)
        if placed is not None:
            return placed[0]
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"a global's name is a non-empty str, got {name!r}")
        if self.global_names is not None and name not in self.global_names:
            raise InvalidArgument(f"the module defines no global {name!r} (it defines: "
                                  f"{', '.join(sorted(self.global_names)) or 'none'})")
        raise self._twins.missing_global(name)

    def kernel(self, name: str) -> Any:
        k = self._kernels.get(name)
        if k is not None:
            return k
        if self.names is not None and name not in self.names:
            raise InvalidArgument(f"the module defines no kernel {name!r} (it defines: "
                                  f"{', '.join(sorted(self.names)) or 'none'})")
        twin = self._twins.get(name)
        declared = self.source.declared(name)
        if declared is not None and declared != twin.signature:
            raise InvalidArgument(f"kernel {name!r}: the signature declared at load ({', '.join(declared)}) is not "
                                  f"its host twin's ({', '.join(twin.signature)}, {twin.origin})")
        if twin.globals:               # the twin reads this module's copies of its globals
            from dataclasses import replace

            from .host_kernels import BoundGlobal
            bound = []
            for g in twin.globals:
                try:
                    glob = self.global_(g)
                except InvalidArgument as exc:
                    raise InvalidArgument(f"kernel {name!r}: its host twin ({twin.origin}) reads global {g!r}: "
                                          f"{exc}") from None
                bound.append(BoundGlobal(g, glob.address, glob.size, self._globals[g][1]))
            twin = replace(twin, bound=tuple(bound))
        self._kernels[name] = twin
        return twin
