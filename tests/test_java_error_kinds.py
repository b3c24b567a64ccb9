"""Every error class of ``cudabridge/errors.py`` is on one side: an error task code can act on,
with a Java exception type of its own (``jvm/errors.py``'s JAVA_KINDS, each
``org.cudabridge.<Name>Exception`` extending CudaBridgeException and chosen by
``CudaBridgeException.of``; out of memory is GpuOutOfMemoryException, with its numbers), or one
that reaches Java as the plain CudaBridgeException, for the reason given here. A new error class
fails this test until someone decides."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from cudabridge import errors
from cudabridge.jvm.errors import JAVA_KINDS, error_info, java_kind

JAVA = Path(__file__).resolve().parent.parent / "jvm" / "src" / "main" / "java" / "org" / "cudabridge"

# the plain CudaBridgeException, and why a type of its own would not help the caller
PLAIN = {
    "CudaBridgeError": "the base class: every service error is a CudaBridgeException",
    "InvalidArgument": "Java checks what it can see first (IllegalArgumentException); the rest is a bug in the call",
    "PoolClosed": "after the bridge's shutdown: Java's own checks say IllegalStateException first",
    "UnknownStream": "Java never passes a stream handle it did not get from the service",
    "CudaError": "a non-sticky CUDA error: the message names the call and the code; nothing to do but fail",
    "StreamOrderRace": "the emulated device's race detector, in tests only",
    "ModuleLoadError": "a module that did not compile or load: the message holds the compiler's log; the source needs "
                       "fixing (a transient failure is not kept: the next load tries again)",
    "FunctionNotFound": "a function reference or pickle that cannot be had: raised when the function is resolved "
                        "(CudaBridge.pythonFunction), before any task work; the message says what to fix",
}
OWN_TYPE = {"OutOfDeviceMemory": "GpuOutOfMemoryException"}


def _error_classes() -> dict[str, type]:
    return {n: c for n, c in vars(errors).items()
            if inspect.isclass(c) and issubclass(c, BaseException) and c.__module__ == errors.__name__}


def test_every_error_class_is_given_a_java_type_or_a_reason():
    kinds = {k.__name__ for k in JAVA_KINDS}
    for name in _error_classes():
        assert (name in kinds) + (name in PLAIN) + (name in OWN_TYPE) == 1, \
            f"{name}: add it to jvm/errors.py's JAVA_KINDS (with org.cudabridge.{name}Exception) or to PLAIN here"
    assert set(PLAIN) | set(OWN_TYPE) | kinds <= set(_error_classes())


def test_each_kind_has_its_java_class_and_its_case_in_the_factory():
    factory = (JAVA / "CudaBridgeException.java").read_text()
    for kind in JAVA_KINDS:
        source = JAVA / f"{kind.__name__}Exception.java"
        assert source.is_file(), source
        assert re.search(rf"class {kind.__name__}Exception extends CudaBridgeException\b", source.read_text())
        assert re.search(rf'case "{kind.__name__}":\s*return new {kind.__name__}Exception\(', factory), kind


def test_a_subclass_reaches_java_as_its_kind_and_other_errors_as_none():
    class MyFault(errors.HostWaitTimeout):
        pass

    message, pytype, oom, kind = error_info(MyFault("late"))
    assert kind == "HostWaitTimeout" and pytype.endswith("MyFault") and message == "MyFault: late" and oom is None
    assert java_kind(errors.InvalidArgument("x")) is None and java_kind(ValueError("x")) is None
    cause = errors.CudaError("cuStreamSynchronize", 700, "CUDA_ERROR_ILLEGAL_ADDRESS")
    assert java_kind(errors.KernelFault(cause, [], 0, "k")) == "KernelFault"
    assert java_kind(errors.UnknownTask("t")) == "UnknownTask" and java_kind(errors.InvalidFree("f")) == "InvalidFree"
