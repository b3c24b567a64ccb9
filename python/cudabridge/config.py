"""Every setting, from the one table ``settings.json`` (shipped in this package; the jar build
generates the Java side from it, ``org.cudabridge.SettingsTable``: ``cudabridge/jvm/settings_java.py``).

Each entry gives the key once; its spellings are derived (:class:`Setting`): the Spark key
``spark.cudabridge.<key>`` (camelCase, as Spark's own keys), the environment variable
``CUDABRIDGE_`` plus the key split at capitals and dots (``poolLimit`` -> ``CUDABRIDGE_POOL_LIMIT``)
and the Python field, its snake_case (``pool_limit``). :func:`load_table` reads the table and
refuses a malformed one, naming the entry (the service's import and the jar's build both fail so).
:class:`ServiceConfig` is generated from the service scope of the table; :func:`check_value`
checks a value by its type and returns it parsed, once (bytes as an int, seconds as a float, a
limit as :class:`Limit`, a list as a tuple), as the Java side (``org.cudabridge.Settings``) does;
an unknown key under ``spark.cudabridge.`` is refused with the nearest valid one (Spark itself
ignores unknown keys silently: users mistype).

The environment: :class:`ServiceConfig` reads the ``CUDABRIDGE_*`` variable of every service
setting not given explicitly (an argument or a Spark key wins over the variable, the variable over
the table's default), so the JVM bridge and every executor read them too. Every ``CUDABRIDGE_*``
name in the environment must be one the table lists as read (:func:`environment_problems`), or the
configuration is refused naming the nearest one, as an unknown key is. :func:`check_all` is the
whole check, the same rules and messages as the Java side's ``Settings.checkAll`` (a test
compares them over every key and a grid of values).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from .errors import InvalidArgument

TABLE = Path(__file__).with_name("settings.json")
SPARK_PREFIX = "spark.cudabridge."
ENV_PREFIX = "CUDABRIDGE_"
MIN_LIMIT_BYTES = 2 << 20   # a byte limit below one 2 MiB chunk makes a pool in which nothing fits
# The least fraction of free memory a limit may be: below it, a GPU with less than 1.9 TiB free
# (every GPU made so far) gives a pool under MIN_LIMIT_BYTES. A larger fraction can still be
# too small for a given GPU: the service refuses that at start (ServiceConfig.check_pool_limit).
# The same constant as org.cudabridge.Settings.MIN_LIMIT_FRACTION (both parse the text to the
# same double and compare it with this one).
MIN_LIMIT_FRACTION = 1e-6
MAX_BYTES = (1 << 63) - 1   # byte counts are signed 64-bit in C and Java
TYPES = ("enum", "int", "bool", "bytes", "limit", "seconds", "list", "string")
SCOPES = ("service", "plugin", "jvm", "environment", "dev")
EXECUTOR_ENV_PREFIX = "spark.executorEnv."   # Spark keys that set the executors' environment


def words(key: str) -> list[str]:
    """The words of a key, from which every spelling is derived (``metrics.refreshMs`` ->
    ``metrics``, ``refresh``, ``Ms``): the variable, the field, Java's constant."""
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
    env: bool = False   # a plugin key whose variable is read too (the table's "env": true)

    @property
    def spark_key(self) -> str | None:
        return SPARK_PREFIX + self.key if self.scope in ("service", "plugin") else None

    @property
    def env_name(self) -> str | None:
        return None if self.scope == "jvm" else ENV_PREFIX + "_".join(w.upper() for w in words(self.key))

    @property
    def env_read(self) -> bool:
        """Whether its ``CUDABRIDGE_*`` variable is read by anything: scopes service (ServiceConfig),
        environment and dev (the scripts and tests), and plugin keys marked ``env``. A variable of
        another setting (a plugin key's derived spelling) is refused, saying where to set it."""
        return self.scope in ("service", "environment", "dev") or (self.scope == "plugin" and self.env)

    @property
    def env_checked(self) -> bool:
        """Whether its variable's value is checked where the service or the bridge starts: every
        variable read, but those of scope dev, which only the project's scripts read."""
        return self.env_read and self.scope != "dev"

    @property
    def field(self) -> str:
        return "_".join(w.lower() for w in words(self.key))

    @property
    def name(self) -> str:
        """How users write it: the Spark key, the JVM property, or the environment variable."""
        return self.spark_key or (self.key if self.scope == "jvm" else self.env_name)  # type: ignore[return-value]


