"""Task binding (task_registry.py), the executor service (service.py), GPU address resolution
(gpu_addresses.py) and configuration (config.py), on the emulated device."""

from __future__ import annotations

import os
import threading

import pytest
from device_kernels import spin_async

from cudabridge.config import SPARK_PREFIX, ServiceConfig, parse_bytes
from cudabridge.device import EmulatedBackend
from cudabridge.errors import CudaError, InvalidArgument, InvalidFree, PoolClosed, UnknownTask
from cudabridge.gpu_addresses import parse_address_map, resolve_gpu_addresses
from cudabridge.service import CudaBridgeService
from cudabridge.stream_pool import MAX_CONNECTIONS_ENV
from cudabridge.task_registry import ReleaseReport, TaskBinding

MiB = 1 << 20
STREAMS = 4


@pytest.fixture
def clean_env(monkeypatch):
    """The service writes CUDA_DEVICE_MAX_CONNECTIONS; restore it (and CUDA_VISIBLE_DEVICES)."""
    for name in (MAX_CONNECTIONS_ENV, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    yield monkeypatch


def make_config(**overrides):
    kwargs = dict(backend="emulated", emulated_devices=2, emulated_memory="64m", pool_limit="32m",
                  streams_per_gpu=STREAMS, high_priority_streams=1, log_level="WARNING")
    kwargs.update(overrides)
    return ServiceConfig(**kwargs)


@pytest.fixture
def service(clean_env):
    svc = CudaBridgeService(make_config())
    yield svc
    svc.close()


@pytest.fixture
def service1(clean_env):
    svc = CudaBridgeService(make_config(emulated_devices=1))
    yield svc
    svc.close()


@pytest.fixture
def be2():
    backend = EmulatedBackend(devices=2, memory_bytes=16 * MiB)
    yield backend
    backend.close()


def run_threads(n, fn):
    results = [None] * n
    errors = []
    barrier = threading.Barrier(n)

    def target(i):
        try:
            barrier.wait(timeout=10)
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    return results


# bind / release ---------------------------------------------------------------------------------

def test_bind_and_release(service):
    b = service.bind_task(7, "0")
    assert isinstance(b, TaskBinding)
    assert (b.task_id, b.gpu, b.address, b.priority) == (7, 0, "0", "normal")
    assert b.stream in service.stream_pool(0).streams("normal")
    reg = service.registry
    assert reg.binding(7) == b and reg.stream(7) == b.stream
    assert reg.tasks_bound == 1 and reg.streams_in_use == 1 and reg.bound_tasks() == [7]
    report = service.release_task(7)
    assert report == ReleaseReport(7, 0, 0)
    assert reg.tasks_bound == 0 and reg.streams_in_use == 0 and reg.tasks_bound_total == 1
    with pytest.raises(UnknownTask):
        reg.binding(7)
    # the id can be bound again once released
    assert service.bind_task(7, "1").gpu == 1


def test_high_priority_binding_gets_a_high_stream(service):
    b = service.bind_task(1, "1", priority="high")
    assert b.priority == "high"
    assert b.stream in service.stream_pool(1).streams("high")


def test_bind_without_address_needs_a_single_gpu(service, service1):
    with pytest.raises(InvalidArgument):
        service.bind_task(1)
    assert service.registry.tasks_bound == 0
    b = service1.bind_task(1)
    assert b.gpu == 0 and b.address == "0"


def test_tasks_get_streams_round_robin_and_share_when_the_pool_is_exhausted(service):
    normal = service.stream_pool(0).streams("normal")
    bindings = [service.bind_task(t, "0") for t in range(STREAMS + 1)]
    assert [b.stream for b in bindings] == normal + normal[:1]
    reg = service.registry
    assert reg.streams_in_use == STREAMS
    service.release_task(0)  # task STREAMS still uses that stream
    assert reg.streams_in_use == STREAMS
    service.release_task(STREAMS)
    assert reg.streams_in_use == STREAMS - 1


def test_every_thread_of_a_task_sees_the_same_stream(service):
    b = service.bind_task(42, "1")
    other = service.bind_task(43, "1")
    reg = service.registry

    def work(_):
        attached = reg.attach(42)
        seen = (reg.stream(42), attached.stream, reg.current().stream, service.backend.get_device())
        reg.detach()
        return seen

    results = run_threads(6, work)
    assert results == [(b.stream, b.stream, b.stream, 1)] * 6
    assert other.stream != b.stream


def test_double_bind_is_refused_and_changes_nothing(service):
    reg = service.registry
    normal = service.stream_pool(0).streams("normal")
    b = service.bind_task(1, "0")
    with pytest.raises(InvalidArgument):
        service.bind_task(1, "1")
    with pytest.raises(InvalidArgument):
        service.bind_task(1, "0")
    assert reg.binding(1) == b
    assert reg.tasks_bound == 1 and reg.tasks_bound_total == 1 and reg.streams_in_use == 1
    # The refused binds did not take a stream: the next task gets the next one in turn.
    assert service.bind_task(2, "0").stream == normal[1]


@pytest.mark.parametrize("task_id", [-1, True, "3", 1.0, None])
def test_bad_task_ids_are_refused(service, task_id):
    with pytest.raises(InvalidArgument):
        service.bind_task(task_id, "0")
    assert service.registry.tasks_bound == 0 and service.registry.tasks_bound_total == 0


def test_unknown_task_and_gpu_errors(service):
    reg = service.registry
    for call in (lambda: reg.binding(99), lambda: reg.stream(99), lambda: reg.attach(99),
                 lambda: reg.allocate(99, 256), lambda: reg.release(99), lambda: service.release_task(99),
                 lambda: service.allocate(99, 256), reg.current):
        with pytest.raises(UnknownTask):
            call()
    with pytest.raises(InvalidArgument):
        service.bind_task(1, "5")  # not an address of this executor
    with pytest.raises(InvalidArgument):
        reg.bind(1, gpu=5)
    with pytest.raises(InvalidArgument):
        reg.gpu(5)
    with pytest.raises(InvalidArgument):
        service.ordinal_of("7")
    with pytest.raises(InvalidArgument):
        service.bind_task(1, "0", priority="urgent")
    assert reg.tasks_bound == 0


def test_release_reclaims_leaked_allocations_and_reports_them(service):
    reg = service.registry
    service.bind_task(7, "0")
    service.bind_task(8, "0")
    leaks = [service.allocate(7, n) for n in (1000, 5000)]
    freed = service.allocate(7, 300)
    kept = service.allocate(8, 700)
    freed.free()
    pool = service.memory_pool(0)
    assert pool.statistics().live_allocations == 3
    report = reg.release(7)
    assert report == ReleaseReport(7, 2, 6000)
    assert not any(a.alive for a in leaks)
    for a in leaks:
        with pytest.raises(InvalidFree):
            a.free()  # the pool reclaimed it: a stale handle
    stats = pool.statistics()
    assert stats.live_allocations == 1
    assert stats.leaks_reclaimed == 2 and stats.leaked_bytes_reclaimed == 6000
    assert kept.alive  # another task's memory is untouched
    assert stats.in_use_bytes == 768  # the 700-byte block, rounded to 256
    kept.free()
    assert reg.release(8) == ReleaseReport(8, 0, 0)


def test_release_clears_the_callers_attachment(service):
    reg = service.registry
    service.bind_task(3, "0")
    reg.attach(3)
    assert reg.current().task_id == 3
    reg.release(3)
    with pytest.raises(UnknownTask):
        reg.current()


def test_attach_sets_the_threads_current_device(service):
    reg = service.registry
    service.bind_task(1, "1")
    service.bind_task(2, "0")

    def work(_):
        backend = service.backend
        before = backend.get_device()
        first = reg.attach(1)
        on_1 = backend.get_device()
        current = reg.current().task_id
        reg.attach(2)
        on_0 = backend.get_device()
        reg.detach()
        try:
            reg.current()
            detached = False
        except UnknownTask:
            detached = True
        return before, first.gpu, on_1, current, on_0, detached

    assert run_threads(1, work) == [(0, 1, 1, 1, 0, True)]


def test_task_on_gpu_1_allocates_from_gpu_1(service):
    b = service.bind_task(5, "1")
    a = service.allocate(5, 4096)
    assert a.device == 1 and a.owner == 5 and a.stream == b.stream
    assert service.memory_pool(1).statistics().live_allocations == 1
    assert service.memory_pool(0).statistics().live_allocations == 0
    assert service.memory_pool(0).statistics().reserved_bytes == 0
    backend = service.backend
    service.registry.attach(5)
    try:
        free1, total1 = backend.mem_get_info()
        assert free1 < total1  # the pool grew on GPU 1
        # the pointer is GPU 1 memory: usable in stream order on the task's (GPU 1) stream
        data = bytes(range(256)) * 16
        backend.copy_to_device_async(a.ptr, data, b.stream)
        out = bytearray(len(data))
        backend.copy_from_device_async(out, a.ptr, b.stream)
        backend.stream_synchronize(b.stream)
        assert out == data
        backend.set_device(0)
        assert backend.mem_get_info()[0] == backend.mem_get_info()[1]  # nothing on GPU 0
    finally:
        service.registry.detach()
        backend.set_device(0)
    a.free()


# GPU addresses ---------------------------------------------------------------------------------

def test_no_addresses_maps_every_device_to_itself(be2):
    assert resolve_gpu_addresses(None, be2) == {"0": 0, "1": 1}


def test_visible_devices_renumber(be2, clean_env):
    assert resolve_gpu_addresses(["3"], be2, visible_devices="2,3") == {"3": 1}
    assert resolve_gpu_addresses(["2", "3"], be2, visible_devices="2, 3") == {"2": 0, "3": 1}
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["1"], be2, visible_devices="2,3")
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["5"], be2, visible_devices="3,4,5")  # ordinal 2 of 2 devices
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert resolve_gpu_addresses(["3"], be2) == {"3": 1}
    assert resolve_gpu_addresses([3, 2], be2) == {"3": 1, "2": 0}


