"""What the bridge's JNI natives call: a plain Python object with one small method per operation.

(About 700 lines, on purpose: one class whose bound methods the JNI library looks up once at
start, each the Python reference its C twin follows step for step, so a reader compares the two
in one place. What it adapts lives elsewhere: the page-locked memory and the kernels by id in the
service, memory/page_locked_regions.py and kernels/kernel_table.py; the handles in handles.py.)

The C library looks these bound methods up once, at start-up, and calls them with
``PyObject_Vectorcall`` on the Java thread's kept thread state. No JPype on this path: a direct
call costs a fraction of a pinned JPype proxy call, and an unpinned proxy call leaks native
memory (docs/architecture.md, "Facts the code relies on"). So each method is kept to a few
built-in operations: the Python body is most of the per-call cost.

Java never sees an :class:`~cudabridge.memory.Allocation`; it holds a *handle*: the pool's
allocation id (never reused within a pool) shifted left by 6 bits, or'ed with the GPU ordinal.
Every method that takes a handle looks it up in the hot path's :class:`~.handles.HandleTable`
first, so a stale handle (double free, a buffer whose task was released, a race between two Java
threads on one buffer) is refused by Python even if the Java side's own checks were bypassed; it
can never reach a block that has since gone to another owner.

Host buffers arrive as ``memoryview`` objects over native memory the C side owns (a per-thread
staging buffer for Java heap arrays, the memory of a direct ``ByteBuffer``), plus, for direct
buffers, the raw address so that pinned buffers handed out by :meth:`alloc_pinned` are
recognised (copies to and from them are truly asynchronous).

``stream``, ``allocate``, ``free`` and ``free_many`` have a C twin (``_hotcore.c``, built with the
pool's C fast path) that the constructor installs on the instance when it is built, as the pool
does with its own: the methods below are the reference it follows and the fallback
(``fast_path="python"``, or ``CUDABRIDGE_NATIVE_FAST_PATH=0``). The twin is handed, explicitly,
only what these methods use: the registry's lease table (the lease protocol documented in
``task_registry.py``), the hot path's handle table (``handles.py``), the pools' allocate and free
per GPU, ``set_device``, and these reference methods themselves, which it calls for the argument
forms it does not take (not exact ints, keywords, a wrong count). Both twins take the same steps
through those APIs, so they give the same results and the same errors (type and words) for the
same inputs and interleavings (``tests/test_hot_core_differential.py``).

Every operation that queues work for a task runs inside the task's lease (the lease protocol,
``task_registry.py``), entered and left in the shape its "Interruptions" section documents:
``lease.inside.append(me)`` the first statement of a ``try`` whose ``finally`` (or, where the
lease is handed to the caller, ``except BaseException``) first calls ``lease.inside.remove(me)``,
both inline, so that an asynchronous exception never leaves this thread recorded inside.
:meth:`JavaHotPath._enter_buffer` and :meth:`JavaHotPath.enter_host_copy` return with the lease
entered for their caller to leave: the C twin, which holds it in C from there, and
``tools.fill_u32``, whose own ``try`` begins after the call returns: an asynchronous exception
landing between that return and the ``try`` would strand it (a test tool, called by no task code).

A free of a handle that its task's release took has no effect, in either twin and in batches
(``handles.py``, ``released_with``): the release freed the buffer and counted it as a leak, so
the free counts nothing. Launches, copies and memsets refuse a buffer whose task is being (or
was) released with :class:`~cudabridge.errors.UnknownTask` and one that is not live with
:class:`~cudabridge.errors.InvalidArgument`; only frees raise
:class:`~cudabridge.errors.InvalidFree`.
"""

from __future__ import annotations

import ctypes
import itertools
import struct
import logging
import threading
from threading import get_ident
from typing import TYPE_CHECKING, Any, Iterable

from ..device.params import PARAM_KINDS
from ..errors import CudaError, InvalidArgument, UnknownTask
from ..kernels import LaunchConfig
from ..memory import FastPath
from ..memory.allocation import RELEASED
from ..memory.native import load as load_native
from ..memory.native import supported as native_supported
from ..task_registry import TaskLeases
from .entry_waits import EntryWaits
from .function_calls import JavaFunctions
from .handles import GPU_BITS, GPU_MASK, MAX_GPUS, HandleTable

if TYPE_CHECKING:
    from ..memory import Allocation
    from ..service import CudaBridgeService
    from ..task_registry import TaskBinding, TaskLease

log = logging.getLogger(__name__)

__all__ = ["JavaHotPath", "GPU_BITS", "GPU_MASK", "MAX_GPUS"]

