"""cudabridge.allocators on the emulated device, through stand-ins that allocate and free the way
CuPy, PyTorch, Numba and RMM do (standin_libraries.py, standin_torch.py): ownership by task,
reclaim of what a task forgot, late frees, frees from finalizers and from other threads, stream
order under the race detector, pointer reuse, statistics."""

from __future__ import annotations

import gc
import sys
import threading
import time

import pytest
from standin_libraries import StandinArray, StandinCupy, StandinNumbaCuda, StandinRmm
from standin_torch import StandinTorch, build_caller

from cudabridge.allocators import LIBRARIES, cupy as cb_cupy, numba as cb_numba, rmm as cb_rmm, torch as cb_torch
from cudabridge.allocators import LibraryAllocator, LibraryStatistics, statistic_names
from cudabridge.config import ServiceConfig
from cudabridge.errors import InvalidArgument, InvalidFree, StreamOrderRace, UnknownStream, UnknownTask
from cudabridge.service import CudaBridgeService

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _plugins_forgotten():
    """What an install leaves process-wide (as in a real executor) is undone after each test."""
    yield
    cb_cupy._module = None
    cb_numba._module = cb_numba._allocator = None
    cb_torch.detach()
    # a stand-in tensor left alive would make every later attach to another service refuse: the
    # test that left it fails here instead
    gc.collect()
    assert cb_torch.compiled_part().outstanding() == 0, "a test left torch tensors of the compiled part alive"


@pytest.fixture(params=["native", "python"])
def twin(request):
    """Every test on both twins of the allocation path: the C one (_library_core.c) and its
    Python reference (LibraryAllocator's methods)."""
    return request.param


def _with_allocators(svc, twin):
    """The service's library allocators made first, on the twin under test (install() then finds them)."""
    for library in LIBRARIES:
        options = {"by_stream": True, "register_streams": True} if library == "torch" else {}
        svc.library_allocators[library] = LibraryAllocator(svc, library, fast_path=twin, **options)
    return svc


def _emulated_service(emulated, **conf):
    """A service on the emulated device, four streams, none of high priority (``conf``: more settings)."""
    return CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=4, high_priority_streams=0, **conf),
                             backend=emulated)


@pytest.fixture
def service(emulated, twin):
    svc = _emulated_service(emulated)
    yield _with_allocators(svc, twin)
    svc.close()


@pytest.fixture
def tight_service(emulated, twin):
    """A pool of one 2 MiB chunk: a second 2 MiB allocation must reuse the first's block."""
    svc = CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=4, high_priority_streams=0,
                                          pool_limit="2m"), backend=emulated)
    yield _with_allocators(svc, twin)
    svc.close()


def _in_thread(fn, *args):
    """Run fn on a thread of its own (a task's thread); return its result or raise its error."""
    out: dict = {}

    def run():
        try:
            out["result"] = fn(*args)
        except BaseException as exc:   # noqa: BLE001 - re-raised on the caller's thread
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the thread hung"
    if "error" in out:
        raise out["error"]
    return out.get("result")


def _as_task(service, torch, task_id, stream, fn):
    """fn() on a thread of its own attached to ``task_id``, with ``stream`` the stand-in torch's
    current stream there (a task's thread as the Java bridge runs it); fn's result."""
    def run():
        service.registry.attach(task_id)
        torch.set_stream(stream)
        return fn()
    return _in_thread(run)


def _cupy(service, emulated):
    cp = StandinCupy(emulated)
    allocator = cb_cupy.install(service, module=cp)
    return cp, allocator


# ownership and reclaim ----------------------------------------------------------------------------
def test_a_tasks_allocations_are_its_own_and_what_it_forgets_is_reclaimed_at_release(service, emulated):
    cp, allocator = _cupy(service, emulated)
    b = service.bind_task(7)

    def task():
        service.registry.attach(7)
        with cb_cupy.task_stream(service):
            kept = [cp.empty(MIB), cp.empty(3 * MIB)]
            freed = cp.empty(MIB)
            assert cp.get_current_stream().ptr == b.stream
        owners = {a.owner for a in service.memory_pool(0).owned_by(7)}
        del freed   # CuPy's __dealloc__: queued, made at the next drain (the release's, at the latest)
        return kept, owners

    kept, owners = _in_thread(task)
    assert owners == {7}
    report = service.release_task(7)
    assert (report.leaks_reclaimed, report.leaked_bytes_reclaimed) == (2, 4 * MIB)
    s = allocator.statistics()
    assert (s.allocations, s.frees, s.leaks_reclaimed, s.leaked_bytes_reclaimed, s.in_use_bytes) == (3, 1, 2, 4 * MIB, 0)
    assert service.memory_pool(0).statistics().peak_in_use_bytes == 5 * MIB
    del kept   # CuPy frees them long after the task: counted, dropped, nothing freed twice
    s = allocator.statistics()
    assert (s.frees, s.frees_after_reclaim, s.frees_pending) == (1, 2, 0)
    assert service.memory_pool(0).statistics().in_use_bytes == 0


def test_outside_any_task_allocations_are_the_executors_and_no_release_takes_them(service, emulated):
    cp, allocator = _cupy(service, emulated)
    x = cp.empty(MIB)   # this thread is attached to no task: CuPy's null stream, owner None
    service.bind_task(1)
    assert service.release_task(1).leaks_reclaimed == 0
    s = allocator.statistics()
    assert (s.allocations, s.allocations_outside_tasks, s.in_use_bytes) == (1, 1, MIB)
    assert x.data.mem._owner.allocation.owner is None
    del x
    assert allocator.statistics().in_use_bytes == 0
    assert service.memory_pool(0).statistics().in_use_bytes == 0