class TableError(ValueError):
    """``settings.json`` is malformed; the message names the file, the entry and what is wrong."""


_ROOT_FIELDS = ("about", "prefix", "settings")
_FIELDS = ("key", "scope", "type", "values", "min", "max", "default", "defaultDoc", "doc", "test", "env")
_KEY = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*)*")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    for i, (k, _) in enumerate(pairs):
        if any(k == other for other, _ in pairs[:i]):
            raise TableError(f"key {k!r} appears twice in one object")
    return dict(pairs)


def _not_json(name: str) -> Any:   # NaN, Infinity: Python's json reads them, JSON has none
    raise TableError(f"{name} is not JSON")


def _field(entry: dict[str, Any], name: str, where: str, kind: type | tuple[type, ...], required: bool) -> Any:
    if name not in entry or entry[name] is None:
        if required:
            raise TableError(f"{where}: '{name}' is missing")
        return None
    v = entry[name]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        what = {str: "a string", bool: "true or false", int: "an integer", list: "an array"}[kind]  # type: ignore[index]
        raise TableError(f"{where}: '{name}' must be {what}, got {v!r}")
    return v


def _entry(e: Any, where: str) -> Setting:
    """One entry of the table, checked field by field."""
    if not isinstance(e, dict):
        raise TableError(f"{where}: expected an object")
    key = e.get("key")
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise TableError(f"{where}: 'key' must be a string of letters and digits, parts joined by '.', got {key!r}")
    where = f"{where} ({key})"
    unknown = [f for f in e if f not in _FIELDS]
    if unknown:
        raise TableError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))})")
    scope = _field(e, "scope", where, str, True)
    if scope not in SCOPES:
        raise TableError(f"{where}: scope {scope} is none of {', '.join(SCOPES)}")
    type_ = _field(e, "type", where, str, True)
    if type_ not in TYPES:
        raise TableError(f"{where}: type {type_} is none of {', '.join(TYPES)}")
    values = e.get("values", [])
    if "values" in e and (type_ not in ("enum", "list") or not isinstance(values, list)):
        raise TableError(f"{where}: 'values' is an array, for types enum and list only")
    if any(not isinstance(v, str) or not v for v in values) or len(set(values)) != len(values):
        raise TableError(f"{where}: 'values' must be distinct non-empty strings")
    if type_ == "enum" and not values:
        raise TableError(f"{where}: an enum needs its 'values'")
    bounds = {}
    for f in ("min", "max"):
        if f in e and type_ not in ("int", "bytes"):
            raise TableError(f"{where}: '{f}' is for types int and bytes only")
        bounds[f] = _field(e, f, where, int, False)
    if bounds["min"] is not None and bounds["max"] is not None and bounds["min"] > bounds["max"]:
        raise TableError(f"{where}: min {bounds['min']} is above max {bounds['max']}")
    if "default" not in e:
        raise TableError(f"{where}: 'default' is missing (null where it is computed)")
    default = _field(e, "default", where, str, False)
    default_doc = _field(e, "defaultDoc", where, str, False)
    if default is None and default_doc is None:
        raise TableError(f"{where}: a null default needs a 'defaultDoc' saying how it is computed")
    env = _field(e, "env", where, bool, False)
    if env is not None and scope != "plugin":
        raise TableError(f"{where}: 'env' is true or false, for scope plugin only")
    return Setting(key=key, scope=scope, type=type_, default=default, doc=_field(e, "doc", where, str, True),
                   values=tuple(values), min=bounds["min"], max=bounds["max"], default_doc=default_doc,
                   test=bool(_field(e, "test", where, bool, False)), env=bool(env))


