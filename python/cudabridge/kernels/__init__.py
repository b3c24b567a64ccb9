"""User kernels: launch configurations, argument kinds, and the emulated device's host twins."""

from .host_kernels import HostKernel, HostKernels, host_kernel
from .launch_config import LaunchConfig
from .params import PARAM_KINDS, DevicePointer, pack_params

__all__ = ["PARAM_KINDS", "DevicePointer", "HostKernel", "HostKernels", "LaunchConfig", "host_kernel", "pack_params"]
