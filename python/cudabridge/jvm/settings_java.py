"""Generates ``org.cudabridge.SettingsTable``, the Java side of the settings table, from
``cudabridge/settings.json`` when the jar is built (:func:`cudabridge.jvm.build.build_jar`): one
constant per setting (its key, scope, type, enum values, bounds, default, doc as javadoc, and the
spellings :class:`cudabridge.config.Setting` derives: Spark key, variable, name, whether the
variable is read and checked), and ``ALL``, every setting in the table's order.

The source is written into the build's temporary source directory, never into the tree: the
table stays the one definition, and the Java side reads no JSON at run time. The table is read
by :func:`cudabridge.config.load_table`, which refuses a malformed one naming the entry (the
build fails with that message). The output depends on the table alone (same table, same bytes).

Constant names: the key in upper snake case (``poolLimit`` -> ``POOL_LIMIT``,
``metrics.refreshMs`` -> ``METRICS_REFRESH_MS``); a system property (scope jvm) drops its leading
``cudabridge.`` and ends in ``_PROPERTY`` (``cudabridge.gate.holdMicros`` ->
``GATE_HOLD_MICROS_PROPERTY``).
"""

from __future__ import annotations

from pathlib import Path

from .. import config
from ..config import Setting

PACKAGE = "org.cudabridge"
CLASS = "SettingsTable"
SOURCE = f"{PACKAGE.replace('.', '/')}/{CLASS}.java"   # its path under a source directory
JVM_PREFIX = "cudabridge."   # the system properties' own prefix, left out of their constants' names


class GenerateError(ValueError):
    """The table cannot be written as Java (it is malformed, or two settings get one constant)."""


def constant_name(s: Setting) -> str:
    """The Java constant of setting ``s`` (see the module's doc)."""
    if s.scope == "jvm":
        key = s.key[len(JVM_PREFIX):] if s.key.startswith(JVM_PREFIX) else s.key
        return "_".join(w.upper() for w in config.words(key)) + "_PROPERTY"
    return "_".join(w.upper() for w in config.words(s.key))


def java_string(s: str | None) -> str:
    """A Java string literal (ASCII: every other character, and controls, as a \\u escape)."""
    if s is None:
        return "null"
    out = []
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif " " <= c <= "~":
            out.append(c)
        else:
            out.extend(f"\\u{u:04x}" for u in _utf16(c))
    return '"' + "".join(out) + '"'


def _utf16(c: str) -> list[int]:
    b = c.encode("utf-16-be")
    return [int.from_bytes(b[i:i + 2], "big") for i in range(0, len(b), 2)]


def javadoc_text(s: str) -> str:
    """Text for a javadoc comment, as it reads: HTML-escaped, ASCII, and nothing javac or javadoc
    would take as code (``*/``, an ``@`` tag, a ``\\u`` escape, which javac reads even in comments)."""
    out = []
    for i, c in enumerate(s):
        if c in "&<>":
            out.append({"&": "&amp;", "<": "&lt;", ">": "&gt;"}[c])
        elif c in "@\\" or (c == "/" and s[i - 1:i] == "*") or not " " <= c <= "~":
            out.append(f"&#{ord(c)};")
        else:
            out.append(c)
    return "".join(out)


def _wrap(text: str, indent: str, width: int = 100) -> list[str]:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(indent) + 3 + len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    if line:
        lines.append(line)
    return [f"{indent} * {x}" for x in lines]


def _doc(s: Setting) -> list[str]:
    spellings = [f"Spark key {s.spark_key}" if s.spark_key else None,
                 f"system property -D{s.key}" if s.scope == "jvm" else None,
                 f"variable {s.env_name}" + ("" if s.env_read else " (not read)") if s.env_name else None]
    kind = s.type + (" (" + ", ".join(s.values) + ")" if s.values else "")
    bounds = "".join(f", {b} {v}" for b, v in (("min", s.min), ("max", s.max)) if v is not None)
    default = f"default {s.default}" if s.default is not None else f"default: {s.default_doc}"
    facts = (f"Scope {s.scope}, type {kind}{bounds}, {default}; "
             + "; ".join(x for x in spellings if x) + "." + (" A test setting." if s.test else ""))
    return (["    /**"] + _wrap(javadoc_text(s.doc + "."), "    ") + ["     *"]
            + _wrap("<p>" + javadoc_text(facts), "    ") + ["     */"])


