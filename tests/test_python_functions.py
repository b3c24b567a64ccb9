"""Python functions called for a task (functions/, jvm/function_calls.py) on the emulated device,
without a JVM: resolving by reference and pickled, arguments, results, errors, the task guard.
The JNI path is PythonFunctionTest's (JUnit); a GPU's CuPy and torch arrays are
test_python_functions_gpu.py's."""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from cudabridge.config import ServiceConfig
from cudabridge.errors import FunctionFailed, FunctionNotFound, InvalidArgument, UnknownTask
from cudabridge.functions import ArrayArgument, FunctionCalls, FunctionTable, pickle_function
from cudabridge.functions.dtypes import CODES
from cudabridge.jvm.errors import error_info
from cudabridge.jvm.hot_path import JavaHotPath
from cudabridge.service import CudaBridgeService

HERE = Path(__file__).resolve().parent
FUNCTIONS = str(HERE / "python_functions")
F = "functions_for_tests"


@pytest.fixture
def service(emulated):
    svc = CudaBridgeService(ServiceConfig(backend="emulated", streams_per_gpu=4, high_priority_streams=0),
                            backend=emulated)
    yield svc
    svc.close()


@pytest.fixture(params=["native", "python"])
def hot(request, service):
    """Every call on both twins: the C one (functions/_call_core.c) and its Python reference."""
    h = JavaHotPath(service, fast_path=request.param)
    assert h.functions.fast_path == request.param
    return h


def _fid(hot, name):
    return hot.functions.resolve(f"{F}:{name}", [FUNCTIONS])


def _float_buffer(hot, service, task, values):
    """A task buffer holding float64 ``values`` (copied on its stream): its handle."""
    data = np.asarray(values, dtype=np.float64)
    hid, _ = hot.allocate(task, data.nbytes)
    hot.copy_in(hid, 0, memoryview(data).cast("B"))
    return hid


def _read(hot, service, hid, nbytes, dtype="float64"):
    out = bytearray(nbytes)
    hot.copy_out(hid, 0, memoryview(out))
    return np.frombuffer(bytes(out), dtype=dtype)


# resolving ------------------------------------------------------------------------------------
def test_a_reference_resolves_once_and_bad_ones_are_refused_and_not_cached(tmp_path):
    table = FunctionTable()
    f = table.resolve(f"{F}:add", [FUNCTIONS])
    assert table.resolve(f"{F}:add") is f and table.get(f.id) is f and f.fn(2, 3) == 5
    for bad, words in [("no_colon", "not a function reference"), ("a:b:c", "not a function reference"),
                       ("no_such_module_xyz:f", "cannot be imported"), (f"{F}:missing", "no attribute"),
                       (f"{F}:not_a_function", "not a function"), (42, "not a function reference")]:
        with pytest.raises(FunctionNotFound, match=words):
            table.resolve(bad)
    assert len(table) == 1
    # a module that raises while importing: refused, and a later ask tries again (nothing cached)
    (tmp_path / "raising_module.py").write_text("raise RuntimeError('broken at import')\n")
    with pytest.raises(FunctionNotFound, match="broken at import"):
        table.resolve("raising_module:f", [str(tmp_path)])
    (tmp_path / "raising_module.py").write_text("def f():\n    return 7\n")
    sys.modules.pop("raising_module", None)
    assert table.resolve("raising_module:f", [str(tmp_path)]).fn() == 7


def test_a_search_path_others_may_write_is_refused_and_nothing_is_added(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "planted.py").write_text("def f():\n    return 'planted'\n")
    shared.chmod(0o777)
    (tmp_path / "fine").mkdir()
    before = list(sys.path)
    with pytest.raises(FunctionNotFound, match="writable by group or others"):
        FunctionTable().resolve("planted:f", [str(tmp_path / "fine"), str(shared)])
    assert sys.path == before
    with pytest.raises(FunctionNotFound, match="No such file"):
        FunctionTable().resolve("planted:f", [str(tmp_path / "missing")])
    shared.chmod(0o755)
    assert FunctionTable().resolve("planted:f", [str(shared)]).fn() == "planted"


def test_a_pickled_function_loads_once_and_another_python_version_is_refused():
    pytest.importorskip("pyspark")
    table = FunctionTable()
    offset = 10

    def shifted(x):
        return x + offset

    payload = pickle_function(shifted)
    f = table.resolve_pickled(payload)
    assert f.fn(1) == 11 and table.resolve_pickled(payload) is f
    version = f"{sys.version_info[0]}.{sys.version_info[1]}".encode()
    other = payload.replace(b"\x00" + bytes([len(version)]) + version, b"\x00\x042.99", 1)
    with pytest.raises(FunctionNotFound, match=r"pickled by Python 2\.99"):
        table.resolve_pickled(other)
    with pytest.raises(FunctionNotFound, match="not a pickled function"):
        table.resolve_pickled(b"junk")
    with pytest.raises(FunctionNotFound, match="loading the pickled function failed"):
        table.resolve_pickled(payload[:-5])
    assert len(table) == 1


