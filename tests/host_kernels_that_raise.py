"""Host kernels that raise what a kernel's Python stand-in should never raise (named by
spark.cudabridge.emulatedKernels=host_kernels_that_raise in tests/test_emulated_backend.py): each must
be the device's sticky illegal-address error, as any other exception of a twin is."""

from __future__ import annotations

from cudabridge.kernels import host_kernel


class ReprFails(Exception):
    """An exception that cannot even be described."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")

    __str__ = __repr__


@host_kernel("exits", "ptr")
def exits(grid, block, p):
    raise SystemExit(3)


@host_kernel("interrupts", "ptr")
def interrupts(grid, block, p):
    raise KeyboardInterrupt


@host_kernel("undescribable", "ptr")
def undescribable(grid, block, p):
    raise ReprFails()