def load_table(path: Path = TABLE) -> tuple[Setting, ...]:
    """The settings of the table at ``path``, checked: strict JSON (no key twice in an object), its
    form, each entry's fields, unique keys and spellings, and each default by its own type.
    Raises :class:`TableError` naming the file and the entry."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_object, parse_constant=_not_json)
    except (OSError, ValueError) as exc:   # a JSONDecodeError names the line and column
        raise TableError(f"{path}: {exc}") from None
    if not isinstance(raw, dict):
        raise TableError(f"{path}: expected an object at the top")
    unknown = [f for f in raw if f not in _ROOT_FIELDS]
    if unknown:
        raise TableError(f"{path}: unknown field {unknown[0]!r} at the top (known: {', '.join(sorted(_ROOT_FIELDS))})")
    if raw.get("prefix") != SPARK_PREFIX:
        raise TableError(f"{path}: 'prefix' must be {SPARK_PREFIX!r}, got {raw.get('prefix')!r}")
    if not isinstance(raw.get("settings"), list):
        raise TableError(f"{path}: 'settings' must be an array")
    out: list[Setting] = []
    spellings: dict[str, str] = {}
    for i, e in enumerate(raw["settings"]):
        s = _entry(e, f"{path}: settings[{i}]")
        if any(o.key == s.key for o in out):
            raise TableError(f"{path}: settings[{i}]: key {s.key} twice")
        for spelling in dict.fromkeys(filter(None, (s.name, s.env_name))):
            if spelling in spellings:
                raise TableError(f"{path}: {s.key}: its spelling {spelling} is {spellings[spelling]}'s too")
            spellings[spelling] = s.key
        if s.default is not None:
            try:
                _parse(s, s.default, s.name)
            except InvalidArgument as exc:
                raise TableError(f"{path}: {s.key}: its default is refused by its own type: {exc}") from None
        out.append(s)
    return tuple(out)


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


class Limit(NamedTuple):
    """A ``limit`` setting's value (``poolLimit``): ``(bytes, 1.0)``, or ``(None, fraction)`` of
    the GPU's free memory (Java: ``Settings.Limit``)."""

    nbytes: int | None
    fraction: float


def human_bytes(n: int) -> str:
    """``2 MiB``, ``1536 KiB``, ``1000 bytes``: the largest binary unit that divides ``n`` (as
    Java's ``Settings.humanBytes``)."""
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def parse_bytes(text: Any, name: str = "size", minimum: int = 0, maximum: int = MAX_BYTES) -> int:
    """Bytes from ``1073741824``, ``512m``, ``8g`` (binary units); refused below ``minimum``,
    above ``maximum`` and at 2**63 or more."""
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
        raise InvalidArgument(f"{name}={text!r}: {nbytes} bytes is below the least accepted, {minimum} "
                              f"({human_bytes(minimum)})")
    if nbytes > maximum:
        raise InvalidArgument(f"{name}={text!r}: {nbytes} bytes is above the most accepted, {maximum} "
                              f"({human_bytes(maximum)})")
    return nbytes


def _fraction(value: float, text: Any, name: str) -> Limit:
    if not MIN_LIMIT_FRACTION <= value <= 1.0:
        raise InvalidArgument(f"{name}={text!r}: a fraction of free memory must be in [0.000001, 1] (a smaller "
                              f"one gives a pool under 2 MiB on any GPU)")
    return Limit(None, value)