# The reference methods the C twin replaces (and calls for the argument forms it does not take).
TWINNED = ("stream", "allocate", "free", "free_many", "launch", "synchronize")
# The staging slots' statistics (HotCore.staging_statistics; docs/glossary.md)
STAGING_STATISTICS = ("staging_reserved_bytes", "staging_slots", "staging_slots_held", "staging_slots_held_peak",
                      "staging_copies", "staging_quick_copies", "staging_waits", "staging_wait_us_total",
                      "staging_fallbacks_pageable", "staging_slots_lost")


# The kind codes Java sends (org.cudabridge.CudaKernel's KINDS, same order).
# A kind's code is its index in PARAM_KINDS (the one definition; Java reads the same table from the
# jar). Code 0 is "ptr": the C twin tells a buffer argument by it.
KIND_CODES = tuple(PARAM_KINDS)
assert KIND_CODES[0] == "ptr"
_I64 = (-(1 << 63), (1 << 63) - 1)


def java_raw_range(kind: str) -> tuple[int, int]:
    """The raw values Java marshals for a parameter of ``kind`` that the C twin takes as they
    stand (anything else goes to the Python reference, which says what is wrong): a signed
    integer's range, a float's 32 raw bits, 0 or 1 for a bool; any 64-bit value for i64, f64 and
    ptr (a handle, checked against the handle table)."""
    if kind in ("i8", "i16", "i32"):
        bits = PARAM_KINDS[kind][1] * 8
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if kind == "f32":
        return 0, (1 << 32) - 1
    if kind == "bool":
        return 0, 1
    return _I64


