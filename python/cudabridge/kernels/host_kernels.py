"""Host kernels: what a user kernel is on the emulated device.

The emulated device has no GPU to run a kernel's machine code on; a kernel there is a Python
function registered for the kernel's name, its *host kernel*. The service finds host kernels in the
Python modules named by ``spark.cudabridge.emulatedKernels`` (comma-separated, importable on the
executor's Python path). A host kernel is called on the stream's worker thread, in stream order, never
inside the launch call, with the launch's grid and block and then the arguments; a ``ptr``
argument arrives as a numpy ``uint8`` array over the device memory from that address to the end
of its allocation (``.view(numpy.float32)`` and so on), so that the host kernel reads and writes device
memory as the kernel would. It must do what the kernel does for the whole grid at once::

    from cudabridge.kernels import host_kernel

    @host_kernel("saxpy", "ptr, ptr, i32, f32")
    def saxpy(grid, block, x, y, n, a):
        xs, ys = x.view("float32")[:n], y.view("float32")[:n]
        ys += a * xs

A kernel's module globals (``__constant__`` and ``__device__`` variables) are declared for the
emulated device next to the host kernels, with their size in bytes, and a host kernel that reads one names it;
it is passed, after the kernel's arguments, as a numpy ``uint8`` array over the global's device
memory (read-only for a ``__constant__``)::

    from cudabridge.kernels import host_global

    scale = host_global("scale", 4)                  # __constant__ float scale;

    @host_kernel("scale_by", "ptr, i32", globals=["scale"])
    def scale_by(grid, block, y, n, scale):
        y.view("float32")[:n] *= scale.view("float32")[0]

Each module loaded on the emulated device that defines such a global gets its own copy of it in
the device's memory (zero-filled, or ``initial``), as each loaded CUDA module has its own; host
code writes and reads it on a task's stream (``kernels/module_globals.py``).

A kernel launched on the emulated device with no host kernel fails with an error that names it and the
setting. The race detector (``emulatedRaceCheck``) counts a host kernel as reading and writing every
``ptr`` argument's allocation from that address on: a launch not ordered after a conflicting
access on another stream is reported, as for any copy; it counts a host kernel as reading each global it
names, and as writing it too where the global is not constant (a ``__device__`` variable that
kernels write).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple, Protocol

from ..device.launch_config import DeviceLimits, KernelLimits
from ..device.params import signature as parse_signature
from ..errors import InvalidArgument, index_int

if TYPE_CHECKING:
    from ..device import DeviceBackend
    from ..device.launch_config import LaunchConfig

_MARK = "__cudabridge_host_kernel__"


class Launchable(Protocol):
    """A kernel the task registry can queue on a task's stream (inside the task's lease)."""

    name: str

    def launch(self, backend: "DeviceBackend", stream: int, config: "LaunchConfig", args: list[Any]) -> None: ...


@dataclass(frozen=True)
class HostGlobal:
    """A module global (``__constant__`` or ``__device__`` variable) as the emulated device has it:
    its name as host code asks for it, its size, whether kernels only read it (``constant``), and
    the bytes it starts with (the rest zero)."""

    name: str
    nbytes: int
    constant: bool = True
    initial: bytes = b""
    origin: str = ""     # the module that declared it, for messages


def host_global(name: str, nbytes: int, *, constant: bool = True, initial: Any = b"") -> HostGlobal:
    """Declare the global ``name`` of ``nbytes`` bytes for the emulated device (assign the result to
    a module-level name of a module that ``emulatedKernels`` names). ``constant``: a
    ``__constant__`` (kernels only read it; False for a ``__device__`` variable kernels write);
    ``initial``: its first bytes (its initializer in the CUDA source), the rest zero."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgument(f"host_global: a global's name is a non-empty str, got {name!r}")
    nbytes = index_int(nbytes, f"host_global({name!r}) size")
    if nbytes <= 0:
        raise InvalidArgument(f"host_global({name!r}): size must be positive, got {nbytes}")
    if not isinstance(constant, bool):
        raise InvalidArgument(f"host_global({name!r}): constant must be a bool, got {constant!r}")
    try:
        first = bytes(memoryview(initial).cast("B"))
    except TypeError:
        raise InvalidArgument(f"host_global({name!r}): initial must be bytes-like, got "
                              f"{type(initial).__name__}") from None
    if len(first) > nbytes:
        raise InvalidArgument(f"host_global({name!r}): initial has {len(first)} bytes, the global {nbytes}")
    return HostGlobal(name, nbytes, constant, first)


class BoundGlobal(NamedTuple):
    """A global a host kernel reads, as one loaded module has it on the emulated device."""

    name: str
    address: int
    nbytes: int
    constant: bool


