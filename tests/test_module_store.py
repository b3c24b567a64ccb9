"""The on-disk cache of compiled modules (spark.cudabridge.moduleCacheDir): entries keyed by the
module cache key, written atomically, read back by a later process instead of compiling; a damaged
entry is ignored and compiled again; a failed compile is never written. The store is tested here on
plain files, the loader with NVRTC and the driver stood in for; on a GPU (marked `gpu`) a second
service with the same directory loads without compiling."""

from __future__ import annotations

import json
import os
import stat
import threading

import numpy as np
import pytest

from cudabridge.config import ServiceConfig
from cudabridge.errors import InvalidArgument
from cudabridge.kernels.module_loader import ModuleLoader
from cudabridge.kernels.module_store import ModuleStore
from cudabridge.kernels.modules import ModuleLoadError, ModuleSource

PTX = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{ ret; }\n"
KEY = "ab" * 32


def test_an_entry_round_trips_and_leaves_no_temporary_file(tmp_path):
    store = ModuleStore(str(tmp_path / "cache"))            # made at the first write
    assert store.get(KEY) is None and store.misses == 1
    assert store.put(KEY, (PTX, {"&ns::v": "_ZN2ns1vE"}), "compute_90/nvrtc(13, 5)")
    assert os.listdir(tmp_path / "cache") == [f"{KEY}.json"]
    again = ModuleStore(str(tmp_path / "cache"))             # another process, say
    assert again.get(KEY) == (PTX, {"&ns::v": "_ZN2ns1vE"})
    assert again.statistics() == {"hits": 1, "misses": 0, "writes": 0, "ignored": 0, "write_failures": 0,
                                  "untrusted_directory": 0, "untrusted_entries": 0}
    assert json.loads((tmp_path / "cache" / f"{KEY}.json").read_text())["target"] == "compute_90/nvrtc(13, 5)"


