"""The executor's GPU service: one stream pool and one memory pool per GPU, and the task registry.

One instance lives in each Spark executor process. It sets ``CUDA_DEVICE_MAX_CONNECTIONS``
before the CUDA context exists, opens the backend, maps Spark's GPU addresses to ordinals,
builds each GPU's pools, and on ``close()`` releases every task, drains the streams, returns
memory and destroys events and streams.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .allocators import LibraryAllocator, LibraryStatistics
from .allocators import install as install_allocators
from .allocators import statistic_names as allocator_statistic_names
from .config import ServiceConfig
from .device import DeviceBackend, open_backend
from .errors import CudaError, DeviceUnusable, InvalidArgument, PoolClosed
from .gpu_addresses import parse_address_map, resolve_gpu_addresses
from .kernels import LaunchConfig
from .kernels.host_kernels import HostKernels
from .kernels.kernel_table import KernelTable
from .kernels.module_loader import ModuleLoader
from .kernels.modules import ModuleCache, ModuleSource
from .memory import Allocation, PoolStatistics, StreamOrderedMemoryPool
from .memory.native import unavailable as c_paths_unavailable
from .memory.page_locked_regions import PageLockedRegions
from .stream_pool import StreamPool, ensure_hardware_queues
from .pressure import MemoryPressure, PressureStatistics
from .task_registry import GpuResources, ReleaseReport, TaskBinding, TaskRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceStatistics:
    backend: str
    gpus: int
    streams: int
    streams_in_use: int
    tasks_bound: int
    tasks_bound_total: int
    c_paths_missing: int
    memory: dict[int, PoolStatistics]
    # the Python GPU libraries whose allocations go through the pools (cudabridge.allocators)
    libraries: dict[str, LibraryStatistics] = field(default_factory=dict)
    # waits for memory and admission (cudabridge.pressure)
    pressure: PressureStatistics | None = None

    @staticmethod
    def total_names() -> tuple[str, ...]:
        """The keys of :meth:`totals`: the service's counts, then every pool statistic."""
        own = tuple(f.name for f in fields(ServiceStatistics) if f.type in ("int", int))
        return (own + tuple(f.name for f in fields(PoolStatistics) if f.name != "device")
                + allocator_statistic_names() + PressureStatistics.names())

    def totals(self) -> dict[str, int]:
        """Executor-level numbers: the per-GPU pool statistics summed (peaks too)."""
        out: dict[str, int] = {"gpus": self.gpus, "streams": self.streams, "streams_in_use": self.streams_in_use,
                               "tasks_bound": self.tasks_bound, "tasks_bound_total": self.tasks_bound_total,
                               "c_paths_missing": self.c_paths_missing}
        for stats in self.memory.values():
            for key, value in stats.as_dict().items():
                if key != "device":
                    out[key] = out.get(key, 0) + value
        for name in allocator_statistic_names():   # every library's, installed or not: fixed names
            out[name] = 0
        for library, lib_stats in self.libraries.items():
            for key, value in lib_stats.as_dict().items():
                out[f"allocator_{library}_{key}"] = value
        out.update(dict.fromkeys(PressureStatistics.names(), 0))
        if self.pressure is not None:
            out.update(self.pressure.as_dict())
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["totals"] = self.totals()
        return d


class CloseReport(list):
    """What :meth:`CudaBridgeService.close` did: the tasks it released (a list of
    :class:`ReleaseReport`, as before), ``errors`` (what the steps met, in order; empty when
    everything closed cleanly) and ``device_error`` (the sticky CUDA error that made the device
    unusable, if any)."""

    def __init__(self, reports: list, errors: list[BaseException],
                 device_error: CudaError | None = None) -> None:
        super().__init__(reports)
        self.errors = list(errors)
        self.device_error = device_error


def _wrap_backend(spec: str, backend: DeviceBackend) -> DeviceBackend:
    """The ``backend_wrapper`` test setting: ``module:callable`` applied to the opened backend."""
    import importlib

    module, _, name = spec.partition(":")
    try:
        wrap = getattr(importlib.import_module(module), name or "wrap")
        wrapped = wrap(backend)
    except Exception as exc:
        backend.close()
        raise InvalidArgument(f"spark.cudabridge.backendWrapper={spec!r}: {type(exc).__name__}: {exc}") from exc
    log.warning("device backend wrapped by %s (a test setting)", spec)
    return wrapped


