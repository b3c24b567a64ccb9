"""The JVM side of cudabridge: the in-process bridge that lets Java task threads reach the service.

Pieces:

* ``bridge/cudabridge_jni.c`` (built into ``_native/libcudabridge_jni.so`` by :mod:`.build`):
  a JNI library loaded by the executor JVM. It starts CPython inside the JVM, exports
  ``JNI_CreateJavaVM`` / ``JNI_GetCreatedJavaVMs`` so that JPype binds to the running VM, and
  carries the hot path (allocate, free, copies, memset) as JNI natives calling cached bound
  methods of a :class:`~cudabridge.jvm.hot_path.JavaHotPath`.
* ``jvm/src/main/java/org/cudabridge`` (built into ``_native/cudabridge.jar``): the Java API,
  ``CudaBridge``, ``DeviceBuffer``, ``TaskScope`` and the exceptions.
* :mod:`.bootstrap`: what the library runs once Python is up: JPype binding, the service, the
  hot-path object and the JPype control plane (:mod:`.control`).

``python -m cudabridge jar`` / ``classpath`` / ``build`` drive :mod:`.build`.
"""

from .build import NATIVE_DIR, classpath, jar_path, library_path

__all__ = ["NATIVE_DIR", "classpath", "jar_path", "library_path"]
