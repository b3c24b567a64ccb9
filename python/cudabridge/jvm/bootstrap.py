"""What the bridge library runs once CPython is up inside the JVM.

``start(library, conf_json)`` is called by ``bridge/cudabridge_jni.c`` on the Java thread that
called ``CudaBridge.start``, with the GIL held. It

1. binds JPype to the running JVM: JPype 1.7 cannot attach to a JVM it did not start; our
   library exports ``JNI_CreateJavaVM`` / ``JNI_GetCreatedJavaVMs`` returning the running VM, and
   ``jpype.startJVM(jvmpath=<our library>)`` "starts" that one, then takes out the
   JVM shutdown hook JPype registered (it interrupts the JVM's other threads at exit and stops
   Python calls while Spark's hooks still make them: :func:`_remove_jpype_exit_hook`);
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
from typing import TYPE_CHECKING, Any

from . import java_classes

if TYPE_CHECKING:
    from ..service import CudaBridgeService

log = logging.getLogger("cudabridge.jvm")

_started: dict[str, Any] = {}   # keeps the service, control and proxy alive for the JVM's life


def jpype_class_path() -> str:
    """JPype's ``org.jpype.jar`` in this environment. JPype defines its classes through a loader
    whose parent is the JVM's system class loader, so the jar must be on the system class path;
    where it is not (the bridge's jars came through a child loader, as Spark's ``--jars`` gives),
    the bridge library appends it to the system class loader's search before JPype starts."""
    _import_jpype()
    from .build import jpype_jar

    return str(jpype_jar())


def _import_jpype() -> None:
    try:
        import jpype  # noqa: F401
        import jpype.config  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            f"JPype is not importable from {sys.prefix} (Python {sys.version.split()[0]}): {exc}. "
            f"Install it there: {sys.executable} -m pip install JPype1==1.7.1") from exc


def _bind_jpype(library: str) -> None:
    _import_jpype()
    import jpype
    import jpype.config
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
    _remove_jpype_exit_hook()


def _remove_jpype_exit_hook() -> bool:
    """Takes out the JVM shutdown hook that ``jpype.startJVM`` registered; returns whether it did.

    JPype assumes the JVM is Python's: its hook (``org.jpype.JPypeContext.shutdown``) interrupts
    every non-daemon thread but its own, then stops all calls between Python and Java and frees
    JPype's resources. Here the JVM is Spark's, and its shutdown runs concurrently with that hook:
    the thread interrupted is Hadoop's ``ShutdownHookManager`` thread, which waits (interruptibly,
    ``FutureTask.get``) for Spark's shutdown hook; it stops waiting, logs ``ShutdownHook ''
    failed, java.lang.InterruptedException`` (``'ClientFinalizer'`` when the interrupt lands while
    it waits for that hook instead) and goes on while Spark's hook, which shuts the executor plugin
    and this service down, still runs and may find JPype stopped under it (measured: the service's
    shutdown failed with ``Proxy called during shutdown`` in about one exit in four when Spark's
    hook ran it). Any other shutdown hook of the JVM that sleeps or waits is interrupted the same
    way. Python is never finalized here and the process ends with the JVM, so the hook has nothing
    to clean up for us.

    One consequence: JPype redirects ``java.lang.Runtime.addShutdownHook`` called *from Python* to
    its own list, which only that hook ran; such hooks no longer run. Register them from Java (or
    with Spark's or Hadoop's ShutdownHookManager).

    Needs ``java.lang`` open to the class path (Spark's launcher passes
    ``--add-opens=java.base/java.lang=ALL-UNNAMED`` to drivers and executors); without it the hook
    stays, as before, and this says so at debug level.
    """
    from jpype import JClass, synchronized

    try:
        Class = JClass("java.lang.Class")
        hooks_class = Class.forName("java.lang.ApplicationShutdownHooks")
        field = hooks_class.getDeclaredField("hooks")
        field.setAccessible(True)
        with synchronized(hooks_class):   # ApplicationShutdownHooks' own lock
            hooks = field.get(None)
            threads = [] if hooks is None else list(hooks.keySet())
        runtime = JClass("java.lang.Runtime").getRuntime()
        removed = False
        for thread in threads:
            task = _runnable_of(thread)
            if task is not None and str(task.getClass().getName()).startswith("org.jpype."):
                removed = bool(runtime.removeShutdownHook(thread)) or removed
        if not removed:
            log.debug("JPype's JVM shutdown hook not found among %d hooks; left as it is", len(threads))
        return removed
    except Exception as exc:  # noqa: BLE001  (JPype's hook then stays, as it was)
        log.debug("JPype's JVM shutdown hook left in place: %s", exc)
        return False


def _runnable_of(thread: Any) -> Any:
    """The Runnable a (not started) Thread will run: its ``target`` field up to JDK 18, its
    ``holder.task`` from JDK 19; None if neither is readable."""
    from jpype import JClass

    Thread = JClass("java.lang.Thread")
    for path in (("target",), ("holder", "task")):
        try:
            obj, cls = thread, Thread.class_
            for name in path:
                f = cls.getDeclaredField(name)
                f.setAccessible(True)
                obj = f.get(obj)
                if obj is None:
                    break
                cls = obj.getClass()
            else:
                return obj
        except Exception:  # noqa: BLE001  (the other layout)
            continue
    return None


def running_service() -> "CudaBridgeService":
    """The service the bridge started in this JVM, for Python code that runs in the executor (a
    Python function called for a task: docs/python-functions.md). Raises
    :class:`~cudabridge.errors.CudaBridgeError` where the bridge has not started one."""
    service = _started.get("service")
    if service is None:
        from ..errors import CudaBridgeError

        raise CudaBridgeError("no cudabridge service runs in this process (the bridge starts one in a JVM: "
                              "CudaBridge.start, or the Spark plugin)")
    return service


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
    java_classes.bind()

    from ..service import CudaBridgeService
    from .control import BridgeControl, make_proxy
    from .hot_path import JavaHotPath

    service = CudaBridgeService(config)
    try:
        hot = JavaHotPath(service)
        info = {"python": sys.executable, "prefix": sys.prefix, "version": sys.version.split()[0],
                "pid": os.getpid(), "library": library}
        control = BridgeControl(service, hot, info)
        proxy = make_proxy(control)
        java_classes.java_class("org.cudabridge.NativeBridge").installControl(proxy)
    except BaseException:
        service.close()
        raise
    _started.update(service=service, hot=hot, control=control, proxy=proxy)
    # JPype runs a full Python collection (holding the GIL) after every Java GC, several a
    # second in a busy executor. Everything alive now (JPype, the service, its streams and
    # pools) lives as long as the JVM: freezing it keeps those collections from walking it each
    # time, which was most of the CPU of JPype's reference thread, where they run
    # (bench/RESULTS.md, "Task lifecycle inside Spark (issue 4, session 4)").
    gc.collect()
    gc.freeze()
    log.info("cudabridge bridge up in JVM pid %d: Python %s at %s, backend %s", os.getpid(),
             sys.version.split()[0], sys.prefix, service.backend.name)
    return control