def _load_arena_type(spec: str) -> type:
    """The ``test_stream_arena`` test setting: ``module:Class``, a StreamArena subclass."""
    import importlib

    from .memory.stream_arena import StreamArena

    module, _, name = spec.partition(":")
    try:
        arena_type = getattr(importlib.import_module(module), name)
    except Exception as exc:
        raise InvalidArgument(f"spark.cudabridge.testStreamArena={spec!r}: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(arena_type, type) and issubclass(arena_type, StreamArena)):
        raise InvalidArgument(f"spark.cudabridge.testStreamArena={spec!r}: not a StreamArena subclass")
    log.warning("memory pools use the stream arenas of %s (a test setting)", spec)
    return arena_type


class CudaBridgeService:
    def __init__(self, config: ServiceConfig | None = None, backend: DeviceBackend | None = None) -> None:
        self.config = config = config or ServiceConfig()
        logging.getLogger("cudabridge").setLevel(config.log_level)   # the table's spelling: DEBUG, INFO, ...
        self._owns_backend = backend is None
        if backend is None:
            ensure_hardware_queues(config.streams_per_gpu + config.high_priority_streams)
            backend = open_backend(config.backend, emulated_devices=config.emulated_devices,
                                   emulated_memory_bytes=config.emulated_memory,
                                   # false leaves it to CUDABRIDGE_EMULATED_RACE_CHECK (the tests set it)
                                   race_check=True if config.emulated_race_check else None)
            if config.backend_wrapper:
                backend = _wrap_backend(config.backend_wrapper, backend)
        self.backend = backend
        # The emulated device runs user kernels as their host kernels (kernels/host_kernels.py).
        self.host_kernels = HostKernels((config.emulated_kernels or "").split(",") if backend.runs_host_kernels else ())
        self.module_loader = ModuleLoader(backend, self.host_kernels, config)
        self.modules = ModuleCache(self.module_loader.load, self.module_loader.target)
        addresses = config.gpu_addresses or None   # unset or empty: every visible GPU
        mapping = resolve_gpu_addresses(addresses, backend,
                                        address_map=parse_address_map(config.gpu_address_map or ""))
        self.addresses = mapping
        limit_bytes, fraction = config.pool_limit
        arena_kw = {"arena_type": _load_arena_type(config.test_stream_arena)} if config.test_stream_arena else {}
        gpus: dict[int, GpuResources] = {}
        try:
            for address, ordinal in mapping.items():
                streams = StreamPool(backend, ordinal, config.streams_per_gpu, config.high_priority_streams,
                                     config.stream_policy, wait_timeout_s=config.host_wait_timeout)
                try:
                    memory = StreamOrderedMemoryPool(backend, ordinal, streams.handles, limit_bytes=limit_bytes,
                                                     limit_fraction=fraction, initial_bytes=config.pool_initial,
                                                     growth=config.pool_growth, cache_frees=config.pool_cache_frees,
                                                     host_wait_timeout_s=config.host_wait_timeout, **arena_kw)
                except BaseException:
                    streams.close()
                    raise
                gpus[ordinal] = GpuResources(ordinal, address, streams, memory)
                config.check_pool_limit(memory.limit, address)   # a fraction too small for this GPU; closed below
        except BaseException:
            for res in gpus.values():
                res.memory.close()
                res.streams.close()
            if self._owns_backend:
                backend.close()
            raise
        self.gpus = gpus
        self.registry = TaskRegistry(gpus)
        self.release_task = self.registry.release   # type: ignore[method-assign]
        # the executor's page-locked host memory (pinned buffers, host registrations) and its
        # kernels by id: the service's, for every front (Python task code, the Java bridge)
        self.page_locked = PageLockedRegions(backend, config.pinned_pool)
        self.registry.on_release(lambda b: self.page_locked.forget_task(b.task_id))
        self.kernels = KernelTable()
        # admission (concurrentGpuTasks) and allocations that wait instead of failing (oomWait)
        self.pressure = MemoryPressure(self.registry, gpus, config.concurrent_gpu_tasks, config.oom_wait)
        # library name -> its allocator (cudabridge.allocators), made by the library's install
        self.library_allocators: dict[str, LibraryAllocator] = {}
        self._by_address = {res.address: res.ordinal for res in gpus.values()}
        self._closed = False
        self._unusable: CudaError | None = None   # the sticky error that made a GPU unusable
        self._unusable_listeners: list[Any] = []
        self._lock = threading.Lock()
        # The C paths are required parts of an install; without them everything works, slower.
        self._c_paths_missing = c_paths_unavailable()
        if self._c_paths_missing:
            log.warning("cudabridge runs WITHOUT %d of its C paths, their Python twins instead (about 3x slower per "
                        "allocation): %s; `python -m cudabridge doctor` says how to fix it",
                        len(self._c_paths_missing), "; ".join(f"{m}: {why}" for m, why in self._c_paths_missing.items()))
        if config.allocators:   # last: a library's install may allocate (from the pools, set up above)
            try:
                install_allocators(self, config.allocators)
            except BaseException:
                self.close()
                raise
        log.info("cudabridge service up: backend %s, GPUs %s, %d+%d streams each%s",
                 backend.name, {a: o for a, o in mapping.items()}, config.streams_per_gpu, config.high_priority_streams,
                 f"; allocators of {', '.join(config.allocators)}" if config.allocators else "")

    # tasks -----------------------------------------------------------------------------------
    def ordinal_of(self, address: str) -> int:
        ordinal = self._by_address.get(str(address))
        if ordinal is None:
            from .errors import InvalidArgument

            raise InvalidArgument(f"GPU address {address!r} is not owned by this executor "
                                  f"(owned: {sorted(self._by_address)})")
        return ordinal

    def bind_task(self, task_id: int, gpu_address: str | None = None, priority: str = "normal") -> TaskBinding:
        if self._closed or self._unusable is not None:
            self._check_open("bind_task")
            self._check_usable("bind_task")
        gpu = None if gpu_address is None else self.ordinal_of(gpu_address)
        if not self.pressure.limited:
            return self.registry.bind(task_id, gpu, priority)
        ordinal = self.registry.gpu_for(gpu)   # the GPU the bind will pick: its admission first
        admitted = self.pressure.admit(task_id, ordinal)
        try:
            return self.registry.bind(task_id, gpu, priority)
        except BaseException:
            if admitted:
                self.pressure.bind_failed(task_id, ordinal)
            raise

    def release_task(self, task_id: int) -> ReleaseReport:
        """The registry's release (replaced by it on each service: one call less per task)."""
        return self.registry.release(task_id)

    def allocate(self, task_id: int, size: int) -> Allocation:
        if self._unusable is not None:
            self._check_usable("allocate")
        try:
            return self.registry.allocate(task_id, size)
        except CudaError as exc:
            if exc.sticky:
                self._mark_unusable(exc)
                self._check_usable("allocate")
            raise

    def launch(self, task_id: int, kernel: Any, config: LaunchConfig, args: list) -> None:
        """Queue ``kernel`` (of a module from :meth:`load_module`) on the task's stream, under the
        task guard (:meth:`TaskRegistry.launch`). After a sticky CUDA error it fails fast with
        :class:`DeviceUnusable`."""
        if self._unusable is not None:
            self._check_usable("launch")
        try:
            self.registry.launch(task_id, kernel, config, args)
        except CudaError as exc:
            failure = self.cuda_failure(exc, "launch")
            if failure is exc:
                raise
            raise failure from exc

    def synchronize(self, task_id: int) -> None:
        """Wait for the task's stream. A kernel that faulted there raises
        :class:`~cudabridge.errors.KernelFault` naming the candidates, and the GPU is unusable
        from then on (:meth:`device_error`)."""
        try:
            self.registry.synchronize(task_id)
        except CudaError as exc:
            if exc.sticky:
                self._mark_unusable(exc)
            raise

    def cuda_failure(self, exc: CudaError, call: str) -> BaseException:
        """What a call that got ``exc`` raises: ``exc``, or once it is sticky (and the GPU marked
        unusable) :class:`DeviceUnusable` naming it."""
        if not exc.sticky:
            return exc
        self._mark_unusable(exc)
        return self._unusable_refusal(call)

    # device health ---------------------------------------------------------------------------
    def device_error(self) -> CudaError | None:
        """The sticky CUDA error that made one of the executor's GPUs unusable, or None.

        After such an error (an illegal address, a launch failure, an uncorrectable ECC error)
        every call in the process fails: only a new process recovers, so the executor plugin asks
        Spark for a new executor. Probes each GPU with one cheap call (``cudaMemGetInfo``, which
        returns the sticky error) until one is found, then remembers it: from then on
        ``bind_task`` and ``allocate`` fail fast with :class:`DeviceUnusable` naming it."""
        if self._unusable is None and not self._closed:
            backend = self.backend
            try:
                prev = backend.get_device()
            except CudaError as exc:
                if exc.sticky:
                    self._mark_unusable(exc)
                return self._unusable
            try:
                for ordinal in self.gpus:
                    try:
                        backend.set_device(ordinal)
                        backend.mem_get_info()
                    except CudaError as exc:
                        if exc.sticky:
                            self._mark_unusable(exc)
                            break
            finally:
                try:
                    backend.set_device(prev)
                except CudaError:
                    pass
        return self._unusable

    def on_unusable(self, listener: Any) -> None:
        """Call ``listener(refusal)`` once the GPU is found unusable: ``refusal(call)`` is the
        :class:`DeviceUnusable` a call must then raise (the Java hot path, which bypasses
        :meth:`allocate` and :meth:`launch`, fails fast through it)."""
        self._unusable_listeners.append(listener)
        if self._unusable is not None:
            listener(self._unusable_refusal)

    def _unusable_refusal(self, call: str) -> DeviceUnusable:
        return DeviceUnusable(f"{call}: the GPU is unusable after a sticky CUDA error ({self._unusable}); "
                              f"only a new executor process recovers")

    def _mark_unusable(self, exc: CudaError) -> None:
        if self._unusable is None:
            self._unusable = exc
            log.error("cudabridge: the CUDA context is unusable after %s; this executor must be replaced", exc)
            for listener in self._unusable_listeners:
                listener(self._unusable_refusal)

    def _check_usable(self, call: str) -> None:
        if self._unusable is not None:
            raise self._unusable_refusal(call)

    # user modules (kernels/) --------------------------------------------------------------------
    def load_module(self, source: ModuleSource, gpu: int = 0):
        """The module of ``source`` on GPU ``gpu`` (a CUDA ordinal), loaded once per executor and
        GPU: concurrent asks wait for one load, a failed load is raised again to every ask."""
        self._check_open("load_module")
        self.registry.gpu(gpu)   # refuses a GPU this executor does not own, naming the ones it does
        return self.modules.load(source, gpu)

    def memory_pool(self, ordinal: int = 0) -> StreamOrderedMemoryPool:
        return self.registry.gpu(ordinal).memory

    def stream_pool(self, ordinal: int = 0) -> StreamPool:
        return self.registry.gpu(ordinal).streams

    # statistics and lifetime -----------------------------------------------------------------
    def statistics(self) -> ServiceStatistics:
        # the libraries' first: reading them makes their queued frees, which the pools' then count
        libraries = {name: a.statistics() for name, a in list(self.library_allocators.items())}
        return ServiceStatistics(
            backend=self.backend.name,
            gpus=len(self.gpus),
            streams=sum(len(r.streams.handles) for r in self.gpus.values()),
            streams_in_use=self.registry.streams_in_use,
            tasks_bound=self.registry.tasks_bound,
            tasks_bound_total=self.registry.tasks_bound_total,
            c_paths_missing=len(self._c_paths_missing),
            memory={o: r.memory.statistics() for o, r in self.gpus.items()},
            libraries=libraries,
            pressure=self.pressure.statistics(),
        )

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise PoolClosed(f"{call} after the cudabridge service was closed")

    def close(self) -> "CloseReport":
        """Release every task, drain the streams, return memory, destroy events and streams.

        Every step runs whatever an earlier one met, so that after a kernel fault (a sticky CUDA
        error: every later CUDA call fails) or a stream still busy past ``hostWaitTimeout``
        everything that can be released is, and the service ends closed. Nothing is raised: the
        errors met are logged once and returned (:class:`CloseReport`, a list of the tasks'
        :class:`ReleaseReport` with ``errors`` and ``device_error``). A second close returns an
        empty report."""
        with self._lock:
            if self._closed:
                return CloseReport([], [])
            self._closed = True
        errors: list[BaseException] = []
        reports: list[ReleaseReport] = []
        self.pressure.close()   # waiters leave (their tasks are released next), nothing waits any more
        try:
            reports = self.registry.close(deadline_s=self.config.host_wait_timeout)
        except Exception as exc:   # noqa: BLE001 - the pools and streams are closed all the same
            errors.append(exc)
        for allocator in list(self.library_allocators.values()):   # their queued frees, before the pools go
            try:
                allocator.close()
            except Exception as exc:   # noqa: BLE001
                errors.append(exc)
        for res in self.gpus.values():
            for part in (res.memory, res.streams):
                try:
                    part.close()
                except Exception as exc:   # noqa: BLE001
                    errors.append(exc)
        try:   # the streams are drained: the pinned pool's memory can go
            self.page_locked.close()
        except Exception as exc:   # noqa: BLE001 - a sticky error: the memory goes with the context
            errors.append(exc)
        if self._owns_backend:
            try:
                self.backend.close(self.config.host_wait_timeout)
            except Exception as exc:   # noqa: BLE001
                errors.append(exc)
        report = CloseReport(reports, errors, self._unusable or next(
            (e for e in errors if isinstance(e, CudaError) and e.sticky), None))
        if errors:
            log.error("cudabridge service closed with %d error(s), first: %s%s", len(errors), errors[0],
                      "" if report.device_error is None else f" (the device: {report.device_error})")
        return report

    def __enter__(self) -> "CudaBridgeService":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
