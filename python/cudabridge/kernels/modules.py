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
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping

from ..device.params import signature as parse_signature
from ..errors import InvalidArgument, ModuleLoadError, index_int   # ModuleLoadError: also this module's name for it

MODULE_KINDS = ("cuda", "ptx", "cubin")


@dataclass(frozen=True)
class ModuleSource:
    code: str | bytes
    kind: str = "cuda"
    options: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()          # (include name, text)
    name_expressions: tuple[str, ...] = ()
    signatures: tuple[tuple[str, tuple[str, ...]], ...] = ()   # (kernel, kinds) declared at load

    @classmethod
    def of(cls, code: str | bytes, kind: str = "cuda", *, options: Iterable[str] | None = (),
           headers: Mapping[str, str] | None = None, name_expressions: Iterable[str] | None = (),
           signatures: Mapping[str, Any] | None = None) -> "ModuleSource":
        """A checked source: every bad part refused with InvalidArgument, naming it, before anything
        loads. ``options`` and ``name_expressions`` are lists of strs (one str is refused, not taken
        as its characters); ``headers`` maps include names to their text; ``signatures`` maps
        kernel names to a str of kinds ("ptr, i32") or a list of kinds; None is none of them. All
        text must be UTF-8 (it is hashed into the cache key and handed to the compiler as such)."""
        if kind not in MODULE_KINDS:
            raise InvalidArgument(f"module kind must be one of {', '.join(MODULE_KINDS)}, got {kind!r}")
        if kind == "cubin":
            if not isinstance(code, (bytes, bytearray)) or not code:
                raise InvalidArgument("a cubin module needs its bytes (non-empty)")
            code = bytes(code)
        elif not isinstance(code, str) or not code.strip():
            raise InvalidArgument(f"a {kind} module needs its text (a non-empty str)")
        else:
            _utf8(code, "the source text")
        opts = _strs(options, "options", "compile options")
        if not isinstance(headers, Mapping) and headers is not None:
            raise InvalidArgument(f"headers: a mapping of include names to their text, got {type(headers).__name__}")
        hdrs = tuple((headers or {}).items())
        if not all(isinstance(n, str) and n and isinstance(t, str) for n, t in hdrs):
            raise InvalidArgument("headers map include names to their text (strs)")
        for n, t in hdrs:
            _utf8(n, f"header name {n!r}")
            _utf8(t, f"header {n!r}")
        hdrs = tuple(sorted(hdrs))
        names = _strs(name_expressions, "name_expressions", "name expressions")
        if kind != "cuda" and (opts or hdrs or names):
            raise InvalidArgument(f"options, headers and name expressions are for CUDA source, not {kind}")
        if not isinstance(signatures, Mapping) and signatures is not None:
            raise InvalidArgument(f"signatures: a mapping of kernel names to signatures, got "
                                  f"{type(signatures).__name__}")
        sigs = []
        for k, v in (signatures or {}).items():
            if not isinstance(k, str) or not k:
                raise InvalidArgument(f"signatures: kernel names are non-empty strs, got {k!r}")
            _utf8(k, f"signature name {k!r}")
            if not isinstance(v, (str, list, tuple)):
                raise InvalidArgument(f"signatures[{k!r}]: a str of kinds (\"ptr, i32\") or a list of kinds, got "
                                      f"{type(v).__name__}")
            sigs.append((k, parse_signature(v)))
        return cls(code, kind, opts, hdrs, names, tuple(sorted(sigs)))

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


def _strs(values: Any, arg: str, what: str) -> tuple[str, ...]:
    """``values`` (an iterable of non-empty strs, or None) as a tuple; a single str is refused:
    iterated, it would be its characters (``"-O3"`` three options)."""
    if values is None:
        return ()
    if isinstance(values, (str, bytes)):
        raise InvalidArgument(f"{arg}: a list of strs, got one {type(values).__name__} {values!r} "
                              f"(write [{values!r}])")
    try:
        out = tuple(values)
    except TypeError:
        raise InvalidArgument(f"{arg}: a list of strs, got {type(values).__name__}") from None
    if not all(isinstance(v, str) and v for v in out):
        raise InvalidArgument(f"{arg}: {what} are non-empty strs, got {out!r}")
    for v in out:
        _utf8(v, f"{what[:-1]} {v!r}")      # "compile option '-O3'"
    return out


