"""Host kernels of tests/test_native_launch.py's kernels besides saxpy (host_kernels_for_tests), so
that the C launch runs its cases on the emulated device too: named with
spark.cudabridge.emulatedKernels=host_kernels_for_tests,host_kernels_for_launch."""

from __future__ import annotations

import numpy as np

from cudabridge.kernels import host_kernel


@host_kernel("mixed", "i8, i16, i32, i64, f32, f64, bool, ptr")
def mixed(grid, block, c, s, i, ll, f, d, b, out):
    """out[0..6] = each argument as a long long (the float and double times 4), as the CUDA kernel."""
    out.view(np.int64)[:7] = [c, s, i, ll, int(f * 4), int(d * 4), int(b)]


@host_kernel("wild", "ptr")
def wild(grid, block, p):
    """An illegal address, as the CUDA kernel's store to 0x10."""
    _ = p[1 << 40]
