"""The stream-ordered memory pool and its parts."""

from .allocation import Allocation
from .statistics import PoolStatistics
from .stream_ordered_pool import ALIGNMENT, REUSE_POLICIES, StreamOrderedMemoryPool

__all__ = ["ALIGNMENT", "Allocation", "PoolStatistics", "REUSE_POLICIES", "StreamOrderedMemoryPool"]
