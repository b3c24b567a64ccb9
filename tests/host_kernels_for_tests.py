"""Host kernels of the test kernels (the emulated device runs them in the kernels' place): named by
spark.cudabridge.emulatedKernels=host_kernels_for_tests in the tests."""

from __future__ import annotations

import numpy as np

from cudabridge.kernels import host_kernel

calls: list[str] = []   # the order the twins ran in, for the tests


@host_kernel("saxpy", "ptr, ptr, i32, f32")
def saxpy(grid, block, x, y, n, a):
    """y[i] += a * x[i] for i < n, over the whole grid at once (as the CUDA kernel would)."""
    assert grid[0] * block[0] >= n, "the grid does not cover n"
    ys = y.view(np.float32)[:n]
    ys += np.float32(a) * x.view(np.float32)[:n]
    calls.append("saxpy")


@host_kernel("histogram", "ptr, i32, ptr")
def histogram(grid, block, data, n, bins):
    """bins[v % 16] += 1 for each of the n uint32 values (atomics on the device)."""
    counts = np.bincount(data.view(np.uint32)[:n] % 16, minlength=16).astype(np.uint32)
    bins.view(np.uint32)[:16] += counts
    calls.append("histogram")


@host_kernel("faults", "ptr")
def faults(grid, block, p):
    """An illegal address: reads far past its buffer."""
    _ = p[1 << 40]
