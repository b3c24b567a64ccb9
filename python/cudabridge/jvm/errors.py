"""How a Python exception is described to Java, for the JNI hot path and the JPype control path alike.

A Python exception that escapes into Java through JPype arrives as ``org.jpype.PyExceptionProxy``
with a null message (JPype 1.7.1), so nothing may escape: the control path catches and raises a
Java exception built from :func:`error_info`, and the C library calls :func:`error_info` (with
the GIL held) and throws after it has released the GIL.
"""

from __future__ import annotations

from typing import Optional

from ..errors import (DeviceUnusable, FunctionFailed, HostWaitTimeout, InvalidFree, KernelFault, OutOfDeviceMemory,
                      UnknownTask)

OomFields = tuple[int, ...]   # OutOfDeviceMemory.FIELDS order

# The errors task code can act on: each reaches Java as an exception type of its own,
# org.cudabridge.<Name>Exception (CudaBridgeException.of picks it by this name; out of memory is
# GpuOutOfMemoryException, with its numbers). Every other error reaches Java as a plain
# CudaBridgeException. tests/test_java_error_kinds.py holds every class of errors.py to one side.
JAVA_KINDS: tuple[type[BaseException], ...] = (KernelFault, DeviceUnusable, HostWaitTimeout, UnknownTask, InvalidFree,
                                               FunctionFailed)


def java_kind(exc: BaseException) -> Optional[str]:
    """The name of the first of :data:`JAVA_KINDS` that ``exc`` is an instance of, or None."""
    for kind in JAVA_KINDS:
        if isinstance(exc, kind):
            return kind.__name__
    return None


def error_info(exc: BaseException) -> tuple[str, str, Optional[OomFields], Optional[str]]:
    """(message, Python type, out-of-memory fields or None, Java kind or None).

    The message is ``"<TypeName>: <str(exc)>"``, ASCII with backslash escapes (JNI's
    ``NewStringUTF`` takes modified UTF-8; ASCII is valid in both). The out-of-memory fields are
    ``OutOfDeviceMemory.FIELDS``, in that order. The kind is :func:`java_kind`'s: it chooses the
    Java exception type (a subclass of a kind's Python class reaches Java as that kind)."""
    t = type(exc)
    text = str(exc)
    message = f"{t.__name__}: {text}" if text else t.__name__
    message = message.encode("ascii", "backslashreplace").decode("ascii")
    module = t.__module__
    pytype = t.__qualname__ if module == "builtins" else f"{module}.{t.__qualname__}"
    if isinstance(exc, FunctionFailed):   # the type the function raised, and its traceback in the message
        message = text.encode("ascii", "backslashreplace").decode("ascii")
        pytype = exc.python_type
    oom = None
    if isinstance(exc, OutOfDeviceMemory):
        oom = exc.values()
    return message, pytype, oom, java_kind(exc)


def java_exception(exc: BaseException):
    """The Java exception (a JPype object, raisable from Python) that stands for ``exc``."""
    from jpype import JArray, JLong

    from .java_classes import java_class

    message, pytype, oom, kind = error_info(exc)
    if oom is not None:
        return java_class("org.cudabridge.GpuOutOfMemoryException")(message, pytype, JArray(JLong)(oom))
    return java_class("org.cudabridge.CudaBridgeException").of(message, pytype, kind)