def parse_limit(text: Any, name: str) -> Limit:
    """``Limit(bytes, 1.0)`` or ``Limit(None, fraction)``: a number with a decimal point is a
    fraction of free memory in [MIN_LIMIT_FRACTION, 1]; anything else is bytes (a bare integer, or
    with a suffix), at least 2 MiB. ``"1"`` is one byte (refused), not all of the memory. A
    :class:`Limit` is checked as it is."""
    if isinstance(text, Limit):
        if text.nbytes is None:
            return _fraction(text.fraction, text, name)
        return Limit(parse_bytes(text.nbytes, name, minimum=MIN_LIMIT_BYTES), 1.0)
    s = str(text).strip(BLANKS)
    if "." in s:
        if not _NUMBER.fullmatch(s):
            raise InvalidArgument(f"{name}={text!r}: expected bytes (1073741824, 512m, 8g) or a fraction of "
                                  f"free memory in [0.000001, 1] such as 0.9")
        return _fraction(float(s), text, name)
    return Limit(parse_bytes(s, name, minimum=MIN_LIMIT_BYTES), 1.0)


def check_value(key: str, value: Any, name: str | None = None) -> Any:
    """``value`` of setting ``key`` (table key, Spark key or Python field), checked by its type
    and returned parsed, once: an int (int; bytes: the byte count), a bool, a float (seconds), a
    :class:`Limit` (limit), a tuple of str (list: split at commas, each item stripped), the
    table's spelling (enum) or the str itself (string); None where the default is None and no
    value is given. A value of the parsed type is checked as it is (so a parsed value passes
    again). Raises :class:`InvalidArgument` naming the key (``name``: as spelled there instead,
    e.g. its environment variable) and what is wrong."""
    s = _setting(key)
    return _parse(s, value, name or s.name)


def _parse(s: Setting, value: Any, name: str) -> Any:
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
    if s.type == "seconds" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return _seconds(value, value, name)
    if s.type == "limit" and isinstance(value, Limit):
        return parse_limit(value, name)
    if s.type == "list" and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return _list_items(s, tuple(v.strip(BLANKS) for v in value), value, name)
    if not isinstance(value, str) and not (s.type == "bytes" and isinstance(value, int)):
        raise InvalidArgument(f"{name}={value!r}: expected {_expected(s)}")
    text = str(value)
    if not text.isascii() and s.type not in ("string", "list"):
        raise InvalidArgument(f"{name}={value!r}: expected {_expected(s)} (ASCII only)")
    if s.type == "enum":
        folded = text.upper() if all(v.isupper() for v in s.values) else text
        if folded not in s.values:
            raise InvalidArgument(f"{name}={value!r}: expected one of {', '.join(s.values)}")
        return folded
    if s.type == "bytes":
        return parse_bytes(text, name, minimum=s.min or 0, maximum=MAX_BYTES if s.max is None else s.max)
    if s.type == "limit":
        return parse_limit(text, name)
    if s.type == "seconds":
        number = text.strip(BLANKS)
        return _seconds(float(number) if _NUMBER.fullmatch(number) else math.nan, value, name)
    if s.type == "list":
        return _list_items(s, tuple(item.strip(BLANKS) for item in text.split(",")) if text.strip(BLANKS) else (),
                           value, name)
    return text   # string


def _list_items(s: Setting, items: tuple[str, ...], given: Any, name: str) -> tuple[str, ...]:
    """A list's items; where the table names ``values``, each one of them, none twice."""
    if s.values:
        bad = [i for i in items if i not in s.values]
        if bad:
            raise InvalidArgument(f"{name}={given!r}: {', '.join(map(repr, bad))} not among {', '.join(s.values)}")
        if len(set(items)) != len(items):
            raise InvalidArgument(f"{name}={given!r}: an item named twice")
    return items


def _seconds(value: float, given: Any, name: str) -> float:
    try:
        seconds = float(value)
    except OverflowError:   # an int too large for a float
        seconds = math.inf
    if not 0 < seconds < math.inf:
        raise InvalidArgument(f"{name}={given!r}: expected a positive number of seconds such as 300 or 0.5")
    return seconds