def test_plain_indices_without_visible_devices(be2, clean_env):
    assert resolve_gpu_addresses(["1"], be2) == {"1": 1}
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["2"], be2)  # only 2 devices


def test_uuid_addresses(be2):
    u0, u1 = be2.device_uuid(0), be2.device_uuid(1)
    assert resolve_gpu_addresses([u1, u0], be2) == {u1: 1, u0: 0}
    assert resolve_gpu_addresses([u1], be2, visible_devices="2,3") == {u1: 1}  # UUIDs are not renumbered
    # nvidia-smi style prefixes work while unambiguous
    prefix = u1[:12]
    assert not u0.startswith(prefix)
    assert resolve_gpu_addresses([prefix], be2) == {prefix: 1}
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["GPU-"], be2)  # matches both
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["GPU-00000000-0000-0000-0000-000000000000"], be2)


def test_duplicate_and_unknown_addresses_are_refused(be2, clean_env):
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["0", "0"], be2)
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["0", " 0"], be2)
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["0", be2.device_uuid(0)], be2)  # two addresses, one GPU
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["a", "b"], be2, address_map={"a": 0, "b": 0})
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["gpu0"], be2)
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["-1"], be2)


def test_address_map_overrides(be2, clean_env):
    assert resolve_gpu_addresses(["0", "1"], be2, address_map={"0": 1, "1": 0}) == {"0": 1, "1": 0}
    assert resolve_gpu_addresses(["7"], be2, visible_devices="2,3", address_map={"7": 0}) == {"7": 0}
    with pytest.raises(InvalidArgument):
        resolve_gpu_addresses(["0"], be2, address_map={"0": 2})


