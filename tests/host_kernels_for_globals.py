"""Host kernels of kernels that use module globals, and the globals' declarations for the emulated
device (spark.cudabridge.emulatedKernels=host_kernels_for_globals in test_module_globals.py and
DeviceGlobalTest). The CUDA source they stand for is GLOBALS_SOURCE in test_module_globals.py:

    __constant__ float scale;                        // written by the host before the launch
    __constant__ int offsets[4] = {1, 2, 3, 4};      // an initializer
    __device__ unsigned long long launches;          // written by the kernel, read by the host
    extern "C" __global__ void scale_by(float* y, int n) { ... y[i] = y[i] * scale + offsets[i % 4]; ...
                                                           if (i == 0) launches += 1; }
"""

from __future__ import annotations

import numpy as np

from cudabridge.kernels import host_global, host_kernel

scale = host_global("scale", 4)                                              # __constant__ float
offsets = host_global("offsets", 16, initial=np.arange(1, 5, dtype=np.int32).tobytes())
launches = host_global("launches", 8, constant=False)                       # __device__ unsigned long long


@host_kernel("scale_by", "ptr, i32", globals=[scale, offsets, launches])
def scale_by(grid, block, y, n, scale, offsets, launches):
    """y[i] = y[i] * scale + offsets[i % 4] for i < n; one more launch counted."""
    assert grid[0] * block[0] >= n, "the grid does not cover n"
    ys = y.view(np.float32)[:n]
    ys *= scale.view(np.float32)[0]
    ys += offsets.view(np.int32)[np.arange(n) % 4].astype(np.float32)
    launches.view(np.uint64)[0] += 1


@host_kernel("write_scale", "f32", globals=["scale"])
def write_scale(grid, block, value, scale):
    """A kernel writing a __constant__ (CUDA would not compile it): refused by the read-only view."""
    scale.view(np.float32)[0] = value