def test_two_threads_installing_one_library_at_once_make_one_allocator(emulated, monkeypatch):
    # A second allocator, made by a racing install and dropped, would stay a holder of every pool
    # and a release listener for the service's life.
    import cudabridge.allocators as allocators

    entered = []
    both = threading.Event()

    class Slow(LibraryAllocator):
        def __init__(self, *args, **kwargs):
            entered.append(1)
            if len(entered) == 2:
                both.set()
            both.wait(0.5)   # the other thread's install gets in here, unless the making is one at a time
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(allocators, "LibraryAllocator", Slow)
    svc = _emulated_service(emulated)
    try:
        holders = len(svc.memory_pool(0)._holders)
        made: list = []
        threads = [threading.Thread(target=lambda: made.append(allocators.allocator_for(svc, "cupy"))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(made) == 2 and made[0] is made[1]
        assert len(entered) == 1
        assert len(svc.memory_pool(0)._holders) == holders + 1
    finally:
        svc.close()


def test_a_refused_allocator_leaves_nothing_registered_with_the_pools_or_the_registry(emulated):
    svc = _emulated_service(emulated)
    try:
        holders, listeners = len(svc.memory_pool(0)._holders), len(svc.registry._release_listeners)
        with pytest.raises(InvalidArgument, match="fast_path"):
            LibraryAllocator(svc, "cupy", fast_path="fastest")
        assert (len(svc.memory_pool(0)._holders), len(svc.registry._release_listeners)) == (holders, listeners)
    finally:
        svc.close()


def test_an_install_in_a_forked_child_does_not_wait_for_a_lock_a_parents_thread_held(tmp_path):
    import subprocess
    import textwrap

    script = tmp_path / "fork.py"
    script.write_text(textwrap.dedent("""
        import os, signal, threading
        import cudabridge.allocators as allocators
        from cudabridge.config import ServiceConfig
        from cudabridge.service import CudaBridgeService
        held, go = threading.Event(), threading.Event()
        def hold():
            with allocators._making:   # another thread making an allocator when the process forks
                held.set()
                go.wait(30)
        t = threading.Thread(target=hold, daemon=True)
        t.start()
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)
            svc = CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=2, high_priority_streams=0))
            allocators.allocator_for(svc, "cupy")
            svc.close()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        go.set()
        t.join(10)
        print("child", os.waitstatus_to_exitcode(status), flush=True)
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "child 0" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


def test_a_stream_the_pool_does_not_know_is_refused_and_nothing_changes(service, emulated):
    cp, allocator = _cupy(service, emulated)
    foreign = emulated.stream_create()
    try:
        with cp.stream(foreign):
            with pytest.raises(UnknownStream):
                cp.empty(MIB)
        assert allocator.statistics().allocations == 0
        assert service.memory_pool(0).statistics().in_use_bytes == 0
        service.memory_pool(0).register_stream(foreign)   # the documented way to use one's own stream
        with cp.stream(foreign):
            x = cp.empty(MIB)
        assert x.data.ptr
        del x
        allocator.drain()
        service.memory_pool(0).unregister_stream(foreign)
    finally:
        emulated.stream_destroy(foreign)


def test_a_thread_left_attached_to_a_released_task_is_refused_with_unknown_task(service, emulated):
    cp, allocator = _cupy(service, emulated)
    service.bind_task(3)
    attached, released = threading.Event(), threading.Event()

    def task():
        service.registry.attach(3)
        attached.set()
        released.wait(10)   # the task ends elsewhere (Spark's lifecycle thread) while this thread lingers
        with pytest.raises(UnknownTask):
            cp.empty(MIB)

    t = threading.Thread(target=lambda: _in_thread(task))
    t.start()
    attached.wait(10)
    service.release_task(3)
    released.set()
    t.join(30)
    assert allocator.statistics().allocations == 0


# frees from finalizers and other threads ----------------------------------------------------------
def test_a_free_from_a_finalizer_inside_the_pools_locked_slow_path_only_queues(service, emulated):
    cp, allocator = _cupy(service, emulated)
    pool = service.memory_pool(0)
    x = cp.empty(MIB)

    def collect_inside_the_lock():
        nonlocal x
        with pool._lock:   # as a garbage collection running inside the pool's locked slow path
            del x
            gc.collect()
            return allocator._frees.__len__()

    assert _in_thread(collect_inside_the_lock) == 1   # queued, the lock never taken (else: a hang)
    assert allocator.statistics().frees == 1


def test_cupys_malloc_is_the_c_twin_on_the_native_path_and_a_failed_wrapping_frees_the_allocation(
        service, emulated, twin):
    """The CuPy malloc runs in C where the allocator does (no Python frame of ours per allocation);
    either way, an allocation CuPy's wrapper refuses goes back at once: nothing leaks, the error
    reaches CuPy's caller."""
    cp = StandinCupy(emulated)

    class RefusingUnownedMemory:
        def __init__(self, ptr, size, owner, device):
            raise MemoryError("UnownedMemory refused")

    allocator = cb_cupy.install(service, module=cp)
    assert type(cp._allocator).__name__ == ("CupyMalloc" if twin == "native" else "function")
    service.bind_task(13)
    cp.cuda.memory.UnownedMemory = RefusingUnownedMemory
    allocator = cb_cupy.install(service, module=cp)

    def task():
        service.registry.attach(13)
        with pytest.raises(MemoryError, match="refused"):
            cp.empty(MIB)
        allocator.drain()

    _in_thread(task)
    s = allocator.statistics()
    assert (s.allocations, s.frees, s.in_use_bytes) == (1, 1, 0)
    assert service.memory_pool(0).owned_by(13) == []
    assert service.release_task(13).leaks_reclaimed == 0


def test_hand_over_knows_the_c_owner_even_when_cupy_py_was_imported_with_the_c_paths_off():
    """cupy.py imported while the switch is off, an allocator made on the C twin later: hand_over
    must still know that twin's owner (else a Python function's result array is copied, not taken)."""
    import os
    import subprocess

    from cudabridge.memory import native

    code = ("from cudabridge.allocators import cupy as cb_cupy; "
            "print(sorted(t.__name__ for t in cb_cupy._OWNERS))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), native.ENV_SWITCH: "false"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    if native.unavailable():
        pytest.skip("the C paths are not built here")
    assert "CupyOwner" in run.stdout and "_Release" in run.stdout, run.stdout


def test_a_cupy_free_that_cannot_be_queued_is_reported_once_and_the_process_goes_on(twin):
    """CuPy drops an array's memory, and its owner's free cannot be queued (the queue's append
    fails: out of memory): one unraisable report, nothing else. In its own interpreter: before the
    fix the C owner reported the error against itself while being deallocated, which deallocated it
    again, until the stack overflowed."""
    import os
    import subprocess

    code = f"""
import collections
from cudabridge.allocators import cupy as cb_cupy, library_allocator
from cudabridge.config import ServiceConfig
from cudabridge.service import CudaBridgeService
from standin_libraries import StandinCupy

class FlakyQueue(collections.deque):
    fail = False
    def append(self, item):
        if FlakyQueue.fail:
            raise MemoryError("the queue cannot grow")
        super().append(item)

library_allocator.deque = FlakyQueue
svc = CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=4, high_priority_streams=0))
svc.library_allocators["cupy"] = library_allocator.LibraryAllocator(svc, "cupy", fast_path={twin!r})
cp = StandinCupy(None)
cb_cupy.install(svc, module=cp)
b = svc.bind_task(1)
svc.registry.attach(1)
with cp.stream(b.stream):
    x = cp.empty(1 << 20)
FlakyQueue.fail = True
del x
FlakyQueue.fail = False
print("went on", svc.library_allocators["cupy"].statistics().frees)
svc.registry.detach()
svc.release_task(1)
svc.close()
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert "went on 0" in run.stdout, run.stdout
    assert run.stderr.count("MemoryError: the queue cannot grow") == 1, run.stderr[-2000:]


@pytest.mark.parametrize("naive", [False, True], ids=["allocation-stream", "naive-freeing-thread-stream"])
def test_a_free_on_another_thread_is_ordered_after_the_allocation_stream(tight_service, emulated, naive):
    service = tight_service
    cp, allocator = _cupy(service, emulated)
    pool = service.memory_pool(0)
    b1, b2 = service.bind_task(1), service.bind_task(2)
    box: dict = {}

    def task1():
        service.registry.attach(1)
        with cb_cupy.task_stream(service):
            x = cp.empty(2 * MIB)
            cp.fill(x, 0x11111111, delay_s=0.3)   # still writing when x is freed and reused
        box["x"] = x

    def other_thread():   # drops it with its own current stream (task 2's): CuPy passes none
        with cp.stream(b2.stream):
            x = box.pop("x")
            if naive:   # an allocator that orders the free on the freeing thread's stream
                pool.free(x.data.mem._owner.allocation, b2.stream)
                box["late"] = x   # the plug-in's own free comes later: counted, dropped
            del x

    def task2():
        service.registry.attach(2)
        with cb_cupy.task_stream(service):
            y = cp.empty(2 * MIB)
            cp.fill(y, 0x22222222)
        return y

    _in_thread(task1)
    ptr = pool.owned_by(1)[0].ptr
    _in_thread(other_thread)
    if naive:
        with pytest.raises(StreamOrderRace):
            _in_thread(task2)
        emulated.races.clear()
        return
    y = _in_thread(task2)
    assert y.data.ptr == ptr   # the freed block was reused, ordered after task 1's write
    emulated.stream_synchronize(b2.stream)
    del y
    service.release_task(1)
    service.release_task(2)


# PyTorch's pluggable allocator ---------------------------------------------------------------------
@pytest.fixture
def torch_standin(service, emulated, tmp_path):
    cb_torch.attach(service)
    part = cb_torch.compiled_part()
    yield StandinTorch(emulated, part, build_caller(tmp_path))
    cb_torch.detach()


def test_torch_allocations_go_through_the_compiled_part_on_the_current_stream(service, torch_standin):
    b = service.bind_task(5)

    def task():
        service.registry.attach(5)
        torch_standin.set_stream(b.stream)
        t = torch_standin.empty(MIB)
        torch_standin.fill(t, 7)
        return t

    t = _in_thread(task)
    assert [a.ptr for a in service.memory_pool(0).owned_by(5)] == [t.data_ptr]
    assert torch_standin.empty(0).data_ptr == 0   # as torch's own: no memory, no call
    del t
    s = service.library_allocators["torch"].statistics()
    assert (s.allocations, s.frees) == (1, 1)
    service.release_task(5)


class _TorchPart:
    """Torch's compiled part called as torch calls it (the stand-in's C++ caller), for a task bound
    here: its allocations on a thread attached to the task, frees from whatever thread calls."""

    def __init__(self, service, torch_standin, task_id):
        import ctypes

        self.binding = service.bind_task(task_id)
        self.allocator = service.library_allocators["torch"]
        self.part = cb_torch.compiled_part()
        self.fn = self.part.addresses()
        self.caller = torch_standin._caller
        self.err = ctypes.create_string_buffer(256)
        self._service, self._task = service, task_id

    def alloc(self, nbytes):
        """On the calling thread: the address, or None with the error in ``err``."""
        return self.caller.caller_alloc(self.fn["alloc"], nbytes, 0, self.binding.stream, self.err, len(self.err))

    def alloc_for_task(self, count, nbytes):
        """``count`` allocations on a thread attached to the task."""
        def task():
            self._service.registry.attach(self._task)
            return [self.alloc(nbytes) for _ in range(count)]
        return _in_thread(task)

    def free(self, ptr, nbytes):
        self.caller.caller_free(self.fn["free"], ptr, nbytes, 0, self.binding.stream)

    def connect_free(self, free):
        """The part's free callable replaced; the allocator's other three kept."""
        a = self.allocator
        self.part.connect(self._service, a.allocate_pointer_owned, free, a.record_stream_pointer, a.drain, a.owner_for)


def test_a_torch_free_never_waits_for_the_gil_and_the_next_drain_makes_it(service, torch_standin):
    """PyTorch frees from a tensor's deleter on its own threads (autograd's) while another thread
    may hold the GIL: the free is listed in the compiled part, not made under the GIL, and the
    allocator's next drain (here: its statistics) makes it; the task's release counts no leak."""
    import ctypes

    torch = _TorchPart(service, torch_standin, 5)
    [ptr] = torch.alloc_for_task(1, MIB)
    held = ctypes.PyDLL(torch.caller._name)   # PyDLL: this thread keeps the GIL during the call
    free_within = held.caller_free_on_new_thread_within
    free_within.restype = ctypes.c_int
    free_within.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                            ctypes.c_int]
    assert free_within(torch.fn["free"], ptr, MIB, 0, torch.binding.stream, 5000) == 1
    s = torch.allocator.statistics()
    assert (s.allocations, s.frees, s.frees_pending, s.in_use_bytes) == (1, 1, 0, 0)
    assert service.release_task(5).leaks_reclaimed == 0


def test_a_release_while_another_thread_hands_torchs_frees_over_counts_no_freed_memory_as_leaked(
        service, torch_standin):
    """Torch's frees wait in the part until a hand-over; one on another thread can give the GIL
    away midway (a free callable that writes somewhere). A release meanwhile still sees every free
    torch made before it: it hands over the rest and waits for the one in flight."""
    import time

    torch = _TorchPart(service, torch_standin, 5)
    handing = threading.Event()

    def slow_free(ptr):   # the first hand-over gives the GIL away before it queues its free
        if not handing.is_set():
            handing.set()
            time.sleep(0.3)
        return torch.allocator.free_pointer(ptr)

    torch.connect_free(slow_free)
    for p in torch.alloc_for_task(3, 4096):
        torch.free(p, 4096)   # each returned: torch is done with them
    t = threading.Thread(target=torch.part.flush, daemon=True)
    t.start()
    assert handing.wait(10)
    report = service.release_task(5)   # its drain hands over the rest and waits for the first
    t.join(10)
    assert report.leaks_reclaimed == 0
    s = torch.allocator.statistics()
    assert (s.frees, s.frees_after_reclaim, s.leaks_reclaimed) == (3, 0, 0)


def test_torch_frees_handed_over_from_inside_a_hand_over_do_not_wait_for_each_other(service, torch_standin):
    """A free callable that drains (a finalizer or an error report can) runs a flush inside a
    hand-over; while another thread is inside one too, neither waits for the other."""
    import time

    torch = _TorchPart(service, torch_standin, 5)
    inside = threading.Barrier(2, timeout=10)

    def draining_free(ptr):
        torch.allocator.free_pointer(ptr)
        if threading.current_thread().name.startswith("hand-over"):
            inside.wait()        # both threads inside a hand-over
            time.sleep(0.05)
            torch.part.flush()   # nested: must not wait for the other thread's hand-over
        return None

    torch.connect_free(draining_free)
    for p in torch.alloc_for_task(2, 4096):
        torch.free(p, 4096)
    threads = [threading.Thread(target=torch.part.flush, name=f"hand-over-{i}", daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "two nested flushes waited for each other"
    assert torch.allocator.statistics().frees == 2
    service.release_task(5)


_PART_SCRIPT = """
import ctypes, os, signal, threading, time
from cudabridge.allocators import torch as cb_torch
part = cb_torch.compiled_part()
part.keep_at_most(0)                       # every free listed, none kept
fn = part.addresses()
ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(fn["alloc"])
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(fn["free"])
RESET = ctypes.CFUNCTYPE(None)(fn["reset"])
nxt = [0x100000]
def alloc(size, device, stream):   # the allocator's side: fresh addresses, no owner
    nxt[0] += 0x1000
    return nxt[0], None
"""


def _run_with_the_part(tmp_path, body: str):
    """``body`` (indented as in the test) in a fresh interpreter, after torch's compiled part is
    set up as torch would call it (_PART_SCRIPT): for what only a process's end or a fork shows."""
    import subprocess
    import textwrap

    script = tmp_path / "part_script.py"
    script.write_text(_PART_SCRIPT + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)


def test_a_thread_that_ends_inside_a_torch_hand_over_leaves_the_part_sound(tmp_path):
    # A daemon thread (or a torch worker thread) handing a free over when the interpreter
    # finalizes is ended by CPython (take_gil -> PyThread_exit_thread -> pthread_exit) inside
    # g_free's call: its HandOver node, on its stack, stays linked in g_oldest/g_newest. The next
    # hand-over (here torch's empty_cache hook during teardown) must not write through it (a node
    # on that thread's stack did: the process crashed).
    r = _run_with_the_part(tmp_path, """
        entered = threading.Event()
        def free(ptr):
            if threading.current_thread().name == "D":
                entered.set()
                time.sleep(1.0)                    # GIL given back; the interpreter finalizes meanwhile
        token = object()
        part.connect(token, alloc, free, lambda p, s: None, lambda: None, lambda d, s: None)
        p1, p2 = ALLOC(256, 0, None), ALLOC(256, 0, None)
        FREE(p1, 256, 0, None)                     # listed
        threading.stack_size(64 << 20)             # over glibc's 40 MiB stack cache: unmapped once reclaimed
        d = threading.Thread(target=part.flush, name="D", daemon=True)
        d.start()
        threading.stack_size(0)
        assert entered.wait(5)
        e = threading.Thread(target=time.sleep, args=(1.3,), daemon=True)   # any other thread ending after D
        e.start()

        class Teardown:                            # runs in module teardown, after D and E were ended
            def __init__(self):
                self.sleep, self.free, self.reset, self.p2, self.w = time.sleep, FREE, RESET, p2, __import__("os").write
            def __del__(self):
                self.w(1, b"teardown\\n")
                self.sleep(2.0)
                self.free(self.p2, 256, 0, None)   # listed
                self.reset()                       # flush_pending -> begin_hand_over
                self.w(1, b"teardown done\\n")

        import sys, types
        holder = sys.modules["handover_teardown_holder"] = types.ModuleType("handover_teardown_holder")
        holder.keep = Teardown()                   # (g_free keeps __main__'s dict alive: never cleared)
        print("main done", flush=True)
    """)
    assert r.returncode == 0 and "teardown done" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


def test_a_drain_in_a_forked_child_does_not_wait_for_the_parents_other_threads_hand_overs(tmp_path):
    """fork() copies the part with another thread's hand-over in flight; that thread does not exist
    in the child, so a drain there (a DataLoader worker's) must not wait for it."""
    r = _run_with_the_part(tmp_path, """
        entered, go = threading.Event(), threading.Event()
        def free(ptr):
            if threading.current_thread().name == "D":
                entered.set()
                go.wait(30)                        # in flight, the GIL given back
        part.connect(object(), alloc, free, lambda p, s: None, lambda: None, lambda d, s: None)
        p1, p2 = ALLOC(256, 0, None), ALLOC(256, 0, None)
        FREE(p1, 256, 0, None)
        d = threading.Thread(target=part.flush, name="D", daemon=True)
        d.start()
        assert entered.wait(10)
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)                       # a drain that waits for D ends the child here
            FREE(p2, 256, 0, None)
            part.flush()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        go.set()
        d.join(10)
        part.flush()                               # the parent's own hand-over ended as ever
        print("child", os.waitstatus_to_exitcode(status), flush=True)
    """)
    assert r.returncode == 0 and "child 0" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


def test_a_torch_allocation_whose_hand_over_disconnects_the_part_fails_in_torch(service, torch_standin):
    """The allocation hands the listed frees over first (Python code: it may disconnect the part):
    then it fails in torch, not on a vanished allocator."""
    torch = _TorchPart(service, torch_standin, 5)

    def disconnecting_free(ptr):
        torch.allocator.free_pointer(ptr)
        torch.part.disconnect()

    torch.connect_free(disconnecting_free)

    def task():
        service.registry.attach(5)
        ptr = torch.alloc(4096)
        torch.allocator.drain()   # a new epoch: the free below is listed, not kept
        torch.free(ptr, 4096)
        assert torch.alloc(4096) is None
        return torch.err.value.decode()

    assert "not connected" in _in_thread(task)
    assert torch.allocator.statistics().frees == 1
    service.release_task(5)


def test_torch_autograd_threads_allocate_for_the_task_whose_stream_they_name(service, torch_standin):
    b = service.bind_task(9)
    torch_standin.set_stream(b.stream)   # this thread is attached to no task
    t = torch_standin.empty(MIB)
    assert service.memory_pool(0).owned_by(9)[0].ptr == t.data_ptr
    report = service.release_task(9)
    assert report.leaks_reclaimed == 1
    del t   # a late free: counted, dropped
    s = service.library_allocators["torch"].statistics()
    assert (s.leaks_reclaimed, s.frees_after_reclaim) == (1, 1)


def test_a_repeated_torch_step_is_served_from_the_parts_kept_frees(service, torch_standin):
    # An MLP's step as torch allocates it (forward temporaries, gradients kept until the next
    # step's zero_grad) through the compiled part: after its first repetition each allocation
    # takes back a free the part kept (same size, stream and task), with no call into the pool,
    # and counts as the library's allocation and free. (Before the part kept frees, each took
    # 4-5 us in the pool's and the allocator's C twins inside a real torch step; before the
    # pool's stream cache, 8 a step reached its locked slow path.)
    t = torch_standin
    b = service.bind_task(3)
    service.registry.attach(3)
    t.set_stream(b.stream)
    pool = service.memory_pool(0)
    grads: list = []

    def step() -> None:
        grads.clear()   # zero_grad(set_to_none=True)
        h1, r, o, sq, m = t.empty(4 * MIB), t.empty(4 * MIB), t.empty(MIB), t.empty(MIB), t.empty(4)
        g, gsq = t.empty(4), t.empty(MIB)
        del sq, m
        go = t.empty(MIB)
        del gsq
        gw2, gb2, gr = t.empty(16 * MIB), t.empty(4096), t.empty(4 * MIB)
        del o, go
        gh = t.empty(4 * MIB)
        del gr, r
        gw1, gb1 = t.empty(16 * MIB), t.empty(16384)
        del gh, h1, g
        t.empty(MIB)   # dropped at once
        grads.extend((gw2, gb2, gw1, gb1))

    try:
        for _ in range(4):
            step()
        allocator = service.library_allocators["torch"]
        lib_before = allocator.statistics()   # a drain: a new epoch
        step()   # from the pool again (but what it frees and allocates again itself): the tensors of
                 # before the drain are never kept
        before = pool.statistics()   # the pool's own: no drain
        for _ in range(10):
            step()
        after = pool.statistics()
        lib_after = allocator.statistics()
        assert (after.slow_allocations - before.slow_allocations, after.allocations - before.allocations) == (0, 0)
        assert lib_after.allocations - lib_before.allocations == 165
        assert lib_after.frees - lib_before.frees == 165   # the gradients of the step before the 11 freed
        assert lib_after.in_use_bytes == 2 * 16 * MIB + 4096 + 16384   # the last step's gradients: the kept
                                                                      # frees were handed over by the drain
        assert after.peak_reserved_bytes <= 56 << 20   # what the step's sizes need at once (52 MiB; 48 coalesced)
    finally:
        grads.clear()
        service.registry.detach()
        service.release_task(3)


def test_a_kept_torch_free_goes_back_only_to_an_allocation_of_the_same_task(service, torch_standin):
    """The part keeps a tensor's free for the next allocation of its size on its stream, but only
    for the task it was made for: two tasks whose threads both allocate on the legacy default
    stream (a user who set no stream) never get each other's memory."""
    part = cb_torch.compiled_part()
    service.bind_task(1)
    service.bind_task(2)
    pool = service.memory_pool(0)

    def on_task(task):   # a tensor on the legacy default stream, freed as the thread's tensor dies
        return _as_task(service, torch_standin, task, 0, lambda: torch_standin.empty(MIB).data_ptr)

    first = on_task(1)
    assert part.kept() == 1
    other = on_task(2)
    assert other != first and part.kept() == 2   # task 2's own from the pool; then kept too
    again = on_task(1)
    assert again == first   # task 1's kept free, taken back
    assert [a.ptr for a in pool.owned_by(1)] == [first] and [a.ptr for a in pool.owned_by(2)] == [other]
    s = service.library_allocators["torch"].statistics()   # its drain hands the kept frees over
    assert (s.allocations, s.frees, s.in_use_bytes) == (3, 3, 0)
    assert part.kept() == 0 and pool.statistics().in_use_bytes == 0
    assert service.release_task(1).leaks_reclaimed == 0
    assert service.release_task(2).leaks_reclaimed == 0


def test_a_torch_free_kept_at_its_tasks_release_is_made_not_reclaimed_as_a_leak(service, torch_standin):
    part = cb_torch.compiled_part()
    b = service.bind_task(4)
    _as_task(service, torch_standin, 4, b.stream, lambda: torch_standin.empty(MIB))   # freed at once: kept
    assert part.kept() == 1
    report = service.release_task(4)
    assert (report.leaks_reclaimed, part.kept()) == (0, 0)
    s = service.library_allocators["torch"].statistics()
    assert (s.allocations, s.frees, s.leaks_reclaimed, s.frees_after_reclaim) == (1, 1, 0, 0)


def test_a_late_torch_free_after_its_tasks_release_is_never_kept(service, torch_standin):
    """A tensor its task's release reclaimed is freed later (autograd's thread dropped it late):
    its memory is the pool's again, so the part must not keep it for the next allocation of its
    size on its stream (which a task bound to that stream again would then share with whoever the
    pool gave the memory to)."""
    part = cb_torch.compiled_part()
    b = service.bind_task(9)
    torch_standin.set_stream(b.stream)   # this thread attached to no task: task 9's by its stream
    t = torch_standin.empty(MIB)
    assert service.release_task(9).leaks_reclaimed == 1
    rebound = service.bind_task(9)
    torch_standin.set_stream(rebound.stream)
    del t
    assert part.kept() == 0   # listed: handed over, counted as a free after reclaim
    s = service.library_allocators["torch"].statistics()
    assert (s.frees_after_reclaim, s.frees) == (1, 0)
    service.release_task(9)


def test_a_torch_free_with_a_recorded_stream_is_not_kept(tight_service, emulated, tmp_path):
    """record_stream named another stream that still uses the tensor: its free must wait for that
    stream (the pool's free does), so the part does not keep it for its own stream's next
    allocation, which would reuse it at once."""
    service = tight_service
    cb_torch.attach(service)
    part = cb_torch.compiled_part()
    torch_standin = StandinTorch(emulated, part, build_caller(tmp_path))
    b1, b2 = service.bind_task(1), service.bind_task(2)
    torch_standin.set_stream(b1.stream)
    t = torch_standin.empty(2 * MIB)
    t.record_stream(b2.stream)
    torch_standin.fill(t, 1, delay_s=0.3, stream=b2.stream)   # the side stream is still writing at the free
    del t
    assert part.kept() == 0
    u = torch_standin.empty(2 * MIB)   # the same block, after the side stream's write (no StreamOrderRace)
    torch_standin.fill(u, 3)
    emulated.stream_synchronize(b1.stream)
    del u
    for task in (1, 2):
        service.release_task(task)
    cb_torch.detach()


def test_a_torch_free_on_the_per_thread_stream_is_not_kept(service, torch_standin):
    # the per-thread default stream's handle names another stream on each thread
    service.bind_task(6)
    _as_task(service, torch_standin, 6, 2, lambda: torch_standin.empty(MIB))   # 2: CU_STREAM_PER_THREAD
    assert cb_torch.compiled_part().kept() == 0
    assert service.library_allocators["torch"].statistics().frees == 1
    service.release_task(6)


def test_a_torch_allocation_that_finds_the_pool_full_gets_the_frees_the_part_kept(tight_service, emulated, tmp_path):
    """The pool holds one 2 MiB chunk; the part keeps a 2 MiB tensor's free (live in the pool) and
    torch asks for 1 MiB: the pool's out-of-memory path has its holders (the library allocator's
    drain: the part's kept frees) give back first, and the allocation is served."""
    service = tight_service
    cb_torch.attach(service)
    part = cb_torch.compiled_part()
    torch_standin = StandinTorch(emulated, part, build_caller(tmp_path))
    b = service.bind_task(1)

    def task():
        torch_standin.empty(2 * MIB)   # freed at once: kept
        assert part.kept() == 1
        return torch_standin.empty(MIB).data_ptr

    ptr = _as_task(service, torch_standin, 1, b.stream, task)
    assert part.kept() == 0   # the 1 MiB one was made across a drain (the give-back): listed, not kept
    assert ptr and [a.ptr for a in service.memory_pool(0).owned_by(1)] == [ptr]
    s = service.library_allocators["torch"].statistics()
    assert (s.allocations, s.frees, s.in_use_bytes) == (2, 2, 0)
    assert service.release_task(1).leaks_reclaimed == 0
    cb_torch.detach()


def test_torch_reuses_go_on_counting_across_a_reconnect_and_stay_each_services_own(emulated, twin, tmp_path):
    # The part counts its reuses per owner: an attach of the same service again goes on counting
    # (its statistics never go backwards), and another service's reuses are not the first one's.
    svc_a, svc_b = _two_services(emulated, twin)
    try:
        cb_torch.attach(svc_a)
        t = StandinTorch(emulated, cb_torch.compiled_part(), build_caller(tmp_path))

        def five_pairs(svc, task):
            def run():
                for _ in range(5):
                    t.empty(MIB)   # allocated, freed (kept), taken back by the next
            _as_task(svc, t, task, svc.bind_task(task).stream, run)
            svc.release_task(task)

        five_pairs(svc_a, 1)
        a_stats = svc_a.library_allocators["torch"].statistics()
        assert (a_stats.allocations, a_stats.frees) == (5, 5)
        cb_torch.attach(svc_a)   # the same service again
        assert svc_a.library_allocators["torch"].statistics().allocations == 5
        cb_torch.attach(svc_b)
        five_pairs(svc_b, 2)
        assert svc_b.library_allocators["torch"].statistics().allocations == 5
        assert svc_a.library_allocators["torch"].statistics().allocations == 5
        cb_torch.attach(svc_a)   # back: A's count resumes
        five_pairs(svc_a, 3)
        assert svc_a.library_allocators["torch"].statistics().allocations == 10
    finally:
        cb_torch.detach()
        svc_b.close()
        svc_a.close()


def test_a_waiting_allocation_gets_the_frees_kept_while_it_waits(emulated, twin, tmp_path):
    # Task 2 finds the pool full and waits (oomWait); meanwhile task 1 frees what filled it, but its
    # torch allocations keep that free in the part (one size, over and over). The pool has its
    # holders give back before each of the handler's calls, so task 2 is served, not timed out.
    svc = _with_allocators(CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=4,
                                                           high_priority_streams=0, pool_limit="2m", oom_wait=5.0),
                                             backend=emulated), twin)
    try:
        cb_torch.attach(svc)
        part = cb_torch.compiled_part()
        t = StandinTorch(emulated, part, build_caller(tmp_path))
        b1 = svc.bind_task(1)
        svc.bind_task(2)
        started, waited, out = threading.Event(), threading.Event(), {}

        def task1():
            svc.registry.attach(1)
            t.set_stream(b1.stream)
            filler = t.empty(3 * MIB // 2)   # 1.5 MiB of the 2
            started.set()
            time.sleep(0.3)                  # task 2 has asked (its give-back: a drain) and waits
            del filler                       # made before that drain: listed
            big = t.empty(3 * MIB // 2)      # the filler's memory again, made after it
            del big                          # kept: live in the pool
            while not waited.is_set():       # one size over and over: served from its kept free
                t.empty(MIB // 4)
                time.sleep(0.02)

        def task2():
            started.wait()
            svc.registry.attach(2)
            t0 = time.monotonic()
            try:
                svc.allocate(2, MIB).free()
                out["served"] = time.monotonic() - t0
            finally:
                waited.set()

        threads = [threading.Thread(target=task1), threading.Thread(target=task2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert out.get("served", 99) < 4.0, out
        svc.release_task(1)
        svc.release_task(2)
        cb_torch.detach()
    finally:
        svc.close()


def test_kept_frees_taken_back_on_native_threads_while_drains_run_lose_and_leak_nothing(service, torch_standin):
    # Two native threads (autograd-like: the task's by its stream) free and allocate one size over
    # and over, taking kept frees back, while another thread drains again and again (statistics:
    # each drain hands the kept frees over and counts a drain): every allocation is counted once
    # and freed once, nothing stays kept after the last drain, the release reclaims nothing.
    b = service.bind_task(12)
    allocator = service.library_allocators["torch"]
    part = cb_torch.compiled_part()
    stop = threading.Event()
    drains = []

    def drain_loop():
        while not stop.is_set():
            allocator.statistics()
            drains.append(1)

    def pairs(size):
        torch_standin.pairs_on_new_thread(size, b.stream, 3000, True)

    drainer = threading.Thread(target=drain_loop)
    workers = [threading.Thread(target=pairs, args=(size,)) for size in (MIB, 2 * MIB)]
    drainer.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    stop.set()
    drainer.join(60)
    s = allocator.statistics()
    assert len(drains) > 1 and part.reuses(part.owner())[0] > 1000   # both paths taken, many times
    assert (s.allocations, s.frees, s.in_use_bytes, s.double_frees, s.frees_after_reclaim) == (6000, 6000, 0, 0, 0)
    assert part.kept() == 0 and part.outstanding() == 0
    assert service.release_task(12).leaks_reclaimed == 0
    assert service.memory_pool(0).statistics().in_use_bytes == 0


@pytest.mark.parametrize("kept_frees", [0, 2])
def test_torch_kept_frees_setting_bounds_what_the_part_keeps(emulated, twin, tmp_path, kept_frees):
    # torchKeptFrees: 0 keeps none (each tensor a pool allocation and free); 2 keeps the newest two
    svc = _with_allocators(CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=4, high_priority_streams=0,
                                                           torch_kept_frees=kept_frees), backend=emulated), twin)
    try:
        cb_torch.attach(svc)
        part = cb_torch.compiled_part()
        t = StandinTorch(emulated, part, build_caller(tmp_path))
        b = svc.bind_task(1)
        svc.registry.attach(1)
        t.set_stream(b.stream)
        one, two, three = t.empty(MIB), t.empty(2 * MIB), t.empty(3 * MIB)
        del one, two, three   # three frees, in that order
        assert part.kept() == kept_frees
        before = svc.memory_pool(0).statistics().allocations
        t.empty(3 * MIB)   # the newest: kept where any is
        assert svc.memory_pool(0).statistics().allocations - before == (1 if kept_frees == 0 else 0)
        svc.registry.detach()
        assert svc.release_task(1).leaks_reclaimed == 0
    finally:
        cb_torch.detach()
        svc.close()


def test_owner_for_says_whose_an_allocation_would_be(service):
    allocator = service.library_allocators["cupy"]
    by_stream = LibraryAllocator(service, "torch-by-stream", by_stream=True, fast_path=allocator.fast_path)
    b = service.bind_task(3)
    assert allocator.owner_for(0, b.stream) is None   # no task on this thread; by stream only where asked
    assert by_stream.owner_for(0, b.stream) == 3
    assert allocator.owner_for(7, b.stream) == -1   # a GPU the executor does not own
    assert allocator.owner_for("0", b.stream) == -1

    def attached():
        service.registry.attach(3)
        return allocator.owner_for(0, 0)
    assert _in_thread(attached) == 3
    service.release_task(3)
    assert by_stream.owner_for(0, b.stream) is None
    by_stream.close()
    assert by_stream.owner_for(0, b.stream) == -1


def _two_services(emulated, twin):
    return _with_allocators(_emulated_service(emulated), twin), _with_allocators(_emulated_service(emulated), twin)


def test_another_service_attaches_torchs_part_only_once_torch_freed_the_last_ones_tensors(emulated, twin, tmp_path):
    # A tensor of service A freed after B attached would reach B's allocator, whose pool may have
    # handed the same address to a live allocation of B's: the attach is refused until A's are gone.
    svc_a, svc_b = _two_services(emulated, twin)
    held: list = []
    try:
        cb_torch.attach(svc_a)
        part = cb_torch.compiled_part()
        t = StandinTorch(emulated, part, build_caller(tmp_path))
        t.set_stream(svc_a.bind_task(1).stream)   # this thread attached to no task: by stream
        held.append(t.empty(MIB))
        with pytest.raises(InvalidArgument, match="still holds 1 tensor"):
            cb_torch.attach(svc_b)
        # the part's own check, which the attach's Python check stands in front of
        b_alloc = svc_b.library_allocators["torch"]
        with pytest.raises(InvalidArgument, match="still holds 1 tensor"):
            part.connect(object(), b_alloc.allocate_pointer_owned, b_alloc.free_pointer, b_alloc.record_stream_pointer,
                         b_alloc.drain, b_alloc.owner_for)
        held.append(t.empty(MIB))   # nothing changed: A's allocator still serves torch
        assert sorted(a.ptr for a in svc_a.memory_pool(0).owned_by(1)) == sorted(x.data_ptr for x in held)
        cb_torch.attach(svc_a)   # the same service again: its tensors stay its own
        cb_torch.detach()
        with pytest.raises(InvalidArgument, match="still holds 2 tensor"):
            cb_torch.attach(svc_b)   # detached, A's tensors still count
        held.clear()   # freed while detached: dropped (A's release reclaims them)
        cb_torch.attach(svc_b)
        assert part.outstanding() == 0
        t.set_stream(svc_b.bind_task(2).stream)
        held.append(t.empty(MIB))
        assert [a.ptr for a in svc_b.memory_pool(0).owned_by(2)] == [held[0].data_ptr]
        held.clear()
        assert svc_b.release_task(2).leaks_reclaimed == 0
        assert svc_a.release_task(1).leaks_reclaimed == 2
    finally:
        held.clear()
        cb_torch.detach()
        svc_b.close()
        svc_a.close()


def test_a_torch_allocation_while_another_service_attaches_keeps_the_part_with_its_own(emulated, twin, tmp_path):
    # The attach hands the frees listed so far to the old service's allocator first, and that is
    # Python code, which lets the GIL go: an allocation that gets in meanwhile is the old service's,
    # and the part, which decides only once nothing is listed or in flight, refuses the switch, and
    # changes nothing: not even the number of frees it keeps (B's torchKeptFrees=0).
    svc_a = _with_allocators(CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=4,
                                                             high_priority_streams=0), backend=emulated), twin)
    svc_b = _with_allocators(CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=4,
                                                             high_priority_streams=0, torch_kept_frees=0),
                                               backend=emulated), twin)
    held: list = []
    try:
        alloc_a = cb_torch.attach(svc_a)
        part = cb_torch.compiled_part()
        t = StandinTorch(emulated, part, build_caller(tmp_path))
        stream = svc_a.bind_task(1).stream
        t.set_stream(stream)
        free_a = alloc_a.free_pointer

        def slow_free(ptr):
            time.sleep(0.3)   # the GIL let go, as any Python code may
            free_a(ptr)

        part.connect(part.owner(), alloc_a.allocate_pointer_owned, slow_free, alloc_a.record_stream_pointer,
                     alloc_a.drain, alloc_a.owner_for)
        del_me = t.empty(MIB)
        del del_me   # listed: the attach below hands it to slow_free

        def allocate_meanwhile():
            time.sleep(0.1)
            t.set_stream(stream)
            held.append(t.empty(MIB))

        th = threading.Thread(target=allocate_meanwhile)
        th.start()
        with pytest.raises(InvalidArgument, match="still holds 1 tensor"):
            cb_torch.attach(svc_b)
        th.join()
        alloc_a.drain()   # the free slow_free queued
        assert [a.ptr for a in svc_a.memory_pool(0).owned_by(1)] == [held[0].data_ptr]
        t.set_stream(stream)
        x = t.empty(2 * MIB)
        del x
        assert part.kept() == 1   # A's part still keeps its frees
        held.clear()
        cb_torch.attach(svc_b)   # now nothing of A's is out
        svc_a.release_task(1)
    finally:
        held.clear()
        cb_torch.detach()
        svc_b.close()
        svc_a.close()


