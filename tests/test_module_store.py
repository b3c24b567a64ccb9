"""The on-disk cache of compiled modules (spark.cudabridge.moduleCacheDir): entries keyed by the
module cache key, written atomically, read back by a later process instead of compiling; a damaged
entry is ignored and compiled again; a failed compile is never written. The store is tested here on
plain files, the loader with NVRTC and the driver stood in for; on a GPU (marked `gpu`) a second
service with the same directory loads without compiling."""

from __future__ import annotations

import json
import os

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
    assert again.statistics() == {"hits": 1, "misses": 0, "writes": 0, "ignored": 0, "write_failures": 0}
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
