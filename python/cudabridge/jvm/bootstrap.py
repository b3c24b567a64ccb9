"""What the bridge library runs once CPython is up inside the JVM.

``start(library, conf_json)`` is called by ``bridge/cudabridge_jni.c`` on the Java thread that
called ``CudaBridge.start``, with the GIL held. It

1. binds JPype to the running JVM: JPype 1.7 cannot attach by itself; our library exports
   ``JNI_CreateJavaVM`` / ``JNI_GetCreatedJavaVMs`` returning the running VM, and
   ``jpype.startJVM(jvmpath=<our library>)`` "starts" that one (FIELD-NOTES);
2. creates the :class:`~cudabridge.service.CudaBridgeService` from the ``spark.cudabridge.*``
   keys Java passed;
3. hands Java the control plane (a JPype proxy) through ``NativeBridge.installControl``;
4. returns the :class:`~cudabridge.jvm.control.BridgeControl`; the library caches the bound
   methods of its ``hot`` (:class:`~cudabridge.jvm.hot_path.JavaHotPath`) for the JNI hot path,
   and its ``native_bind`` / ``native_release`` for the task lifecycle.

Any exception here reaches Java as a ``CudaBridgeException`` carrying the Python traceback.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
from typing import Any

log = logging.getLogger("cudabridge.jvm")

_started: dict[str, Any] = {}   # keeps the service, control and proxy alive for the JVM's life


def _bind_jpype(library: str) -> None:
    try:
        import jpype
        import jpype.config
    except ImportError as exc:
        raise RuntimeError(
            f"JPype is not importable from {sys.prefix} (Python {sys.version.split()[0]}): {exc}. "
            f"Install it there: {sys.executable} -m pip install JPype1==1.7.1") from exc
    if jpype.isJVMStarted():
        return
    # Never let Python's exit shut the JVM down: this JVM is not Python's (Python is not
    # finalized here anyway; this is in case someone calls sys.exit's machinery).
    jpype.config.onexit = False
    jpype.config.destroy_jvm = False
    # interrupt=True keeps ^C what it is in the JVM (it stops the process); False would make
    # JPype install Java signal handlers that hand ^C to Python. The JVM owns the signals. The
    # JVM options JPype builds are ignored: the VM exists already.
    jpype.startJVM(jvmpath=library, interrupt=True, classpath=[])


def start(library: str, conf_json: str) -> Any:
    if "control" in _started:
        return _started["control"]
    if not logging.getLogger().handlers and not logging.getLogger("cudabridge").handlers:
        # The JVM's stderr is the executor's log: warnings and errors of the service go there.
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("cudabridge").addHandler(handler)
    conf = json.loads(conf_json) if conf_json else {}
    if not isinstance(conf, dict):
        raise ValueError(f"cudabridge start: the configuration must be a JSON object, got {conf_json!r}")
    from ..config import SPARK_PREFIX, ServiceConfig

    conf = {(k if k.startswith(SPARK_PREFIX) else SPARK_PREFIX + k): v for k, v in conf.items()}
    config = ServiceConfig.from_mapping(conf)
    _bind_jpype(library)

    from jpype import JClass

    from ..service import CudaBridgeService
    from .control import BridgeControl, make_proxy
    from .hot_path import JavaHotPath

    service = CudaBridgeService(config)
    try:
        policy = config.extra.get(SPARK_PREFIX + "test_reuse_policy")
        if policy is not None:
            from .tools import apply_test_reuse_policy

            apply_test_reuse_policy(service, str(policy))
        hot = JavaHotPath(service)
        info = {"python": sys.executable, "prefix": sys.prefix, "version": sys.version.split()[0],
                "pid": os.getpid(), "library": library}
        control = BridgeControl(service, hot, info)
        proxy = make_proxy(control)
        JClass("org.cudabridge.NativeBridge").installControl(proxy)
    except BaseException:
        service.close()
        raise
    _started.update(service=service, hot=hot, control=control, proxy=proxy)
    # JPype runs a full Python collection (holding the GIL) after every Java GC, several a
    # second in a busy executor. Everything alive now (JPype, the service, its streams and
    # pools) lives as long as the JVM: freezing it keeps those collections from walking it each
    # time (measured in Spark local[4], 2400 short tasks: the CPU of JPype's reference thread,
    # where those collections run, fell from about 0.45 s to 0.02 s).
    gc.collect()
    gc.freeze()
    log.info("cudabridge bridge up in JVM pid %d: Python %s at %s, backend %s", os.getpid(),
             sys.version.split()[0], sys.prefix, service.backend.name)
    return control