def test_a_stream_two_tasks_share_names_no_task_and_the_allocation_is_the_executors(service, torch_standin):
    """Four pool streams, five tasks: the fifth shares the first's stream (round-robin). An
    unattached thread naming that stream allocates for no task (the executor's); naming another
    task's own stream, for that task. Both twins alike."""
    bindings = [service.bind_task(t) for t in range(20, 25)]
    by_stream: dict[int, list[int]] = {}
    for b in bindings:
        by_stream.setdefault(b.stream, []).append(b.task_id)
    shared = next(s for s, tasks in by_stream.items() if len(tasks) == 2)
    single, (owner,) = next((s, tasks) for s, tasks in by_stream.items() if len(tasks) == 1)
    allocator = service.library_allocators["torch"]
    torch_standin.set_stream(shared)
    t1 = torch_standin.empty(MIB)
    assert allocator.statistics().allocations_outside_tasks == 1
    torch_standin.set_stream(single)
    t2 = torch_standin.empty(MIB)
    assert [a.ptr for a in service.memory_pool(0).owned_by(owner)] == [t2.data_ptr]
    assert allocator.statistics().allocations_outside_tasks == 1
    del t1, t2
    for b in bindings:
        service.release_task(b.task_id)


@pytest.mark.parametrize("python_state", [True, False], ids=["autograd-like", "no-python-state"])
def test_a_native_thread_allocates_for_the_task_whose_stream_it_names(service, torch_standin, python_state):
    """PyTorch calls the part from threads of its own: autograd's device threads, which keep a Python
    thread state for their life, and any C++ thread, which has none (the part's PyGILState_Ensure
    makes one per call)."""
    b = service.bind_task(10)
    torch_standin.pairs_on_new_thread(MIB, b.stream, 50, python_state)
    s = service.library_allocators["torch"].statistics()
    assert (s.allocations, s.frees) == (50, 50)
    assert service.release_task(10).leaks_reclaimed == 0


