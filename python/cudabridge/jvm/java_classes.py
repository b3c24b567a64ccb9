"""The bridge's own Java classes (``org.cudabridge.*``), looked up through the class loader that
loaded them.

JPype finds classes through its own loader, whose parent is the JVM's system class loader. The
bridge's jars may instead come through a child loader (Spark's ``--jars``, ``spark.jars``: how a
job ships them when the executor's Python environment travels with it, docs/deploy.md). A class
found by name through JPype's loader would then be missing, or, were the jar on both paths, a
second copy with its own statics. So every ``org.cudabridge`` class Python uses is looked up here,
through the loader of ``org.cudabridge.NativeBridge`` (``Launcher`` makes it the starting thread's
context class loader while Python starts; :func:`bind` records it).
"""

from __future__ import annotations

from typing import Any

_loader: Any = None   # java.lang.ClassLoader of the bridge's classes; None until bind()


def bind() -> None:
    """Records the bridge's class loader: the context class loader of the thread starting the
    bridge (the JVM must be bound to JPype already)."""
    global _loader
    from jpype import JClass

    _loader = JClass("java.lang.Thread").currentThread().getContextClassLoader()


def java_class(name: str) -> Any:
    """The JPype class ``name`` as the bridge's class loader defines it."""
    from jpype import JClass

    if _loader is None:
        return JClass(name)
    return JClass(name, loader=_loader)
