"""Every setting, from the one table ``settings.json`` (shipped in this package and inside
``cudabridge.jar``, where the Spark plugin and the Java API read it).

Each entry gives the key once; its spellings are derived (:class:`Setting`): the Spark key
``spark.cudabridge.<key>`` (camelCase, as Spark's own keys), the environment variable
``CUDABRIDGE_`` plus the key split at capitals and dots (``poolLimit`` -> ``CUDABRIDGE_POOL_LIMIT``)
and the Python field, its snake_case (``pool_limit``). :class:`ServiceConfig` is generated from
the service scope of the table; :func:`check_value` parses and checks a value by its type, as the
Java side (``org.cudabridge.Settings``) does; an unknown key under ``spark.cudabridge.`` is
refused with the nearest valid one (Spark itself ignores unknown keys silently: users mistype).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import InvalidArgument

TABLE = Path(__file__).with_name("settings.json")
SPARK_PREFIX = "spark.cudabridge."
ENV_PREFIX = "CUDABRIDGE_"
MIN_LIMIT_BYTES = 2 << 20   # a byte limit below one 2 MiB chunk makes a pool in which nothing fits
MAX_BYTES = (1 << 63) - 1   # byte counts are signed 64-bit in C and Java
TYPES = ("enum", "int", "bool", "bytes", "limit", "seconds", "list", "string")
SCOPES = ("service", "plugin", "jvm", "environment")


def _words(key: str) -> list[str]:
    return [w for part in key.split(".") for w in re.split(r"(?<=[a-z0-9])(?=[A-Z])", part) if w]


@dataclass(frozen=True)
class Setting:
    key: str
    scope: str
    type: str
    default: str | None
    doc: str
    values: tuple[str, ...] = ()
    min: int | None = None
    max: int | None = None
    default_doc: str | None = None
    test: bool = False

    @property
    def spark_key(self) -> str | None:
        return SPARK_PREFIX + self.key if self.scope in ("service", "plugin") else None

    @property
    def env_name(self) -> str | None:
        return None if self.scope == "jvm" else ENV_PREFIX + "_".join(w.upper() for w in _words(self.key))

    @property
    def field(self) -> str:
        return "_".join(w.lower() for w in _words(self.key))

    @property
    def name(self) -> str:
        """How users write it: the Spark key, the JVM property, or the environment variable."""
        return self.spark_key or (self.key if self.scope == "jvm" else self.env_name)  # type: ignore[return-value]


def _load(path: Path = TABLE) -> tuple[Setting, ...]:
    raw = json.loads(path.read_text())
    out = []
    for entry in raw["settings"]:
        s = Setting(key=entry["key"], scope=entry["scope"], type=entry["type"], default=entry["default"],
                    doc=entry["doc"], values=tuple(entry.get("values", ())), min=entry.get("min"),
                    max=entry.get("max"), default_doc=entry.get("defaultDoc"), test=bool(entry.get("test", False)))
        if s.scope not in SCOPES or s.type not in TYPES or (s.type == "enum") != bool(s.values):
            raise ValueError(f"{path}: bad entry {entry!r}")
        out.append(s)
    keys = [s.key for s in out]
    if len(set(keys)) != len(keys) or raw["prefix"] != SPARK_PREFIX:
        raise ValueError(f"{path}: keys must be unique and the prefix {SPARK_PREFIX!r}")
    return tuple(out)


SETTINGS: tuple[Setting, ...] = _load()
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}
SERVICE: dict[str, Setting] = {s.field: s for s in SETTINGS if s.scope == "service"}
SPARK_KEYS: dict[str, Setting] = {s.spark_key: s for s in SETTINGS if s.spark_key}


# values -------------------------------------------------------------------------------------------
# Strict forms, the same as org.cudabridge.Settings': ASCII digits only (int() and float() would
# also take "1_0", full-width digits and blanks inside).
_INT = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_BYTES = re.compile(r"(\+?[0-9]+)([kmgt]?b?)")
TRUE, FALSE = ("true", "1"), ("false", "0")
BLANKS = " \t\n\r\f\v"   # trimmed around values (ASCII only, as Java's Settings trims)

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


def parse_bytes(text: Any, name: str = "size", minimum: int = 0) -> int:
    """Bytes from ``1073741824``, ``512m``, ``8g`` (binary units); refused below ``minimum``
    and at 2**63 or more."""
    if isinstance(text, bool):
        raise InvalidArgument(f"{name}={text!r}: expected bytes such as 1073741824, 512m or 8g")
    text_ = str(text).strip(BLANKS)
    m = _BYTES.fullmatch(text_.lower()) if text_.isascii() else None
    if m is None or m.group(2) not in _UNITS:
        raise InvalidArgument(f"{name}={text!r}: expected bytes such as 1073741824, 512m or 8g")
    nbytes = int(m.group(1)) * _UNITS[m.group(2)]
    if nbytes > MAX_BYTES:
        raise InvalidArgument(f"{name}={text!r}: {nbytes} bytes is 2**63 or more")
    if nbytes < minimum:
        raise InvalidArgument(f"{name}={text!r}: {nbytes} bytes is below the least accepted, {minimum} (2 MiB)")
    return nbytes


def parse_limit(text: Any, name: str) -> tuple[int | None, float]:
    """(bytes, 1.0) or (None, fraction): a number with a decimal point is a fraction of free
    memory in (0, 1]; anything else is bytes (a bare integer, or with a suffix), at least 2 MiB.
    ``"1"`` is one byte (refused), not all of the memory."""
    s = str(text).strip(BLANKS)
    if "." in s:
        if not _NUMBER.fullmatch(s):
            raise InvalidArgument(f"{name}={text!r}: expected bytes (1073741824, 512m, 8g) or a fraction of "
                                  f"free memory in (0, 1] such as 0.9")
        value = float(s)
        if not 0.0 < value <= 1.0:
            raise InvalidArgument(f"{name}={text!r}: a fraction of free memory must be in (0, 1]")
        return None, value
    return parse_bytes(s, name, minimum=MIN_LIMIT_BYTES), 1.0


def check_value(key: str, value: Any) -> Any:
    """``value`` of setting ``key`` (table key, Spark key or Python field) parsed by its type:
    an int, a bool, a float for seconds, a str otherwise (or None where the default is None).
    Raises :class:`InvalidArgument` naming the key and what is wrong."""
    s = _setting(key)
    name = s.name
    if value is None:
        if s.default is None:
            return None
        raise InvalidArgument(f"{name}=None: expected {_expected(s)}")
    if s.type == "int":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise InvalidArgument(f"{name}={value!r}: expected an integer")
        if isinstance(value, str):
            if not _INT.fullmatch(value.strip(BLANKS)) or not value.isascii():
                raise InvalidArgument(f"{name}={value!r}: expected an integer")
            value = value.strip(BLANKS)
        n = int(value)
        if (s.min is not None and n < s.min) or (s.max is not None and n > s.max):
            raise InvalidArgument(f"{name}={value!r}: expected an integer in [{s.min}, {s.max}]")
        return n
    if s.type == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.isascii() and value.strip(BLANKS).lower() in TRUE + FALSE:
            return value.strip(BLANKS).lower() in TRUE
        raise InvalidArgument(f"{name}={value!r}: expected true or false (or 1 or 0)")
    if not isinstance(value, str) and not (s.type == "bytes" and isinstance(value, int)):
        raise InvalidArgument(f"{name}={value!r}: expected {_expected(s)}")
    text = str(value)
    if not text.isascii() and s.type not in ("string", "list"):
        raise InvalidArgument(f"{name}={value!r}: expected {_expected(s)} (ASCII only)")
    if s.type == "enum":
        folded = text.upper() if all(v.isupper() for v in s.values) else text
        if folded not in s.values:
            raise InvalidArgument(f"{name}={value!r}: expected one of {', '.join(s.values)}")
        return text
    if s.type == "bytes":
        parse_bytes(text, name, minimum=s.min or 0)
        return text
    if s.type == "limit":
        parse_limit(text, name)
        return text
    if s.type == "seconds":
        seconds = float(text.strip(BLANKS)) if _NUMBER.fullmatch(text.strip(BLANKS)) else math.nan
        if not 0 < seconds < math.inf:
            raise InvalidArgument(f"{name}={value!r}: expected a positive number of seconds such as 300 or 0.5")
        return text
    return text   # list, string


def _expected(s: Setting) -> str:
    return {"enum": "one of " + ", ".join(s.values), "int": "an integer", "bool": "true or false",
            "bytes": "bytes such as 512m", "limit": "bytes or a fraction", "seconds": "seconds",
            "list": "a comma-separated list", "string": "a string"}[s.type]


def _setting(key: str) -> Setting:
    s = BY_KEY.get(key) or SPARK_KEYS.get(key) or SERVICE.get(key)
    if s is None:
        raise InvalidArgument(unknown_key_message(key))
    return s


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (the Java side, ``Settings.nearest``, uses the same rule)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def nearest_key(key: str) -> str | None:
    """The known Spark key nearest to ``key`` (the part after the prefix, case-insensitive, with
    ``_`` ``-`` ``.`` ignored), if within max(2, a third of its length) edits."""
    def norm(k: str) -> str:
        return re.sub(r"[._-]", "", k[len(SPARK_PREFIX):] if k.startswith(SPARK_PREFIX) else k).lower()

    target = norm(key)
    best = min(SPARK_KEYS, key=lambda k: (edit_distance(norm(k), target), k))
    return best if edit_distance(norm(best), target) <= max(2, len(target) // 3) else None


def unknown_key_message(key: str) -> str:
    """What a misspelled key gets: the nearest valid Spark key, if any is close."""
    spark = key if key.startswith(SPARK_PREFIX) else SPARK_PREFIX + key
    near = nearest_key(spark)
    hint = f"did you mean {near}?" if near else "no key is close (python -m cudabridge config lists them)"
    return f"unknown key {spark}; {hint}"


# the service's configuration ------------------------------------------------------------------------
class _ServiceConfigBase:
    """Methods of :class:`ServiceConfig` (whose fields come from the table's service scope)."""

    DOCS: dict[str, str] = {field: s.doc for field, s in SERVICE.items()}

    def __post_init__(self) -> None:
        for field, s in SERVICE.items():
            object.__setattr__(self, field, check_value(s.key, getattr(self, field)))
        # a staging ring is one block of the pinned pool: one that can never fit it is a mistake
        pool = parse_bytes(self.pinned_pool)   # type: ignore[attr-defined]
        ring = self.staging_slots * parse_bytes(self.staging_slot_bytes)   # type: ignore[attr-defined]
        if 0 < pool < ring:
            raise InvalidArgument(
                f"{SPARK_PREFIX}stagingSlots x {SPARK_PREFIX}stagingSlotBytes ({ring} bytes) is more than "
                f"{SPARK_PREFIX}pinnedPool ({pool} bytes): a thread's staging ring is one block of the pinned pool "
                f"and could never come from it; raise pinnedPool (0 disables the pool) or lower the ring")

    def limit(self) -> tuple[int | None, float]:
        """(bytes, 1.0) or (None, fraction) from ``pool_limit``."""
        return parse_limit(self.pool_limit, SERVICE["pool_limit"].name)  # type: ignore[attr-defined]

    def wait_timeout_s(self) -> float:
        """``host_wait_timeout`` in seconds."""
        return float(self.host_wait_timeout)  # type: ignore[attr-defined]

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any], prefix: str = SPARK_PREFIX) -> "ServiceConfig":
        """From a Spark conf (or any mapping): the service keys under ``prefix``; the plugin's own
        keys are skipped; any other key under the prefix is refused with the nearest valid one."""
        kwargs: dict[str, Any] = {}
        for key, value in conf.items():
            if not key.startswith(prefix):
                continue
            s = BY_KEY.get(key[len(prefix):])
            if s is None or s.scope not in ("service", "plugin"):
                raise InvalidArgument(unknown_key_message(SPARK_PREFIX + key[len(prefix):]))
            if s.scope == "service":
                kwargs[s.field] = check_value(s.key, value)
        return cls(**kwargs)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "ServiceConfig":
        """From ``CUDABRIDGE_<KEY>`` variables (other ``CUDABRIDGE_*`` variables are the scripts')."""
        kwargs = {field: check_value(s.key, environ[s.env_name]) for field, s in SERVICE.items()
                  if s.env_name in environ}
        return cls(**kwargs)