def test_torch_record_stream_orders_the_free_after_that_stream_too(tight_service, emulated, tmp_path):
    service = tight_service
    cb_torch.attach(service)
    torch_standin = StandinTorch(emulated, cb_torch.compiled_part(), build_caller(tmp_path))
    pool = service.memory_pool(0)
    b1, b2, b3 = service.bind_task(1), service.bind_task(2), service.bind_task(3)
    torch_standin.set_stream(b1.stream)
    t = torch_standin.empty(2 * MIB)
    ptr = t.data_ptr
    t.record_stream(b2.stream)
    torch_standin.fill(t, 1, delay_s=0.3, stream=b2.stream)   # the side stream is still writing at the free
    del t
    torch_standin.set_stream(b3.stream)
    u = torch_standin.empty(2 * MIB)   # reuses the block: after task 1's stream and the recorded one
    assert u.data_ptr == ptr
    torch_standin.fill(u, 3)
    emulated.stream_synchronize(b3.stream)
    del u
    assert service.library_allocators["torch"].statistics().frees == 2   # statistics() makes the queued frees
    assert pool.statistics().in_use_bytes == 0
    for task in (1, 2, 3):
        service.release_task(task)
    cb_torch.detach()


def test_a_failed_torch_allocation_raises_in_torch_and_changes_nothing(service, torch_standin):
    with pytest.raises(RuntimeError, match="cudabridge torch allocator: InvalidArgument: .*exceeds the pool limit"):
        torch_standin.empty(1 << 40)
    assert service.library_allocators["torch"].statistics().allocations == 0
    with pytest.raises(RuntimeError, match="record_stream of address"):
        torch_standin.record_stream(type("T", (), {"data_ptr": 0x1234})(), 0)
    cb_torch.detach()
    with pytest.raises(RuntimeError, match="not connected to a service"):
        torch_standin.empty(16)