class JavaHotPath:
    """The hot path of the Java API, over one :class:`CudaBridgeService`."""

    # Calls counted per kind (statistics ``bridge_<kind>``); the C twin counts what it takes itself
    # (HotCore.counts), which ``counters`` adds.
    COUNTERS = ("allocations", "frees", "batched_frees", "batches", "copies_in", "copies_out", "copies_direct",
                "memsets", "synchronizes", "launches", "launches_referred", "copies_address", "pinned_reclaimed",
                "copies_referred")

    def __init__(self, service: "CudaBridgeService", fast_path: str = "auto") -> None:
        fast_path = FastPath.parse(fast_path, "fast_path")
        if max(service.gpus, default=0) >= MAX_GPUS:
            raise InvalidArgument(f"the Java bridge supports GPU ordinals below {MAX_GPUS}, got {sorted(service.gpus)}")
        self._service = service
        self._registry = service.registry
        self._binding = service.registry.binding
        # the lease protocol (task_registry.py): the same table and steps as the C twin, entered
        # and left inline (module docstring)
        self._leases: TaskLeases = service.registry.leases
        self._lease_of = self._leases.lease_of
        self._backend = service.backend
        # per GPU ordinal: the memory pool's allocate (bound once; the pool is fixed for the service's life)
        self._allocators = {o: res.memory.allocate for o, res in service.gpus.items()}
        # ... and its free (the pool binds its C fast path on the instance: calling it directly
        # saves Allocation.free's Python frame, most of a batched free's cost)
        self._frees = {o: res.memory.free for o, res in service.gpus.items()}
        self._multi_gpu = len(service.gpus) > 1
        self._set_device = service.backend.set_device
        self._live = HandleTable()   # handle -> Allocation: handed to the C twin
        # Python functions Java calls (function_calls.py): the native callFunction calls call_function
        self.functions = JavaFunctions(service, self._live, fast_path)
        self.call_function = self.functions.call
        # the executor's page-locked host memory (pinned buffers, registrations), the service's:
        # this adapter adds Java's leases and counters; the C twin reads its tables
        self._regions = service.page_locked
        self.pinned_pool = service.page_locked.pinned_pool
        self._staging: dict[int, Any] = {}          # GPU ordinal -> its staging slots' memory
        self._dummy_threads = 0
        # Calls counted per kind; plain ints, incremented under the GIL (atomic enough for
        # statistics: a lost increment under a free-threaded build would only skew a gauge).
        self._counts = dict.fromkeys(self.COUNTERS, 0)
        self._ids = itertools.count(1)
        self._kernels = service.kernels              # kernel id <-> kernel, the service's
        self._in_core: set[int] = set()             # kernel ids handed to the C twin
        self._refuse_unusable: Any = None   # after a sticky error: call -> DeviceUnusable
        # the driver table the C paths call (the installed driver, or the emulated device's, so
        # that CI runs the same C code); None: copies and launches take the Python paths
        self._driver = service.backend.native_driver
        self._core = self._native_core(fast_path)
        service.on_unusable(self._device_unusable)
        # Drop a task's handles at its release, once its operations have drained.
        service.registry.on_release(self._forget)

    def _native_core(self, choice: str) -> Any:
        """Install the C twin of the allocate/free methods (``_hotcore.c``) on this instance."""
        if choice == "python":
            return None
        module = load_native("cudabridge.jvm._hotcore")
        if module is None:
            if choice == "native":
                ok, why = native_supported()
                raise InvalidArgument("fast_path='native' but the hot path's C extension is unavailable: "
                                      + (why or "not built (python -m cudabridge.memory.build_fastpath)"))
            return None
        core = module.HotCore(
            leases=self._leases, handles=self._live, allocators=self._allocators, frees=self._frees,
            set_device=self._set_device if self._multi_gpu else None,
            reference={name: getattr(JavaHotPath, name).__get__(self) for name in TWINNED},
            launch_log=self._registry.launch_log, launch_failed=self._launch_failed, driver=self._driver)
        for name in TWINNED:
            setattr(self, name, getattr(core, name))
        if self._driver is not None:   # copies from Java in C: pinned staging, page-locked DMA
            cfg = self._service.config
            try:
                # the page-locked regions' tables, read by the C twin as PageLockedRegions.lookup reads them
                regions = tuple(self._regions.tables)
                core.enable_copies(self._enter_buffer, self.enter_host_copy, self._copy_failed, regions,
                                   cfg.staging_slots, cfg.staging_slot_bytes,
                                   cfg.staging_copy_threads)
            except RuntimeError as exc:   # no driver entry points: copies take the Python path
                log.warning("copies from Java go through Python: %s", exc)
            else:
                self._reserve_staging(core, cfg)
        return core

    def _reserve_staging(self, core: Any, cfg: Any) -> None:
        """Each GPU's staging slots (jvm/staging_pool.h): stagingCopies x stagingSlotBytes of
        page-locked memory, reserved here, once, and shared by the copies that need staging (a copy
        takes up to stagingSlots of them and gives them back when it ends). Where the reservation
        fails, that GPU's staged copies go through pageable memory (logged here, counted there)."""
        slot_bytes = cfg.staging_slot_bytes
        slots = cfg.staging_copies
        for ordinal in self._service.gpus:
            try:
                prev = self._backend.get_device()
                self._backend.set_device(ordinal)
                try:
                    memory = self._backend.alloc_pinned(slots * slot_bytes)
                finally:
                    self._backend.set_device(prev)
            except CudaError as exc:
                log.warning("GPU %d: reserving %d staging slots of %d bytes failed (%s); its staged copies go "
                            "through pageable memory", ordinal, slots, slot_bytes, exc)
                continue
            core.enable_staging(ordinal, ctypes.addressof(memory), slots, slot_bytes, cfg.staging_wait)
            self._staging[ordinal] = memory

    def close_staging(self) -> None:
        """Give the staging slots' memory back (at shutdown: the streams are drained). A GPU whose
        slots a copy still holds keeps them (logged)."""
        for ordinal in list(self._staging):
            if self._core is not None and not self._core.close_staging(ordinal):
                log.warning("GPU %d: staging slots still held by a copy at shutdown; their memory is kept", ordinal)
                continue
            memory = self._staging.pop(ordinal)
            try:
                self._backend.free_pinned(memory)
            except Exception as exc:   # noqa: BLE001 - a sticky error: the memory goes with the context
                log.warning("GPU %d: freeing the staging slots failed: %s", ordinal, exc)

    def staging_statistics(self) -> dict[str, int]:
        """The staging slots' statistics (zeros where copies are not staged in C)."""
        if self._core is None or not hasattr(self._core, "staging_statistics"):
            return dict.fromkeys(STAGING_STATISTICS, 0)
        return self._core.staging_statistics()

    def _device_unusable(self, refusal: Any) -> None:
        """The GPU is unusable (a sticky error): allocations and launches fail fast from now on,
        as the service's own do (frees, copies and releases go on: they only return memory or
        report the error themselves)."""
        self._refuse_unusable = refusal
        if self._core is not None:
            self._core.set_unusable(refusal)

    @property
    def fast_path(self) -> str:
        """"native" (the C twin) or "python"."""
        return "native" if self._core is not None else "python"

    @property
    def counters(self) -> dict[str, int]:
        """Calls counted per kind (the C twin counts its own)."""
        out = dict(self._counts)
        out["pinned_reclaimed"] = self._regions.reclaimed   # at task releases, by the service
        if self._core is not None:
            for k, v in self._core.counts().items():
                out[k] += v
        return out

    # streams ---------------------------------------------------------------------------------
    def stream(self, task: int) -> tuple[int, int]:
        """(stream, GPU ordinal) of a bound task; Java caches it per task attempt id."""
        b = self._lease_of(task).binding
        return b.stream, b.gpu

    def synchronize(self, task: int) -> None:
        """Waits for the task's stream; a kernel fault there raises KernelFault naming the
        kernels launched on it since its last completed synchronize (service.synchronize)."""
        self._counts["synchronizes"] += 1
        self._service.synchronize(task)

    # memory ----------------------------------------------------------------------------------
    def allocate(self, task: int, size: int) -> tuple[int, int]:
        """``size`` bytes for ``task`` on its stream: (handle, device pointer). Runs inside the
        task's lease (the lease protocol, task_registry.py): a release that has begun refuses it
        with UnknownTask, and a release waits for it, so the allocation is reclaimed with the
        task if Java loses it."""
        if self._refuse_unusable is not None:
            raise self._refuse_unusable("allocate")
        lease = self._lease_of(task)
        me = get_ident()
        try:
            lease.inside.append(me)
            if not lease.open:
                raise self._leases.refusal(task, lease)
            b = lease.binding
            if self._multi_gpu:
                self._set_device(b.gpu)
            a = self._allocators[b.gpu](size, b.stream, b.task_id)
            hid = a.id << GPU_BITS | b.gpu
            self._live.insert(hid, a)
        finally:
            lease.inside.remove(me)
        self._counts["allocations"] += 1
        return hid, a.ptr

    def free(self, hid: int) -> None:
        """Free the buffer behind ``hid``; no effect when its task's release took it (raced with
        it: the release freed it and counted it as a leak)."""
        if hid.__class__ is not int:   # 1.0 would find handle 1 in the table
            raise self._live.refusal(hid, "free")
        a = self._live.pop(hid, None)
        if a is None:
            if self._live.released_with(hid) is not None:
                return
            raise self._live.refusal(hid, "free")
        try:
            self._frees[hid & GPU_MASK](a)
        except Exception:
            if a._state != RELEASED:
                raise
            return   # its task's release reclaimed it between the pop and the pool's free
        self._counts["frees"] += 1

    def free_many(self, hids: Iterable[int]) -> int:
        """Free every handle of ``hids`` in one call; returns how many this call freed. All are
        checked first: one bad handle (not an int, neither live nor taken by its task's release,
        or the same handle twice) frees nothing and raises. A handle its task's release took (or
        takes while the batch runs) is passed over, as a free of it is. A handle that another
        thread frees while the batch runs (an earlier free ran Python code) stops the batch there,
        with the error a free of it would raise."""
        if hids.__class__ is not tuple and hids.__class__ is not list:
            try:
                it = iter(hids)
            except TypeError:
                raise TypeError("free_many: handles must be an iterable of ints") from None
            hids = list(it)
        table = self._live
        get, released = table.get, table.released_with
        for h in hids:
            if h.__class__ is not int or (get(h) is None and released(h) is None):
                raise table.refusal_many(hids)
        if len(hids) > 1 and len(set(hids)) != len(hids):
            raise table.refusal_many(hids)
        pop = table.pop
        frees = self._frees
        freed = 0
        for h in hids:
            a = pop(h, None)
            if a is None:
                if released(h) is not None:
                    continue
                raise table.refusal(h, "free")
            try:
                frees[h & GPU_MASK](a)
            except Exception:
                if a._state != RELEASED:
                    raise
                continue
            freed += 1
        c = self._counts
        c["batched_frees"] += freed
        c["batches"] += 1
        return freed

    def _buffer(self, hid: int, call: str) -> tuple["Allocation", "TaskLease"]:
        """The live allocation behind ``hid`` and its task's lease, not entered: refused when the
        handle is not live (``HandleTable.dead``) or its task's release has begun."""
        a = self._live.get(hid) if hid.__class__ is int else None
        if a is None:
            raise self._live.dead(hid, call)
        lease = self._leases.get(a.owner)   # the registry's task ids are exact ints
        if lease is None:   # a release takes the lease out of the table first
            raise self._releasing(hid, call, a.owner)
        return a, lease

    @staticmethod
    def _releasing(hid: int, call: str, task: int) -> UnknownTask:
        return UnknownTask(f"{call}: device buffer handle {hid:#x}: its task {task} is being released")

    def _check_buffer(self, a: "Allocation", hid: int, call: str, offset: int, nbytes: int) -> None:
        """Inside ``a``'s task lease: ``a`` still live (a free on another thread may have run) and
        [offset, offset + nbytes) inside it; its GPU current."""
        if not a.alive:
            raise self._live.dead(hid, call)
        if offset < 0 or nbytes < 0 or offset + nbytes > a.size:
            raise InvalidArgument(f"{call}: range [{offset}, {offset}+{nbytes}) is outside the buffer of "
                                  f"{a.size} bytes")
        if self._multi_gpu:
            self._set_device(a.device)

    def _enter_buffer(self, hid: int, call: str, offset: int, nbytes: int) -> tuple["Allocation", "TaskLease"]:
        """The live allocation behind ``hid`` with its task's lease entered, for the caller to
        leave once the work is queued (the C twin's heap-array copies; ``tools.fill_u32``): no
        work is queued for a task whose release has begun. The methods below enter inline."""
        a, lease = self._buffer(hid, call)
        me = get_ident()
        try:
            lease.inside.append(me)
            if not lease.open:
                raise self._releasing(hid, call, a.owner)
            self._check_buffer(a, hid, call, offset, nbytes)
        except BaseException:
            lease.inside.remove(me)
            raise
        return a, lease   # nothing between the try and the return: the caller holds it from here

    # copies (each queued inside its buffer's task lease) ---------------------------------------
    def copy_in(self, hid: int, offset: int, view: memoryview) -> None:
        """Host (staged Java heap array: pageable memory) to device. Returns once the host bytes
        are staged: the caller reuses its staging buffer at once."""
        a, lease = self._buffer(hid, "copy_in")
        me = get_ident()
        try:
            lease.inside.append(me)
            if not lease.open:
                raise self._releasing(hid, "copy_in", a.owner)
            self._check_buffer(a, hid, "copy_in", offset, len(view))
            self._counts["copies_in"] += 1
            self._backend.copy_to_device_async(a.ptr + offset, view, a.stream)
        finally:
            lease.inside.remove(me)

    def copy_out(self, hid: int, offset: int, view: memoryview) -> None:
        """Device to host (staging memory: pageable); returns when the bytes are there."""
        a, lease = self._buffer(hid, "copy_out")
        me = get_ident()
        try:
            lease.inside.append(me)
            if not lease.open:
                raise self._releasing(hid, "copy_out", a.owner)
            self._check_buffer(a, hid, "copy_out", offset, len(view))
            self._counts["copies_out"] += 1
            self._backend.copy_from_device_async(view, a.ptr + offset, a.stream)
        finally:
            lease.inside.remove(me)

    def copy_in_direct(self, hid: int, offset: int, address: int, view: memoryview) -> bool:
        """Direct ByteBuffer to device, asynchronous on the buffer's stream when the memory is
        page-locked (returns True: the Java caller keeps the ByteBuffer alive and unchanged until
        a synchronize, or waits itself). Refused, as a copy by address is, into a range the
        buffer's task unregistered."""
        return self._host_memory_copy("copies_direct", True, hid, offset, address, view)

    def copy_out_direct(self, hid: int, offset: int, address: int, view: memoryview) -> bool:
        return self._host_memory_copy("copies_direct", False, hid, offset, address, view)

    def copy_device(self, dst: int, dst_offset: int, src: int, src_offset: int, nbytes: int) -> None:
        """Device to device, on the destination's stream; when the source lives on another
        stream that stream's work is ordered first by recording the source on it."""
        d, d_lease = self._buffer(dst, "copy_device")
        me = get_ident()
        try:
            d_lease.inside.append(me)
            if not d_lease.open:
                raise self._releasing(dst, "copy_device", d.owner)
            self._check_buffer(d, dst, "copy_device", dst_offset, nbytes)
            s, s_lease = self._buffer(src, "copy_device")
            try:
                s_lease.inside.append(me)
                if not s_lease.open:
                    raise self._releasing(src, "copy_device", s.owner)
                self._check_buffer(s, src, "copy_device", src_offset, nbytes)
                if s.stream != d.stream:
                    # The source's stream may still be writing it: the copy runs after its queued
                    # work. record_stream also makes the source's free wait for the copy.
                    s.record_stream(d.stream)
                    self._order_after(s.stream, d.stream)
                self._backend.memcpy_async(d.ptr + dst_offset, s.ptr + src_offset, nbytes, d.stream)
            finally:
                s_lease.inside.remove(me)
        finally:
            d_lease.inside.remove(me)

    def _order_after(self, first: int, then: int) -> None:
        """Make later work on ``then`` wait, on the device, for what is queued on ``first`` now.
        A transient event, destroyed at once: CUDA (and the emulator) keep a dependency taken
        with cudaStreamWaitEvent after the event is destroyed. Rare (cross-stream copies only),
        so it does not draw on the pools' event pool."""
        backend = self._backend
        ev = backend.event_create()
        try:
            backend.event_record(ev, first)
            backend.stream_wait_event(then, ev)
        finally:
            backend.event_destroy(ev)

    def memset(self, hid: int, offset: int, value: int, nbytes: int) -> None:
        a, lease = self._buffer(hid, "memset")
        me = get_ident()
        try:
            lease.inside.append(me)
            if not lease.open:
                raise self._releasing(hid, "memset", a.owner)
            self._check_buffer(a, hid, "memset", offset, nbytes)
            self._counts["memsets"] += 1
            self._backend.memset_async(a.ptr + offset, value, nbytes, a.stream)
        finally:
            lease.inside.remove(me)

    # pinned host memory ----------------------------------------------------------------------
    def alloc_pinned(self, nbytes: int, task: int = 0) -> tuple[int, bool]:
        """Page-locked host memory for asynchronous copies; returns its address (the C side
        wraps it in a direct ByteBuffer) and whether it is page-locked (False: the pageable
        fallback), so that Java learns both in one call."""
        if task.__class__ is not int:
            raise InvalidArgument(f"alloc_pinned: the owning task is an int (0: none), got {task!r}")
        if not task:
            return self._alloc_pinned(nbytes, 0)
        lease = self._lease_of(task)   # owned by a bound task, reclaimed at its release
        me = get_ident()
        try:
            lease.inside.append(me)
            if not lease.open:
                raise self._leases.refusal(task, lease)
            return self._alloc_pinned(nbytes, task)
        finally:
            lease.inside.remove(me)

    def _alloc_pinned(self, nbytes: int, task: int) -> tuple[int, bool]:
        block = self._regions.alloc_pinned(nbytes, task)
        return block.address, block.pinned

    def free_pinned(self, address: int) -> None:
        """Back to the pinned pool, reused once the copies queued from or into it have passed."""
        self._regions.free_pinned(address)

    # off-heap memory Java code owns (Arrow buffers, Unsafe, off-heap column vectors) -------------
    def register_host(self, address: int, nbytes: int) -> None:
        """PageLockedRegions.register: page-lock [address, address + nbytes) until
        :meth:`unregister_host`; copies from and to it run asynchronously."""
        self._regions.register(address, nbytes)

    def unregister_host(self, address: int, task: int = 0) -> None:
        """PageLockedRegions.unregister, by ``task`` (0: none): waits for the copies that used
        the region, then unlocks it; copies into it are refused from then on."""
        self._regions.unregister(address, task)

    def copy_in_address(self, hid: int, offset: int, address: int, view: memoryview) -> bool:
        """Off-heap memory at ``address`` to device: asynchronous on the buffer's stream from a
        page-locked region (returns True: keep the memory unchanged until a synchronize), staged
        by the driver before returning from pageable memory (False)."""
        return self._host_memory_copy("copies_address", True, hid, offset, address, view)

    def copy_out_address(self, hid: int, offset: int, address: int, view: memoryview) -> bool:
        """Device to off-heap memory at ``address``: asynchronous into a page-locked region (True:
        read it after a synchronize), complete on return into pageable memory (False)."""
        return self._host_memory_copy("copies_address", False, hid, offset, address, view)

    def _host_memory_copy(self, counter: str, to_device: bool, hid: int, offset: int, address: int,
                          view: memoryview) -> bool:
        """One copy between buffer ``hid`` and host memory Java owns outside the heap (a direct
        ByteBuffer's, or by address) over ``view``: refused as PageLockedRegions.lookup says,
        counted as ``counter``, queued on the buffer's stream inside its task's lease. A copy of a
        page-locked region is looked up and queued in one step under the regions' lock (their
        invariant, memory/page_locked_regions.py); pageable memory is copied by the backend before it returns, as CUDA does."""
        call = "copy_in" if to_device else "copy_out"   # the copy's own words for a refusal
        nbytes = len(view)
        a, lease = self._buffer(hid, call)
        me = get_ident()
        try:
            lease.inside.append(me)
            if not lease.open:
                raise self._releasing(hid, call, a.owner)
            self._check_buffer(a, hid, call, offset, nbytes)
            regions = self._regions
            with regions.lock:
                region = regions.lookup(call, address, nbytes, a.owner)
                self._counts[counter] += 1
                if region is not None:
                    self._copy(to_device, a, offset, regions.view(address, len(view), a.stream, region))
            if region is None:
                self._copy(to_device, a, offset, view)
        finally:
            lease.inside.remove(me)
        return region is not None   # queued asynchronously (page-locked): the caller may wait

    def _copy(self, to_device: bool, a: "Allocation", offset: int, host: Any) -> None:
        if to_device:
            self._backend.copy_to_device_async(a.ptr + offset, host, a.stream)
        else:
            self._backend.copy_from_device_async(host, a.ptr + offset, a.stream)

    def enter_host_copy(self, hid: int, offset: int, address: int, nbytes: int, to_device: bool,
                        direct: bool) -> tuple["Allocation", "TaskLease", bool]:
        """The reference of the C twin's ``enter_copy`` for host memory outside the heap (on a
        GPU the JNI side copies it in C; the twin refers here what it does not take as it
        stands): buffer ``hid``'s allocation with its task's lease entered (the caller leaves it)
        and whether [address, address + nbytes) is page-locked, after PageLockedRegions.lookup's
        refusals in the copy's own words; counted as ``copies_direct`` (a direct ByteBuffer's
        memory: ``direct``) or ``copies_address``. Page-locked memory is then copied with one
        asynchronous DMA on the allocation's stream (recorded here, for a pinned buffer's reuse
        and a registration's unregister_host; the twin looks the region up again with the GIL
        held before it queues the DMA), pageable memory through its GPU's staging slots."""
        call = "copy_in" if to_device else "copy_out"
        a, lease = self._buffer(hid, call)
        me = get_ident()
        try:
            lease.inside.append(me)
            if not lease.open:
                raise self._releasing(hid, call, a.owner)
            self._check_buffer(a, hid, call, offset, nbytes)
            regions = self._regions
            with regions.lock:
                region = regions.lookup(call, address, nbytes, a.owner)
                if region is not None:
                    regions.used_on(region[0], a.stream)
            self._counts["copies_direct" if direct else "copies_address"] += 1
            pagelocked = region is not None
        except BaseException:
            lease.inside.remove(me)
            raise
        return a, lease, pagelocked   # nothing between the try and the return: the caller holds it from here

    # task end --------------------------------------------------------------------------------
    def forget_task(self, task: int) -> list[int]:
        """Drop the handles of ``task``'s live allocations, so that the handle table never keeps a
        released task's allocations (the registry's release does this by itself, through
        :meth:`_forget`). Returns the dropped handles."""
        try:
            b = self._binding(task)
        except UnknownTask:
            return []
        return self._forget(b)

    def _forget(self, b: "TaskBinding") -> list[int]:
        pool = self._service.memory_pool(b.gpu)
        return self._live.forget([a.id << GPU_BITS | b.gpu for a in pool.owned_by(b.task_id)], b.task_id)

    def sweep(self) -> int:
        """Drop handles whose allocation is no longer alive (a release raced with an allocate
        on another thread of the same task). Called at statistics time; O(live handles)."""
        return self._live.sweep()

    # misc ------------------------------------------------------------------------------------
    # user kernels (kernels/) -------------------------------------------------------------------
    def register_kernel(self, kernel: Any) -> int:
        """An id for Java to launch ``kernel`` by (the control plane's ``kernel`` call). A CUDA
        kernel is also handed to the C twin, which then launches it without the Python path (the
        emulated device's host kernels always run the Python path)."""
        kid = self._kernels.add(kernel)   # each task asks again: one id per kernel, not per ask
        if kid in self._in_core:
            return kid
        self._in_core.add(kid)
        function = self._driver.function(kernel) if self._driver is not None else None
        if self._core is not None and self._driver is not None and function is not None:
            d, k = self._backend.device_limits(kernel.gpu), kernel.limits
            try:
                self._core.add_kernel(
                    kid, kernel, kernel.name, int(function), kernel.gpu,
                    bytes(KIND_CODES.index(kind) for kind in kernel.signature),
                    bytes(PARAM_KINDS[kind][1] for kind in kernel.signature),
                    tuple(java_raw_range(kind) for kind in kernel.signature),
                    (d.max_threads_per_block, *d.max_block, *d.max_grid, d.shared_per_block_optin),
                    k.max_threads_per_block, k.static_shared, k.max_dynamic_shared)
            except RuntimeError as exc:   # no driver entry points: the Python path launches it
                log.warning("kernel %r is launched through Python: %s", kernel.name, exc)
        return kid

    def install_gate(self, yield_address: int, resume_address: int) -> None:
        """Called by the bridge library at start with its gate's yield and resume (bridge/
        thread_states.h): an allocation that waits for other tasks' frees (pressure/
        memory_waits.py) lets the gate go while it waits, so that the other threads' short calls,
        the frees it waits for among them, pass meanwhile. ctypes releases the GIL around them."""
        gate_yield = ctypes.CFUNCTYPE(ctypes.c_int)(yield_address)
        gate_resume = ctypes.CFUNCTYPE(None, ctypes.c_int)(resume_address)
        self._service.pressure.memory_waits.around_wait(gate_yield, gate_resume)

    def install_entry_waits(self, entering_address: int, pause_address: int, resume_address: int) -> None:
        """Called by the bridge library at start with its table of Java threads inside calls of
        tasks (bridge/entry_waits.h), read through a PYFUNCTYPE prototype, which keeps the GIL (a
        scan of atomics that never waits), and the pause and resume a waiting allocation calls on
        its own thread: the deadlock breaker counts those tasks as running (pressure/
        memory_waits.py), and a thread waiting for memory as waiting."""
        read = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_int)(entering_address)
        pause = ctypes.PYFUNCTYPE(ctypes.c_ulonglong)(pause_address)
        resume = ctypes.PYFUNCTYPE(None, ctypes.c_ulonglong)(resume_address)
        self._service.pressure.memory_waits.entry_waits(EntryWaits(read, self._handle_owner), pause, resume)

    def _handle_owner(self, hid: int) -> int | None:
        """The task a live buffer handle belongs to, or None."""
        a = self._live.get(hid)
        return None if a is None else a.owner

    @property
    def native_api(self) -> Any:
        """The C twin's entry points for the JNI library (a capsule, jvm/native_api.h), or None."""
        return self._core.native_api() if self._core is not None else None

    def _copy_failed(self, call: str, code: int) -> BaseException:
        """What a staged copy raises when a driver call of it fails (a raw CUresult)."""
        return self._service.cuda_failure(self._backend.driver_error(call, code), "copy")

    def _launch_failed(self, kernel_id: int, code: int) -> BaseException:
        """What the C twin raises when the driver refuses a launch (a raw CUresult)."""
        kernel = self._kernels.get(kernel_id)
        exc = self._backend.driver_error(f"cuLaunchKernel({getattr(kernel, 'name', kernel_id)})", code)
        return self._service.cuda_failure(exc, "launch")

    def launch(self, task: int, kernel_id: int, dims: tuple, shared: int, values: tuple, kinds: bytes,
               offsets: tuple) -> None:
        """One user kernel on the task's stream, from Java: ``values`` hold each argument as Java
        marshalled it (a buffer's handle, with its byte offset in ``offsets``; a float's or
        double's raw bits), ``kinds`` their kind codes (KIND_CODES). Checked, then queued under
        the task guard (TaskRegistry.launch)."""
        kernel = self._kernels.get(kernel_id)
        if kernel is None:
            raise InvalidArgument(f"launch: no kernel {kernel_id!r} was loaded through this bridge")
        if not len(values) == len(kinds) == len(offsets):
            raise InvalidArgument("launch: values, kinds and offsets differ in length")
        args: list[Any] = []
        for v, code, off in zip(values, kinds, offsets):
            kind = KIND_CODES[code] if code < len(KIND_CODES) else None
            if kind == "ptr":
                a = self._live.get(v) if v.__class__ is int else None
                if a is None:
                    raise self._live.dead(v, "launch")
                args.append((a, off))
            elif kind == "f32":
                args.append(struct.unpack("<f", struct.pack("<I", v & 0xFFFFFFFF))[0])
            elif kind == "f64":
                args.append(struct.unpack("<d", struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF))[0])
            elif kind == "bool":
                args.append(bool(v))
            elif kind is not None:
                args.append(v)
            else:
                raise InvalidArgument(f"launch: unknown argument kind code {code}")
        self._service.launch(task, kernel, LaunchConfig(tuple(dims[:3]), tuple(dims[3:6]), shared), args)
        self._counts["launches"] += 1

    def ping(self) -> None:
        """The empty call: what the bench measures as the bridge's own cost."""
        return None

    def thread_exit(self, ident: int) -> None:
        """Called by the C side just before it deletes a finished Java thread's Python state:
        ``threading`` registers a ``_DummyThread`` for foreign threads that touch it (logging
        does) and never removes it; drop it so that coming and going threads leave nothing."""
        active = threading._active  # type: ignore[attr-defined]
        t = active.get(ident)
        if t is not None and isinstance(t, threading._DummyThread):  # type: ignore[attr-defined]
            active.pop(ident, None)
            self._dummy_threads += 1

    @property
    def live_handles(self) -> int:
        return len(self._live)
