"""How a Python exception is described to Java, for the JNI hot path and the JPype control path alike.

A Python exception that escapes into Java through JPype arrives as ``org.jpype.PyExceptionProxy``
with a null message (JPype 1.7.1), so nothing may escape: the control path catches and raises a
Java exception built from :func:`error_info`, and the C library calls :func:`error_info` (with
the GIL held) and throws after it has released the GIL.
"""

from __future__ import annotations

from typing import Optional

from ..errors import OutOfDeviceMemory

OomFields = tuple[int, ...]   # OutOfDeviceMemory.FIELDS order


def error_info(exc: BaseException) -> tuple[str, str, Optional[OomFields]]:
    """(message, Python type, out-of-memory fields or None).

    The message is ``"<TypeName>: <str(exc)>"``, ASCII with backslash escapes (JNI's
    ``NewStringUTF`` takes modified UTF-8; ASCII is valid in both). The out-of-memory fields are
    ``OutOfDeviceMemory.FIELDS``, in that order."""
    t = type(exc)
    text = str(exc)
    message = f"{t.__name__}: {text}" if text else t.__name__
    message = message.encode("ascii", "backslashreplace").decode("ascii")
    module = t.__module__
    pytype = t.__qualname__ if module == "builtins" else f"{module}.{t.__qualname__}"
    oom = None
    if isinstance(exc, OutOfDeviceMemory):
        oom = exc.values()
    return message, pytype, oom


def java_exception(exc: BaseException):
    """The Java exception (a JPype object, raisable from Python) that stands for ``exc``."""
    from jpype import JArray, JLong

    from .java_classes import java_class

    message, pytype, oom = error_info(exc)
    if oom is not None:
        return java_class("org.cudabridge.GpuOutOfMemoryException")(message, pytype, JArray(JLong)(oom))
    return java_class("org.cudabridge.CudaBridgeException")(message, pytype)