def _field_type(s: Setting) -> type:
    return {"int": int, "bool": bool}.get(s.type, str)


ServiceConfig = dataclasses.make_dataclass(
    "ServiceConfig",
    [(field, _field_type(s) if s.default is not None else (str | None),  # type: ignore[operator]
      dataclasses.field(default=None if s.default is None else check_value(s.key, s.default)))
     for field, s in SERVICE.items()],
    bases=(_ServiceConfigBase,), frozen=True)
ServiceConfig.__module__ = __name__
ServiceConfig.__doc__ = ("The service's settings (the table's service scope; fields in snake_case): "
                         + "; ".join(f"{f}: {s.doc}" for f, s in SERVICE.items()))


# documentation --------------------------------------------------------------------------------------
def markdown_table(scope: str) -> str:
    """docs/configuration.md's table of one scope, generated from the table (a test compares them)."""
    head = {"service": "| key | environment | default | meaning |\n| --- | --- | --- | --- |",
            "plugin": "| key | default | meaning |\n| --- | --- | --- |",
            "jvm": "| property | default | meaning |\n| --- | --- | --- |",
            "environment": "| variable | default | meaning |\n| --- | --- | --- |"}[scope]
    rows = [head]
    for s in SETTINGS:
        if s.scope != scope:
            continue
        default = f"`{s.default}`" if s.default is not None else (s.default_doc or "unset")
        doc = ("*test setting:* " if s.test else "") + s.doc
        if scope == "service":
            rows.append(f"| `{s.spark_key}` | `{s.env_name}` | {default} | {doc} |")
        else:
            rows.append(f"| `{s.name}` | {default} | {doc} |")
    return "\n".join(rows)
