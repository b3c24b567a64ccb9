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
MIN_LIMIT_BYTES = 2 << 20   # a byte limit below one 2 MiB chunk makes a pool in which nothing fits
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


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
    backend_wrapper: str | None = None    # test setting: "module:callable" wrapping the backend
    host_wait_timeout: str = "300"        # seconds the pool waits for a stream before it gives up
    log_level: str = "INFO"
    extra: Mapping[str, Any] = field(default_factory=dict)

    # Documentation of each key, used by the README and `python -m cudabridge config`.
    DOCS = {
        "backend": "device backend: auto (cuda when a GPU is visible, else emulated), cuda, emulated",
        "streams_per_gpu": "normal-priority streams in each GPU's pool (CUDA_DEVICE_MAX_CONNECTIONS follows it, up to 32)",
        "high_priority_streams": "high-priority streams in each GPU's pool",
        "stream_policy": "how a task's stream is picked: round-robin, or idle-first (queries streams)",
        "pool_limit": "most device memory a GPU's pool reserves: bytes (1073741824, 512m, 8g; at least 2 MiB) "
                      "or, written with a decimal point, a fraction of free memory in (0, 1] (0.9, 1.0)",
        "pool_initial": "device memory reserved when the pool starts (bytes, 0 for none)",
        "pool_growth": "how blocks above 1 MiB get memory: segment (one expandable virtual-memory segment, "
                       "physical pieces moved out of free holes), chunks (cudaMalloc chunks), auto (segment where supported)",
        "gpu_addresses": "Spark GPU addresses this executor owns; unset: every visible GPU",
        "gpu_address_map": "explicit address:ordinal pairs, for when addresses are not visible ordinals",
        "emulated_devices": "number of GPUs the emulated backend shows",
        "emulated_memory": "memory of each emulated GPU (bytes, 16g; at least 2 MiB)",
        "backend_wrapper": "test setting, unset in production: module:callable (on the executor's Python path) "
                           "that takes the device backend and returns the backend the service uses "
                           "(fault injection: tests/faulty_backend.py)",
        "host_wait_timeout": "seconds the pool waits for a stream to finish before an allocation fails with "
                             "HostWaitTimeout naming it (instead of hanging on a hung stream)",
        "log_level": "log level of the cudabridge loggers: DEBUG, INFO, WARNING, ERROR or CRITICAL",
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
        if not isinstance(self.log_level, str) or self.log_level.upper() not in LOG_LEVELS:
            raise InvalidArgument(f"spark.cudabridge.log_level={self.log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
        self.wait_timeout_s()  # validate
        self.limit()  # validate
        parse_bytes(self.pool_initial, SPARK_PREFIX + "pool_initial")
        parse_bytes(self.emulated_memory, SPARK_PREFIX + "emulated_memory", minimum=MIN_LIMIT_BYTES)

    def wait_timeout_s(self) -> float:
        """``host_wait_timeout`` in seconds: a positive number."""
        try:
            value = float(str(self.host_wait_timeout).strip())
        except ValueError:
            value = float("nan")
        if not 0 < value < float("inf"):
            raise InvalidArgument(f"spark.cudabridge.host_wait_timeout={self.host_wait_timeout!r}: expected a positive "
                                  f"number of seconds such as 300 or 0.5")
        return value

    def limit(self) -> tuple[int | None, float]:
        """(bytes, None-fraction) or (None, fraction) from ``pool_limit``: a number with a
        decimal point is a fraction of free memory in (0, 1]; anything else is bytes (a bare
        integer, or with a suffix), at least 2 MiB. ``"1"`` is one byte (refused), not all."""
        text = str(self.pool_limit).strip()
        if "." in text:
            try:
                value = float(text)
            except ValueError:
                raise InvalidArgument(f"spark.cudabridge.pool_limit={text!r}: expected bytes (1073741824, 512m, 8g) "
                                      f"or a fraction of free memory in (0, 1] such as 0.9") from None
            if not 0.0 < value <= 1.0:
                raise InvalidArgument(f"spark.cudabridge.pool_limit={text!r}: a fraction of free memory must be "
                                      f"in (0, 1]")
            return None, value
        return parse_bytes(text, SPARK_PREFIX + "pool_limit", minimum=MIN_LIMIT_BYTES), 1.0

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


MAX_BYTES = (1 << 63) - 1   # byte counts are signed 64-bit in C and Java


def parse_bytes(text: Any, name: str = "size", minimum: int = 0) -> int:
    """Bytes from ``1073741824``, ``512m``, ``8g`` (binary units); refused below ``minimum``
    and at 2**63 or more."""
    if isinstance(text, bool):
        raise InvalidArgument(f"{name}={text!r}: expected bytes such as 1073741824, 512m or 8g")
    s = str(text).strip().lower()
    num = s.rstrip("kmgtb")
    unit = s[len(num):]
    try:
        value = int(num)
    except ValueError:
        raise InvalidArgument(f"{name}={text!r}: expected bytes such as 1073741824, 512m or 8g") from None
    if unit not in _UNITS or value < 0:
        raise InvalidArgument(f"{name}={text!r}: expected bytes such as 1073741824, 512m or 8g")
    nbytes = value * _UNITS[unit]
    if nbytes > MAX_BYTES:
        raise InvalidArgument(f"{name}={text!r}: {nbytes} bytes is 2**63 or more")
    if nbytes < minimum:
        raise InvalidArgument(f"{name}={text!r}: {nbytes} bytes is below the least accepted, {minimum} (2 MiB)")
    return nbytes
