"""User kernels: launch configurations, argument kinds, module globals, and the emulated device's
host kernels."""

from ..device.launch_config import DeviceLimits, KernelLimits, LaunchConfig, check_launch
from ..device.params import PARAM_KINDS, DevicePointer, pack_params
from .host_kernels import HostGlobal, HostKernel, HostKernels, host_global, host_kernel
from .module_globals import ModuleGlobal, copy_from_global, copy_to_global

__all__ = ["PARAM_KINDS", "DeviceLimits", "DevicePointer", "HostGlobal", "HostKernel", "HostKernels", "KernelLimits",
           "LaunchConfig", "ModuleGlobal", "check_launch", "copy_from_global", "copy_to_global", "host_global",
           "host_kernel", "pack_params"]
