"""Exceptions raised by the service.

Every error says what was asked and what was wrong. Errors raised for bad input are raised
before any state is touched, so a caller that catches one finds the service exactly as it was.
"""

from __future__ import annotations

import operator


class CudaBridgeError(Exception):
    """Base class of every error the service raises."""


class InvalidArgument(CudaBridgeError, ValueError):
    """A call was given an argument the service cannot accept (size, stream, device, handle)."""


def index_int(value: object, what: str, kind: str = "an int") -> int:
    """An API argument as an int: any ``operator.index()`` type except ``bool`` (``True`` is not 1
    byte nor stream 1, and ``1.0`` is not an int: a dict would take either for 1); anything else
    is refused with :class:`InvalidArgument`."""
    if value.__class__ is int:
        return value  # type: ignore[return-value]
    if isinstance(value, bool):
        raise InvalidArgument(f"{what} must be {kind}, got a bool ({value!r})")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgument(f"{what} must be {kind}, got {type(value).__name__}") from None


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


class KernelFault(CudaError):
    """A sticky CUDA error found by a synchronize of a task's stream: a kernel faulted there (an
    illegal address, a trap). ``candidates`` names the kernels launched on that stream since its
    last completed synchronize, oldest first: the one that faulted is among them (launches older
    than the log keeps are counted in ``dropped``)."""

    def __init__(self, cause: CudaError, candidates: list[str], dropped: int, described: str) -> None:
        super().__init__(cause.call, cause.code, cause.name)
        self.args = (f"{cause}; {described}",)
        self.candidates = candidates
        self.dropped = dropped


class HostWaitTimeout(CudaBridgeError):
    """A host wait for a stream passed its deadline (``host_wait_timeout``): the stream has not
    finished work queued before the wait; it may be hung. Nothing was changed by the wait."""


class DeviceUnusable(CudaBridgeError):
    """The GPU's CUDA context is unusable after a sticky error; the executor must be replaced."""


class OutOfDeviceMemory(CudaBridgeError, MemoryError):
    """The pool could not satisfy an allocation, after draining completed events and one host
    synchronize. Carries the numbers needed to tell fragmentation from real exhaustion.

    :attr:`FIELDS` is the one definition of those numbers, in order: the bridge hands them to
    Java in that order (``jvm/errors.py``), ``GpuOutOfMemoryException.FIELDS`` names them in
    camelCase (a test compares), and each is named as the pool's statistics name it."""

    FIELDS = ("requested_bytes", "in_use_bytes", "reserved_bytes", "largest_free_block_bytes",
              "waiting_on_events_bytes", "limit_bytes", "device", "reason")

    # Why the allocation failed (``reason``; Java's OomReason, same order: a reason's code is its
    # index): ``no_wait``, it could not wait (no task's allocation, or its task's release began);
    # ``breaker``, the deadlock breaker failed it (every task holding memory on the GPU was waiting:
    # free what the block allocated and retry it); ``too_large``, it cannot fit even with every
    # task's memory back (no task holds memory on the GPU: split the request); ``timeout``, it
    # waited ``oomWait`` for other tasks' memory (pressure/memory_waits.py).
    REASONS = ("no_wait", "breaker", "too_large", "timeout")
    _EXPLAINED = {"no_wait": "", "breaker": "; the deadlock breaker failed it: every task holding memory on the GPU "
                  "was waiting (retry it after freeing what it holds)",
                  "too_large": "; it cannot fit even with every task's memory back",
                  "timeout": "; it waited oomWait for other tasks' frees and releases"}

    def __init__(self, requested_bytes: int, in_use_bytes: int, reserved_bytes: int, largest_free_block_bytes: int,
                 waiting_on_events_bytes: int, limit_bytes: int, device: int, reason: str = "no_wait") -> None:
        self.requested_bytes = requested_bytes
        self.in_use_bytes = in_use_bytes
        self.reserved_bytes = reserved_bytes
        self.largest_free_block_bytes = largest_free_block_bytes
        self.waiting_on_events_bytes = waiting_on_events_bytes
        self.limit_bytes = limit_bytes
        self.device = device
        self.reason = reason

    @property
    def reason(self) -> str:
        return self._reason

    @reason.setter
    def reason(self, reason: str) -> None:
        if reason not in self.REASONS:
            raise ValueError(f"OutOfDeviceMemory reason {reason!r}: one of {self.REASONS}")
        self._reason = reason
        self.args = (
            f"out of device memory on GPU {self.device}: requested {self.requested_bytes} bytes; "
            f"in use {self.in_use_bytes}, reserved {self.reserved_bytes} of limit {self.limit_bytes}, "
            f"largest free block {self.largest_free_block_bytes}, waiting on events {self.waiting_on_events_bytes}"
            + self._EXPLAINED[reason],)

    def __reduce__(self):   # the constructor's arguments, not the message (pickled across processes)
        return (type(self), tuple(getattr(self, f) for f in self.FIELDS))

    def values(self) -> tuple[int, ...]:
        """The numbers in :attr:`FIELDS` order (``reason`` as its code: its index in :attr:`REASONS`)."""
        return tuple(self.REASONS.index(self.reason) if f == "reason" else int(getattr(self, f)) for f in self.FIELDS)


class StreamOrderRace(CudaBridgeError):
    """A device access not ordered after a conflicting earlier one, found by the emulated
    backend's race detector."""


class ModuleLoadError(CudaBridgeError):
    """A module could not be loaded (for source: the compiler's log says why). ``transient``: the
    failure is not the source's (the compiler ran out of memory, say), so the module cache does
    not keep it and a later ask loads again. Raised by the kernels (``kernels/modules.py``, which
    names it too) and by a backend's ``module_load``."""

    def __init__(self, message: str, log: str = "", transient: bool = False) -> None:
        super().__init__(message + (f"\n{log}" if log else ""))
        self.summary = message
        self.log = log
        self.transient = transient


class FunctionNotFound(InvalidArgument):
    """A Python function asked for by reference (``"package.module:function"``) or as a pickled
    function that cannot be had: a malformed reference, a module that does not import, a missing
    or non-callable attribute, a search path another user could write, a pickle made by another
    Python version. Nothing is cached for it: a later ask tries again."""


class FunctionFailed(CudaBridgeError):
    """A Python function called from Java raised. ``python_type`` is the qualified type of what it
    raised, ``traceback_text`` the formatted traceback; the message is ``"<function>: <Type>:
    <text>"`` followed by the traceback. Errors of the service itself (out of device memory, a task
    being released) are not wrapped: they reach the caller as themselves."""

    def __init__(self, function: str, exc: BaseException, traceback_text: str) -> None:
        t = type(exc)
        self.python_type = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
        self.traceback_text = traceback_text
        self.function = function
        text = str(exc)
        head = f"{function}: {self.python_type}: {text}" if text else f"{function}: {self.python_type}"
        super().__init__(head + ("\n" + traceback_text.rstrip() if traceback_text else ""))
