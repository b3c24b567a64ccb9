"""One emulated GPU's memory: device memory as host memory behind fake device addresses, virtual
memory (reservations, physical handles, their mappings), and the GPU's sticky error; with the
address layout of all emulated GPUs and the CUDA error codes the emulated device raises.

What is modelled and why is the backend's contract (emulated_backend.py's docstring). Here, the
invariants the model keeps: addresses are never reused and never leave their GPU's window, two
allocations are never adjacent (a pool that coalesces across two ``malloc`` results is caught),
and every access is checked against one allocation (``view``, ``extent``).

Below the streams (emulated_streams.py): a GPU holds its legacy stream, made by the backend on
first use, but nothing here calls a stream.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import mmap
import threading
import uuid
from typing import Any

from ..config import BY_KEY
from ..errors import CudaError
from .backend import DeviceAllocationFailed
from .emulated_device_thread import _DEVICE_THREAD, log

_ERR_OUT_OF_MEMORY = (2, "cudaErrorMemoryAllocation")
_ERR_INVALID_VALUE = (1, "cudaErrorInvalidValue")
_ERR_HOST_ALREADY_REGISTERED = (712, "cudaErrorHostMemoryAlreadyRegistered")
_ERR_HOST_NOT_REGISTERED = (713, "cudaErrorHostMemoryNotRegistered")
_ERR_INVALID_DEVICE = (101, "cudaErrorInvalidDevice")
_ERR_INVALID_HANDLE = (400, "cudaErrorInvalidResourceHandle")
_ERR_ILLEGAL_ADDRESS = (700, "cudaErrorIllegalAddress")
_ERR_NOT_SUPPORTED = (801, "cudaErrorNotSupported")

# Fake address spaces: each device gets its own 1 TiB window, chunks are separated by a gap.
# The window is the most memory an emulated GPU may have: one constant, the emulatedMemory
# setting's max in settings.json (which the Java check reads too), so that the setting's bound
# and this layout cannot drift apart; a larger memory would let GPU n's buffers run into GPU n+1's
# window (and the backend's _device_of would name the wrong GPU).
_ADDRESS_BASE = 0x7F00_0000_0000
_DEVICE_WINDOW = BY_KEY["emulatedMemory"].max   # 1 << 40
_ALLOC_GRANULE = 1 << 21  # cudaMalloc rounds to 2 MiB pages; keep one page of gap too


def _fail(call: str, err: tuple[int, str], detail: str = "") -> CudaError:
    return CudaError(call, err[0], err[1], detail)


_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value; Python 3.11 lacks the name
_PHYS_HANDLES = itertools.count(0x5000_0001)


class _Reservation:
    __slots__ = ("base", "size", "pages", "mappings")

    def __init__(self, base: int, size: int) -> None:
        self.base = base
        self.size = size
        self.pages = bytearray(size // _ALLOC_GRANULE)   # 1 where a handle is mapped
        self.mappings: dict[int, tuple[int, int]] = {}   # start -> (size, handle)

    def accessible(self, ptr: int, nbytes: int) -> bool:
        p0 = (ptr - self.base) // _ALLOC_GRANULE
        p1 = -(-(ptr - self.base + max(nbytes, 1)) // _ALLOC_GRANULE)
        return self.pages.find(0, p0, p1) == -1


class _Physical:
    __slots__ = ("size", "mapped_at", "released")

    def __init__(self, size: int) -> None:
        self.size = size
        self.mapped_at: int | None = None
        self.released = False


class _EmuDevice:
    """One emulated GPU: its memory, virtual memory and sticky error.

    ``_lock`` is a plain ``_thread`` lock taken only by ``with``, so that no exception leaves it
    held; inside it each step makes its calls (``mmap``, ``bisect``, lookups, constructors) before
    its first change and then changes the books with plain stores, any one mutating call last: an
    exception, asynchronous ones included (they land only at calls and loops' jumps back), finds
    the step done or not begun, never the books half changed."""

    def __init__(self, ordinal: int, memory_bytes: int) -> None:
        self.ordinal = ordinal
        self.total = memory_bytes
        self.used = 0
        self.uuid = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"cudabridge-emulated-{ordinal}"))
        self._lock = threading.Lock()
        self._bases: list[int] = []          # sorted
        self._chunks: dict[int, mmap.mmap] = {}
        self._reservations: dict[int, _Reservation] = {}
        self._phys: dict[int, _Physical] = {}
        self._next = _ADDRESS_BASE + ordinal * _DEVICE_WINDOW
        # addresses are never reused (_next only grows), and all of them lie in this GPU's window:
        # an allocation past its end is refused, never placed in the next GPU's addresses
        self._window_end = _ADDRESS_BASE + (ordinal + 1) * _DEVICE_WINDOW
        self.sticky: CudaError | None = None
        self.context_created = False
        # its legacy stream (an _EmuStream of emulated_streams.py), made by the backend on first use
        self.legacy: Any = None

    def set_sticky(self, exc: CudaError) -> None:
        if self.sticky is None:
            self.sticky = exc
            # logged by the device thread: a stream's worker (the usual caller) never takes logging's locks
            _DEVICE_THREAD.post(functools.partial(log.error, "emulated GPU %d: sticky error %s", self.ordinal, exc))

    def malloc(self, nbytes: int) -> int:
        span = -(-nbytes // _ALLOC_GRANULE) * _ALLOC_GRANULE
        with self._lock:
            if self.used + span > self.total:
                raise DeviceAllocationFailed(nbytes, f"emulated GPU {self.ordinal} has "
                                             f"{self.total - self.used} of {self.total} bytes free")
            base = self._next
            if base + span > self._window_end:
                raise DeviceAllocationFailed(nbytes, f"emulated GPU {self.ordinal} has used up its address "
                                             f"window ({_DEVICE_WINDOW} bytes of addresses, never reused)")
            chunk = mmap.mmap(-1, span)
            self._next = base + span + _ALLOC_GRANULE
            self._chunks[base] = chunk
            self.used += span
            self._bases.append(base)   # last; the largest base yet (_next only grows): still sorted
        return base

    # virtual memory: a reservation is one lazily committed host mapping; its pages are
    # accessible only while a physical handle is mapped over them (else: illegal address).
    def va_reserve(self, nbytes: int) -> int:
        if nbytes <= 0 or nbytes % _ALLOC_GRANULE:
            raise _fail("cuMemAddressReserve", _ERR_INVALID_VALUE,
                        f"size {nbytes} is not a positive multiple of {_ALLOC_GRANULE}")
        with self._lock:
            base = self._next
            if base + nbytes > self._window_end:
                raise _fail("cuMemAddressReserve", _ERR_OUT_OF_MEMORY,
                            f"emulated GPU {self.ordinal} has no {nbytes} bytes of addresses left in its window")
            chunk = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
            res = _Reservation(base, nbytes)
            self._next = base + nbytes + _ALLOC_GRANULE
            self._chunks[base] = chunk
            self._reservations[base] = res
            self._bases.append(base)   # last; the largest base yet (_next only grows): still sorted
        return base

    def _reservation_of(self, call: str, ptr: int, nbytes: int) -> "_Reservation":
        i = bisect.bisect_right(self._bases, ptr) - 1
        res = self._reservations.get(self._bases[i]) if i >= 0 else None
        if res is None or ptr + nbytes > res.base + res.size or nbytes <= 0:
            raise _fail(call, _ERR_INVALID_VALUE, f"[{ptr:#x}, +{nbytes}) is not inside one reservation "
                                                  f"of GPU {self.ordinal}")
        if (ptr - res.base) % _ALLOC_GRANULE or nbytes % _ALLOC_GRANULE:
            raise _fail(call, _ERR_INVALID_VALUE, f"[{ptr:#x}, +{nbytes}) is not aligned to {_ALLOC_GRANULE}")
        return res

    def va_release(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            res = self._reservations.get(ptr)
            if res is None or res.size != nbytes:
                raise _fail("cuMemAddressFree", _ERR_INVALID_VALUE, f"{ptr:#x}+{nbytes} is not a reservation")
            if res.mappings:
                raise _fail("cuMemAddressFree", _ERR_INVALID_VALUE,
                            f"reservation {ptr:#x} still has {len(res.mappings)} mapping(s)")
            chunk = self._chunks[ptr]
            i = bisect.bisect_left(self._bases, ptr)
            del self._reservations[ptr]
            del self._chunks[ptr]
            del self._bases[i]
        try:
            chunk.close()
        except BufferError:
            pass

    def phys_create(self, nbytes: int) -> int:
        if nbytes <= 0 or nbytes % _ALLOC_GRANULE:
            raise _fail("cuMemCreate", _ERR_INVALID_VALUE, f"size {nbytes} is not a positive multiple of {_ALLOC_GRANULE}")
        phys = _Physical(nbytes)
        handle = next(_PHYS_HANDLES)
        with self._lock:
            if self.used + nbytes > self.total:
                raise DeviceAllocationFailed(nbytes, f"emulated GPU {self.ordinal} has "
                                             f"{self.total - self.used} of {self.total} bytes free")
            self.used += nbytes
            self._phys[handle] = phys
        return handle

    def phys_release(self, handle: int) -> None:
        with self._lock:
            phys = self._phys.get(handle)
            if phys is None or phys.released:
                raise _fail("cuMemRelease", _ERR_INVALID_VALUE, f"{handle!r} is not a live memory handle")
            phys.released = True       # as in CUDA: the memory goes once its mapping is gone
            if phys.mapped_at is None:
                del self._phys[handle]
                self.used -= phys.size

    def mem_map(self, ptr: int, nbytes: int, handle: int) -> None:
        with self._lock:
            res = self._reservation_of("cuMemMap", ptr, nbytes)
            phys = self._phys.get(handle)
            if phys is None or phys.released or phys.size != nbytes:
                raise _fail("cuMemMap", _ERR_INVALID_VALUE, f"handle {handle!r} is not a live handle of {nbytes} bytes")
            if phys.mapped_at is not None:
                raise _fail("cuMemMap", _ERR_INVALID_VALUE, f"handle {handle!r} is mapped already (not modelled twice)")
            p0, p1 = (ptr - res.base) // _ALLOC_GRANULE, (ptr - res.base + nbytes) // _ALLOC_GRANULE
            if res.pages.find(1, p0, p1) != -1:
                raise _fail("cuMemMap", _ERR_INVALID_VALUE, f"[{ptr:#x}, +{nbytes}) overlaps a mapping")
            res.pages[p0:p1] = b"\x01" * (p1 - p0)
            res.mappings[ptr] = (nbytes, handle)
            phys.mapped_at = ptr

    def mem_unmap(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            res = self._reservation_of("cuMemUnmap", ptr, nbytes)
            spans = []
            at = ptr
            while at < ptr + nbytes:          # the range must be made of whole mappings
                m = res.mappings.get(at)
                if m is None:
                    raise _fail("cuMemUnmap", _ERR_INVALID_VALUE, f"{at:#x} does not start a mapping")
                spans.append((at, m))
                at += m[0]
            if at != ptr + nbytes:
                raise _fail("cuMemUnmap", _ERR_INVALID_VALUE, f"[{ptr:#x}, +{nbytes}) cuts a mapping")
            chunk = self._chunks[res.base]
            # One mapping at a time, each undone whole (an exception can land at the loop's jump
            # back): an unmap cut short leaves whole mappings, mapped or not, never half of one.
            for start, (size, handle) in spans:
                p0, p1 = (start - res.base) // _ALLOC_GRANULE, (start - res.base + size) // _ALLOC_GRANULE
                unmapped = bytes(p1 - p0)
                phys = self._phys[handle]
                del res.mappings[start]
                res.pages[p0:p1] = unmapped
                phys.mapped_at = None
                if phys.released:
                    del self._phys[handle]
                    self.used -= phys.size
                # The physical pages are gone: what a later mapping shows is not what was written.
                chunk.madvise(mmap.MADV_DONTNEED, start - res.base, size)

    def free(self, ptr: int) -> int:
        """Free a ``malloc`` result; returns the bytes it spanned."""
        if ptr in self._reservations:
            raise _fail("cudaFree", _ERR_INVALID_VALUE, f"{ptr:#x} is a reservation (cuMemAddressFree), not a cudaMalloc")
        with self._lock:
            chunk = self._chunks.get(ptr)
            if chunk is None:
                raise _fail("cudaFree", _ERR_INVALID_VALUE, f"{ptr:#x} is not an allocation of GPU {self.ordinal}")
            span = len(chunk)
            i = bisect.bisect_left(self._bases, ptr)
            del self._chunks[ptr]
            del self._bases[i]
            self.used -= span
        try:
            chunk.close()
        except BufferError:
            pass  # a view of it is still referenced (a finished op's closure); GC unmaps it
        return span

    def extent(self, call: str, ptr: int) -> int:
        """Bytes from ``ptr`` to the end of its allocation (in a reservation: of the mapped run
        that holds it): what a kernel given ``ptr`` may touch."""
        bases = self._bases
        i = bisect.bisect_right(bases, ptr) - 1
        if i >= 0:
            base = bases[i]
            chunk = self._chunks.get(base)
            if chunk is not None and ptr < base + len(chunk):
                res = self._reservations.get(base)
                if res is None:
                    return base + len(chunk) - ptr
                p0 = (ptr - base) // _ALLOC_GRANULE
                if res.pages[p0]:
                    p1 = res.pages.find(0, p0)
                    end = base + (len(res.pages) if p1 == -1 else p1) * _ALLOC_GRANULE
                    return end - ptr
                raise _fail(call, _ERR_ILLEGAL_ADDRESS, f"{ptr:#x} is in unmapped pages of a reservation on GPU "
                            f"{self.ordinal}")
        raise _fail(call, _ERR_INVALID_VALUE, f"{ptr:#x} is not inside an allocation of GPU {self.ordinal}")

    def view(self, call: str, ptr: int, nbytes: int) -> memoryview:
        """The host memory behind [ptr, ptr+nbytes), which must lie inside one allocation."""
        if nbytes < 0:
            raise _fail(call, _ERR_INVALID_VALUE, f"negative size {nbytes}")
        bases = self._bases
        i = bisect.bisect_right(bases, ptr) - 1
        if i >= 0:
            base = bases[i]
            chunk = self._chunks.get(base)
            if chunk is not None and ptr + nbytes <= base + len(chunk):
                res = self._reservations.get(base)
                if res is not None and not res.accessible(ptr, nbytes):
                    raise _fail(call, _ERR_ILLEGAL_ADDRESS,
                                f"[{ptr:#x}, +{nbytes}) touches unmapped pages of a reservation on GPU {self.ordinal}")
                off = ptr - base
                return memoryview(chunk)[off:off + nbytes]
        raise _fail(call, _ERR_INVALID_VALUE,
                    f"[{ptr:#x}, +{nbytes}) is not inside one allocation of GPU {self.ordinal}")