# calls ------------------------------------------------------------------------------------------
def test_scalars_strings_and_bytes_go_in_and_come_back(service, hot):
    service.bind_task(1)
    call = hot.call_function
    assert call(1, _fid(hot, "add"), (2, 40)) == 42
    assert call(1, _fid(hot, "kinds"), (None, 1, 2.5, True, "s", b"b")) == "NoneType,int,float,bool,str,bytes"
    assert call(1, _fid(hot, "text"), ("abc",)) == "ABC \u00e9\U0001F600"
    assert call(1, _fid(hot, "reverse_bytes"), (b"abc",)) == b"cba"
    assert call(1, _fid(hot, "echo"), (1, "x", None)) == [1, "x", None]
    assert call(1, _fid(hot, "echo"), (np.float32(1.5),)) == 1.5


def test_an_array_argument_is_the_buffer_itself_after_the_stream_ran(service, hot):
    service.bind_task(1)
    hid = _float_buffer(hot, service, 1, [1.0, 2.0, 3.0, 4.0])
    code = CODES.index("float64")
    assert hot.call_function(1, _fid(hot, "total"), ((hid, 0, code, 0, 4),)) == 10.0
    assert hot.call_function(1, _fid(hot, "shape_of"), ((hid, 0, code, 0, 2, 2),)) == "2,2:float64"
    assert hot.call_function(1, _fid(hot, "scale"), ((hid, 8, code, 0, 2), 10.0)) is None   # elements 1..2, in place
    assert list(_read(hot, service, hid, 32)) == [1.0, 20.0, 30.0, 4.0]


def test_array_results_become_task_buffers_with_handles(service, hot):
    service.bind_task(1)
    hid = _float_buffer(hot, service, 1, [1.0, 2.0, 3.0])
    code = CODES.index("float64")
    live = hot.live_handles
    h, ptr, nbytes, dtype, *shape = hot.call_function(1, _fid(hot, "squares_like"), ((hid, 0, code, 0, 3),))
    assert (nbytes, CODES[dtype], shape) == (24, "float64", [3]) and hot.live_handles == live + 1
    assert list(_read(hot, service, h, 24)) == [1.0, 4.0, 9.0]
    first, second = hot.call_function(1, _fid(hot, "two_arrays"), ((hid, 0, code, 0, 3),))
    assert first[4:] == (3,) and second[4:] == (1,) and list(_read(hot, service, second[0], 8)) == [6.0]
    # results are the task's: freed by Java, or reclaimed with the task
    hot.free(h)
    report = service.release_task(1)
    assert report[1] == 3   # the argument and the two results of two_arrays


def test_a_failing_function_is_a_typed_error_with_its_traceback_and_nothing_is_left(service, hot):
    service.bind_task(1)
    pool = service.memory_pool(0)
    before = pool.statistics().in_use_bytes
    with pytest.raises(FunctionFailed) as info:
        hot.call_function(1, _fid(hot, "fail"), ("no luck",))
    message, pytype, oom, kind = error_info(info.value)
    assert kind == "FunctionFailed" and pytype == "ValueError" and oom is None
    assert message.startswith(f"{F}:fail: ValueError: no luck\nTraceback (most recent call last):")
    assert 'raise ValueError(message)' in message
    with pytest.raises(FunctionFailed, match="SystemExit"):
        hot.call_function(1, _fid(hot, "exits"), ())
    for name, words in [("returns_a_set", "cannot be returned to Java"), ("huge_int", "does not fit a Java long")]:
        with pytest.raises(InvalidArgument, match=words):
            hot.call_function(1, _fid(hot, name), ())
    assert pool.statistics().in_use_bytes == before
    assert service.registry.attached_task() is None   # the attachment is put back


def test_results_made_before_a_bad_one_are_freed(service, hot):
    service.bind_task(1)
    hid = _float_buffer(hot, service, 1, [1.0, 2.0])
    pool = service.memory_pool(0)
    before = pool.statistics().in_use_bytes
    live = hot.live_handles
    fid = hot.functions.table.keep("arrays then a set", "arrays then a set",
                                   lambda: (lambda x: [x * 2, x * 3, {1}])).id
    with pytest.raises(InvalidArgument, match=r"returned\[2\]"):
        hot.call_function(1, fid, ((hid, 0, CODES.index("float64"), 0, 2),))
    assert pool.statistics().in_use_bytes == before and hot.live_handles == live