def _utf8(text: str, what: str) -> None:
    """Refuse text with a lone surrogate (no UTF-8 for it: the cache key and the compiler take
    the source as UTF-8)."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{what}: not UTF-8 (a lone surrogate {text[exc.start]!r} at index "
                              f"{exc.start})") from None


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
    """One load of the module cache. ``outcome`` is None until the load ends, then ``(module,
    None)`` or ``(None, error)`` for an error the source itself caused (kept). A load that ended
    in anything else (an interruption, a failure not the source's) leaves ``outcome`` None with
    ``done`` set: the entry is abandoned, and whoever finds it loads again."""

    __slots__ = ("done", "outcome")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.outcome: tuple[Any, BaseException | None] | None = None

    @property
    def abandoned(self) -> bool:
        return self.done.is_set() and self.outcome is None


def _kept(exc: BaseException) -> bool:
    """Whether a load's failure is the source's own, to be raised again to every later ask: a
    compile error or a refused image (ModuleLoadError), a bad part of the source (InvalidArgument).
    Anything else (KeyboardInterrupt, SystemExit, MemoryError, an OSError, a CUDA error, a
    ModuleLoadError marked transient) is the loading thread's: kept, it would fail every later
    load of the source for the life of the process."""
    return isinstance(exc, (ModuleLoadError, InvalidArgument)) and not getattr(exc, "transient", False)


class ModuleCache:
    """Loaded modules by (GPU, source digest): ``load(source, gpu)`` loads each once; concurrent
    callers for the same key wait for the first; the source's own failures (``_kept``) are kept
    and raised again. A load that fails otherwise is raised to its own caller only: the callers
    waiting on it load again themselves (one loads, the rest wait for that one), and so does
    every later ask."""

    def __init__(self, loader: Callable[[ModuleSource, int], Any], target: Callable[[int], str]) -> None:
        self._loader = loader
        self._target = target
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, str], _Entry] = {}
        self.loads = 0          # loads run (compiles, on a real device)
        self.hits = 0           # asks served from the cache, or by waiting for a load
        self.failures = 0       # loads that failed by the source's fault (kept: asked again, they fail at once)
        self.abandoned = 0      # loads that failed otherwise (interrupted, transient): not kept

    def load(self, source: ModuleSource, gpu: int) -> Any:
        # checked before anything is counted or entered: a refused ask changes nothing
        if source.__class__ is not ModuleSource:
            raise InvalidArgument(f"load_module: expects a ModuleSource (ModuleSource.of(code, ...)), got "
                                  f"{type(source).__name__}")
        gpu = index_int(gpu, "load_module: gpu")
        key = (gpu, source.digest(self._target(gpu)))
        while True:
            entry = self._once(key, source, gpu)
            outcome = entry.outcome
            if outcome is not None:
                break
            # the load this ask waited for was abandoned: load again (or wait for whoever does)
        module, exc = outcome
        if exc is not None:
            if isinstance(exc, ModuleLoadError):
                raise ModuleLoadError(exc.summary, exc.log) from exc
            raise exc
        return module

    def _once(self, key: tuple[int, str], source: ModuleSource, gpu: int) -> _Entry:
        """The entry of ``key`` once its load has ended: this thread's own load where none was
        running or kept (its failure, unless kept, raised here), or the one it waited for."""
        mine = _Entry()
        # ``mine.done`` is set on every way out, so no thread waits forever on it whatever
        # interrupts this one; an entry left without an outcome is abandoned (``_Entry``)
        try:
            with self._lock:
                entry = self._entries.get(key)
                if entry is None or entry.abandoned:
                    entry = self._entries[key] = mine
                    self.loads += 1
                else:
                    self.hits += 1
            if entry is not mine:
                entry.done.wait()
                return entry
            try:
                mine.outcome = (self._loader(source, gpu), None)
            except BaseException as exc:
                if not _kept(exc):
                    with self._lock:
                        self.abandoned += 1
                        if self._entries.get(key) is mine:
                            del self._entries[key]
                    raise
                mine.outcome = (None, exc)
                with self._lock:
                    self.failures += 1
            return mine
        finally:
            mine.done.set()

    def __len__(self) -> int:
        return len(self._entries)


class EmulatedModule:
    """A module on the emulated device: its kernels are the host kernels of the names it defines
    (found in CUDA source or PTX; any host kernel for a cubin, whose names cannot be read here), and its
    globals are those it defines that the host kernels' modules declare (``host_global``), each given
    its own bytes of the device's memory at load (all of them in one allocation: one module, one
    ``malloc``), zero-filled or holding the declaration's ``initial`` bytes."""

    # each global's offset in the module's allocation is a multiple of this (CUDA aligns globals
    # to their type, at most 16 bytes for the built-in vector types)
    GLOBAL_ALIGN = 256

    def __init__(self, source: ModuleSource, host_kernels: Any, backend: Any = None, gpu: int = 0) -> None:
        self.source = source
        self.gpu = gpu
        self._host_kernels = host_kernels
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
        decls = [host_kernels.global_decl(n) for n in (host_kernels.global_names() if defined is None else sorted(defined))]
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
        raise self._host_kernels.missing_global(name)

    def kernel(self, name: str) -> Any:
        k = self._kernels.get(name)
        if k is not None:
            return k
        if self.names is not None and name not in self.names:
            raise InvalidArgument(f"the module defines no kernel {name!r} (it defines: "
                                  f"{', '.join(sorted(self.names)) or 'none'})")
        host_kernel = self._host_kernels.get(name)
        declared = self.source.declared(name)
        if declared is not None and declared != host_kernel.signature:
            raise InvalidArgument(f"kernel {name!r}: the signature declared at load ({', '.join(declared)}) is not "
                                  f"its host kernel's ({', '.join(host_kernel.signature)}, {host_kernel.origin})")
        bound = []
        for g in host_kernel.globals:         # the host kernel reads this module's copies of its globals
            from .host_kernels import BoundGlobal
            try:
                glob = self.global_(g)
            except InvalidArgument as exc:
                raise InvalidArgument(f"kernel {name!r}: its host kernel ({host_kernel.origin}) reads global {g!r}: "
                                      f"{exc}") from None
            bound.append(BoundGlobal(g, glob.address, glob.size, self._globals[g][1]))
        # the module's kernel: of this module's GPU (the task registry refuses it to a task on
        # another, as it does a CUDA kernel), reading this module's globals
        kernel = replace(host_kernel, bound=tuple(bound), gpu=self.gpu)
        self._kernels[name] = kernel
        return kernel
