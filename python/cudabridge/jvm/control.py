"""The control path: task binding and release (called by the bridge's natives), lookups,
statistics, tools, shutdown (through JPype).

The state lives in :class:`BridgeControl`, a plain Python object; the JPype proxy made by
:func:`make_proxy` is a thin front that converts arguments (JPype hands ``long`` over as
``JLong``, an ``int`` subclass that the pool's ``size.__class__ is int`` fast-path check refuses),
calls the plain object and turns every Python exception into a Java one
(:func:`cudabridge.jvm.errors.java_exception`): a ``@JImplements`` class is a poor home for state
(its ``__init__`` runs twice per instance, attribute access is slower) and a Python exception
reaching Java through JPype loses its message.

Java threads that call this proxy keep a Python thread state of their own (the Java side calls
``NativeBridge.ensureThreadState()`` first): JPype makes and drops one per call otherwise, which
makes each call several times slower and leaks a ``_jpype._JAlloc`` type (native memory) each
time.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

from ..errors import InvalidArgument, PoolClosed, UnknownTask
from ..stream_pool import Priority
from . import tools
from .hot_path import STAGING_STATISTICS

if TYPE_CHECKING:
    from ..service import CudaBridgeService
    from .hot_path import JavaHotPath

log = logging.getLogger(__name__)


class BridgeControl:
    def __init__(self, service: "CudaBridgeService", hot: "JavaHotPath", info: dict[str, Any]) -> None:
        self.service = service
        self.hot = hot
        self.info = dict(info)
        self._lock = threading.Lock()
        self.closed = False
        self.releases = 0
        self._modules: dict[int, Any] = {}      # module id -> module (load_module)
        self._module_ids: dict[Any, int] = {}   # and back: the service's cache hands out one object per module

    def bind_task(self, task: int, gpu_address: str | None, priority: str) -> tuple[int, int]:
        if priority not in Priority.__members__.values():
            raise InvalidArgument(f"task {task}: priority must be one of {', '.join(Priority)}, got {priority!r}")
        b = self.service.bind_task(task, gpu_address, priority)
        return b.stream, b.gpu

    # What the bridge library's bindTask / releaseTask natives call (no JPype on the task
    # lifecycle: a JNI native costs a fraction of a JPype proxy call, on any thread; bind and
    # release through JNI against JPype: bench/RESULTS.md, "JVM bridge after the C hot core and
    # the gate (issue 3, session 3)").
    def native_bind(self, task: int, gpu_address: str | None, priority: str) -> tuple[int, int]:
        self.check_open("bindTask")
        return self.bind_task(task, gpu_address, priority)

    def native_release(self, task: int) -> tuple[int, int]:
        self.check_open("releaseTask")
        return self.release_task(task)

    def native_release_many(self, tasks: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[str | None, ...] | None]:
        """Release many tasks in one call (the plugin's lifecycle thread batches them): a flat
        tuple of (leaked allocations, leaked bytes) per task, (-1, -1) where a release failed,
        and None when none failed, else each task's failure message (None where it succeeded).
        One failure does not stop the others' releases."""
        self.check_open("releaseTasks")
        out: list[int] = []
        failures: list[str | None] = []
        for task in tasks:
            try:
                out += self.release_task(task)
                failures.append(None)
            except Exception as exc:  # reported to Java per task; the rest are still released
                out += (-1, -1)
                failures.append(f"{type(exc).__name__}: {exc}")
        return tuple(out), (tuple(failures) if any(f is not None for f in failures) else None)

    def load_module(self, spec_json: str, binary: bytes | None) -> int:
        """Load (or find in the service's cache) the module Java described; returns its id."""
        from ..kernels.modules import ModuleSource

        self.check_open("loadModule")
        spec = json.loads(spec_json)
        code = binary if spec["kind"] == "cubin" else spec["code"]
        source = ModuleSource.of(code, spec["kind"], options=spec.get("options", ()), headers=spec.get("headers"),
                                 name_expressions=spec.get("nameExpressions", ()), signatures=spec.get("signatures"))
        module = self.service.load_module(source, int(spec.get("gpu", 0)))
        with self._lock:
            mid = self._module_ids.get(module)
            if mid is None:
                mid = self._module_ids[module] = len(self._modules) + 1
                self._modules[mid] = module
        return mid

    def kernel(self, module_id: int, name: str) -> str:
        """``"<kernel id>;<kind>,<kind>,..."``: the kernel Java launches by id, and its signature."""
        self.check_open("kernel")
        k = self._module("kernel", module_id).kernel(name)
        return f"{self.hot.register_kernel(k)};{','.join(k.signature)}"

    def _module(self, call: str, module_id: int) -> Any:
        module = self._modules.get(module_id)
        if module is None:
            raise InvalidArgument(f"{call}: no module {module_id!r} was loaded through this bridge")
        return module

    def global_(self, module_id: int, name: str) -> tuple[int, int]:
        """(address, size) of a module's ``__constant__`` / ``__device__`` variable."""
        self.check_open("global")
        g = self._module("global", module_id).global_(name)
        return g.address, g.size

    def copy_to_global(self, task: int, module_id: int, name: str, offset: int, data: bytes) -> None:
        """Java's ``DeviceGlobal.copyFrom``: the bytes into the global, on the task's stream."""
        from ..kernels.module_globals import copy_to_global

        self.check_open("copyToGlobal")
        g = self._module("copyToGlobal", module_id).global_(name)
        copy_to_global(self.service.registry, task, g, data, offset)

    def copy_from_global(self, task: int, module_id: int, name: str, offset: int, length: int) -> bytes:
        """Java's ``DeviceGlobal.copyTo``: ``length`` bytes of the global, after the task's queued work."""
        from ..kernels.module_globals import copy_from_global

        self.check_open("copyFromGlobal")
        g = self._module("copyFromGlobal", module_id).global_(name)
        if not 0 <= length <= g.size:
            raise InvalidArgument(f"copyFromGlobal: {length} bytes of global {name!r} of {g.size} bytes")
        out = bytearray(length)
        copy_from_global(self.service.registry, task, g, out, offset)
        return bytes(out)

    def lookup_task(self, task: int) -> tuple[int, int]:
        return self.hot.stream(task)

    # Python functions (functions/, through jvm/function_calls.py) ---------------------------------
    def python_function(self, reference: str, search_paths: list[str]) -> int:
        """The id of the function ``"package.module:function"`` names (imported once per executor)."""
        self.check_open("pythonFunction")
        return self.hot.functions.resolve(reference, search_paths)

    def pickled_function(self, payload: bytes) -> int:
        """The id of a function pickled by ``cudabridge.functions.pickle_function`` (loaded once per bytes)."""
        self.check_open("pythonFunction")
        return self.hot.functions.resolve_pickled(payload)

    def batch_function(self, function_id: int, inputs: list[str], outputs: list[str], dtypes: list[str]) -> int:
        """The id of function ``function_id`` over column batches (functions/batches.py)."""
        self.check_open("batchFunction")
        return self.hot.functions.batches(function_id, inputs, outputs, dtypes)

    def memory_returned(self) -> None:
        """GpuRetry gave back what its block held after a break: waiters re-check at once."""
        self.check_open("memoryReturned")
        self.service.pressure.memory_returned()

    def retried_attempt(self, task: int) -> None:
        """The task is a retried attempt: admitted ahead of first attempts (MemoryPressure.retried)."""
        self.check_open("retriedAttempt")
        self.service.pressure.retried(task)

    def cancel_waits(self, task: int) -> None:
        """The task was killed (the plugin's kill watch saw Spark interrupt it): its waits for
        memory and admission end at once (MemoryPressure.cancel)."""
        self.check_open("cancelWaits")
        self.service.pressure.cancel(task)

    def release_task(self, task: int) -> tuple[int, int]:
        """Release the task; its buffers die in Java (the Java side marked them) and in Python
        (the hot path drops their handles when the registry's release has drained the task's
        operations) before the registry frees them on the task's stream."""
        try:
            report = self.service.release_task(task)
        except UnknownTask:
            if not self.service.pressure.cancel_admission(task):
                raise
            return 0, 0   # it waited for admission (its bind had not happened): it leaves, nothing held
        self.releases += 1
        return report.leaks_reclaimed, report.leaked_bytes_reclaimed

    # What statistics() holds besides the service's totals, each a count or a gauge.
    BRIDGE_STATISTICS = ("bridge_calls_total", "bridge_live_handles", "bridge_pinned_buffers", "bridge_releases",
                         "device_unusable", "pinned_in_use_bytes", "pinned_reserved_bytes",
                         "pinned_fallbacks_host_alloc", "pinned_fallbacks_pageable") + STAGING_STATISTICS

    @classmethod
    def statistics_names(cls) -> tuple[str, ...]:
        """Every key of :meth:`statistics`, in order: the one list the Java side's metric names
        come from (the build writes it into cudabridge.jar as ``org/cudabridge/statistics.txt``)."""
        from ..service import ServiceStatistics
        from .hot_path import JavaHotPath

        return (ServiceStatistics.total_names() + tuple("bridge_" + k for k in JavaHotPath.COUNTERS)
                + cls.BRIDGE_STATISTICS)

    def statistics(self) -> dict[str, int]:
        self.hot.sweep()
        stats = self.service.statistics()
        out = {k: int(v) for k, v in stats.totals().items()}
        for key, value in self.hot.counters.items():
            out["bridge_" + key] = int(value)
        # calls into Python on the hot path (a batch of frees is one call)
        out["bridge_calls_total"] = sum(int(v) for k, v in self.hot.counters.items() if k != "batched_frees")
        out["bridge_live_handles"] = self.hot.live_handles
        out["bridge_pinned_buffers"] = self.service.page_locked.pinned_buffers
        out["bridge_releases"] = self.releases
        out["device_unusable"] = int(self.service._unusable is not None)
        pool = self.service.page_locked.pinned_pool
        out["pinned_in_use_bytes"] = pool.in_use_bytes
        out["pinned_reserved_bytes"] = pool.reserved_bytes
        out["pinned_fallbacks_host_alloc"] = pool.fallbacks_host_alloc
        out["pinned_fallbacks_pageable"] = pool.fallbacks_pageable
        out.update(self.hot.staging_statistics())
        return out

    def device_error(self) -> str | None:
        """The sticky CUDA error that made a GPU unusable (``CudaBridgeService.device_error``)."""
        if self.closed:
            return None
        err = self.service.device_error()
        return None if err is None else str(err)

    def describe(self) -> str:
        info = dict(self.info)
        info["backend"] = self.service.backend.name
        info["gpus"] = {str(o): r.address for o, r in self.service.gpus.items()}
        return json.dumps(info, sort_keys=True)

    def call_tool(self, name: str, args_json: str) -> str:
        """Run ``cudabridge.jvm.tools.<name>(control, **args)`` and return its result as JSON:
        test kernels, pool statistics, in-process Python timings for the benchmark. Only the
        functions of that module are reachable; this is no general eval."""
        fn = tools.TOOLS.get(name)
        if fn is None:
            raise InvalidArgument(f"unknown tool {name!r}; known: {sorted(tools.TOOLS)}")
        args = json.loads(args_json) if args_json else {}
        if not isinstance(args, dict):
            raise InvalidArgument(f"tool {name}: arguments must be a JSON object, got {args_json!r}")
        return json.dumps(fn(self, **args))

    def shutdown(self) -> int:
        """Close the service: releases every task, drains the streams, returns memory. Python
        itself stays up (it is never finalized inside a JVM). Returns the tasks released."""
        with self._lock:
            if self.closed:
                return 0
            self.closed = True
        reports = self.service.close()
        self.hot._live.clear()
        self.hot.close_staging()   # the streams are drained: the staging slots' memory can go
        return len(reports)

    def check_open(self, call: str) -> None:
        if self.closed:
            raise PoolClosed(f"{call} after the cudabridge bridge was shut down")


def make_proxy(control: BridgeControl) -> Any:
    """The ``org.cudabridge.ControlPlane`` implementation (the JVM must be bound already)."""
    from jpype import JArray, JByte, JClass, JImplements, JLong, JOverride

    from .errors import java_exception
    from .java_classes import java_class

    HashMap = JClass("java.util.HashMap")
    Long = JClass("java.lang.Long")
    StreamBinding = java_class("org.cudabridge.StreamBinding")

    def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any) -> Any:
            try:
                return fn(*args)
            except Exception as exc:  # every error becomes a Java exception with its message
                log.debug("control call %s failed", fn.__name__, exc_info=True)
                raise java_exception(exc) from None
        wrapper.__name__ = fn.__name__
        return wrapper

    c = control

    def j_lookup_task(task: Any) -> Any:
        c.check_open("attach")
        stream, ordinal = c.lookup_task(int(task))
        return StreamBinding(stream, ordinal)

    def j_statistics() -> Any:
        c.check_open("statistics")
        m = HashMap()
        for key, value in c.statistics().items():
            m.put(key, Long(value))
        return m

    def j_describe() -> Any:
        return c.describe()

    def j_device_error() -> Any:
        return c.device_error()

    def j_call_tool(name: Any, args: Any) -> Any:
        return c.call_tool(str(name), None if args is None else str(args))

    def j_shutdown() -> Any:
        return c.shutdown()

    def j_load_module(spec: Any, binary: Any) -> Any:
        return c.load_module(str(spec), None if binary is None else bytes(binary))

    def j_kernel(module_id: Any, name: Any) -> Any:
        return c.kernel(int(module_id), str(name))

    def j_global(module_id: Any, name: Any) -> Any:
        return JArray(JLong)(c.global_(int(module_id), str(name)))

    def j_copy_to_global(task: Any, module_id: Any, name: Any, offset: Any, data: Any) -> Any:
        c.copy_to_global(int(task), int(module_id), str(name), int(offset), bytes(data))

    def j_copy_from_global(task: Any, module_id: Any, name: Any, offset: Any, length: Any) -> Any:
        return JArray(JByte)(c.copy_from_global(int(task), int(module_id), str(name), int(offset), int(length)))

    def j_register_host(address: Any, nbytes: Any) -> Any:
        c.check_open("registerHost")
        c.hot.register_host(int(address), int(nbytes))

    def j_unregister_host(address: Any, task: Any) -> Any:
        c.check_open("unregisterHost")
        c.hot.unregister_host(int(address), int(task))

    def j_python_function(reference: Any, paths: Any) -> Any:
        return c.python_function(str(reference), [str(p) for p in paths])

    def j_pickled_function(payload: Any) -> Any:
        return c.pickled_function(bytes(payload))

    def j_batch_function(function_id: Any, inputs: Any, outputs: Any, dtypes: Any) -> Any:
        return c.batch_function(int(function_id), [str(n) for n in inputs], [str(n) for n in outputs],
                                [str(t) for t in dtypes])

    def j_cancel_waits(task: Any) -> Any:
        c.cancel_waits(int(task))

    def j_retried_attempt(task: Any) -> Any:
        c.retried_attempt(int(task))

    def j_memory_returned() -> Any:
        c.memory_returned()

    @JImplements(java_class("org.cudabridge.ControlPlane"))
    class ControlProxy:
        lookupTask = JOverride(guarded(j_lookup_task))
        statistics = JOverride(guarded(j_statistics))
        describe = JOverride(guarded(j_describe))
        deviceError = JOverride(guarded(j_device_error))
        callTool = JOverride(guarded(j_call_tool))
        shutdown = JOverride(guarded(j_shutdown))
        loadModule = JOverride(guarded(j_load_module))
        kernel = JOverride(guarded(j_kernel))
        globalVariable = JOverride(guarded(j_global))
        copyToGlobal = JOverride(guarded(j_copy_to_global))
        copyFromGlobal = JOverride(guarded(j_copy_from_global))
        registerHost = JOverride(guarded(j_register_host))
        unregisterHost = JOverride(guarded(j_unregister_host))
        pythonFunction = JOverride(guarded(j_python_function))
        pickledFunction = JOverride(guarded(j_pickled_function))
        batchFunction = JOverride(guarded(j_batch_function))
        cancelWaits = JOverride(guarded(j_cancel_waits))
        retriedAttempt = JOverride(guarded(j_retried_attempt))
        memoryReturned = JOverride(guarded(j_memory_returned))

    return ControlProxy()
