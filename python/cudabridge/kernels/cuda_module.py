"""Modules on a real GPU: CUDA source compiled with NVRTC (through NVIDIA's cuda.bindings) to PTX,
loaded with the driver; kernels launched with ``cuLaunchKernel`` from Python.

Source is compiled for the GPU's own architecture (``compute_XY``, unless the options name one)
with ``-std=c++17`` and the CUDA toolkit's include directories (``cuda_headers.py``, unless the
options name include paths); the driver turns the PTX into machine code at load. The PTX's
``.entry`` declarations give each kernel's parameter kinds (a ``.u64`` is taken as a pointer),
unless a signature was declared at load; its ``.global`` / ``.const`` declarations name the
module's globals. This is the Python launch path; Java launches go through the hot path's C twin
(``jvm/_hotcore.c``), which takes the kernel's function from here.
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from typing import Any

from ..device.launch_config import LaunchConfig, check_launch
from ..device.params import DevicePointer, check_args, param_layout
from ..errors import InvalidArgument
from .cuda_headers import CudaHeaders, cuda_headers, names_include_path, nvrtc_major
from .module_globals import ModuleGlobal
from .modules import ModuleLoadError, ModuleSource, ptx_entries, ptx_globals


# NVRTC's words for an #include it could not find ("could not open source file" when it has no
# include path at all)
_MISSING_INCLUDE = re.compile(r'(?:cannot|could not) open source file "([^"]+)"')


def compile_to_ptx(nvrtc: Any, source: ModuleSource, arch: str,
                   headers: CudaHeaders | None = None) -> tuple[str, dict[str, str]]:
    """(PTX, {name expression: lowered name}); ModuleLoadError with NVRTC's log on failure.
    ``headers``: the CUDA include directories, passed unless the options give include paths."""
    def ok(call: str, result: Any) -> Any:
        if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            # out of memory is the process's state, not the source's: not kept by the module cache
            raise ModuleLoadError(f"{call} failed: {result[0].name}",
                                  transient=result[0] == nvrtc.nvrtcResult.NVRTC_ERROR_OUT_OF_MEMORY)
        return result[1] if len(result) > 1 else None

    names = [n.encode() for n, _ in source.headers]
    texts = [t.encode() for _, t in source.headers]
    prog = ok("nvrtcCreateProgram", nvrtc.nvrtcCreateProgram(source.code.encode(), b"module.cu", len(names), texts, names))
    try:
        for expr in source.name_expressions:
            ok("nvrtcAddNameExpression", nvrtc.nvrtcAddNameExpression(prog, expr.encode()))
        opts = list(source.options)
        if not any(o.startswith(("--gpu-architecture", "-arch")) for o in opts):
            opts.insert(0, f"--gpu-architecture={arch}")
        if not any(o.startswith(("-std", "--std")) for o in opts):
            opts.append("-std=c++17")
        if headers is not None and not names_include_path(source.options):
            opts += headers.options()
        err = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])[0]
        size = ok("nvrtcGetProgramLogSize", nvrtc.nvrtcGetProgramLogSize(prog))
        # NVRTC writes into the buffer: a bytearray, never bytes (b" " * 1 is the interpreter's shared
        # one-byte object, and writing a NUL into it turns every b" " in the process into b"\0")
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        text = log.decode(errors="replace").rstrip("\x00 \n")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            summary = f"the module did not compile ({err.name}, options {opts})"
            missing = _MISSING_INCLUDE.search(text)
            if missing and headers is not None and not names_include_path(source.options):
                summary += "; " + headers.hint(missing.group(1))
            raise ModuleLoadError(summary, text, transient=err == nvrtc.nvrtcResult.NVRTC_ERROR_OUT_OF_MEMORY)
        size = ok("nvrtcGetPTXSize", nvrtc.nvrtcGetPTXSize(prog))
        ptx = bytearray(size)
        ok("nvrtcGetPTX", nvrtc.nvrtcGetPTX(prog, ptx))
        lowered = {expr: ok("nvrtcGetLoweredName", nvrtc.nvrtcGetLoweredName(prog, expr.encode())).decode()
                   for expr in source.name_expressions}
        return ptx.decode(errors="replace").rstrip("\x00"), lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


class CudaKernel:
    __slots__ = ("name", "signature", "function", "gpu", "limits", "_lock")

    def __init__(self, name: str, signature: tuple[str, ...], function: Any, gpu: int, limits: Any) -> None:
        self.name = name
        self.signature = signature
        self.function = function
        self.gpu = gpu
        self.limits = limits           # KernelLimits, the dynamic shared maximum raised as asked
        self._lock = threading.Lock()

    def launch(self, backend: Any, stream: int, config: LaunchConfig, args: list[Any]) -> None:
        # every check before the opt-in below: a refused launch changes nothing
        values = [v.address if v.__class__ is DevicePointer else v
                  for v in check_args(self.signature, args, self.name)]
        raise_to = check_launch(config, backend.device_limits(self.gpu), self.limits, self.name)
        if raise_to is not None:
            with self._lock:           # opt in once, for every later launch as large
                if raise_to > self.limits.max_dynamic_shared:
                    backend.raise_dynamic_shared(self.function, raise_to)
                    self.limits = replace(self.limits, max_dynamic_shared=raise_to)
        backend.launch_kernel(self.function, config, stream, self.signature, values, self.gpu)


_PTX_TARGET = re.compile(r"^\s*\.target\s+sm_(\d+)", re.M)


def _load_refusal(exc: "ModuleLoadError", ptx: str, arch: str, gpu: int) -> "ModuleLoadError":
    """The driver's refusal, said plainly where the PTX targets a newer architecture than the GPU's
    (``arch`` is ``compute_XY``): a driver cannot run code for a GPU generation after its device's."""
    m = _PTX_TARGET.search(ptx) if ptx else None
    have = int(arch.removeprefix("compute_"))
    if m is not None and int(m.group(1)) > have:
        return ModuleLoadError(f"the module's PTX targets sm_{m.group(1)}, newer than GPU {gpu}'s sm_{have}: compile "
                               f"it for sm_{have} or older (the default for CUDA source is the GPU's own "
                               f"architecture), or load a binary with code for sm_{have} ({exc.summary})")
    return exc


