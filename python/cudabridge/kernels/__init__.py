"""User kernels: launch configurations, argument kinds, and the emulated device's host twins."""

from .host_kernels import HostKernel, HostKernels, host_kernel
from .launch_config import DeviceLimits, KernelLimits, LaunchConfig, check_launch
from .params import PARAM_KINDS, DevicePointer, pack_params

__all__ = ["PARAM_KINDS", "DeviceLimits", "DevicePointer", "HostKernel", "HostKernels", "KernelLimits", "LaunchConfig",
           "check_launch", "host_kernel", "pack_params"]