@pytest.mark.parametrize("damage", [
    lambda e: "{not json",
    lambda e: json.dumps({**e, "format": 2}),
    lambda e: json.dumps({**e, "digest": "cd" * 32}),
    lambda e: json.dumps({**e, "ptx": e["ptx"].replace("ret", "bra")}),   # the checksum differs
    lambda e: json.dumps({**e, "lowered": {"a": 1}}),
    lambda e: json.dumps({**e, "ptx": None}),
    lambda e: json.dumps([e]),
    lambda e: json.dumps(e)[: len(json.dumps(e)) // 2],
    lambda e: b"\xff\xfe binary".decode("latin-1"),
], ids=["not-json", "format", "other-key", "checksum", "lowered", "no-ptx", "not-an-object", "truncated", "binary"])
def test_a_damaged_entry_is_ignored_and_counted(tmp_path, damage, caplog):
    store = ModuleStore(str(tmp_path))
    store.put(KEY, (PTX, {}))
    path = tmp_path / f"{KEY}.json"
    path.write_text(damage(json.loads(path.read_text())), encoding="latin-1")
    assert store.get(KEY) is None
    assert (store.ignored, store.misses, store.hits) == (1, 1, 0)
    assert "ignoring" in caplog.text and KEY in caplog.text
    store.put(KEY, (PTX, {}))                               # compiled again: the entry is whole again
    assert store.get(KEY) == (PTX, {})


def test_an_unwritable_directory_costs_the_disk_cache_only(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = ModuleStore(str(blocker / "cache"))
    assert store.put(KEY, (PTX, {})) is False and store.write_failures == 1
    assert "could not write" in caplog.text
    assert store.get(KEY) is None                           # unreadable too: a miss, not an error


def test_keys_and_directories_are_checked(tmp_path):
    store = ModuleStore(str(tmp_path))
    for bad in ("../../etc/passwd", "AB" * 32, "ab" * 31, None):
        with pytest.raises(InvalidArgument, match="sha256 in lower-case hex"):
            store.get(bad)
    for bad in ("", "  ", None):
        with pytest.raises(InvalidArgument, match="needs a directory"):
            ModuleStore(bad)
    store.discard(KEY)                                      # absent: nothing to do


# --- the loader: a second "process" with the same directory loads without compiling ---------------

class _FakeNvrtc:
    class nvrtcResult:
        NVRTC_SUCCESS = 0

    @staticmethod
    def nvrtcVersion():
        return (0, 13, 5)


class _DriverStandIn:
    """The CUDA backend as CudaModule and the loader use it, without a GPU; ``refuse`` makes the
    driver refuse every PTX image (a damaged one)."""

    name = "cuda"
    runs_host_kernels = False   # compiled kernels, as CudaBackend (DeviceBackend's property)

    def __init__(self) -> None:
        self.nvrtc = _FakeNvrtc()
        self.loaded: list[bytes] = []
        self.refuse = False

    def compute_arch(self, gpu):
        return "compute_90"

    def module_load(self, image, gpu):
        if self.refuse:
            raise ModuleLoadError("cuModuleLoadData failed: CUDA_ERROR_INVALID_PTX")
        self.loaded.append(image)
        return object()


def _loader(directory, compiled=(PTX, {})) -> tuple[ModuleLoader, _DriverStandIn, list]:
    backend = _DriverStandIn()
    loader = ModuleLoader(backend, None, ServiceConfig(backend="emulated", module_cache_dir=directory))
    compiles: list[str] = []

    def compile(source, gpu):       # NVRTC stood in for: counts, and fails on "bad" source
        compiles.append(source.code)
        if "bad" in source.code:
            raise ModuleLoadError("the module did not compile", 'module.cu(1): error: identifier "bad"')
        return compiled
    loader.compile = compile
    return loader, backend, compiles


SOURCE = ModuleSource.of('extern "C" __global__ void k(float* p) {}')


def test_a_later_loader_with_the_same_directory_does_not_compile(tmp_path):
    first, _, compiles = _loader(str(tmp_path))
    m = first.load(SOURCE, 0)
    assert compiles == [SOURCE.code] and first.store.writes == 1 and "k" in m.entries
    second, backend, compiles2 = _loader(str(tmp_path))
    m2 = second.load(SOURCE, 0)
    assert compiles2 == [] and second.store.hits == 1 and m2.entries == m.entries
    assert backend.loaded == [PTX.encode() + b"\0"]
    other = ModuleSource.of(SOURCE.code, options=["-DX=1"])   # another key: compiled
    second.load(other, 0)
    assert compiles2 == [other.code]
    assert len(os.listdir(tmp_path)) == 2


def test_a_failed_compile_is_not_written_and_no_directory_means_no_store(tmp_path):
    loader, _, compiles = _loader(str(tmp_path))
    bad = ModuleSource.of('extern "C" __global__ void k(float* p) { bad; }')
    with pytest.raises(ModuleLoadError, match="did not compile"):
        loader.load(bad, 0)
    assert os.listdir(tmp_path) == [] and loader.store.writes == 0
    for unset in (None, "", "   "):
        off, _, compiles = _loader(unset)
        assert off.store is None
        off.load(SOURCE, 0)
        off.load(SOURCE, 0)                                    # the in-memory cache is the service's
        assert compiles == [SOURCE.code] * 2


def test_a_stored_entry_the_driver_refuses_is_compiled_again(tmp_path, caplog):
    first, _, _ = _loader(str(tmp_path))
    first.load(SOURCE, 0)
    second, backend, compiles = _loader(str(tmp_path))
    backend.refuse = True
    with pytest.raises(ModuleLoadError, match="INVALID_PTX"):   # refused twice: the fresh compile too
        second.load(SOURCE, 0)
    assert compiles == [SOURCE.code] and "refused the stored PTX" in caplog.text
    assert os.listdir(tmp_path) == []                           # discarded, and nothing written back
    backend.refuse = False
    second.load(SOURCE, 0)
    assert second.store.writes == 1


def test_a_damaged_entry_is_compiled_and_written_again(tmp_path):
    first, _, _ = _loader(str(tmp_path))
    first.load(SOURCE, 0)
    (entry,) = os.listdir(tmp_path)
    (tmp_path / entry).write_text("{")
    second, _, compiles = _loader(str(tmp_path))
    second.load(SOURCE, 0)
    assert compiles == [SOURCE.code] and second.store.ignored == 1 and second.store.writes == 1
    third, _, compiles3 = _loader(str(tmp_path))
    third.load(SOURCE, 0)
    assert compiles3 == [] and third.store.hits == 1


def test_the_setting_is_a_service_key():
    assert ServiceConfig.from_mapping({"spark.cudabridge.moduleCacheDir": "/tmp/x"}).module_cache_dir == "/tmp/x"
    assert ServiceConfig().module_cache_dir is None
    assert ServiceConfig.from_env({"CUDABRIDGE_MODULE_CACHE_DIR": "/var/cache/cb"}).module_cache_dir == "/var/cache/cb"


@pytest.mark.gpu
def test_on_a_gpu_a_second_service_with_the_same_directory_loads_without_compiling(tmp_path):
    from cudabridge.kernels import LaunchConfig
    from cudabridge.service import CudaBridgeService
    source = ModuleSource.of(r'''
template <typename T> __global__ void scale(T* p, int n, T a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= a;
}''', name_expressions=["scale<float>"])
    config = ServiceConfig(backend="cuda", streams_per_gpu=2, high_priority_streams=0, module_cache_dir=str(tmp_path))

    def run(service):
        k = service.load_module(source).kernel("scale<float>")      # found through the stored lowered name
        reg, be = service.registry, service.backend
        b = reg.bind(1)
        n = 4096
        p = reg.allocate(1, 4 * n)
        be.copy_to_device_async(p.ptr, bytearray(np.ones(n, dtype=np.float32).tobytes()), b.stream)
        reg.launch(1, k, LaunchConfig(n // 256, 256), [p, n, 3.0])
        out = bytearray(4 * n)
        be.copy_from_device_async(out, p.ptr, b.stream)
        be.stream_synchronize(b.stream)
        assert np.array_equal(np.frombuffer(out, dtype=np.float32), np.full(n, 3, dtype=np.float32))
        reg.release(1)

    with CudaBridgeService(config) as first:
        run(first)
        assert first.module_loader.compiles == 1 and first.module_loader.store.writes == 1
    with CudaBridgeService(config) as second:
        run(second)
        assert second.module_loader.compiles == 0 and second.module_loader.store.hits == 1
    (entry,) = [e for e in os.listdir(tmp_path) if e.endswith(".json")]
    (tmp_path / entry).write_text("damaged")
    with CudaBridgeService(config) as third:
        run(third)
        assert third.module_loader.compiles == 1 and third.module_loader.store.ignored == 1
    bad = ModuleSource.of('extern "C" __global__ void f(float* p) { p[0] = q; }')
    with CudaBridgeService(config) as fourth:
        with pytest.raises(ModuleLoadError, match="did not compile"):
            fourth.load_module(bad)
        assert fourth.module_loader.store.writes == 0 and len(os.listdir(tmp_path)) == 1


def test_a_deeply_nested_entry_is_ignored_as_a_damaged_one(tmp_path, caplog):
    """Issue 23, 6.10: JSON nested deeper than the decoder recurses is a damaged entry (logged,
    ignored, counted), not a RecursionError out of the load."""
    store = ModuleStore(str(tmp_path))
    for deep in ("[" * 200_000 + "]" * 200_000, '{"a":' * 200_000 + "1" + "}" * 200_000):
        (tmp_path / f"{KEY}.json").write_text(deep)
        assert store.get(KEY) is None
    assert (store.ignored, store.misses, store.hits) == (2, 2, 0) and "ignoring" in caplog.text
    assert store.put(KEY, (PTX, {})) and store.get(KEY) == (PTX, {})


# --- issue 23, 7: only the executor's user may write the cache --------------------------------------
# Anyone who can write an entry can make the executor load their PTX and launch it as the task's
# kernel over the task's memory. A planted entry here is consistent (the store's own key and
# format): only who owns and may write the directory and the file tells it from a real one.

PLANTED_PTX = PTX.replace("{ ret; }", "{ trap; }")


def _plant(directory, source=None, loader=None, mode=0o600) -> str:
    """Write a consistent entry for ``source`` as ``loader`` keys it (``KEY`` without them) into
    ``directory``, holding PLANTED_PTX; returns its path."""
    digest = KEY if source is None else source.digest(loader.target(0))
    assert ModuleStore(directory).put(digest, (PLANTED_PTX, {}), "compute_90")   # the store's own writer
    path = os.path.join(directory, f"{digest}.json")
    os.chmod(path, mode)
    assert ModuleStore._checked(json.loads(open(path, "rb").read()), digest)[0] == PLANTED_PTX
    return path


def _mode(path) -> int:
    return os.lstat(path).st_mode & 0o7777


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o730, 0o702],
                         ids=["world-writable", "sticky-like-tmp", "group-writable", "group-writes-only",
                              "others-write-only"])
def test_a_directory_others_may_write_is_not_used(tmp_path, mode, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    loader, backend, compiles = _loader(str(shared))
    planted = _plant(str(shared), SOURCE, loader)
    shared.chmod(mode)
    module = loader.load(SOURCE, 0)
    assert compiles == [SOURCE.code] and backend.loaded == [PTX.encode() + b"\0"]   # compiled, not planted
    assert "k" in module.entries
    stats = loader.store.statistics()
    assert stats["untrusted_directory"] == 2 and stats["hits"] == 0 and stats["writes"] == 0   # read and write
    assert os.listdir(shared) == [os.path.basename(planted)]                      # nothing written there
    loader.load(ModuleSource.of(SOURCE.code, options=["-DX=1"]), 0)
    assert loader.store.untrusted_directory == 4
    warnings = [r for r in caplog.records if "not using the module cache directory" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"                # once per store
    assert "writable by" in warnings[0].getMessage() and str(shared) in warnings[0].getMessage()
    shared.chmod(0o700)                                # made private: used again, the planted entry too
    assert ModuleStore(str(shared)).get(json.loads(open(planted).read())["digest"])[0] == PLANTED_PTX


def test_a_directory_of_another_user_is_not_used(tmp_path, caplog):
    """The directory's owner (os.stat's st_uid) must be the executor's user (os.geteuid())."""
    if os.geteuid() == 0:                              # root can make a directory another user's
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o755)
        _plant(str(foreign))
        os.chown(foreign, 65534, -1)
    else:                                              # any other user has one at hand
        foreign = tmp_path.anchor
        assert os.stat(foreign).st_uid != os.geteuid()
    store = ModuleStore(str(foreign))
    assert store.get(KEY) is None and store.put(KEY, (PTX, {})) is False
    assert (store.untrusted_directory, store.hits, store.writes, store.write_failures) == (2, 0, 0, 0)
    assert "is owned by uid" in caplog.text


@pytest.mark.parametrize("make", ["world-writable", "group-writable", "symlink", "another-owner", "fifo"])
def test_an_entry_others_may_write_or_not_a_plain_file_is_ignored_and_compiled_again(tmp_path, make, caplog):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    loader, backend, compiles = _loader(str(cache))
    digest = SOURCE.digest(loader.target(0))
    entry = cache / f"{digest}.json"
    if make in ("world-writable", "group-writable"):
        _plant(str(cache), SOURCE, loader, mode=0o666 if make == "world-writable" else 0o660)
    elif make == "symlink":                            # a consistent entry, the link's target another's
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        os.symlink(_plant(str(elsewhere), SOURCE, loader), entry)
    elif make == "another-owner":
        if os.geteuid() != 0:
            pytest.skip("only root can give a file to another user")
        os.chown(_plant(str(cache), SOURCE, loader), 65534, -1)
    else:
        os.mkfifo(entry, 0o600)                        # would block a plain open()
    loaded: list = []
    t = threading.Thread(target=lambda: loaded.append(loader.load(SOURCE, 0)), daemon=True)
    t.start()
    t.join(30)                                         # (a load blocked on the FIFO fails here, not hangs)
    assert len(loaded) == 1, "the load did not return"
    module = loaded[0]
    assert compiles == [SOURCE.code] and backend.loaded == [PTX.encode() + b"\0"] and "k" in module.entries
    assert loader.store.statistics()["untrusted_entries"] == 1 and "module cache: ignoring" in caplog.text
    # written again in its place: a plain file of the executor's user, read and written by it alone
    st = os.lstat(entry)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and _mode(entry) == 0o600
    again, _, compiles2 = _loader(str(cache))
    again.load(SOURCE, 0)
    assert compiles2 == [] and again.store.hits == 1


def test_the_directory_is_made_private_and_entries_are_written_for_the_user_alone(tmp_path):
    old = os.umask(0o002)                              # a permissive umask takes nothing from the modes
    try:
        store = ModuleStore(str(tmp_path / "a" / "b" / "cache"))
        assert store.put(KEY, (PTX, {}))
    finally:
        os.umask(old)
    for made in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "cache"):
        assert _mode(made) == 0o700, (made, oct(_mode(made)))
    assert _mode(tmp_path) == 0o700                    # an existing parent is left as it was
    (entry,) = os.listdir(tmp_path / "a" / "b" / "cache")
    assert _mode(tmp_path / "a" / "b" / "cache" / entry) == 0o600
    assert store.get(KEY) == (PTX, {}) and store.untrusted_directory == store.untrusted_entries == 0
    # a directory the user made readable by others is used (only writing is refused)
    (tmp_path / "a" / "b" / "cache").chmod(0o755)
    assert ModuleStore(str(tmp_path / "a" / "b" / "cache")).get(KEY) == (PTX, {})


@pytest.mark.gpu
def test_on_a_gpu_a_planted_entry_runs_only_where_the_user_alone_could_have_written_it(tmp_path):
    """Issue 23, 7, on the real compiler and driver: an entry holding other PTX under a source's key
    (compiled by NVRTC here, stored by the store itself) is what the executor runs when the
    directory and the file are the user's alone (so only the user can have planted it); in a
    world-writable directory, or as a world-writable file, it is not loaded: the source is compiled
    and its kernel runs."""
    from cudabridge.kernels import LaunchConfig
    from cudabridge.service import CudaBridgeService
    code = r'''
extern "C" __global__ void scale(float* p, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= a;
}'''
    source, planted = ModuleSource.of(code), ModuleSource.of(code.replace("p[i] *= a", "p[i] = 666.0f"))
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    config = ServiceConfig(backend="cuda", streams_per_gpu=2, high_priority_streams=0, module_cache_dir=str(cache))

    def run(service) -> float:
        k = service.load_module(source).kernel("scale")
        reg, be = service.registry, service.backend
        b = reg.bind(1)
        n = 1024
        p = reg.allocate(1, 4 * n)
        be.copy_to_device_async(p.ptr, bytearray(np.ones(n, dtype=np.float32).tobytes()), b.stream)
        reg.launch(1, k, LaunchConfig(n // 256, 256), [p, n, 3.0])
        out = bytearray(4 * n)
        be.copy_from_device_async(out, p.ptr, b.stream)
        be.stream_synchronize(b.stream)
        reg.release(1)
        values = set(np.frombuffer(out, dtype=np.float32).tolist())
        assert len(values) == 1, values
        return values.pop()

    with CudaBridgeService(config) as planter:
        loader = planter.module_loader
        assert loader.store.put(source.digest(loader.target(0)), loader.compile(planted, 0), "planted")
    (entry,) = cache.iterdir()
    with CudaBridgeService(config) as trusting:          # the user's own directory and file: loaded
        assert run(trusting) == 666.0 and trusting.module_loader.compiles == 0
    cache.chmod(0o777)
    with CudaBridgeService(config) as shared_dir:
        assert run(shared_dir) == 3.0 and shared_dir.module_loader.compiles == 1
        assert shared_dir.module_loader.store.untrusted_directory == 2
    cache.chmod(0o700)
    entry.chmod(0o666)
    with CudaBridgeService(config) as shared_file:
        assert run(shared_file) == 3.0 and shared_file.module_loader.compiles == 1
        assert shared_file.module_loader.store.untrusted_entries == 1
    assert _mode(entry) == 0o600                          # written again, for the user alone