def test_torch_streams_the_pool_does_not_know_are_registered_not_refused(service, emulated, torch_standin):
    side = emulated.stream_create()   # as torch.cuda.Stream(): from torch's own pool, never destroyed
    torch_standin.set_stream(side)
    t = torch_standin.empty(MIB)
    assert service.memory_pool(0).accepts(side)
    torch_standin.fill(t, 5)
    emulated.stream_synchronize(side)
    del t
    assert service.library_allocators["torch"].statistics().frees == 1


# pointer libraries: a late free never frees someone else's memory ---------------------------------
def test_an_address_the_library_still_holds_is_never_handed_out_again(service, emulated):
    rmm = StandinRmm()
    allocator = cb_rmm.install(service, module=rmm)
    b = service.bind_task(4)

    def task():
        service.registry.attach(4)
        return rmm.device_buffer(MIB, stream=b.stream)

    held = _in_thread(task)   # the task forgets it; RMM still holds the address
    assert service.release_task(4).leaks_reclaimed == 1
    others = [rmm.device_buffer(MIB) for _ in range(3)]   # the pool would hand the same block out again
    assert held.ptr not in {o.ptr for o in others}
    assert allocator.statistics().allocations_set_aside == 1
    del held   # the late free: counted and dropped; the block held back for it goes back to the pool
    s = allocator.statistics()
    assert (s.frees_after_reclaim, s.allocations_set_aside) == (1, 0)
    with pytest.raises(InvalidFree):
        allocator.free_pointer(0xDEAD000)
    del others
    allocator.drain()
    assert service.memory_pool(0).statistics().in_use_bytes == 0


