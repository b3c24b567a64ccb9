"""A task's lease survives interruptions: an operation never stays recorded inside it after it
returned or raised, and a release never waits for a thread that is no longer inside.

Before the fix a ``KeyboardInterrupt`` landing between entering the lease and the ``try`` whose
``finally`` leaves it (``TaskLeases.enter`` / ``leave`` called as Python functions) left the
thread's ident in ``lease.inside``: a SIGINT every millisecond for 6 s while one thread allocated
and freed gave 49 stale entries; then ``release_task`` on that thread refused ("cannot be released
from inside one of its own operations") and on any other thread waited forever. The same through
``launch`` and ``copy_to_global`` with ``PyThreadState_SetAsyncExc``.

Both the registry's C twin and its Python reference run; the operations under test are the
Python API's (the Java hot path's C twin enters leases in C). ``CUDABRIDGE_INTERRUPT_SECONDS``
sets the length of the two injection tests together (default 6, as in tests/test_interruptions.py).
"""

from __future__ import annotations

import os
import random
import threading

import numpy as np
import pytest

from cudabridge.config import ServiceConfig
from cudabridge.errors import OutOfDeviceMemory
from cudabridge.kernels import LaunchConfig, copy_to_global
from cudabridge.kernels.modules import ModuleSource
from cudabridge.service import CudaBridgeService
from interruption_storms import async_storm, sigint_storm

# each of the two injection tests runs for half (per twin): without the fix a third of that
# already left hundreds of stale entries
SECONDS = float(os.environ.get("CUDABRIDGE_INTERRUPT_SECONDS", "6")) / 2
GLOBALS_SOURCE = r'''
__constant__ float scale;
__constant__ int offsets[4] = {1, 2, 3, 4};
__device__ unsigned long long launches;
extern "C" __global__ void scale_by(float* y, int n) {}
'''
SAXPY_SOURCE = 'extern "C" __global__ void saxpy(const float* x, float* y, int n, float a) {}\n'


def _service(twin: str) -> CudaBridgeService:
    svc = CudaBridgeService(ServiceConfig(backend="emulated", emulated_kernels="host_kernels_for_tests,host_kernels_for_globals",
                                          emulated_memory="256m", pool_limit="64m", streams_per_gpu=4,
                                          # ERROR: the breaker logs each break at WARNING, and CPython's
                                          # logging is not safe against asynchronous exceptions (one landing
                                          # between a handler's acquire and its try strands its lock)
                                          high_priority_streams=0, log_level="ERROR",
                                          # the storms stop their threads holding memory: a waiting
                                          # allocation would wait for tasks that never free again
                                          # (the waits' own storm: test_memory_pressure.py)
                                          oom_wait=0.2))
    reg = svc.registry
    if twin == "python":   # the references instead of the C twin's bind and release
        reg.bind, reg.release = reg._bind_reference, reg._release_reference
    elif not reg.native:
        pytest.skip("the registry's C twin is not built")
    return svc


def _release_within(svc, task: int, seconds: float = 20.0) -> object:
    """Release ``task`` on another thread; fail (instead of hanging) if it does not return."""
    out: list = []

    def run():
        try:
            out.append(svc.release_task(task))
        except BaseException as exc:   # noqa: BLE001 - reported below
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"release of task {task} still waits after {seconds} s: a stale lease entry"
    assert not isinstance(out[0], BaseException), out[0]
    return out[0]


@pytest.mark.parametrize("twin", ["native", "python"])
def test_sigint_every_millisecond_while_the_main_thread_allocates_leaves_no_stale_entry(twin):
    svc = _service(twin)
    svc.bind_task(1)
    lease = svc.registry.leases[1]
    rng = random.Random(5)
    held: list = []

    def op():
        if held and rng.random() < 0.5:
            held.pop().free()
        else:
            held.append(svc.allocate(1, rng.choice((256, 4096, 1 << 20))))

    interrupts, calls, errors = sigint_storm(SECONDS, op, expected=(OutOfDeviceMemory,))
    assert not errors, f"{len(errors)} errors besides the interruptions, first: {errors[0]!r}"
    assert interrupts > 20 and calls > 100, (interrupts, calls)
    assert not lease.inside, f"{len(lease.inside)} stale entries in task 1's lease"
    report = _release_within(svc, 1)
    assert report.task_id == 1
    assert svc.memory_pool(0).statistics().live_allocations == 0
    svc.close()