def test_parse_address_map():
    assert parse_address_map("0:1,1:0") == {"0": 1, "1": 0}
    assert parse_address_map(" 0 : 1 , 1:0 ,") == {"0": 1, "1": 0}
    assert parse_address_map("") == {}
    uuid = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"
    assert parse_address_map(f"{uuid}:1") == {uuid: 1}
    for bad in ("0", "0:", ":1", "0:x", "0:-1", "0:1,0:0", "0:1.5"):
        with pytest.raises(InvalidArgument):
            parse_address_map(bad)


def test_parse_address_map_duplicate_with_spaces():
    with pytest.raises(InvalidArgument):
        parse_address_map("0:1,0 :0")


def test_service_uses_addresses_and_visible_devices(clean_env):
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with CudaBridgeService(make_config(gpu_addresses="3")) as svc:
        assert svc.addresses == {"3": 1}
        assert list(svc.gpus) == [1]
        assert svc.ordinal_of("3") == 1
        b = svc.bind_task(1)  # the only GPU of this executor
        assert (b.gpu, b.address) == (1, "3")
        with pytest.raises(InvalidArgument):
            svc.bind_task(2, "2")
        with pytest.raises(InvalidArgument):
            svc.memory_pool(0)


def test_service_address_map(clean_env):
    with CudaBridgeService(make_config(gpu_addresses="0,1", gpu_address_map="0:1,1:0")) as svc:
        assert svc.addresses == {"0": 1, "1": 0}
        assert svc.bind_task(1, "0").gpu == 1
        assert svc.bind_task(2, "1").gpu == 0