def test_an_allocation_set_aside_for_a_late_free_is_not_the_leak_of_the_task_it_was_made_for(
        service, torch_standin, monkeypatch):
    # Task 1 forgets a tensor (torch still holds it): its release reclaims it. Task 2's allocation
    # on that stream gets that address from the pool: set aside (never handed to task 2) and another
    # taken. Task 2 frees all it was given: its release reclaims nothing and counts no leak, and the
    # set-aside block waits for the late free, not for task 2's release. The block is never counted
    # as one of the library's allocations, not even while it is set aside (the count then stepped
    # back when it was).
    b1 = service.bind_task(1)
    torch_standin.set_stream(b1.stream)   # this thread: task 1's, by its stream
    x = torch_standin.empty(MIB)
    assert service.release_task(1).leaks_reclaimed == 1
    service.bind_task(2)
    pool, seen = service.memory_pool(0), []
    disown = pool.disown

    def disown_seen(a):
        seen.append(service.library_allocators["torch"].statistics().allocations)
        return disown(a)

    monkeypatch.setattr(pool, "disown", disown_seen)
    before = service.library_allocators["torch"].statistics().allocations

    def task2():
        t = torch_standin.empty(MIB)   # x's address first: set aside, another handed out
        return t.data_ptr              # t dropped here: task 2 freed all it was given

    p = _as_task(service, torch_standin, 2, b1.stream, task2)
    allocator = service.library_allocators["torch"]
    try:
        assert p != x.data_ptr and allocator.statistics().allocations_set_aside == 1
        assert seen == [before] and allocator.statistics().allocations == before + 1, (seen, before)
        leaks_before = allocator.statistics().leaks_reclaimed   # task 1's
        pool_leaks = pool.statistics().leaks_reclaimed
        report = service.release_task(2)
        assert report.leaks_reclaimed == 0, report
        assert pool.statistics().leaks_reclaimed == pool_leaks
        assert allocator.statistics().leaks_reclaimed == leaks_before
        assert allocator.statistics().allocations_set_aside == 1   # still held for x's address
        assert pool.statistics().in_use_bytes == MIB
    finally:
        del x   # the late free: the block set aside for it goes back
    s = allocator.statistics()
    assert (s.frees_after_reclaim, s.allocations_set_aside) == (1, 0)
    assert pool.statistics().in_use_bytes == 0


def test_a_late_free_that_comes_while_its_address_is_set_aside_still_gives_the_block_back(service, monkeypatch):
    # The library's late free (a finalizer during a collection, or another thread) can come while
    # the allocator is setting a block aside for it: the block must not stay set aside for ever.
    rmm = StandinRmm()
    allocator = cb_rmm.install(service, module=rmm)
    pool = service.memory_pool(0)
    b4 = service.bind_task(4)

    def task4():
        service.registry.attach(4)
        return rmm.device_buffer(MIB, stream=b4.stream)

    held = [_in_thread(task4)]   # the task forgets it; RMM still holds the address
    assert service.release_task(4).leaks_reclaimed == 1
    service.bind_task(5)
    disown = pool.disown

    def disown_then_late_free(a):   # a collection inside the set-aside runs the library's finalizer
        held.clear()
        return disown(a)

    monkeypatch.setattr(pool, "disown", disown_then_late_free)

    def task5():
        service.registry.attach(5)
        buf = rmm.device_buffer(MIB, stream=b4.stream)   # the pool hands the reclaimed address first
        del buf

    _in_thread(task5)
    service.release_task(5)
    s = allocator.statistics()
    assert s.frees_after_reclaim == 1
    assert (s.allocations_set_aside, pool.statistics().in_use_bytes) == (0, 0), (s, pool.statistics().in_use_bytes)


def test_a_release_right_after_a_pointer_allocation_never_lets_its_address_go_to_another_task(
        emulated, twin, monkeypatch):
    # A task killed while its own allocation returns: the release reclaims the allocation. The
    # address must already be one the library holds, so that the pool handing it out again (to
    # another task) sets it aside: else the library would hold two buffers at one address.
    import itertools

    from cudabridge.allocators import library_allocator as la

    hook = {}

    class Counted:   # the allocator's count of allocations, which both twins step after the lease
        def __init__(self):
            self._n = itertools.count()

        def __iter__(self):
            return self

        def __next__(self):
            fn = hook.pop("at_count", None)
            if fn is not None:
                fn()
            return next(self._n)

    made = []

    def counting():
        c = Counted() if not made else itertools.count()   # the first count() made is _allocated
        made.append(c)
        return c

    svc = _emulated_service(emulated)
    try:
        monkeypatch.setattr(la, "count", counting)
        svc.library_allocators["rmm"] = LibraryAllocator(svc, "rmm", fast_path=twin)
        monkeypatch.undo()
        rmm = StandinRmm()
        cb_rmm.install(svc, module=rmm)
        b1, b2 = svc.bind_task(1), svc.bind_task(2)
        other = {}

        def killed_then_another():
            svc.release_task(1)   # reclaims task 1's allocation, just made
            other["buf"] = _in_thread(lambda: (svc.registry.attach(2), rmm.device_buffer(MIB, stream=b2.stream))[1])

        def task1():
            svc.registry.attach(1)
            hook["at_count"] = killed_then_another
            return rmm.device_buffer(MIB, stream=b1.stream)

        first = _in_thread(task1)
        assert "buf" in other
        assert other["buf"].ptr != first.ptr, "two library buffers at one address"
        del first, other
    finally:
        svc.close()


# the pair: a library that frees and allocates one size on its stream ------------------------------------
def _pool_frees(pool, monkeypatch):
    """The frees the pool makes from now on (both twins drain through the pool's ``free``
    attribute): a reissue makes none."""
    made, free = [], pool.free

    def counting(a, stream=None):
        made.append(a)
        return free(a) if stream is None else free(a, stream)

    monkeypatch.setattr(pool, "free", counting)
    return made


def test_the_newest_free_of_one_size_on_its_stream_is_handed_out_again_under_a_new_handle(service, emulated,
                                                                                           monkeypatch):
    """CuPy's and PyTorch's steady state: a temporary dropped, the next one allocated. The pool
    would hand the block just freed out again (its bin for that stream); the allocator has the
    pool reissue it: the same memory under a new handle, still the task's, the old handle freed
    (a stale second free of it is refused and dropped, never freeing the new owner's memory)."""
    allocator = service.library_allocators["cupy"]
    pool = service.memory_pool(0)
    b = service.bind_task(5)

    frees = _pool_frees(pool, monkeypatch)

    def task():
        service.registry.attach(5)
        a = allocator.allocate(MIB, 0, b.stream)
        made = pool.statistics().allocations
        allocator.free(a)
        again = allocator.allocate(MIB, 0, b.stream)
        return a, again, made, pool.statistics().allocations

    a, again, made, after = _in_thread(task)
    assert frees == []   # reissued: no free in the pool
    assert again is not a and again.ptr == a.ptr and again.alive and not a.alive
    assert (again.size, again.owner, again.stream) == (MIB, 5, b.stream)
    assert after == made + 1   # the pool counts the reissue as an allocation: a handle issued
    s = allocator.statistics()
    assert (s.allocations, s.frees, s.frees_pending, s.in_use_bytes) == (2, 1, 0, MIB)
    allocator.free(a)   # a library's stale second free of the old handle: counted as such
    s = allocator.statistics()
    assert (s.frees, s.double_frees, s.frees_after_reclaim, s.in_use_bytes) == (1, 1, 0, MIB) and again.alive
    assert service.release_task(5).leaks_reclaimed == 1   # forgotten: the task's, reclaimed with it