def _expected(s: Setting) -> str:
    return {"enum": "one of " + ", ".join(s.values), "int": "an integer", "bool": "true or false",
            "bytes": "bytes such as 512m", "limit": "bytes or a fraction", "seconds": "seconds",
            "list": "a comma-separated list", "string": "a string"}[s.type]


def _setting(key: str) -> Setting:
    s = BY_KEY.get(key) or SPARK_KEYS.get(key) or SERVICE.get(key)
    if s is None:
        raise InvalidArgument(unknown_key_message(key))
    return s


# the table ----------------------------------------------------------------------------------------
SETTINGS: tuple[Setting, ...] = load_table()
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}
SERVICE: dict[str, Setting] = {s.field: s for s in SETTINGS if s.scope == "service"}
SPARK_KEYS: dict[str, Setting] = {s.spark_key: s for s in SETTINGS if s.spark_key}
# CUDABRIDGE_* names: those read (the only ones an environment may hold) and the others, which are
# derived spellings of plugin keys that nothing reads (refused with a pointer to the Spark key)
VARIABLES: dict[str, Setting] = {s.env_name: s for s in SETTINGS if s.env_name and s.env_read}
_UNREAD_VARIABLES: dict[str, Setting] = {s.env_name: s for s in SETTINGS if s.env_name and not s.env_read}