class CudaModule:
    def __init__(self, backend: Any, source: ModuleSource, gpu: int,
                 compiled: tuple[str, dict[str, str]] | None = None) -> None:
        """Load ``source`` on GPU ``gpu``; CUDA source is compiled here unless ``compiled`` holds
        its (PTX, lowered names) already (the module loader's disk store)."""
        self.source = source
        if source.kind == "cuda":
            if compiled is None:
                compiled = compile_to_ptx(backend.nvrtc, source, backend.compute_arch(gpu),
                                          cuda_headers(nvrtc_major(backend.nvrtc)))
            ptx, self.lowered = compiled
            image: bytes = ptx.encode() + b"\0"
        elif source.kind == "ptx":
            ptx, self.lowered = source.code, {}
            image = ptx.encode() + b"\0"
        else:
            ptx, self.lowered, image = "", {}, source.code
        self.entries = ptx_entries(ptx) if ptx else {}
        self.globals = ptx_globals(ptx) if ptx else None   # None: a cubin's cannot be listed here
        try:
            self.handle = backend.module_load(image, gpu)
        except ModuleLoadError as exc:
            raise _load_refusal(exc, ptx, backend.compute_arch(gpu), gpu) from exc
        self.gpu = gpu
        self._backend = backend
        self._kernels: dict[str, CudaKernel] = {}
        self._global_vars: dict[str, ModuleGlobal] = {}
        self._lock = threading.Lock()

    def global_(self, name: str) -> ModuleGlobal:
        """The module's ``__constant__`` or ``__device__`` variable ``name``: its device address and
        size (``cuModuleGetGlobal``). A C++ name (not ``extern "C"``, or in a namespace) is found
        through its name expression, given at load as ``&name`` (NVRTC takes a variable's address)."""
        g = self._global_vars.get(name)
        if g is not None:
            return g
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"a global's name is a non-empty str, got {name!r}")
        symbol = self.lowered.get(name) or self.lowered.get("&" + name) or name
        if self.globals is not None and symbol not in self.globals:
            named = {low: expr.lstrip("&") for expr, low in self.lowered.items()}   # as the user wrote them
            raise InvalidArgument(f"the module defines no global {name!r} (it defines: "
                                  f"{', '.join(sorted(named.get(s, s) for s in self.globals)) or 'none'}; a C++ "
                                  f"name is found through its name expression &name, given at load)")
        address, size = self._backend.module_global(self.handle, symbol, name, self.gpu)
        with self._lock:
            g = self._global_vars.setdefault(name, ModuleGlobal(name, address, size, self.gpu))
        return g

    def kernel(self, name: str) -> CudaKernel:
        k = self._kernels.get(name)
        if k is not None:
            return k
        symbol = self.lowered.get(name, name)
        if self.source.kind != "cubin" and symbol not in self.entries:
            raise InvalidArgument(f"the module defines no kernel {name!r} (it defines: "
                                  f"{', '.join(sorted(self.entries)) or 'none'})")
        sig = self.source.declared(name)
        if sig is None:
            sig = self.entries.get(symbol)
            if sig is None:
                raise InvalidArgument(f"kernel {name!r}: declare its signature at load (its parameters are not "
                                      f"all plain scalars and pointers in the PTX, or the module is a cubin)")
        function = self._backend.module_function(self.handle, symbol, name)
        # the signature (the PTX's or one declared) against the compiled kernel's own parameters:
        # a declared signature that does not match would pass arguments at the wrong places
        theirs = self._backend.param_layout(function)
        if theirs is not None and theirs != param_layout(sig):
            raise InvalidArgument(f"kernel {name!r}: the signature ({', '.join(sig)}) places parameters at "
                                  f"(offset, size) {param_layout(sig)}, the compiled kernel's are {theirs} "
                                  f"(cuFuncGetParamInfo): declare the signature that matches")
        with self._lock:   # one kernel object per name: Java registers it once
            k = self._kernels.get(name)
            if k is None:
                k = self._kernels[name] = CudaKernel(name, sig, function, self.gpu,
                                                     self._backend.kernel_limits(function))
        return k
