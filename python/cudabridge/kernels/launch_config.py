"""A launch as task code asks for it: :func:`check_launch_request` refuses one whose parts are not
a module's kernel, a :class:`LaunchConfig` and a list of arguments, before the task registry
enters anything.

The launch's shape and the device's and kernel's limits (:class:`LaunchConfig`,
:class:`DeviceLimits`, :class:`KernelLimits`, :func:`check_launch`) are part of the device
interface and live in ``cudabridge/device/launch_config.py``; they are re-exported here
unchanged."""

from __future__ import annotations

from ..device.launch_config import MAX_DIM, DeviceLimits, KernelLimits, LaunchConfig, check_launch
from ..errors import InvalidArgument

__all__ = ["MAX_DIM", "DeviceLimits", "KernelLimits", "LaunchConfig", "check_launch", "check_launch_request"]


def check_launch_request(kernel: object, config: object, args: object) -> None:
    """Refuse a launch whose parts are not what a launch takes, naming which, before anything is
    entered or queued (``TaskRegistry.launch`` calls it first): ``kernel`` a module's kernel
    (anything with a str ``name`` and a ``launch`` method: a CUDA kernel, a host kernel), ``config``
    a :class:`LaunchConfig`, ``args`` a list or tuple (an iterator would be used up by the checks
    before the launch; each argument is checked against the kernel's signature at the launch)."""
    name = getattr(kernel, "name", None)
    if not isinstance(name, str) or not callable(getattr(kernel, "launch", None)):
        raise InvalidArgument(f"launch: kernel must be a module's kernel (module.kernel(name)), got "
                              f"{type(kernel).__name__}")
    if not isinstance(config, LaunchConfig):
        raise InvalidArgument(f"launch of kernel {name!r}: config must be a LaunchConfig (LaunchConfig(grid, block)), "
                              f"got {type(config).__name__}")
    if not isinstance(args, (list, tuple)):
        raise InvalidArgument(f"launch of kernel {name!r}: args must be a list or tuple of its arguments, got "
                              f"{type(args).__name__}")