# unknown names --------------------------------------------------------------------------------------
def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (the Java side, ``Settings.nearest``, uses the same rule)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _nearest(name: str, known: Any, prefix: str) -> str | None:
    """The name in ``known`` nearest to ``name``: the parts after ``prefix`` compared
    case-insensitively with ``_`` ``-`` ``.`` left out; ties go to the first in sorted order; None
    unless within max(2, a third of the length) edits (Java's ``Settings.nearest``, the same rule)."""
    def norm(k: str) -> str:
        return re.sub(r"[._-]", "", k[len(prefix):] if k.startswith(prefix) else k).lower()

    target = norm(name)
    best = min(known, key=lambda k: (edit_distance(norm(k), target), k))
    return best if edit_distance(norm(best), target) <= max(2, len(target) // 3) else None


def nearest_key(key: str) -> str | None:
    """The known Spark key nearest to ``key`` (see :func:`_nearest`)."""
    return _nearest(key, SPARK_KEYS, SPARK_PREFIX)


def nearest_variable(name: str) -> str | None:
    """The ``CUDABRIDGE_*`` variable read that is nearest to ``name`` (see :func:`_nearest`)."""
    return _nearest(name, VARIABLES, ENV_PREFIX)


def unknown_key_message(key: str) -> str:
    """What a misspelled key gets: the nearest valid Spark key, if any is close."""
    spark = key if key.startswith(SPARK_PREFIX) else SPARK_PREFIX + key
    near = nearest_key(spark)
    hint = f"did you mean {near}?" if near else "no key is close (python -m cudabridge config lists them)"
    return f"unknown key {spark}; {hint}"


def unknown_variable_message(name: str) -> str:
    """What an environment variable ``CUDABRIDGE_*`` that nothing reads gets: where its setting is
    set instead (a plugin key's spelling), or the nearest variable that is read, as for keys."""
    s = _UNREAD_VARIABLES.get(name)
    if s is not None:
        return (f"{name} is not read from the environment: {s.spark_key} is a plugin key, set in the Spark "
                f"configuration (--conf {s.spark_key}=...)")
    near = nearest_variable(name)
    hint = f"did you mean {near}?" if near else "no variable is close (python -m cudabridge config lists them)"
    return f"unknown environment variable {name}; {hint}"


# the whole check ------------------------------------------------------------------------------------
def executor_environment(conf: Mapping[str, Any]) -> dict[str, str]:
    """The executors' ``CUDABRIDGE_*`` variables a Spark configuration sets
    (``spark.executorEnv.CUDABRIDGE_*``): what the driver checks as their environment."""
    return {k[len(EXECUTOR_ENV_PREFIX):]: v for k, v in conf.items()
            if isinstance(k, str) and k.startswith(EXECUTOR_ENV_PREFIX + ENV_PREFIX) and isinstance(v, str)}


def _blank(value: str) -> bool:
    """A variable set to nothing (or blanks) is unset (``X= cmd``, as the emulated backend reads
    CUDABRIDGE_EMULATED_RACE_CHECK); its name is still checked."""
    return not value.strip(BLANKS)


def environment_problems(environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(unknown names, bad values) of the ``CUDABRIDGE_*`` variables in ``environ``, sorted by
    name: every such name must be a variable the table lists as read; the values of those the
    service or the bridge reads are checked by their types, named as the variable."""
    ours = sorted((k, v) for k, v in environ.items() if k.startswith(ENV_PREFIX))
    unknown = [unknown_variable_message(k) for k, _ in ours if k not in VARIABLES]
    bad = []
    for k, v in ours:
        s = VARIABLES.get(k)
        if s is not None and s.env_checked and not _blank(v):
            try:
                check_value(s.key, v, name=k)
            except InvalidArgument as exc:
                bad.append(str(exc))
    return unknown, bad


def environment_fields(environ: Mapping[str, str]) -> dict[str, Any]:
    """The service fields ``environ``'s ``CUDABRIDGE_*`` variables set, checked; raises
    :class:`InvalidArgument` saying every unknown name (else every bad value)."""
    unknown, bad = environment_problems(environ)
    if unknown or bad:
        raise InvalidArgument("; ".join(unknown or bad))
    return {s.field: check_value(s.key, environ[s.env_name], name=s.env_name) for s in SERVICE.values()
            if s.env_name in environ and not _blank(environ[s.env_name])}


def check_all(conf: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> None:
    """The whole check of a Spark configuration (Java's ``Settings.checkAll``: the same rules, order
    and messages). Every key under ``spark.cudabridge.`` must be a service or plugin key, and every
    ``CUDABRIDGE_*`` name in ``environ`` (None: the executors' environment as ``conf`` sets it,
    ``spark.executorEnv.CUDABRIDGE_*``) a variable that is read; once every name is known, every
    value is checked (no rule ties keys to each other today). Raises one :class:`InvalidArgument` saying
    everything wrong at the first stage that found something, joined by ``; ``."""
    if environ is None:
        environ = executor_environment(conf)
    ours = sorted((k, v) for k, v in conf.items() if isinstance(k, str) and k.startswith(SPARK_PREFIX)
                  and v is not None)
    problems = [unknown_key_message(k) for k, _ in ours if k not in SPARK_KEYS]
    unknown_vars, bad_vars = environment_problems(environ)
    problems += unknown_vars
    if not problems:
        for k, v in ours:
            try:
                check_value(k, v)
            except InvalidArgument as exc:
                problems.append(str(exc))
        problems += bad_vars
    if problems:
        raise InvalidArgument("; ".join(problems))


# the service's configuration ------------------------------------------------------------------------
class _ServiceConfigBase:
    """Methods of :class:`ServiceConfig` (whose fields come from the table's service scope)."""

    DOCS: dict[str, str] = {field: s.doc for field, s in SERVICE.items()}

    def __post_init__(self) -> None:
        for field, s in SERVICE.items():
            object.__setattr__(self, field, check_value(s.key, getattr(self, field)))

    def check_pool_limit(self, limit_bytes: int, gpu: Any) -> None:
        """At service start, once GPU ``gpu``'s pool took ``limit_bytes`` from its free memory: a
        fraction that gave less than MIN_LIMIT_BYTES is refused (no 2 MiB chunk fits such a pool,
        every allocation would fail), naming the key. A byte limit is at least that already."""
        nbytes, fraction = self.pool_limit  # type: ignore[attr-defined]
        if nbytes is None and limit_bytes < MIN_LIMIT_BYTES:
            raise InvalidArgument(
                f"{SERVICE['pool_limit'].name}={str(fraction)!r}: {fraction} of GPU {gpu}'s free memory is "
                f"{limit_bytes} bytes, below the least a pool can use, {MIN_LIMIT_BYTES} "
                f"({human_bytes(MIN_LIMIT_BYTES)}); give a larger fraction, or bytes (at least 2m)")

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any], prefix: str = SPARK_PREFIX) -> "ServiceConfig":
        """From a Spark conf (or any mapping): the service keys under ``prefix``, over the
        process's ``CUDABRIDGE_*`` variables, over the defaults; the plugin's own keys are checked
        and skipped; any other key under the prefix is refused with the nearest valid one."""
        kwargs: dict[str, Any] = {}
        for key, value in conf.items():
            if not key.startswith(prefix):
                continue
            s = BY_KEY.get(key[len(prefix):])
            if s is None or s.scope not in ("service", "plugin"):
                raise InvalidArgument(unknown_key_message(SPARK_PREFIX + key[len(prefix):]))
            checked = check_value(s.key, value)   # a plugin key too: the driver's check refuses the same
            if s.scope == "service":
                kwargs[s.field] = checked
        return cls(**kwargs)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "ServiceConfig":
        """From the ``CUDABRIDGE_*`` variables of ``environ`` alone (not the process's, where
        ``environ`` is another mapping), over the defaults; unknown names are refused."""
        config = cls.__new__(cls)
        _fields_init(config, **environment_fields(environ))
        return config


_FIELD_TYPES: dict[str, Any] = {"int": int, "bool": bool, "bytes": int, "seconds": float, "limit": Limit,
                                "list": tuple[str, ...], "enum": str, "string": str}


ServiceConfig = dataclasses.make_dataclass(
    "ServiceConfig",
    [(field, _FIELD_TYPES[s.type] if s.default is not None else (_FIELD_TYPES[s.type] | None),
      dataclasses.field(default=None if s.default is None else check_value(s.key, s.default)))
     for field, s in SERVICE.items()],
    bases=(_ServiceConfigBase,), frozen=True)
ServiceConfig.__module__ = __name__
_fields_init = ServiceConfig.__init__   # the generated one: every field from its argument or the default


def _init_with_environment(self: Any, **fields: Any) -> None:
    # Precedence: an argument given here (or a Spark key through from_mapping) over the process's
    # CUDABRIDGE_* variable over the table's default. The environment is checked whole every
    # time (unknown names, bad values), also where every field is given: one rule, no surprise
    # that depends on which fields a caller happened to pass.
    _fields_init(self, **{**environment_fields(os.environ), **fields})


_init_with_environment.__signature__ = inspect.Signature(   # type: ignore[attr-defined]
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
    + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
       for p in list(inspect.signature(_fields_init).parameters.values())[1:]])
_init_with_environment.__qualname__ = "ServiceConfig.__init__"
ServiceConfig.__init__ = _init_with_environment   # type: ignore[method-assign]
ServiceConfig.__doc__ = ("The service's settings (the table's service scope; fields in snake_case): "
                         + "; ".join(f"{f}: {s.doc}" for f, s in SERVICE.items()))


# documentation --------------------------------------------------------------------------------------
def markdown_table(scope: str) -> str:
    """docs/configuration.md's table of one scope, generated from the table (a test compares them)."""
    head = {"service": "| key | environment | default | meaning |\n| --- | --- | --- | --- |",
            "plugin": "| key | default | meaning |\n| --- | --- | --- |",
            "jvm": "| property | default | meaning |\n| --- | --- | --- |",
            "environment": "| variable | default | meaning |\n| --- | --- | --- |",
            "dev": "| variable | default | meaning |\n| --- | --- | --- |"}[scope]
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