@dataclass(frozen=True)
class HostKernel:
    name: str
    signature: tuple[str, ...]
    fn: Callable[..., None]
    origin: str     # module.function, for messages
    globals: tuple[str, ...] = ()        # the globals it reads, passed after the arguments in this order
    bound: tuple[BoundGlobal, ...] = ()  # ... as one module has them (EmulatedModule.kernel binds them)
    # the GPU of the module it was taken from (EmulatedModule.kernel): its bound globals live in
    # that GPU's memory, and a module's kernel belongs to its GPU as a CUDA kernel does, so
    # TaskRegistry.launch refuses it to a task on another GPU; None for a bare host kernel
    # (HostKernels.get), which reads no module's memory and runs on any GPU
    gpu: int | None = None

    @property
    def limits(self) -> KernelLimits:
        """What it allows a launch: any dynamic shared memory the device allows (it has no
        registers or static shared memory to limit it, and needs no opt-in)."""
        return KernelLimits(max_dynamic_shared=DeviceLimits().shared_per_block_optin)

    def launch(self, backend: "DeviceBackend", stream: int, config: "LaunchConfig", args: list[Any]) -> None:
        """Queue this host kernel on ``stream`` of the emulated device (checked there, run in stream order)."""
        launch = getattr(backend, "launch_host_kernel", None)
        if launch is None:
            raise InvalidArgument(f"kernel {self.name!r} is a host kernel: it runs on the emulated device only")
        launch(stream, self, config, args)


def host_kernel(name: str | None = None, signature: str | Iterable[str] = (),
                globals: Iterable[str | HostGlobal] = ()) -> Callable[[Callable], Callable]:
    """Mark ``fn`` as the host kernel of the CUDA kernel ``name`` (default: the function's name) with
    the parameter kinds ``signature`` (see params.py). ``globals``: the module globals it reads
    (names, or what :func:`host_global` returned), passed to it after the arguments, in order."""
    kinds = parse_signature(signature)
    if isinstance(globals, (str, HostGlobal)):
        globals = (globals,)
    reads = tuple(g.name if isinstance(g, HostGlobal) else g for g in globals)
    if not all(isinstance(g, str) and g for g in reads) or len(set(reads)) != len(reads):
        raise InvalidArgument(f"host_kernel({name!r}): globals are distinct non-empty names, got {reads!r}")

    def mark(fn: Callable) -> Callable:
        if not callable(fn):
            raise InvalidArgument(f"host_kernel marks a function, got {fn!r}")
        setattr(fn, _MARK, (name or fn.__name__, kinds, reads))
        return fn
    return mark


def _described(exc: BaseException) -> str:
    """``Type: message`` of an exception, whatever its ``__str__`` does."""
    try:
        text = str(exc)
    except Exception:
        text = "<its message could not be read>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class HostKernels:
    """The host kernels found in ``modules``, by kernel name (the setting's modules, imported once)."""

    def __init__(self, modules: Iterable[str] = (), setting: str = "spark.cudabridge.emulatedKernels") -> None:
        self.setting = setting
        self.modules = tuple(m.strip() for m in modules if m.strip())
        self._by_name: dict[str, HostKernel] = {}
        self._globals: dict[str, HostGlobal] = {}
        for module_name in self.modules:
            try:
                module = importlib.import_module(module_name)
            except (Exception, SystemExit) as exc:
                # the message names the setting: a typo is found at start. A module that calls
                # sys.exit() at import fails like any other (SystemExit is no request to end the
                # executor's Python); only KeyboardInterrupt, the user's, passes through
                raise InvalidArgument(f"{setting}: cannot import {module_name!r}: {_described(exc)}") from exc
            for attr_name, attr in vars(module).items():
                if isinstance(attr, HostGlobal):
                    self._add_global(attr, f"{module_name}.{attr_name}")
                    continue
                mark = getattr(attr, _MARK, None)
                if mark is None or not callable(attr):
                    continue
                kname, kinds, reads = mark
                origin = f"{module_name}.{getattr(attr, '__name__', kname)}"
                host_kernel = HostKernel(kname, kinds, attr, origin, reads)
                known = self._by_name.get(kname)
                if known is not None and known.fn is not attr:
                    raise InvalidArgument(f"{setting}: two host kernels for kernel {kname!r}: {known.origin} and {origin}")
                self._by_name[kname] = host_kernel

    def _add_global(self, decl: HostGlobal, origin: str) -> None:
        known = self._globals.get(decl.name)
        if known is not None and (known.nbytes, known.constant, known.initial) != (decl.nbytes, decl.constant,
                                                                                   decl.initial):
            raise InvalidArgument(f"{self.setting}: two different declarations of global {decl.name!r}: "
                                  f"{known.origin} and {origin}")
        if known is None:
            self._globals[decl.name] = HostGlobal(decl.name, decl.nbytes, decl.constant, decl.initial, origin)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def global_names(self) -> list[str]:
        return sorted(self._globals)

    def global_decl(self, name: str) -> HostGlobal | None:
        """The declaration of global ``name`` (:func:`host_global`), or None."""
        return self._globals.get(name)

    def missing_global(self, name: str) -> InvalidArgument:
        """The error for a global the emulated device has no declaration of."""
        where = ", ".join(self.modules) if self.modules else "none: the setting is empty"
        return InvalidArgument(f"global {name!r} has no declaration for the emulated device: declare it with "
                               f"host_global({name!r}, <bytes>) in a module named by {self.setting} "
                               f"(modules: {where})")

    def get(self, name: str) -> HostKernel:
        host_kernel = self._by_name.get(name)
        if host_kernel is None:
            where = ", ".join(self.modules) if self.modules else "none: the setting is empty"
            raise InvalidArgument(f"kernel {name!r} has no host kernel for the emulated device: register one with "
                                  f"@host_kernel({name!r}, ...) in a module named by {self.setting} (modules: {where})")
        return host_kernel
