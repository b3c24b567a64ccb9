"""A stand-in for PyTorch on the emulated device: the compiled part of cudabridge's torch
allocator (``cudabridge.allocators._torch_allocator``) called the way PyTorch's
``CUDAPluggableAllocator`` calls it: from C++ through its function pointers, without the GIL, with
the current stream at each allocation and the same stream at its free (the allocation's), from
the tensor's deleter on whatever thread drops it. An exception thrown by the allocation becomes
``RuntimeError``, as PyTorch's bindings make it.
"""

from __future__ import annotations

import ctypes
import subprocess
import threading
from pathlib import Path
from typing import Any

from device_kernels import fill_u32_async

HERE = Path(__file__).resolve().parent
CALLER_SOURCE = HERE / "native" / "pluggable_caller.cpp"


def build_caller(out_dir: Path) -> ctypes.CDLL:
    out = out_dir / "pluggable_caller.so"
    subprocess.run(["g++", "-O1", "-fPIC", "-shared", str(CALLER_SOURCE), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.caller_alloc.restype = vp
    lib.caller_alloc.argtypes = [vp, sz, ctypes.c_int, vp, ctypes.c_char_p, sz]
    lib.caller_free.restype = None
    lib.caller_free.argtypes = [vp, vp, sz, ctypes.c_int, vp]
    lib.caller_record_stream.restype = ctypes.c_int
    lib.caller_record_stream.argtypes = [vp, vp, vp, ctypes.c_char_p, sz]
    lib.caller_reset.restype = None
    lib.caller_reset.argtypes = [vp]
    lib.caller_pairs_on_new_thread.restype = ctypes.c_longlong
    lib.caller_pairs_on_new_thread.argtypes = [vp, vp, sz, ctypes.c_int, vp, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                               sz]
    return lib


class StandinTensor:
    def __init__(self, torch: "StandinTorch", ptr: int, nbytes: int, device: int, stream: int) -> None:
        self._torch, self.data_ptr, self.nbytes, self.device, self.stream = torch, ptr, nbytes, device, stream

    def record_stream(self, stream: int) -> None:
        self._torch.record_stream(self, stream)

    def __del__(self) -> None:
        self._torch.free(self)


class StandinTorch:
    def __init__(self, backend: Any, part: Any, caller: ctypes.CDLL, device: int = 0) -> None:
        self.backend, self._caller, self._device = backend, caller, device
        self._fn = part.addresses()
        self._local = threading.local()

    def current_stream(self) -> int:
        return self._local.__dict__.get("stream", 0)

    def set_stream(self, stream: int) -> None:
        self._local.stream = stream

    def empty(self, nbytes: int) -> StandinTensor:
        err = ctypes.create_string_buffer(1024)
        stream = self.current_stream()
        ptr = self._caller.caller_alloc(self._fn["alloc"], nbytes, self._device, stream, err, len(err))
        if err.value:
            raise RuntimeError(err.value.decode())
        return StandinTensor(self, ptr or 0, nbytes, self._device, stream)

    def free(self, t: StandinTensor) -> None:
        self._caller.caller_free(self._fn["free"], t.data_ptr, t.nbytes, t.device, t.stream)

    def record_stream(self, t: StandinTensor, stream: int) -> None:
        err = ctypes.create_string_buffer(1024)
        if self._caller.caller_record_stream(self._fn["record_stream"], t.data_ptr, stream, err, len(err)) != 0:
            raise RuntimeError(err.value.decode())

    def pairs_on_new_thread(self, nbytes: int, stream: int, pairs: int, python_state: bool) -> float:
        """``pairs`` allocations, each freed at once, on a new native thread: with a Python thread
        state kept for its life (as PyTorch's autograd device threads), or none (a user's C++
        thread). The seconds they took."""
        err = ctypes.create_string_buffer(1024)
        took = self._caller.caller_pairs_on_new_thread(self._fn["alloc"], self._fn["free"], nbytes, self._device,
                                                       stream, pairs, int(python_state), err, len(err))
        if took < 0:
            raise RuntimeError(err.value.decode())
        return took / 1e9

    def empty_cache(self) -> None:
        self._caller.caller_reset(self._fn["reset"])

    def fill(self, t: StandinTensor, value: int, delay_s: float = 0.0, stream: int | None = None) -> None:
        fill_u32_async(self.backend, t.data_ptr, t.nbytes // 4, value,
                       self.current_stream() if stream is None else stream, delay_s)
