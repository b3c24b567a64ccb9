"""The stream-ordered memory pool and its parts."""

from .allocation import Allocation
from .statistics import PoolStatistics
from .stream_ordered_pool import ALIGNMENT, FastPath, PoolGrowth, StreamOrderedMemoryPool

__all__ = ["ALIGNMENT", "Allocation", "FastPath", "PoolGrowth", "PoolStatistics",            "StreamOrderedMemoryPool"]
