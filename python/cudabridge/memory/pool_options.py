"""A pool's options, checked once: what ``StreamOrderedMemoryPool(...)`` takes besides its backend,
device and streams. Every bad value is refused here, with InvalidArgument, before the pool
touches the device."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import MAX_BYTES
from ..errors import InvalidArgument, index_int
from ..modes import Mode
from .stream_arena import StreamArena

DEFAULT_HOST_WAIT_TIMEOUT_S = 300.0   # the longest the pool waits for a stream before OOM
# A stream's newest frees kept in its bins, out of the slow path's coalescing until growth is
# refused (stream_ordering.py says why): above the allocations of a repeating step (a CuPy chain of
# temporaries makes about 70, a PyTorch MLP step 18), small beside what a long task frees.
DEFAULT_CACHE_FREES = 256


class FastPath(Mode):
    AUTO = "auto"       # the C extension where built, else Python
    NATIVE = "native"
    PYTHON = "python"


class PoolGrowth(Mode):
    """How blocks above SMALL_REQUEST get memory."""
    AUTO = "auto"         # segment where the GPU has virtual memory management
    SEGMENT = "segment"   # one expandable virtual-memory segment
    CHUNKS = "chunks"     # cudaMalloc chunks


def owner_key(value: object) -> int | None:
    """An owner: None or an int (a Spark task attempt id)."""
    return None if value is None else index_int(value, "owner (a task attempt id)")


@dataclass(frozen=True)
class PoolOptions:
    limit_bytes: int | None = None          # the most the pool reserves; None: limit_fraction of free memory
    limit_fraction: float = 0.9
    initial_bytes: int = 0                  # reserved at creation, as one block
    arena_type: type[StreamArena] = StreamArena   # the tests' extension point (see the pool)
    fast_path: str = FastPath.AUTO
    growth: str = PoolGrowth.AUTO
    host_wait_timeout_s: float | None = DEFAULT_HOST_WAIT_TIMEOUT_S
    cache_frees: int = DEFAULT_CACHE_FREES  # a stream's newest frees it keeps until growth is refused

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "growth", PoolGrowth.parse(self.growth, "growth"))
        put(self, "fast_path", FastPath.parse(self.fast_path, "fast_path"))
        arena_type = self.arena_type
        if not (isinstance(arena_type, type) and issubclass(arena_type, StreamArena)):
            raise InvalidArgument(f"arena_type must be a StreamArena class, got {arena_type!r}")
        if arena_type is not StreamArena and self.fast_path == "native":
            raise InvalidArgument(f"fast_path='native' runs only the default composition, not arena_type={arena_type!r}")
        if self.limit_bytes is not None:
            limit = index_int(self.limit_bytes, "limit_bytes")
            if not 0 < limit <= MAX_BYTES:
                raise InvalidArgument(f"limit_bytes must be a positive int below 2**63, got {limit!r}")
            put(self, "limit_bytes", limit)
        fraction = self.limit_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
            raise InvalidArgument(f"limit_fraction must be a number in (0, 1], got {fraction!r}")
        initial = index_int(self.initial_bytes, "initial_bytes")
        if not 0 <= initial <= MAX_BYTES:
            raise InvalidArgument(f"initial_bytes must be a non-negative int below 2**63, got {initial!r}")
        put(self, "initial_bytes", initial)
        cache = index_int(self.cache_frees, "cache_frees")
        if not 0 <= cache <= 1 << 20:
            raise InvalidArgument(f"cache_frees must be an int in [0, 2**20], got {cache!r}")
        put(self, "cache_frees", cache)

    @property
    def default_composition(self) -> bool:
        """Whether the C fast path can run this composition."""
        return self.arena_type is StreamArena