def test_bad_array_arguments_are_refused_before_the_function_runs(service, hot):
    service.bind_task(1)
    service.bind_task(2)
    hid = _float_buffer(hot, service, 1, [1.0, 2.0])
    other = _float_buffer(hot, service, 2, [1.0])
    count = _fid(hot, "count_calls")
    code = CODES.index("float64")
    before = hot.call_function(1, count, ())
    for args, words in [(((hid, 0, code, 0, 3),), "needs 24 bytes"),
                        (((hid, 4, code, 0, 1),), "not a multiple"),
                        (((hid, 0, 99, 0, 2),), "unknown dtype code"),
                        (((hid, 0, code, 5, 2),), "unknown framework"),
                        (((hid, 0, code, 0, -1),), "non-negative"),
                        (((other, 0, code, 0, 1),), "belongs to task 2"),
                        (((12345, 0, code, 0, 1),), "handle")]:
        with pytest.raises(InvalidArgument, match=words):
            hot.call_function(1, count, args)
    assert hot.call_function(1, count, ()) == before + 1   # none of those ran it
    with pytest.raises(FunctionNotFound):
        hot.call_function(1, 99999, ())
    with pytest.raises(UnknownTask):
        hot.call_function(77, count, ())


def test_a_memoryview_argument_reaches_the_function_and_its_writes_come_back(service, hot):
    """(Its release after the call, and the refusal of a call that kept it, are the native's:
    PythonFunctionTest's direct ByteBuffers.)"""
    service.bind_task(1)
    data = bytearray(b"\x01\x02\x03")
    assert hot.call_function(1, _fid(hot, "view_sum"), (memoryview(data),)) == 6
    hot.call_function(1, _fid(hot, "write_view"), (memoryview(data),))
    assert data[0] == 42


def test_a_call_never_runs_after_its_task_release_began(service, hot):
    """Many threads call a slow function while the task is released: every call either ran
    entirely before the release finished draining, or was refused; none ran after it."""
    fid = _fid(hot, "count_calls")
    for round_ in range(5):
        task = 100 + round_
        service.bind_task(task)
        started, refused, finished = [], [], []
        released = threading.Event()
        go = threading.Barrier(9)

        def caller():
            go.wait()
            for _ in range(20):
                try:
                    hot.call_function(task, fid, (0.001,))
                except UnknownTask:
                    refused.append(1)
                    return
                finished.append(released.is_set())

        threads = [threading.Thread(target=caller) for _ in range(8)]
        for t in threads:
            t.start()
        go.wait()
        service.release_task(task)
        released.set()
        for t in threads:
            t.join()
        assert not any(finished), "a call finished after its task's release had returned"
        assert refused


def test_calls_from_python_code_use_the_same_path(service):
    """FunctionCalls without the Java front: ArrayArgument over an allocation."""
    calls = FunctionCalls(service)
    f = calls.table.resolve(f"{F}:total", [FUNCTIONS])
    b = service.bind_task(5)
    a = service.allocate(5, 16)
    service.backend.memset_async(a.ptr, 0, 16, b.stream)
    assert calls.call(5, f, [ArrayArgument(a, 0, "float64", (2,))]) == 0.0
    with pytest.raises(InvalidArgument, match="torch"):
        import importlib.util
        if importlib.util.find_spec("torch") is not None:
            raise InvalidArgument("torch")   # torch installed: from_numpy works; nothing to check here
        calls.call(5, f, [ArrayArgument(a, 0, "float64", (2,), "torch")])


def test_the_dtype_table_matches_java_and_numpy():
    """functions/dtypes.py's table is what Java's DType reads from the jar (DTypeTest holds its
    constants to it); here: each entry's item size and typestr are numpy's own."""
    from cudabridge.functions.dtypes import DTYPES, dtype_of_typestr

    for name, (size, typestr) in DTYPES.items():
        assert np.dtype(name).itemsize == size and np.dtype(name).str == typestr
        assert dtype_of_typestr(np.dtype(name).str, "x") == name
    with pytest.raises(InvalidArgument, match="not supported"):
        dtype_of_typestr("<c16", "x")


def test_running_service_outside_a_jvm_bridge_is_a_clear_error():
    """The executor's service for Python code in it: none where no bridge started one."""
    from cudabridge.errors import CudaBridgeError
    from cudabridge.jvm.bootstrap import running_service

    with pytest.raises(CudaBridgeError, match="no cudabridge service runs in this process"):
        running_service()