@pytest.mark.parametrize("twin", ["native", "python"])
def test_async_exceptions_into_threads_allocating_launching_and_writing_globals(twin):
    svc = _service(twin)
    reg = svc.registry
    kernel = svc.load_module(ModuleSource.of(SAXPY_SOURCE)).kernel("saxpy")
    scale = svc.load_module(ModuleSource.of(GLOBALS_SOURCE)).global_("scale")
    tasks = [11, 12, 13, 14]
    for t in tasks:
        svc.bind_task(t)
    bufs = {t: (svc.allocate(t, 64), svc.allocate(t, 64)) for t in tasks}
    value = bytearray(np.float32(2.0).tobytes())

    def op(i, rng, held):
        t = tasks[i]
        k = rng.random()
        if k < 0.3:
            held.append(svc.allocate(t, rng.choice((256, 65536))))
        elif k < 0.45 and held:
            held.pop().free()
        elif k < 0.75 or i:   # one task writes the global (a second would race with it)
            svc.launch(t, kernel, LaunchConfig(1, 32), [*bufs[t], 16, 2.0])
        else:
            copy_to_global(reg, t, scale, value)

    hits, errors, finished = async_storm(len(tasks), SECONDS, op, expected=(OutOfDeviceMemory,))
    assert finished, "a worker thread hung"
    assert not errors, f"{len(errors)} errors besides the interruptions, first: {errors[0]!r}"
    assert sum(hits) > 20, hits
    stale = {t: len(reg.leases[t].inside) for t in tasks if reg.leases[t].inside}
    assert not stale, f"stale lease entries (task: count): {stale}"
    for t in tasks:
        _release_within(svc, t)
    svc.backend.device_synchronize()
    assert svc.memory_pool(0).statistics().live_allocations == 0
    svc.close()


@pytest.mark.parametrize("twin", ["native", "python"])
def test_a_release_cut_short_is_finished_by_the_next_release_or_by_close(twin):
    svc = _service(twin)
    reg = svc.registry
    calls = []

    def interrupted_once(binding):
        calls.append(binding.task_id)
        if len(calls) == 1:
            raise KeyboardInterrupt   # as if it landed inside the release, after the lease closed

    reg.on_release(interrupted_once)
    svc.bind_task(3)
    leaked = svc.allocate(3, 4096)
    with pytest.raises(KeyboardInterrupt):
        svc.release_task(3)
    assert not leaked.alive                   # reclaimed whatever the listener did
    assert 3 not in reg.leases and reg.releases_in_progress() == [3]
    with pytest.raises(Exception, match="still being released"):
        svc.bind_task(3)
    report = svc.release_task(3)              # finishes it
    assert report.task_id == 3
    assert reg.releases_in_progress() == [] and calls == [3, 3]
    svc.bind_task(3)                          # bindable again
    svc.bind_task(4)
    svc.allocate(4, 4096)
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        svc.release_task(4)
    reports = svc.close()                     # close finishes the one cut short too
    assert sorted(r.task_id for r in reports) == [3, 4]
    assert reg.releases_in_progress() == []


def test_a_tasks_first_operations_import_no_module():
    """An operation of a task never runs an import: an asynchronous exception landing in a first
    import (in importlib's module locks, Python code) can strand the module's lock, and every
    thread that imports it next waits forever. The storm above hung that way, one run in a few,
    while launch imported the kernel parameters' module on its first call. A fresh interpreter:
    here every module is long imported."""
    code = f"""
import sys
import numpy as np
from cudabridge.config import ServiceConfig
from cudabridge.kernels import LaunchConfig, copy_to_global
from cudabridge.kernels.modules import ModuleSource
from cudabridge.service import CudaBridgeService
svc = CudaBridgeService(ServiceConfig(backend="emulated", emulated_kernels="host_kernels_for_tests,host_kernels_for_globals"))
kernel = svc.load_module(ModuleSource.of({SAXPY_SOURCE!r})).kernel("saxpy")
scale = svc.load_module(ModuleSource.of({GLOBALS_SOURCE!r})).global_("scale")
svc.bind_task(1)
before = set(sys.modules)
x, y = svc.allocate(1, 64), svc.allocate(1, 64)
svc.launch(1, kernel, LaunchConfig(1, 32), [x, y, 16, 2.0])
svc.launch(1, kernel, LaunchConfig(1, 32), [(x, 4), y, 15, 2.0])
copy_to_global(svc.registry, 1, scale, bytearray(np.float32(2.0).tobytes()))
svc.synchronize(1)
x.free()
svc.release_task(1)
print("imported", sorted(m for m in set(sys.modules) - before))
svc.close()
"""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sys.path])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert "imported []" in run.stdout, run.stdout