def test_a_free_on_a_per_thread_stream_is_not_handed_to_another_threads_stream(service, emulated, monkeypatch):
    """Handle 2 names each thread's own default stream: a block thread A's kernel still writes
    must not go to thread B's stream unordered (the race detector would see B's write race A's)."""
    from cudabridge.device import PER_THREAD_STREAM
    from device_kernels import fill_u32_async

    allocator = service.library_allocators["cupy"]
    service.bind_task(5)
    seen = {}

    def first():
        service.registry.attach(5)
        a = allocator.allocate(MIB, 0, PER_THREAD_STREAM)
        fill_u32_async(emulated, a.ptr, MIB // 4, 0x11111111, PER_THREAD_STREAM, 0.2)   # still writing
        allocator.free(a)
        seen["a"] = a

    def second():
        service.registry.attach(5)
        b = allocator.allocate(MIB, 0, PER_THREAD_STREAM)
        seen["b"] = b
        fill_u32_async(emulated, b.ptr, MIB // 4, 0x22222222, PER_THREAD_STREAM)
        emulated.stream_synchronize(PER_THREAD_STREAM)
        allocator.free(b)

    frees = _pool_frees(service.memory_pool(0), monkeypatch)
    _in_thread(first)
    _in_thread(second)   # a StreamOrderRace here: handed across unordered
    assert frees[:1] == [seen["a"]] and not emulated.races   # made in the pool (fenced), not reissued
    service.release_task(5)


def test_a_release_while_the_newest_free_waits_for_reuse_makes_it_and_counts_no_leak(service, emulated, monkeypatch):
    """The task released on another thread while its allocation drains older frees (which runs
    the pool's code): the newest free, still in the queue, is made by the release; nothing the
    task freed is counted as a leak, and the allocation is refused."""
    allocator = service.library_allocators["cupy"]
    pool = service.memory_pool(0)
    b = service.bind_task(5)
    pool_free, state = pool.free, {"armed": False}

    def free_then_release(a, stream=None):
        pool_free(a) if stream is None else pool_free(a, stream)
        if state.pop("armed", False):
            t = threading.Thread(target=lambda: state.setdefault("report", service.release_task(5)))
            t.start()
            t.join(30)

    def task():
        service.registry.attach(5)
        older, a = allocator.allocate(2 * MIB, 0, b.stream), allocator.allocate(MIB, 0, b.stream)
        allocator.free(older)   # drained by the allocation below, which releases the task meanwhile
        allocator.free(a)       # the newest: a reuse for the allocation below
        state["armed"] = True
        monkeypatch.setattr(pool, "free", free_then_release)
        try:
            with pytest.raises(UnknownTask):
                allocator.allocate(MIB, 0, b.stream)
        finally:
            monkeypatch.undo()

    _in_thread(task)
    s = allocator.statistics()
    assert (s.frees, s.leaks_reclaimed, s.frees_after_reclaim, s.frees_pending) == (2, 0, 0, 0)
    assert state["report"].leaks_reclaimed == 0


@pytest.mark.parametrize("change", [None, "size", "task"])
def test_the_c_twin_reads_an_allocations_slots_by_name_where_it_does_not_know_their_layout(emulated, monkeypatch,
                                                                                          change):
    """Where Allocation's base is not the C AllocationBase, the twin reads the slots by name: the
    same decisions (the newest free reissued; another size's or another task's made)."""
    from cudabridge.allocators import library_allocator

    monkeypatch.setattr(library_allocator, "_allocation_base", lambda: None)
    svc = CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=2, high_priority_streams=0),
                            backend=emulated)
    try:
        allocator = LibraryAllocator(svc, "cupy", fast_path="native")
        assert allocator._core is not None
        b = svc.bind_task(5)
        svc.bind_task(6)
        frees = _pool_frees(svc.memory_pool(0), monkeypatch)

        def first():
            svc.registry.attach(5)
            a = allocator.allocate(MIB, 0, b.stream)
            allocator.free(a)
            return a, (allocator.allocate(2 * MIB if change == "size" else MIB, 0, b.stream)
                       if change != "task" else None)

        def second():
            svc.registry.attach(6)
            return allocator.allocate(MIB, 0, b.stream)

        a, again = _in_thread(first)
        if change == "task":
            again = _in_thread(second)
        assert not a.alive and again.alive
        if change is None:
            assert frees == [] and again.ptr == a.ptr and again.owner == 5
        else:
            assert frees == [a] and (again.size, again.owner) == ((2 * MIB, 5) if change == "size" else (MIB, 6))
    finally:
        svc.close()


@pytest.mark.parametrize("change", ["size", "stream", "a stream recorded", "task"])
def test_a_free_is_made_not_reused_for_another_size_stream_or_task_or_once_another_stream_used_it(
        service, emulated, change, monkeypatch):
    from cudabridge.device import LEGACY_STREAM

    allocator = service.library_allocators["cupy"]
    pool = service.memory_pool(0)
    b = service.bind_task(5)
    service.bind_task(6)

    def first():
        service.registry.attach(5)
        a = allocator.allocate(MIB, 0, b.stream)
        if change == "a stream recorded":
            allocator.record_stream(a, LEGACY_STREAM)
        allocator.free(a)
        if change == "task":
            return a, None
        size, stream = (2 * MIB if change == "size" else MIB), (LEGACY_STREAM if change == "stream" else b.stream)
        return a, allocator.allocate(size, 0, stream)

    def second():   # task 6 on task 5's stream (the pool's: accepted)
        service.registry.attach(6)
        return allocator.allocate(MIB, 0, b.stream)

    frees = _pool_frees(pool, monkeypatch)
    a, again = _in_thread(first)
    if change == "task":
        again = _in_thread(second)
    assert frees == [a]   # made in the pool, not reissued
    assert again is not a and not a.alive and again.alive
    assert (again.size, again.owner) == ((2 * MIB if change == "size" else MIB), (6 if change == "task" else 5))
    assert pool.statistics().allocations == 2
    s = allocator.statistics()
    assert (s.allocations, s.frees, s.frees_pending) == (2, 1, 0)
    service.release_task(5)
    service.release_task(6)


@pytest.mark.parametrize("size", [True, 1.0], ids=repr)
def test_a_size_equal_to_a_queued_frees_but_not_an_int_is_refused_and_the_free_made(service, emulated, size):
    allocator = service.library_allocators["cupy"]
    b = service.bind_task(5)

    def task():
        service.registry.attach(5)
        allocator.free(allocator.allocate(1, 0, b.stream))
        with pytest.raises(InvalidArgument):
            allocator.allocate(size, 0, b.stream)
        with pytest.raises(InvalidArgument):
            allocator.allocate_pointer(size, 0, b.stream)

    _in_thread(task)
    s = allocator.statistics()
    assert (s.allocations, s.frees, s.frees_pending, s.in_use_bytes) == (1, 1, 0, 0)
    assert service.memory_pool(0).statistics().in_use_bytes == 0
    service.release_task(5)


# Numba's EMM plug-in ---------------------------------------------------------------------------------
def test_numba_allocates_on_the_tasks_stream_and_frees_from_its_finalizer(service, emulated):
    numba_cuda = StandinNumbaCuda(emulated)
    allocator = cb_numba.install(service, module=numba_cuda)
    b = service.bind_task(6)

    def task():
        service.registry.attach(6)
        d = numba_cuda.device_array(MIB)
        (a,) = service.memory_pool(0).owned_by(6)
        return a.stream, a.ptr == d.device_pointer.value

    assert _in_thread(task) == (b.stream, True)   # the finalizer ran when the pointer went
    assert allocator.statistics().frees == 1
    info = numba_cuda.get_memory_info()
    assert info.total == service.memory_pool(0).limit
    assert numba_cuda.device_array(0).size == 0
    service.release_task(6)


def test_numbas_manager_before_install_names_the_fix():
    class Unconfigured(StandinNumbaCuda):
        pass

    saved, cb_numba._allocator = cb_numba._allocator, None
    try:
        numba_cuda = Unconfigured(None)
        numba_cuda.set_memory_manager(cb_numba.manager_class(numba_cuda))
        with pytest.raises(InvalidArgument, match="install"):
            numba_cuda.device_array(16)
    finally:
        cb_numba._allocator = saved


# setting, statistics -------------------------------------------------------------------------------
def test_the_setting_names_only_known_libraries_and_an_absent_library_stops_the_start(emulated):
    with pytest.raises(InvalidArgument, match="'tensorflow' not among cupy, torch, numba, rmm"):
        ServiceConfig(backend="emulated", allocators="cupy,tensorflow")
    with pytest.raises(InvalidArgument, match="named twice"):
        ServiceConfig(backend="emulated", allocators="cupy,cupy")
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    with pytest.raises(InvalidArgument, match="the cupy allocator needs cupy"):
        CudaBridgeService(ServiceConfig(backend="emulated", allocators="cupy"), backend=emulated)


def test_every_librarys_statistics_are_executor_statistics(service, emulated, twin):
    assert service.library_allocators["cupy"].fast_path == twin
    from cudabridge.jvm.control import BridgeControl

    cp, _ = _cupy(service, emulated)
    x = cp.empty(MIB)
    totals = service.statistics().totals()
    assert totals["allocator_cupy_allocations"] == 1
    assert totals["allocator_cupy_in_use_bytes"] == MIB
    assert totals["allocator_torch_allocations"] == 0   # not installed: zero, the name still there
    names = set(statistic_names())
    assert len(names) == len(LIBRARIES) * len(LibraryStatistics.names())
    assert names <= set(totals) and names <= set(BridgeControl.statistics_names())
    del x