# configuration ---------------------------------------------------------------------------------

def test_defaults():
    cfg = ServiceConfig()
    assert cfg.backend == "auto" and cfg.streams_per_gpu == 32 and cfg.high_priority_streams == 4
    assert cfg.pool_limit == (None, 0.9)
    assert set(ServiceConfig.DOCS) == set(ServiceConfig.__dataclass_fields__)


def test_from_mapping_camel_case():
    conf = {
        SPARK_PREFIX + "backend": "emulated",
        SPARK_PREFIX + "streamsPerGpu": "8",
        SPARK_PREFIX + "highPriorityStreams": "2",
        SPARK_PREFIX + "streamPolicy": "idle-first",
        SPARK_PREFIX + "poolLimit": "8g",
        SPARK_PREFIX + "poolInitial": "64m",
        SPARK_PREFIX + "gpuAddressMap": "0:1",
        SPARK_PREFIX + "emulatedDevices": 3,
        SPARK_PREFIX + "taskBind": "ahead",      # a plugin key: not the service's, skipped
        "spark.executor.cores": "4",
    }
    cfg = ServiceConfig.from_mapping(conf)
    assert cfg.backend == "emulated"
    assert cfg.streams_per_gpu == 8 and cfg.high_priority_streams == 2 and cfg.emulated_devices == 3
    assert cfg.stream_policy == "idle-first"
    assert cfg.pool_limit == (8 << 30, 1.0)   # parsed once, by its type
    assert cfg.pool_initial == 64 << 20
    assert cfg.gpu_address_map == "0:1"
    assert cfg.gpu_addresses is None and cfg.log_level == "INFO"  # untouched defaults


@pytest.mark.parametrize("key,suggestion", [("streams_per_gpu", "streamsPerGpu"), ("poolLimt", "poolLimit"),
                                            ("pool.limit", "poolLimit"), ("StreamPolicy", "streamPolicy"),
                                            ("somethingNew", None)])
def test_unknown_or_misspelled_keys_are_refused_with_the_nearest(key, suggestion):
    with pytest.raises(InvalidArgument, match="unknown key spark.cudabridge." + key.replace(".", r"\.")) as info:
        ServiceConfig.from_mapping({SPARK_PREFIX + key: "1"})
    if suggestion:
        assert f"did you mean spark.cudabridge.{suggestion}?" in str(info.value)
    else:
        assert "no key is close" in str(info.value)


def test_from_mapping_other_prefix_and_from_env():
    cfg = ServiceConfig.from_mapping({"x.streamsPerGpu": "3", SPARK_PREFIX + "streamsPerGpu": "9"}, prefix="x.")
    assert cfg.streams_per_gpu == 3
    env = {"CUDABRIDGE_STREAMS_PER_GPU": "5", "CUDABRIDGE_BACKEND": "emulated", "OTHER": "2"}
    cfg = ServiceConfig.from_env(env)
    assert cfg.streams_per_gpu == 5 and cfg.backend == "emulated"
    with pytest.raises(InvalidArgument, match="unknown environment variable"):   # tests/test_settings.py has more
        ServiceConfig.from_env({**env, "CUDABRIDGE_NOPE": "1"})


@pytest.mark.parametrize("conf", [
    {"backend": "gpu"},
    {"streamsPerGpu": "eight"},
    {"streamsPerGpu": "0"},
    {"highPriorityStreams": "-1"},
    {"emulatedDevices": "0"},
    {"streamPolicy": "fifo"},
    {"poolLimit": "lots"},
    {"poolLimit": "1.5"},
    {"poolLimit": "-0.5"},
    {"poolInitial": "-1"},
    {"emulatedMemory": "16q"},
    {"streamsPerGpu": None},
])
def test_from_mapping_bad_values_raise(conf):
    with pytest.raises(InvalidArgument):
        ServiceConfig.from_mapping({SPARK_PREFIX + k: v for k, v in conf.items()})


@pytest.mark.parametrize("kwargs", [
    {"streams_per_gpu": True}, {"streams_per_gpu": 2.0}, {"emulated_devices": 0}, {"high_priority_streams": -1},
])
def test_constructor_bad_values_raise(kwargs):
    with pytest.raises(InvalidArgument):
        ServiceConfig(**kwargs)


def test_zero_high_priority_streams_allowed():
    assert ServiceConfig(high_priority_streams=0).high_priority_streams == 0


