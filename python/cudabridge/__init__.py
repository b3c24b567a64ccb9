"""spark-cuda-bridge: per-executor GPU streams, task binding and stream-ordered memory for Spark."""

from .config import ServiceConfig
from .device import LEGACY_STREAM, PER_THREAD_STREAM, DeviceBackend, open_backend
from .errors import (
    CudaBridgeError,
    CudaError,
    InvalidArgument,
    InvalidFree,
    OutOfDeviceMemory,
    PoolClosed,
    UnknownStream,
    UnknownTask,
)
from .memory import Allocation, PoolStatistics, StreamOrderedMemoryPool
from .service import CudaBridgeService, ServiceStatistics
from .stream_pool import StreamPool
from .task_registry import ReleaseReport, TaskBinding, TaskRegistry

__version__ = "0.1.0"

__all__ = [
    "LEGACY_STREAM", "PER_THREAD_STREAM", "Allocation", "CudaBridgeError", "CudaBridgeService", "CudaError",
    "DeviceBackend", "InvalidArgument", "InvalidFree", "OutOfDeviceMemory", "PoolClosed", "PoolStatistics",
    "ReleaseReport", "ServiceConfig", "ServiceStatistics", "StreamOrderedMemoryPool", "StreamPool", "TaskBinding",
    "TaskRegistry", "UnknownStream", "UnknownTask", "open_backend",
]