def test_the_setting_installs_the_plugins_at_the_services_start(emulated, monkeypatch):
    cp = StandinCupy(emulated)
    monkeypatch.setitem(sys.modules, "cupy", cp)   # `import cupy` finds the stand-in
    svc = CudaBridgeService(ServiceConfig(backend="emulated", allocators="cupy"), backend=emulated)
    try:
        assert list(svc.library_allocators) == ["cupy"]
        x = cp.empty(MIB)
        assert svc.statistics().libraries["cupy"].in_use_bytes == MIB
        del x
    finally:
        svc.close()
    with pytest.raises(InvalidArgument, match="after its cudabridge allocator was closed"):
        cp.empty(MIB)   # CuPy outlives the service: refused, typed


@pytest.mark.parametrize("size, device, stream", [
    (0, 0, None), (-1, 0, None), (True, 0, None), (1.5, 0, None), ("1m", 0, None), (1 << 50, 0, None),
    (MIB, 7, None), (MIB, True, None), (MIB, 0.0, None), (MIB, 0, "s"), (MIB, 0, 0xDEAD0), (MIB, 0, True),
], ids=lambda v: repr(v))
def test_bad_input_gets_the_same_typed_error_from_both_twins_and_changes_nothing(emulated, size, device, stream):
    svc = CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=2, high_priority_streams=0),
                            backend=emulated)
    try:
        svc.bind_task(1)
        svc.registry.attach(1)
        seen = []
        for fast_path in ("native", "python"):
            allocator = LibraryAllocator(svc, f"cupy", fast_path=fast_path)
            for call in (allocator.allocate, allocator.allocate_pointer):
                with pytest.raises(Exception) as info:
                    call(size, device, stream)
                seen.append((type(info.value), str(info.value)))
                assert isinstance(info.value, InvalidArgument), info.value
            s = allocator.statistics()
            assert (s.allocations, s.in_use_bytes, s.allocations_set_aside) == (0, 0, 0)
        assert len(set(seen)) == 1, seen
        assert svc.memory_pool(0).statistics().in_use_bytes == 0
    finally:
        svc.registry.detach()
        svc.close()


def test_frees_after_the_service_closed_are_counted_quietly(emulated, twin, caplog):
    """CuPy arrays that outlive the service (dropped at interpreter exit, say): their memory went
    back with the pools at close; their frees are counted as after reclaim, with no warning."""
    svc = CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=2, high_priority_streams=0),
                            backend=emulated)
    cp, allocator = _cupy(_with_allocators(svc, twin), emulated)
    kept = [cp.empty(MIB) for _ in range(3)]
    svc.close()
    with caplog.at_level("WARNING", logger="cudabridge.allocators.library_allocator"):
        del kept
        s = allocator.statistics()
    assert (s.frees, s.frees_after_reclaim, s.frees_pending) == (0, 3, 0)
    assert not [r for r in caplog.records if r.name.startswith("cudabridge.allocators")]


def test_a_cupy_array_handed_over_is_the_tasks_and_cupy_no_longer_frees_it(service, emulated):
    """allocators.cupy.hand_over (a Python function's result given to Java with no copy): the
    allocation leaves the library's books, and dropping the array frees nothing; an array of
    another task, a view into the middle, or one handed over already is refused (None: copied)."""
    cp, allocator = _cupy(service, emulated)
    service.bind_task(7)
    service.bind_task(8)

    def task():
        service.registry.attach(7)
        with cb_cupy.task_stream(service):
            return cp.empty(MIB), cp.empty(MIB)

    whole, other = _in_thread(task)
    inner = StandinArray(type(whole.data)(whole.data.mem, 256), 256)
    assert cb_cupy.hand_over(inner, 7) is None and cb_cupy.hand_over(other, 8) is None
    a = cb_cupy.hand_over(whole, 7)
    assert a is not None and a.owner == 7 and a.ptr == whole.data.ptr
    assert cb_cupy.hand_over(whole, 7) is None   # once
    del whole, inner
    s = allocator.statistics()
    assert (s.allocations_handed_over, s.frees_pending, s.frees, s.in_use_bytes) == (1, 0, 0, MIB)
    assert a.alive
    service.memory_pool(0).free(a)   # its new owner frees it (Java's DeviceBuffer.close)
    report = service.release_task(7)
    assert report.leaks_reclaimed == 1   # `other`, still CuPy's
    with pytest.raises(InvalidArgument):
        allocator.hand_over(a)


# --- review demos ------------------------------------------------------------------------------
def test_a_connect_that_another_owners_connect_overtakes_keeps_the_reuse_counts(emulated, twin, tmp_path):
    # A connect hands the kept frees over first (Python code: another connect may get in); the
    # owner's count it read against must still be the owner's when it swaps, or it goes round again.
    svc_a, svc_b = _two_services(emulated, twin)
    try:
        alloc_a = cb_torch.attach(svc_a)
        alloc_b = svc_b.library_allocators["torch"]
        part = cb_torch.compiled_part()
        tok_a, tok_b = cb_torch._owner_token(svc_a), cb_torch._owner_token(svc_b)
        t = StandinTorch(emulated, part, build_caller(tmp_path))
        b = svc_a.bind_task(1)
        svc_a.registry.attach(1)
        t.set_stream(b.stream)
        for _ in range(5):
            t.empty(MIB)
        before = part.reuses(tok_a)
        assert before[0] == 4
        done = []

        def free_then_switch(ptr):
            alloc_a.free_pointer(ptr)
            if not done:
                done.append(1)   # e.g. another thread's attach(B) that got in while this connect let the GIL go
                part.connect(tok_b, alloc_b.allocate_pointer_owned, alloc_b.free_pointer,
                             alloc_b.record_stream_pointer, alloc_b.drain, alloc_b.owner_for)

        part.connect(tok_a, alloc_a.allocate_pointer_owned, free_then_switch, alloc_a.record_stream_pointer,
                     alloc_a.drain, alloc_a.owner_for)
        t.empty(MIB)   # kept: the next connect hands it to free_then_switch
        assert part.kept() == 1
        part.connect(tok_a, alloc_a.allocate_pointer_owned, alloc_a.free_pointer, alloc_a.record_stream_pointer,
                     alloc_a.drain, alloc_a.owner_for)   # A again (attach(svc_a) again)
        assert part.owner() is tok_a
        assert part.reuses(tok_a) == before, part.reuses(tok_a)
    finally:
        svc_a.registry.detach()
        cb_torch.detach()
        svc_b.close()
        svc_a.close()


def test_an_owners_reuse_count_reads_the_same_while_another_owner_connects(emulated, twin, tmp_path):
    # The switch moves the old owner's count aside in the same step as the owner: a reader in
    # between (a finalizer or gc callback during the connect, or another thread) never sees it gone.
    svc_a, svc_b = _two_services(emulated, twin)
    old = gc.get_threshold()
    seen: list = []
    try:
        cb_torch.attach(svc_a)
        part = cb_torch.compiled_part()
        tok_a = cb_torch._owner_token(svc_a)
        t = StandinTorch(emulated, part, build_caller(tmp_path))
        b = svc_a.bind_task(1)

        def five():
            for _ in range(5):
                t.empty(MIB)   # allocated, freed (kept), taken back by the next

        _as_task(svc_a, t, 1, b.stream, five)
        svc_a.release_task(1)
        assert part.reuses(tok_a) == (4, 0)

        def watch(phase, info):
            seen.append(part.reuses(tok_a))

        gc.callbacks.append(watch)
        gc.set_threshold(1)   # a collection at nearly every allocation of Python objects
        try:
            cb_torch.attach(svc_b)
        finally:
            gc.set_threshold(*old)
            gc.callbacks.remove(watch)
        assert seen and all(r == (4, 0) for r in seen), sorted(set(seen))
        assert part.reuses(tok_a) == (4, 0)
    finally:
        gc.set_threshold(*old)
        cb_torch.detach()
        svc_b.close()
        svc_a.close()


def test_a_lowered_kept_frees_limit_lists_the_oldest_over_it(service, torch_standin):
    part = cb_torch.compiled_part()
    b = service.bind_task(7)

    def task():
        ts = [torch_standin.empty((i + 1) * MIB) for i in range(6)]
        del ts[:]
        assert part.kept() == 6
        part.keep_at_most(2)
        for i in range(3):
            torch_standin.empty((10 + i) * MIB)
        return part.kept()

    try:
        assert _as_task(service, torch_standin, 7, b.stream, task) <= 2
    finally:
        part.keep_at_most(128)
        service.release_task(7)


def test_a_release_waits_only_for_the_torch_hand_overs_begun_before_it(service, torch_standin):
    """A drain (a task's release) waits for the frees other threads were handing over when it began,
    not for every hand-over that begins while it waits: with threads whose hand-overs overlap one
    another without end (autograd's, of other tasks), it would otherwise never return."""
    torch = _TorchPart(service, torch_standin, 5)
    entered, gates = {}, {}

    def gated_free(ptr):   # a hand-over that gives the GIL away until its gate opens
        if ptr in gates:
            entered[ptr].set()
            gates[ptr].wait(10)
        return torch.allocator.free_pointer(ptr)

    torch.connect_free(gated_free)
    first, later = torch.alloc_for_task(2, 4096)
    for p in (first, later):
        entered[p], gates[p] = threading.Event(), threading.Event()
    torch.free(first, 4096)
    before = threading.Thread(target=torch.part.flush, daemon=True)
    before.start()                      # hands `first` over, stopped at its gate
    assert entered[first].wait(10)
    drain = threading.Thread(target=torch.part.flush, daemon=True)
    drain.start()                       # waits for `first`
    time.sleep(0.2)
    torch.free(later, 4096)
    after = threading.Thread(target=torch.part.flush, daemon=True)
    after.start()                       # hands `later` over after the drain began, stopped at its gate
    assert entered[later].wait(10)
    gates[first].set()
    drain.join(5)
    drained = not drain.is_alive()
    gates[later].set()
    for t in (before, drain, after):
        t.join(10)
    assert drained, "the drain waited for a hand-over that began after it"
    assert torch.allocator.statistics().frees == 2
    assert service.release_task(5).leaks_reclaimed == 0
