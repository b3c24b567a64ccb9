"""Service configuration: every key, its default, and its Spark conf spelling.

Keys are ``spark.cudabridge.<name>``; :meth:`ServiceConfig.from_mapping` reads them from a Spark
conf (or any mapping), :meth:`ServiceConfig.from_env` from ``CUDABRIDGE_<NAME>`` variables.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import InvalidArgument

SPARK_PREFIX = "spark.cudabridge."


@dataclass(frozen=True)
class ServiceConfig:
    backend: str = "auto"                 # auto | cuda | emulated
    streams_per_gpu: int = 32             # normal-priority pool streams per GPU
    high_priority_streams: int = 4        # high-priority pool streams per GPU
    stream_policy: str = "round-robin"    # round-robin | idle-first
    pool_limit: str = "0.9"               # bytes ("8g", "512m", "1073741824") or a fraction of free memory
    pool_initial: str = "0"               # bytes reserved up front
    pool_growth: str = "auto"             # auto | segment | chunks
    gpu_addresses: str | None = None      # Spark resource addresses, comma-separated; None: all visible
    gpu_address_map: str | None = None    # explicit "address:ordinal,..." override
    emulated_devices: int = 1             # GPUs the emulated backend shows
    emulated_memory: str = "16g"          # memory of each emulated GPU
    log_level: str = "INFO"
    extra: Mapping[str, Any] = field(default_factory=dict)

    # Documentation of each key, used by the README and `python -m cudabridge config`.
    DOCS = {
        "backend": "device backend: auto (cuda when a GPU is visible, else emulated), cuda, emulated",
        "streams_per_gpu": "normal-priority streams in each GPU's pool (CUDA_DEVICE_MAX_CONNECTIONS follows it, up to 32)",
        "high_priority_streams": "high-priority streams in each GPU's pool",
        "stream_policy": "how a task's stream is picked: round-robin, or idle-first (queries streams)",
        "pool_limit": "most device memory a GPU's pool reserves: bytes (8g, 512m) or a fraction of free memory (0.9)",
        "pool_initial": "device memory reserved when the pool starts (bytes, 0 for none)",
        "pool_growth": "how blocks above 1 MiB get memory: segment (one expandable virtual-memory segment, "
                       "physical pieces moved out of free holes), chunks (cudaMalloc chunks), auto (segment where supported)",
        "gpu_addresses": "Spark GPU addresses this executor owns; unset: every visible GPU",
        "gpu_address_map": "explicit address:ordinal pairs, for when addresses are not visible ordinals",
        "emulated_devices": "number of GPUs the emulated backend shows",
        "emulated_memory": "memory of each emulated GPU (bytes, 16g)",
        "log_level": "log level of the cudabridge loggers",
    }

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "cuda", "emulated"):
            raise InvalidArgument(f"spark.cudabridge.backend={self.backend!r}: expected auto, cuda or emulated")
        for name in ("streams_per_gpu", "high_priority_streams", "emulated_devices"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "high_priority_streams" else 1):
                raise InvalidArgument(f"spark.cudabridge.{name}={value!r}: expected a positive integer")
        if self.stream_policy not in ("round-robin", "idle-first"):
            raise InvalidArgument(f"spark.cudabridge.stream_policy={self.stream_policy!r}: expected round-robin or idle-first")
        if self.pool_growth not in ("auto", "segment", "chunks"):
            raise InvalidArgument(f"spark.cudabridge.pool_growth={self.pool_growth!r}: expected auto, segment or chunks")
        self.limit()  # validate
        parse_bytes(self.pool_initial, "pool_initial")
        parse_bytes(self.emulated_memory, "emulated_memory")

    def limit(self) -> tuple[int | None, float]:
        """(bytes, None-fraction) or (None, fraction) from ``pool_limit``."""
        text = str(self.pool_limit).strip()
        try:
            value = float(text)
        except ValueError:
            return parse_bytes(text, "pool_limit"), 1.0
        if 0.0 < value <= 1.0 and ("." in text or value == 1.0):
            return None, value
        nbytes = parse_bytes(text, "pool_limit")
        if nbytes <= 0:
            raise InvalidArgument(f"spark.cudabridge.pool_limit={text!r}: expected a positive size or a fraction in (0, 1]")
        return nbytes, 1.0

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any], prefix: str = SPARK_PREFIX) -> "ServiceConfig":
        kwargs: dict[str, Any] = {}
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
        extra = {}
        for key, value in conf.items():
            if not key.startswith(prefix):
                continue
            name = key[len(prefix):].replace(".", "_").replace("-", "_")
            # camelCase spellings (streamsPerGpu) too, as Spark keys often are
            snake = "".join("_" + c.lower() if c.isupper() else c for c in name)
            name = snake if snake in fields else name
            if name not in fields:
                extra[key] = value
                continue
            kwargs[name] = _coerce(fields[name], value, key)
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "ServiceConfig":
        conf = {SPARK_PREFIX + k[len("CUDABRIDGE_"):].lower(): v for k, v in environ.items()
                if k.startswith("CUDABRIDGE_") and k[len("CUDABRIDGE_"):].lower() in cls.DOCS}
        return cls.from_mapping(conf)


def _coerce(f: dataclasses.Field, value: Any, key: str) -> Any:
    if f.type in ("int", int):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise InvalidArgument(f"{key}={value!r}: expected an integer") from None
    return None if value is None else str(value)


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


def parse_bytes(text: Any, name: str = "size") -> int:
    s = str(text).strip().lower()
    num = s.rstrip("kmgtb")
    unit = s[len(num):]
    try:
        value = int(num)
    except ValueError:
        raise InvalidArgument(f"{name}={text!r}: expected bytes such as 1073741824, 512m or 8g") from None
    if unit not in _UNITS or value < 0:
        raise InvalidArgument(f"{name}={text!r}: expected bytes such as 1073741824, 512m or 8g")
    return value * _UNITS[unit]
