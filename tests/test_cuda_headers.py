"""The CUDA headers NVRTC compiles find (<cuda_fp16.h>, CCCL's <cuda/std/...>): the include
directories are discovered once per process from the NVIDIA wheels, $CUDA_PATH / $CUDA_HOME and the
system's toolkits (a filesystem search, tested here on made-up trees), passed as --include-path
unless the options give their own, part of the cache key, and named in the error when a header is
missing. With NVRTC installed (no GPU needed) a kernel using both compiles; on a GPU (marked `gpu`)
it runs."""

from __future__ import annotations

import os

import numpy as np
import pytest

from cudabridge.kernels.cuda_headers import CudaHeaders, cuda_version_major, find_cuda_headers
from cudabridge.kernels.modules import ModuleLoadError, ModuleSource


def _toolkit(root, version: int = 13000, cccl: str | None = "cccl"):
    """A toolkit include directory: cuda_runtime.h, its CUDART_VERSION, CCCL under ``cccl``
    (CUDA 13), in the include itself ("", CUDA 12) or nowhere (None)."""
    inc = root / "include"
    inc.mkdir(parents=True)
    (inc / "cuda_runtime.h").write_text("// runtime\n")
    (inc / "cuda_fp16.h").write_text("// fp16\n")
    (inc / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION  {version}\n")
    if cccl is not None:
        std = inc / cccl / "cuda" / "std" if cccl else inc / "cuda" / "std"
        std.mkdir(parents=True)
        (std / "version").write_text("// cccl\n")
    return inc


def _find(**kw) -> CudaHeaders:
    kw.setdefault("use_pathfinder", False)
    kw.setdefault("environ", {})
    kw.setdefault("system_dirs", ())
    kw.setdefault("site_dirs", ())
    return find_cuda_headers(**kw)


def test_a_cuda_13_wheel_on_the_python_path_is_found_with_its_cccl(tmp_path):
    site = tmp_path / "site"
    inc = _toolkit(site / "nvidia" / "cu13")
    _toolkit(tmp_path / "cuda-home", 12080, cccl="")
    found = _find(site_dirs=[str(tmp_path / "elsewhere"), str(site)], environ={"CUDA_HOME": str(tmp_path / "cuda-home")})
    assert found.include_dirs == (str(inc), str(inc / "cccl"))        # wheels come before CUDA_HOME
    assert found.options() == [f"--include-path={inc}", f"--include-path={inc / 'cccl'}"]
    assert cuda_version_major(str(inc)) == 13


def test_cuda_12_wheels_have_cccl_in_a_wheel_of_its_own(tmp_path):
    site = tmp_path / "site"
    runtime = _toolkit(site / "nvidia" / "cuda_runtime", 12080, cccl=None)
    cccl = site / "nvidia" / "cuda_cccl" / "include" / "cuda" / "std"
    cccl.mkdir(parents=True)
    (cccl / "version").write_text("//\n")
    found = _find(site_dirs=[str(site)])
    assert found.include_dirs == (str(runtime), str(site / "nvidia" / "cuda_cccl" / "include"))


def test_cuda_home_then_the_system_toolkits_newest_first(tmp_path):
    home = _toolkit(tmp_path / "home", 12040, cccl="")     # CUDA 12: CCCL inside the include itself
    assert _find(environ={"CUDA_HOME": str(tmp_path / "home")}).include_dirs == (str(home),)
    old, new = _toolkit(tmp_path / "cuda-12.4"), _toolkit(tmp_path / "cuda-12.10")
    found = _find(system_dirs=[str(tmp_path / "cuda" / "include"), str(tmp_path / "cuda-*" / "include")])
    assert found.include_dirs[0] == str(new), found            # 12.10 is newer than 12.4
    assert old != new


def test_the_toolkit_of_nvrtcs_major_version_is_preferred(tmp_path):
    site = tmp_path / "site"
    _toolkit(site / "nvidia" / "cuda_runtime", 12080, cccl="")
    home = _toolkit(tmp_path / "home", 13000)
    kw = dict(site_dirs=[str(site)], environ={"CUDA_PATH": str(tmp_path / "home")})
    assert _find(**kw).include_dirs[0] == str(site / "nvidia" / "cuda_runtime" / "include")   # first found
    assert _find(prefer_major=13, **kw).include_dirs == (str(home), str(home / "cccl"))
    assert _find(prefer_major=11, **kw).include_dirs[0] == str(site / "nvidia" / "cuda_runtime" / "include")


def test_none_found_says_where_it_looked(tmp_path):
    (tmp_path / "empty" / "include").mkdir(parents=True)     # no cuda_runtime.h: not a toolkit
    found = _find(site_dirs=[str(tmp_path)], environ={"CUDA_HOME": str(tmp_path / "empty")},
                  system_dirs=[str(tmp_path / "cuda" / "include")])
    assert found.include_dirs == () and found.options() == [] and found.key() == "none"
    hint = found.hint("cuda_fp16.h")
    for where in ("nvidia/cu13/include and nvidia/cuda_runtime/include under the 1 directories of the Python path",
                  f"$CUDA_HOME/include ({tmp_path / 'empty' / 'include'})", "$CUDA_PATH/include (unset)",
                  str(tmp_path / "cuda" / "include"), "<cuda_fp16.h>", "--include-path"):
        assert where in hint, hint


def test_the_include_directories_are_part_of_the_cache_key(tmp_path):
    a, b = _toolkit(tmp_path / "a"), _toolkit(tmp_path / "b")
    src = ModuleSource.of('#include <cuda_fp16.h>\nextern "C" __global__ void k() {}')
    keys = {src.digest(f"compute_90/nvrtc(13, 0)/include={_find(environ={'CUDA_HOME': str(d.parent)}).key()}")
            for d in (a, b)}
    assert len(keys) == 2


HALF_SOURCE = r'''
#include <cuda_fp16.h>
#include <cuda/std/limits>
extern "C" __global__ void to_half(const float* x, __half* h, float* biggest, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = __float2half(x[i]);
    if (i == 0) *biggest = cuda::std::numeric_limits<float>::max();
}
'''



def test_with_nvrtc_the_found_headers_compile_fp16_and_cccl(nvrtc):
    from cudabridge.kernels.cuda_headers import cuda_headers, nvrtc_major
    from cudabridge.kernels.cuda_module import compile_to_ptx

    headers = cuda_headers(nvrtc_major(nvrtc))
    if not headers.include_dirs:
        pytest.skip(f"no CUDA headers here: {headers.hint('cuda_fp16.h')}")
    ptx, _ = compile_to_ptx(nvrtc, ModuleSource.of(HALF_SOURCE), "compute_90", headers)
    assert ".entry to_half" in ptx
    # options with include paths of their own: nothing is added (here: a directory without them)
    with pytest.raises(ModuleLoadError, match="could not open|cannot open") as info:
        compile_to_ptx(nvrtc, ModuleSource.of(HALF_SOURCE, options=[f"--include-path={os.getcwd()}"]),
                       "compute_90", headers)
    assert headers.include_dirs[0] not in info.value.summary


def test_with_nvrtc_a_missing_header_names_where_the_search_looked(tmp_path, nvrtc):
    from cudabridge.kernels.cuda_module import compile_to_ptx

    nothing = _find(system_dirs=[str(tmp_path / "include")])
    with pytest.raises(ModuleLoadError) as info:
        compile_to_ptx(nvrtc, ModuleSource.of(HALF_SOURCE), "compute_90", nothing)
    assert "no CUDA include directory was found for <cuda_fp16.h>" in info.value.summary
    assert str(tmp_path / "include") in str(info.value) and "cuda_fp16.h" in info.value.log


@pytest.mark.gpu
def test_on_a_gpu_a_kernel_using_fp16_and_cuda_std_runs():
    from cudabridge.config import ServiceConfig
    from cudabridge.kernels import LaunchConfig
    from cudabridge.service import CudaBridgeService
    with CudaBridgeService(ServiceConfig(backend="cuda", streams_per_gpu=4, high_priority_streams=0)) as service:
        assert "/include=none" not in service.module_loader.target(0), "no CUDA headers found on the GPU machine"
        k = service.load_module(ModuleSource.of(HALF_SOURCE)).kernel("to_half")
        assert k.signature == ("ptr", "ptr", "ptr", "i32")
        reg, be = service.registry, service.backend
        b = reg.bind(1)
        n = 1024
        x, h, big = reg.allocate(1, 4 * n), reg.allocate(1, 2 * n), reg.allocate(1, 4)
        values = np.linspace(-3, 3, n, dtype=np.float32)
        be.copy_to_device_async(x.ptr, bytearray(values.tobytes()), b.stream)
        reg.launch(1, k, LaunchConfig(n // 256, 256), [x, h, big, n])
        out, top = bytearray(2 * n), bytearray(4)
        be.copy_from_device_async(out, h.ptr, b.stream)
        be.copy_from_device_async(top, big.ptr, b.stream)
        be.stream_synchronize(b.stream)
        assert np.array_equal(np.frombuffer(out, dtype=np.float16), values.astype(np.float16))
        assert np.frombuffer(top, dtype=np.float32)[0] == np.finfo(np.float32).max
        reg.release(1)
