"""The real device, through NVIDIA's ``cuda-python`` bindings (``cuda.bindings``).

Every call's return code is checked and turned into :class:`cudabridge.errors.CudaError`
naming the call. User modules (``kernels/cuda_module.py``: compiled by NVRTC there) are loaded,
and their kernels launched, through the driver API on the runtime's primary context.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from ..errors import CudaError, InvalidArgument, ModuleLoadError
from .backend import INSTALLED_DRIVER, DeviceAllocationFailed, DeviceBackend, InstalledDriver, host_view
from .launch_config import DeviceLimits, KernelLimits

log = logging.getLogger(__name__)

def _load() -> tuple[Any, Any, Any]:
    from cuda.bindings import driver, nvrtc, runtime

    return runtime, driver, nvrtc


class CudaBackend(DeviceBackend):
    name = "cuda"

    @property
    def native_driver(self) -> InstalledDriver:
        return INSTALLED_DRIVER

    def __init__(self) -> None:
        self.rt, self.drv, self.nvrtc = _load()
        rt = self.rt
        self._success = rt.cudaError_t.cudaSuccess
        self._not_ready = rt.cudaError_t.cudaErrorNotReady
        self._oom = rt.cudaError_t.cudaErrorMemoryAllocation
        self._arch: dict[int, str] = {}          # per GPU: its architecture, its launch limits
        self._limits: dict[int, Any] = {}        # (a device's never change; read on first use)
        count = self.device_count()
        if count < 1:
            raise CudaError("cudaGetDeviceCount", 100, "cudaErrorNoDevice", "no CUDA device is visible")

    # plumbing -------------------------------------------------------------------------------
    def _check(self, call: str, result: Any) -> Any:
        err = result[0]
        if err != self._success:
            raise self._error(call, err)
        if len(result) == 1:
            return None
        return result[1] if len(result) == 2 else result[1:]

    def _error(self, call: str, err: Any) -> CudaError:
        code = int(err)
        name = getattr(err, "name", str(err))
        detail = ""
        try:
            if isinstance(err, self.drv.CUresult):
                r = self.drv.cuGetErrorString(err)
                if r[0] == self.drv.CUresult.CUDA_SUCCESS and r[1]:
                    detail = r[1].decode()
            else:
                r = self.rt.cudaGetErrorString(err)
                detail = r[1].decode() if isinstance(r[1], bytes) else str(r[1])
        except Exception:  # the message is a courtesy; the code is what matters
            pass
        return CudaError(call, code, name, detail)

    def driver_error(self, call: str, code: int) -> CudaError:
        """The error for a driver call's raw ``CUresult`` (one the native layer got)."""
        try:
            err = self.drv.CUresult(code)
        except ValueError:   # a code this binding does not know
            return CudaError(call, code, f"CUresult {code}")
        return self._error(call, err)

    # devices -------------------------------------------------------------------------------
    def device_count(self) -> int:
        return self._check("cudaGetDeviceCount", self.rt.cudaGetDeviceCount())

    def set_device(self, ordinal: int) -> None:
        self._check("cudaSetDevice", self.rt.cudaSetDevice(ordinal))

    def get_device(self) -> int:
        return self._check("cudaGetDevice", self.rt.cudaGetDevice())

    def device_uuid(self, ordinal: int) -> str:
        props = self._check("cudaGetDeviceProperties", self.rt.cudaGetDeviceProperties(ordinal))
        raw = bytes(props.uuid.bytes) if hasattr(props.uuid, "bytes") else bytes(props.uuid)
        h = raw[:16].hex()
        return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self._check("cudaMemGetInfo", self.rt.cudaMemGetInfo())
        return int(free), int(total)

    def context_active(self, ordinal: int) -> bool:
        drv = self.drv
        self._check("cuInit", drv.cuInit(0))
        dev = self._check("cuDeviceGet", drv.cuDeviceGet(ordinal))
        _flags, active = self._check("cuDevicePrimaryCtxGetState", drv.cuDevicePrimaryCtxGetState(dev))
        return bool(active)

    def device_synchronize(self) -> None:
        self._check("cudaDeviceSynchronize", self.rt.cudaDeviceSynchronize())

    # memory --------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        err, ptr = self.rt.cudaMalloc(nbytes)
        if err == self._oom:
            self.rt.cudaGetLastError()  # not sticky; clear it so later calls don't report it
            raise DeviceAllocationFailed(nbytes, "cudaMalloc: cudaErrorMemoryAllocation")
        if err != self._success:
            raise self._error("cudaMalloc", err)
        return int(ptr)

    def free(self, ptr: int) -> None:
        self._check("cudaFree", self.rt.cudaFree(ptr))

    def native_stream_query(self) -> int:
        # The same libcuda the bindings loaded (dlopen returns the loaded handle). Runtime stream
        # handles are driver CUstreams, so the driver's query answers for them.
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            return int(ctypes.cast(lib.cuStreamQuery, ctypes.c_void_p).value or 0)
        except (OSError, AttributeError):
            return 0

    # virtual memory --------------------------------------------------------------------------
    def _vmm_prop(self) -> Any:
        drv = self.drv
        prop = drv.CUmemAllocationProp()
        prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.get_device()
        return prop

    def vmm_granularity(self) -> int:
        drv = self.drv
        dev = self._check("cuDeviceGet", drv.cuDeviceGet(self.get_device()))
        attr = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        if not self._check("cuDeviceGetAttribute", drv.cuDeviceGetAttribute(attr, dev)):
            return 0
        flag = drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        return int(self._check("cuMemGetAllocationGranularity",
                               drv.cuMemGetAllocationGranularity(self._vmm_prop(), flag)))

    def va_reserve(self, nbytes: int) -> int:
        return int(self._check("cuMemAddressReserve", self.drv.cuMemAddressReserve(nbytes, 0, 0, 0)))

    def va_release(self, ptr: int, nbytes: int) -> None:
        self._check("cuMemAddressFree", self.drv.cuMemAddressFree(ptr, nbytes))

    def phys_create(self, nbytes: int) -> int:
        drv = self.drv
        err, handle = drv.cuMemCreate(nbytes, self._vmm_prop(), 0)
        if err == drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise DeviceAllocationFailed(nbytes, "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY")
        if err != drv.CUresult.CUDA_SUCCESS:
            raise self._error("cuMemCreate", err)
        return int(handle)

    def phys_release(self, handle: int) -> None:
        self._check("cuMemRelease", self.drv.cuMemRelease(handle))

    def mem_map(self, ptr: int, nbytes: int, handle: int) -> None:
        drv = self.drv
        self._check("cuMemMap", drv.cuMemMap(ptr, nbytes, 0, handle, 0))
        desc = drv.CUmemAccessDesc()
        desc.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.get_device()
        desc.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        try:
            self._check("cuMemSetAccess", drv.cuMemSetAccess(ptr, nbytes, [desc], 1))
        except BaseException:
            self.drv.cuMemUnmap(ptr, nbytes)
            raise

    def mem_unmap(self, ptr: int, nbytes: int) -> None:
        self._check("cuMemUnmap", self.drv.cuMemUnmap(ptr, nbytes))

    # streams -------------------------------------------------------------------------------
    def stream_priority_range(self) -> tuple[int, int]:
        least, greatest = self._check("cudaDeviceGetStreamPriorityRange", self.rt.cudaDeviceGetStreamPriorityRange())
        return int(least), int(greatest)

    def stream_create(self, priority: int = 0) -> int:
        s = self._check(
            "cudaStreamCreateWithPriority",
            self.rt.cudaStreamCreateWithPriority(self.rt.cudaStreamNonBlocking, priority),
        )
        return int(s)

    def stream_destroy(self, stream: int) -> None:
        self._check("cudaStreamDestroy", self.rt.cudaStreamDestroy(stream))

    def stream_query(self, stream: int) -> bool:
        err = self.rt.cudaStreamQuery(stream)[0]
        if err == self._success:
            return True
        if err == self._not_ready:
            return False
        raise self._error("cudaStreamQuery", err)

    def stream_synchronize(self, stream: int) -> None:
        self._check("cudaStreamSynchronize", self.rt.cudaStreamSynchronize(stream))

    def stream_wait_event(self, stream: int, event: int) -> None:
        self._check("cudaStreamWaitEvent", self.rt.cudaStreamWaitEvent(stream, event, 0))

    # events --------------------------------------------------------------------------------
    def event_create(self) -> int:
        ev = self._check("cudaEventCreateWithFlags", self.rt.cudaEventCreateWithFlags(self.rt.cudaEventDisableTiming))
        return int(ev)

    def event_destroy(self, event: int) -> None:
        self._check("cudaEventDestroy", self.rt.cudaEventDestroy(event))

    def event_record(self, event: int, stream: int) -> None:
        self._check("cudaEventRecord", self.rt.cudaEventRecord(event, stream))

    def event_query(self, event: int) -> bool:
        err = self.rt.cudaEventQuery(event)[0]
        if err == self._success:
            return True
        if err == self._not_ready:
            return False
        raise self._error("cudaEventQuery", err)

    def event_synchronize(self, event: int) -> None:
        self._check("cudaEventSynchronize", self.rt.cudaEventSynchronize(event))

    # copies --------------------------------------------------------------------------------
    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._check(
            "cudaMemcpyAsync",
            self.rt.cudaMemcpyAsync(dst, src, nbytes, self.rt.cudaMemcpyKind.cudaMemcpyDefault, stream),
        )

    @staticmethod
    def _address(view: memoryview) -> int:
        if view.readonly:
            # Read-only buffers (bytes) have no ctypes-writable alias; c_char_p gives their address.
            return ctypes.cast(ctypes.c_char_p(view.obj if isinstance(view.obj, bytes) else bytes(view)),
                               ctypes.c_void_p).value or 0
        return ctypes.addressof(ctypes.c_char.from_buffer(view))

    def alloc_pinned(self, nbytes: int) -> Any:
        ptr = self._check("cudaMallocHost", self.rt.cudaMallocHost(nbytes))
        return (ctypes.c_char * nbytes).from_address(int(ptr))

    def free_pinned(self, buffer: Any) -> None:
        self._check("cudaFreeHost", self.rt.cudaFreeHost(ctypes.addressof(buffer)))

    def host_register(self, address: int, nbytes: int) -> Any:
        # portable: page-locked for every context, as alloc_pinned's memory is
        self._check("cudaHostRegister", self.rt.cudaHostRegister(address, nbytes, self.rt.cudaHostRegisterPortable))
        return (ctypes.c_char * nbytes).from_address(address)

    def host_unregister(self, region: Any) -> None:
        self._check("cudaHostUnregister", self.rt.cudaHostUnregister(ctypes.addressof(region)))

    def copy_to_device_async(self, dst: int, host: Any, stream: int) -> None:
        view = host_view(host, writable=False)
        if view.readonly and not (isinstance(view.obj, bytes) and len(view) == len(view.obj)):
            view = memoryview(bytearray(view))  # stage: we need a stable address we own
        n = len(view)
        if n == 0:
            return
        self._check(
            "cudaMemcpyAsync",
            self.rt.cudaMemcpyAsync(dst, self._address(view), n, self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream),
        )

    def copy_from_device_async(self, host: Any, src: int, stream: int) -> None:
        view = host_view(host, writable=True)
        n = len(view)
        if n == 0:
            return
        self._check(
            "cudaMemcpyAsync",
            self.rt.cudaMemcpyAsync(self._address(view), src, n, self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream),
        )

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        self._check("cudaMemsetAsync", self.rt.cudaMemsetAsync(ptr, value, nbytes, stream))

    # user modules (kernels/cuda_module.py) -----------------------------------------------------
    def compute_arch(self, ordinal: int) -> str:
        """The GPU's virtual architecture for NVRTC (``compute_90`` on an H100 or H200)."""
        arch = self._arch.get(ordinal)
        if arch is not None:
            return arch
        rt = self.rt
        major = self._check("cudaDeviceGetAttribute",
                            rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, ordinal))
        minor = self._check("cudaDeviceGetAttribute",
                            rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, ordinal))
        arch = self._arch[ordinal] = f"compute_{major}{minor}"
        return arch

    def module_load(self, image: bytes, ordinal: int) -> Any:
        prev = self.get_device()
        self.set_device(ordinal)
        try:
            self._check("cudaFree", self.rt.cudaFree(0))   # the primary context current on this thread
            err, module = self.drv.cuModuleLoadData(image)
            if err != self.drv.CUresult.CUDA_SUCCESS:
                raise ModuleLoadError(f"cuModuleLoadData failed: {err.name} (PTX for a newer architecture than "
                                      f"GPU {ordinal}'s, or a damaged image)")
            return module
        finally:
            self.set_device(prev)

    def module_function(self, module: Any, symbol: str, name: str) -> Any:
        err, fn = self.drv.cuModuleGetFunction(module, symbol.encode())
        if err != self.drv.CUresult.CUDA_SUCCESS:
            raise InvalidArgument(f"the module has no kernel {name!r} ({err.name})")
        return fn

    def param_layout(self, function: Any) -> list[tuple[int, int]] | None:
        """Each parameter's (offset, size) in the kernel's parameter buffer, as the compiled kernel
        has them (``cuFuncGetParamInfo``, asked for index 0, 1, ... until CUDA_ERROR_INVALID_VALUE:
        the driver has no parameter count call); None where the driver has no such call."""
        get = getattr(self.drv, "cuFuncGetParamInfo", None)
        if get is None:
            return None
        R = self.drv.CUresult
        out: list[tuple[int, int]] = []
        while True:
            err, offset, size = get(function, len(out))
            if err == R.CUDA_ERROR_INVALID_VALUE:
                return out
            if err in (R.CUDA_ERROR_NOT_SUPPORTED, R.CUDA_ERROR_NOT_FOUND):
                return None
            if err != R.CUDA_SUCCESS:
                raise self._error("cuFuncGetParamInfo", err)
            out.append((int(offset), int(size)))

    def module_global(self, module: Any, symbol: str, name: str, ordinal: int) -> tuple[int, int]:
        """(device address, size in bytes) of the module's global ``symbol`` (``cuModuleGetGlobal``),
        with GPU ``ordinal``'s primary context current: the module belongs to it."""
        prev = self.get_device()
        if prev != ordinal:
            self.set_device(ordinal)
        try:
            err, address, size = self.drv.cuModuleGetGlobal(module, symbol.encode())
        finally:
            if prev != ordinal:
                self.set_device(prev)
        if err == self.drv.CUresult.CUDA_ERROR_NOT_FOUND:
            raise InvalidArgument(f"the module has no global {name!r} ({err.name})")
        if err != self.drv.CUresult.CUDA_SUCCESS:
            raise self._error("cuModuleGetGlobal", err)
        return int(address), int(size)

    def device_limits(self, ordinal: int) -> Any:
        """What GPU ``ordinal`` allows a launch (cached: a device's limits never change)."""
        limits = self._limits.get(ordinal)
        if limits is None:
            A = self.rt.cudaDeviceAttr

            def attr(a: Any) -> int:
                return int(self._check("cudaDeviceGetAttribute", self.rt.cudaDeviceGetAttribute(a, ordinal)))
            limits = self._limits[ordinal] = DeviceLimits(
                max_threads_per_block=attr(A.cudaDevAttrMaxThreadsPerBlock),
                max_block=(attr(A.cudaDevAttrMaxBlockDimX), attr(A.cudaDevAttrMaxBlockDimY), attr(A.cudaDevAttrMaxBlockDimZ)),
                max_grid=(attr(A.cudaDevAttrMaxGridDimX), attr(A.cudaDevAttrMaxGridDimY), attr(A.cudaDevAttrMaxGridDimZ)),
                shared_per_block=attr(A.cudaDevAttrMaxSharedMemoryPerBlock),
                shared_per_block_optin=attr(A.cudaDevAttrMaxSharedMemoryPerBlockOptin))
        return limits

    def kernel_limits(self, function: Any) -> Any:
        F = self.drv.CUfunction_attribute

        def attr(a: Any) -> int:
            return int(self._check("cuFuncGetAttribute", self.drv.cuFuncGetAttribute(a, function)))
        return KernelLimits(max_threads_per_block=attr(F.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
                            static_shared=attr(F.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                            max_dynamic_shared=attr(F.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES))

    def raise_dynamic_shared(self, function: Any, nbytes: int) -> None:
        """Let ``function`` take ``nbytes`` of dynamic shared memory (past the 48 KiB default)."""
        F = self.drv.CUfunction_attribute
        self._check("cuFuncSetAttribute",
                    self.drv.cuFuncSetAttribute(function, F.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes))

    _CTYPES = {"ptr": ctypes.c_void_p, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
               "i64": ctypes.c_int64, "f32": ctypes.c_float, "f64": ctypes.c_double, "bool": ctypes.c_bool}

    def launch_kernel(self, function: Any, config: Any, stream: int, kinds: tuple[str, ...], values: list,
                      ordinal: int) -> None:
        """cuLaunchKernel on GPU ``ordinal``'s primary context, made current for the call: the
        kernel's function belongs to that GPU's module, whatever device the calling thread last
        used (an executor with several GPUs)."""
        args = (tuple(values), tuple(self._CTYPES[k] for k in kinds))
        (gx, gy, gz), (bx, by, bz) = config.grid, config.block
        prev = self.get_device()
        self._check("cudaSetDevice", self.rt.cudaSetDevice(ordinal))   # also makes the primary context current
        try:
            self._check("cuLaunchKernel", self.drv.cuLaunchKernel(function, gx, gy, gz, bx, by, bz,
                                                                  config.shared_bytes, stream, args, 0))
        finally:
            if prev != ordinal:
                self.set_device(prev)