@pytest.mark.parametrize("text, expected", [
    ("0.9", (None, 0.9)), ("0.5", (None, 0.5)), ("1.0", (None, 1.0)),
    ("512m", (512 << 20, 1.0)), ("1073741824", (1 << 30, 1.0)), ("8G", (8 << 30, 1.0)),
])
def test_pool_limit_bytes_or_fraction(text, expected):
    assert ServiceConfig(pool_limit=text).pool_limit == expected


@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("1024", 1024), (2048, 2048), (" 512m ", 512 << 20), ("512M", 512 << 20), ("1k", 1024),
    ("1kb", 1024), ("8g", 8 << 30), ("8GB", 8 << 30), ("2t", 2 << 40), ("5b", 5),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "g", "1.5g", "-1", "10x", "1bk", "eight", "1e9", None])
def test_parse_bytes_refuses(text):
    with pytest.raises(InvalidArgument) as info:
        parse_bytes(text, "pool_initial")
    assert "pool_initial" in str(info.value)


# service lifetime and statistics ---------------------------------------------------------------

def test_service_shape(service):
    assert service.backend.name == "emulated"
    assert service.addresses == {"0": 0, "1": 1}
    for ordinal in (0, 1):
        assert len(service.stream_pool(ordinal).handles) == STREAMS + 1
        assert service.memory_pool(ordinal).limit == 32 * MiB
        assert service.memory_pool(ordinal).device == ordinal
    assert os.environ[MAX_CONNECTIONS_ENV] == str(STREAMS + 1)


def test_service_close_releases_tasks_and_refuses_binds(service):
    service.bind_task(1, "0")
    service.bind_task(2, "1")
    service.allocate(1, 1000)
    service.allocate(2, 256)
    service.allocate(2, 256)
    reports = service.close()
    assert sorted(reports, key=lambda r: r.task_id) == [ReleaseReport(1, 1, 1000), ReleaseReport(2, 2, 512)]
    assert service.registry.tasks_bound == 0
    with pytest.raises(PoolClosed):
        service.bind_task(3, "0")
    with pytest.raises(PoolClosed):
        service.registry.bind(3, 0)
    for ordinal in (0, 1):
        assert service.stream_pool(ordinal).closed
        assert service.memory_pool(ordinal).closed
    assert service.close() == []  # idempotent


def test_service_with_a_borrowed_backend_leaves_it_open(clean_env):
    backend = EmulatedBackend(devices=1, memory_bytes=64 * MiB)
    try:
        svc = CudaBridgeService(make_config(emulated_devices=1), backend=backend)
        s = svc.stream_pool(0).handles[0]
        svc.close()
        # the pool's streams are gone, the backend itself still works
        with pytest.raises(CudaError):
            backend.stream_query(s)
        t = backend.stream_create()
        spin_async(backend, t, 0.01)
        backend.stream_synchronize(t)
    finally:
        backend.close()


def test_service_statistics_totals(service):
    service.bind_task(1, "0")
    service.bind_task(2, "1")
    service.bind_task(3, "1")
    service.allocate(1, 1000)  # 1024 block bytes
    service.allocate(2, 256)   # 256
    service.allocate(3, 300)   # 512
    stats = service.statistics()
    assert stats.backend == "emulated"
    assert stats.gpus == 2 and stats.streams == 2 * (STREAMS + 1)
    assert stats.tasks_bound == 3 and stats.tasks_bound_total == 3 and stats.streams_in_use == 3
    assert stats.memory[0].in_use_bytes == 1024 and stats.memory[1].in_use_bytes == 768
    totals = stats.totals()
    assert "device" not in totals
    assert totals["in_use_bytes"] == 1792
    assert totals["live_allocations"] == 3
    assert totals["limit_bytes"] == 64 * MiB
    assert totals["reserved_bytes"] == stats.memory[0].reserved_bytes + stats.memory[1].reserved_bytes > 0
    assert totals["allocations"] == 3
    assert (totals["gpus"], totals["streams"], totals["tasks_bound"]) == (2, 2 * (STREAMS + 1), 3)
    assert stats.as_dict()["totals"] == totals
    service.release_task(2)
    after = service.statistics()
    assert after.tasks_bound == 2 and after.tasks_bound_total == 3 and after.streams_in_use == 2
    assert after.totals()["in_use_bytes"] == 1536
    assert after.totals()["leaks_reclaimed"] == 1
    assert after.totals()["peak_in_use_bytes"] == 1792
