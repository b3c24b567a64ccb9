"""The host memory one emulated backend treats as page-locked: the buffers it allocated
(``alloc_pinned``) and the ranges registered with it (``host_register``). Whether a copy's host
memory is one of them decides how the copy behaves (emulated_backend.py), as in CUDA: pageable
memory is staged before a copy to the device returns, and a copy from the device into it returns
only once complete.

Nothing is locked in memory for real: a buffer is plain ctypes memory and a registration a ctypes
array over the range, kept by the id of that object, which is what a view of it exports
(``memoryview.obj``). Registration refuses what ``cudaHostRegister`` refuses, with the driver's
error codes, instead of accepting a range that a later copy would fault on.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import CudaError
from .emulated_device import (
    _ERR_HOST_ALREADY_REGISTERED,
    _ERR_HOST_NOT_REGISTERED,
    _ERR_INVALID_VALUE,
    _ERR_NOT_SUPPORTED,
    _fail,
)


def _host_register_refusal(address: int, nbytes: int) -> CudaError | None:
    """What ``cudaHostRegister(address, nbytes, portable)`` refuses, as it answered on the H200
    (CUDA 13 runtime): a null address or no bytes, and a range that wraps past 2^64, are
    ``cudaErrorInvalidValue``; a range reaching into the upper half of the address space (where no
    process memory is: the kernel's half, or a length like 2^63-1) is ``cudaErrorNotSupported``;
    any byte that is not in memory the process has mapped readable and writable (unmapped,
    ``PROT_NONE``, read-only: a portable registration writes) is ``cudaErrorInvalidValue``. The
    driver pins every page; here nothing is pinned, so the pages are checked in /proc/self/maps."""
    call = "cudaHostRegister"
    end = address + nbytes
    if address <= 0 or nbytes <= 0 or end > 1 << 64:
        return _fail(call, _ERR_INVALID_VALUE, f"address {address:#x}, {nbytes} bytes")
    if end > 1 << 63:
        return _fail(call, _ERR_NOT_SUPPORTED, f"[{address:#x}, +{nbytes}) reaches into the upper (the "
                                               f"kernel's) half of the address space")
    try:
        with open("/proc/self/maps", "rb") as f:
            maps = f.read()
    except OSError:   # no /proc (not Linux): the pages go unchecked
        return None
    at = address      # [address, at) is readable and writable; the lines are in address order
    for line in maps.splitlines():
        span, perms = line.split(None, 2)[:2]
        lo, _, hi = span.partition(b"-")
        lo, hi = int(lo, 16), int(hi, 16)
        if hi <= at:
            continue
        if lo > at:
            break
        if perms[:2] != b"rw":
            return _fail(call, _ERR_INVALID_VALUE, f"[{address:#x}, +{nbytes}): {at:#x} is in memory mapped "
                                                   f"{perms.decode()}, not readable and writable")
        at = hi
        if at >= end:
            return None
    return _fail(call, _ERR_INVALID_VALUE, f"[{address:#x}, +{nbytes}): nothing is mapped at {at:#x}")


class _PageLockedHostMemory:
    """One backend's page-locked buffers and registered ranges. ``_lock`` (a plain lock, taken by
    ``with``) makes a registration's overlap check and its store one step; the other calls are one
    dict operation each under the GIL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pinned: dict[int, Any] = {}   # id(buffer or region) -> it

    def alloc(self, nbytes: int) -> Any:
        import ctypes

        buf = (ctypes.c_char * nbytes)()
        self._pinned[id(buf)] = buf
        return buf

    def free(self, buffer: Any) -> None:
        if self._pinned.get(id(buffer)) is not buffer:
            raise _fail("cudaFreeHost", _ERR_INVALID_VALUE, "not a pinned buffer of this backend")
        del self._pinned[id(buffer)]

    def register(self, address: int, nbytes: int) -> Any:
        import ctypes

        refused = _host_register_refusal(address, nbytes)
        if refused is not None:
            raise refused
        region = (ctypes.c_char * nbytes).from_address(address)
        with self._lock:   # (checks first, then the one store)
            for buf in list(self._pinned.values()):
                base = ctypes.addressof(buf)
                if address < base + len(buf) and base < address + nbytes:
                    raise _fail("cudaHostRegister", _ERR_HOST_ALREADY_REGISTERED,
                                f"[{address:#x}, +{nbytes}) overlaps page-locked [{base:#x}, +{len(buf)})")
            self._pinned[id(region)] = region
        return region

    def view_at(self, address: int, nbytes: int) -> memoryview:
        """A view of host memory [address, address + nbytes) for a copy by address (the C paths'
        driver calls, emulated_driver.py): a slice of the page-locked buffer or region that holds
        the whole range, so that :meth:`holds` says page-locked, else a raw view, pageable. A
        range only partly inside one is pageable, as the driver treats it (its copy is staged)."""
        import ctypes

        if address <= 0 or nbytes <= 0:
            raise _fail("cuMemcpyAsync", _ERR_INVALID_VALUE, f"host address {address:#x}, {nbytes} bytes")
        for buf in list(self._pinned.values()):
            base = ctypes.addressof(buf)
            if base <= address and address + nbytes <= base + len(buf):
                return memoryview(buf).cast("B")[address - base:address - base + nbytes]
        return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")

    def unregister(self, region: Any) -> None:
        with self._lock:
            if self._pinned.get(id(region)) is not region:
                raise _fail("cudaHostUnregister", _ERR_HOST_NOT_REGISTERED, "not a registered region of this backend")
            del self._pinned[id(region)]

    def holds(self, view: memoryview) -> bool:
        """Whether ``view`` is of page-locked memory of this backend."""
        obj = view.obj
        # A view over raw memory (PyMemoryView_FromMemory) has no exporter: never pinned.
        return obj is not None and self._pinned.get(id(obj)) is obj
