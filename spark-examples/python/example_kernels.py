"""Host kernels of the examples' kernels: on the emulated device (no GPU) they run in the kernels'
place. The executors find them through spark.cudabridge.emulatedKernels=example_kernels with this
folder in spark.cudabridge.pythonPath (docs/examples.md: examples (a) and (c))."""

from __future__ import annotations

import numpy as np

from cudabridge.kernels import host_kernel


@host_kernel("histogram", "ptr, i32, ptr")
def histogram(grid, block, data, n, bins):
    """bins[v % 16] += 1 for each of the n uint32 values: what GpuHistogramJob's CUDA kernel does
    with atomicAdd, for the whole grid at once."""
    bins.view(np.uint32)[:16] += np.bincount(data.view(np.uint32)[:n] % 16, minlength=16).astype(np.uint32)


@host_kernel("fill_tag", "ptr, i32, i32")
def fill_tag(grid, block, p, n, tag):
    """p[i] = tag for i < n: example (a)'s kernel (PartitionWork.SOURCE)."""
    p.view(np.uint32)[:n] = tag & 0xFFFFFFFF


@host_kernel("sum_i64", "ptr, i32, ptr")
def sum_i64(grid, block, v, n, total):
    """total += the sum of the n int64 values (atomics on the device; two's complement wraps the
    same way): example (e)'s kernel (GpuArrowSumJob.SOURCE)."""
    t = total.view(np.uint64)
    t[0] = (int(t[0]) + int(v.view(np.int64)[:n].sum())) & 0xFFFFFFFFFFFFFFFF