def _long(v: int | None) -> str:
    return "null" if v is None else f"{v}L"


def _bool(v: bool) -> str:
    return "true" if v else "false"


def _constant(s: Setting) -> list[str]:
    """The constant: ``new Setting(...)`` with the record's components in their order, a group a line."""
    values = "List.of(" + ", ".join(map(java_string, s.values)) + ")"
    groups = [[java_string(s.key), java_string(s.scope), java_string(s.type)],
              [values, _long(s.min), _long(s.max), java_string(s.default), java_string(s.default_doc)],
              [java_string(s.doc)],
              [_bool(s.test), _bool(s.env)],
              [java_string(s.spark_key), java_string(s.env_name), java_string(s.name), _bool(s.env_read),
               _bool(s.env_checked)]]
    body = [f"            {', '.join(g)}," for g in groups]
    body[-1] = body[-1][:-1] + ");"
    return _doc(s) + [f"    public static final Setting {constant_name(s)} = new Setting("] + body


def generate(settings: tuple[Setting, ...]) -> str:
    """The source of ``org.cudabridge.SettingsTable`` for ``settings`` (as :func:`config.load_table`
    returns them)."""
    names: dict[str, str] = {}
    for s in settings:
        name = constant_name(s)
        if name in names or name in ("PREFIX", "SCOPES", "ALL"):
            raise GenerateError(f"settings {names.get(name, name)} and {s.key} get one Java constant, {name}")
        names[name] = s.key
    lines = [
        "// Generated by cudabridge/jvm/settings_java.py from python/cudabridge/settings.json when",
        "// cudabridge.jar is built. Not in the source tree; do not edit: change the table.",
        f"package {PACKAGE};",
        "",
        "import java.util.List;",
        "",
        "import org.cudabridge.Settings.Setting;",
        "",
        "/**",
        " * Every setting of spark-cuda-bridge, one constant each, generated from the one table",
        " * {@code python/cudabridge/settings.json} when the jar is built (the Python service reads the",
        " * same table): keys, types, bounds, defaults, docs and the derived spellings are written once,",
        " * there. {@link Settings} checks values by type and finds settings by name over {@link #ALL}.",
        " */",
        f"public final class {CLASS} {{",
        f"    private {CLASS}() {{}}",
        "",
        "    /** The prefix of the Spark keys (scopes service and plugin). */",
        f"    public static final String PREFIX = {java_string(config.SPARK_PREFIX)};",
        "",
        "    /** The scopes, in the table's order. */",
        "    public static final List<String> SCOPES = List.of(" + ", ".join(map(java_string, config.SCOPES)) + ");",
    ]
    for s in settings:
        lines += [""] + _constant(s)
    lines += ["", "    /** Every setting, in the table's order. */", "    public static final List<Setting> ALL = List.of("]
    lines += [f"            {constant_name(s)}{',' if i < len(settings) - 1 else ');'}" for i, s in enumerate(settings)]
    lines += ["}", ""]
    return "\n".join(lines)


def write(source_dir: Path, table: Path = config.TABLE) -> Path:
    """Reads ``table`` (refused if malformed: :class:`GenerateError` with the reason) and writes
    ``SettingsTable.java`` under ``source_dir``; returns its path."""
    try:
        settings = config.load_table(table)
    except config.TableError as exc:
        raise GenerateError(f"the settings table is malformed: {exc}") from None
    out = source_dir / SOURCE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(generate(settings), encoding="ascii")
    return out
