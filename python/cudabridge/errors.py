"""Exceptions raised by the service.

Every error says what was asked and what was wrong. Errors raised for bad input are raised
before any state is touched, so a caller that catches one finds the service exactly as it was.
"""

from __future__ import annotations


class CudaBridgeError(Exception):
    """Base class of every error the service raises."""


class InvalidArgument(CudaBridgeError, ValueError):
    """A call was given an argument the service cannot accept (size, stream, device, handle)."""


class PoolClosed(CudaBridgeError):
    """A call reached a pool, registry or service after its ``close()``."""


class UnknownStream(InvalidArgument):
    """A stream handle that the pool does not own and that was not registered with it."""


class InvalidFree(InvalidArgument):
    """A free of something that is not a live allocation of this pool.

    Covers double frees, handles from another pool, and stale handles whose block has since
    been released (for example at task end) and possibly handed to another owner.
    """


class UnknownTask(InvalidArgument):
    """A Spark task attempt id that is not bound."""


# Errors after which the CUDA context is unusable: every later call in the process returns the
# same error (the runtime's and the driver's codes agree): illegal address, launch timeout,
# device-side assert, hardware stack error, illegal instruction, misaligned address, invalid
# address space, invalid PC, launch failure, uncorrectable ECC error.
STICKY_CODES = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719, 214})


class CudaError(CudaBridgeError):
    """A CUDA call returned an error code. ``call`` names the call, ``code`` is the raw code."""

    def __init__(self, call: str, code: int, name: str, detail: str = "") -> None:
        self.call = call
        self.code = code
        self.name = name
        message = f"{call} failed: {name} ({code})"
        if detail:
            message += f": {detail}"
        super().__init__(message)

    @property
    def sticky(self) -> bool:
        """Whether the CUDA context is unusable after this error (only a new process recovers)."""
        return self.code in STICKY_CODES


class HostWaitTimeout(CudaBridgeError):
    """A host wait for a stream passed its deadline (``host_wait_timeout``): the stream has not
    finished work queued before the wait; it may be hung. Nothing was changed by the wait."""


class DeviceUnusable(CudaBridgeError):
    """The GPU's CUDA context is unusable after a sticky error; the executor must be replaced."""


class OutOfDeviceMemory(CudaBridgeError, MemoryError):
    """The pool could not satisfy an allocation, after draining completed events and one host
    synchronize. Carries the numbers needed to tell fragmentation from real exhaustion."""

    def __init__(
        self,
        requested: int,
        in_use: int,
        reserved: int,
        largest_free: int,
        waiting_on_events: int,
        limit: int,
        device: int,
    ) -> None:
        self.requested = requested
        self.in_use = in_use
        self.reserved = reserved
        self.largest_free = largest_free
        self.waiting_on_events = waiting_on_events
        self.limit = limit
        self.device = device
        super().__init__(
            f"out of device memory on GPU {device}: requested {requested} bytes; "
            f"in use {in_use}, reserved {reserved} of limit {limit}, "
            f"largest free block {largest_free}, waiting on events {waiting_on_events}"
        )


class StreamOrderRace(CudaBridgeError):
    """A device access not ordered after a conflicting earlier one, found by the emulated
    backend's race detector."""
