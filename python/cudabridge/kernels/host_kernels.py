"""Host twins: what a user kernel is on the emulated device.

The emulated device has no GPU to run a kernel's machine code on; a kernel there is a Python
function registered for the kernel's name, its *host twin*. The service finds twins in the
Python modules named by ``spark.cudabridge.emulatedKernels`` (comma-separated, importable on the
executor's Python path). A twin is called on the stream's worker thread, in stream order, never
inside the launch call, with the launch's grid and block and then the arguments; a ``ptr``
argument arrives as a numpy ``uint8`` array over the device memory from that address to the end
of its allocation (``.view(numpy.float32)`` and so on), so that the twin reads and writes device
memory as the kernel would. It must do what the kernel does for the whole grid at once::

    from cudabridge.kernels import host_kernel

    @host_kernel("saxpy", "ptr, ptr, i32, f32")
    def saxpy(grid, block, x, y, n, a):
        xs, ys = x.view("float32")[:n], y.view("float32")[:n]
        ys += a * xs

A kernel launched on the emulated device with no twin fails with an error that names it and the
setting. The race detector (``emulatedRaceCheck``) counts a twin as reading and writing every
``ptr`` argument's allocation from that address on: a launch not ordered after a conflicting
access on another stream is reported, as for any copy.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

from ..errors import InvalidArgument
from .params import signature as parse_signature

if TYPE_CHECKING:
    from ..device import DeviceBackend
    from .launch_config import LaunchConfig

_MARK = "__cudabridge_host_kernel__"


class Launchable(Protocol):
    """A kernel the task registry can queue on a task's stream (inside the task's lease)."""

    name: str

    def launch(self, backend: "DeviceBackend", stream: int, config: "LaunchConfig", args: list[Any]) -> None: ...


@dataclass(frozen=True)
class HostKernel:
    name: str
    signature: tuple[str, ...]
    fn: Callable[..., None]
    origin: str     # module.function, for messages

    def launch(self, backend: "DeviceBackend", stream: int, config: "LaunchConfig", args: list[Any]) -> None:
        """Queue this twin on ``stream`` of the emulated device (checked there, run in stream order)."""
        launch = getattr(backend, "launch_host_kernel", None)
        if launch is None:
            raise InvalidArgument(f"kernel {self.name!r} is a host twin: it runs on the emulated device only")
        launch(stream, self, config, args)


def host_kernel(name: str | None = None, signature: str | Iterable[str] = ()) -> Callable[[Callable], Callable]:
    """Mark ``fn`` as the host twin of the CUDA kernel ``name`` (default: the function's name) with
    the parameter kinds ``signature`` (see params.py)."""
    kinds = parse_signature(signature)

    def mark(fn: Callable) -> Callable:
        if not callable(fn):
            raise InvalidArgument(f"host_kernel marks a function, got {fn!r}")
        setattr(fn, _MARK, (name or fn.__name__, kinds))
        return fn
    return mark


class HostKernels:
    """The host twins found in ``modules``, by kernel name (the setting's modules, imported once)."""

    def __init__(self, modules: Iterable[str] = (), setting: str = "spark.cudabridge.emulatedKernels") -> None:
        self.setting = setting
        self.modules = tuple(m.strip() for m in modules if m.strip())
        self._by_name: dict[str, HostKernel] = {}
        for module_name in self.modules:
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:   # the message names the setting: a typo is found at start
                raise InvalidArgument(f"{setting}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
            for attr in vars(module).values():
                mark = getattr(attr, _MARK, None)
                if mark is None or not callable(attr):
                    continue
                kname, kinds = mark
                origin = f"{module_name}.{getattr(attr, '__name__', kname)}"
                twin = HostKernel(kname, kinds, attr, origin)
                known = self._by_name.get(kname)
                if known is not None and known.fn is not attr:
                    raise InvalidArgument(f"{setting}: two host twins for kernel {kname!r}: {known.origin} and {origin}")
                self._by_name[kname] = twin

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def get(self, name: str) -> HostKernel:
        twin = self._by_name.get(name)
        if twin is None:
            where = ", ".join(self.modules) if self.modules else "none: the setting is empty"
            raise InvalidArgument(f"kernel {name!r} has no host twin for the emulated device: register one with "
                                  f"@host_kernel({name!r}, ...) in a module named by {self.setting} (modules: {where})")
        return twin
