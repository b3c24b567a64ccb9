"""``python -m cudabridge doctor``: what a new machine has and lacks, one line per check.

(About 700 lines, on purpose: one small function per check, in the order they print, each with
the fix it names; split up, a reader would chase one report across files.)

Each check prints ``ok``, ``warn`` (something optional, or a choice worth knowing about) or
``FAIL`` (something the configured backend needs), a short detail, and for a failure the fix.
The exit status is 1 when a check failed, 0 otherwise. In order:

0. ``config``: the ``CUDABRIDGE_*`` variables (``ServiceConfig.from_env``) and the backend checked;
1. ``python``, ``libpython``: the interpreter and its shared libpython (the JVM loads it);
2. ``jpype``, ``org.jpype.jar``: JPype (pinned to 1.7.1) and the jar it needs on the class path;
3. ``jni-library``, ``jni-python``: ``_native/libcudabridge_jni.so`` against the size and SHA-256
   the build recorded in ``cudabridge-native.properties``, the Python it was built for and the
   libpython it links;
4. ``_fastpath``, ``_registry_core``, ``_hotcore``: the C fast paths (``memory.native.load``);
5. ``cudabridge.jar``, ``cudabridge-spark.jar`` (readable, with their main class), ``java``;
6. ``device`` (and ``gpu<N>`` per GPU), ``kernels`` (NVRTC on a GPU, host kernels on the emulated
   device), ``cuda-headers`` (a GPU only);
7. ``pinned-memory``: a small pinned buffer through the backend (and the pinned pool), copied to
   the device and back.

A check that raises becomes that check's ``FAIL`` line; the command itself does not crash.
:func:`run_checks` is the API (paths and names can be passed in, for checking another copy of the
build), :func:`main` the command.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from .memory.native import EXTENSIONS

OK, WARN, FAIL = "ok", "warn", "FAIL"



def _jpype_pin() -> str | None:
    """The JPype version the package pins (pyproject.toml's ``JPype1==...``, from the installed
    package's metadata); None where the package is not installed (run from a source path)."""
    import importlib.metadata

    try:
        for req in importlib.metadata.requires("spark-cuda-bridge") or ():
            m = re.fullmatch(r"\s*JPype1\s*==\s*([\w.]+)\s*(;.*)?", req, re.IGNORECASE)
            if m:
                return m.group(1)
    except importlib.metadata.PackageNotFoundError:
        pass
    return None


JPYPE_PIN = _jpype_pin()
REBUILD_LIBRARY = "python -m cudabridge build --native-only"
BUILD_FAST_PATHS = "python -m cudabridge.memory.build_fastpath"
# (module, what it speeds up): the C paths the build makes (memory/native.py lists them)
FAST_PATHS: tuple[tuple[str, str], ...] = tuple((m, p.twin_of) for m, p in EXTENSIONS.items())
CORE_MAIN_CLASS = "org/cudabridge/CudaBridge.class"
PLUGIN_MAIN_CLASS = "org/cudabridge/spark/CudaBridgePlugin.class"
JPYPE_CHECK_CLASS = "org/jpype/manager/TypeManager.class"   # what a JVM without it fails to find
PINNED_BYTES = 4096
JAVA_MIN = 17                             # the jars are compiled with javac --release 17
_TEST_KERNEL = 'extern "C" __global__ void cudabridge_doctor(int *p) { p[threadIdx.x] = threadIdx.x; }\n'


@dataclasses.dataclass
class Check:
    """One line of the report: ``name``, ``status`` (ok, warn, FAIL), ``detail``, and ``fix``
    (a command or a setting; None where there is nothing to do)."""

    name: str
    status: str
    detail: str
    fix: str | None = None

    def line(self, width: int = 16) -> str:
        text = f"{self.status:<4}  {self.name:<{width}} {self.detail}"
        return text + (f"  -> fix: {self.fix}" if self.fix else "")


@dataclasses.dataclass
class _Context:
    backend_name: str                     # auto | cuda | emulated, as configured or asked
    native_dir: Path | None               # None: the package's _native/
    fast_paths: Sequence[tuple[str, str]]
    environ: Mapping[str, str]
    chosen: str | None = None             # cuda | emulated, once the device check decided
    backend: Any = None                   # the backend the device check opened (closed at the end)
    backend_error: str | None = None

    def native(self, default: Path) -> Path:
        """``default`` (one of the package's ``_native/`` files), or its namesake in native_dir."""
        return default if self.native_dir is None else self.native_dir / default.name


# --- 0. configuration --------------------------------------------------------------------------

def resolve_backend(backend: str | None, environ: Mapping[str, str]) -> tuple[str, Check]:
    """The backend to check (``backend`` when given, else the configured one) and the config line."""
    from .config import BY_KEY, ServiceConfig

    setting = BY_KEY["backend"]
    try:
        config = ServiceConfig.from_env(environ)
    except Exception as exc:
        name = backend or "auto"
        return name, Check("config", FAIL, f"the CUDABRIDGE_* variables are refused, the service would not start: "
                                           f"{exc} (checking backend {name})",
                           "fix or unset the variable (python -m cudabridge config lists them)")
    if backend:
        source = "--backend"
    elif (environ.get(setting.env_name) or "").strip():
        source = f"{setting.env_name}"
    else:
        source = f"the default of {setting.spark_key}"
    name = backend or config.backend
    return name, Check("config", OK, f"backend {name} (from {source}); the CUDABRIDGE_* variables are valid")


# --- 1. interpreter ----------------------------------------------------------------------------

def _check_interpreter(ctx: _Context) -> Iterator[Check]:
    from .jvm import build

    v = sys.version_info
    impl = sys.implementation.name
    yield Check("python", OK if impl == "cpython" else FAIL,
                f"{sys.executable}, {impl} {v.major}.{v.minor}.{v.micro}"
                + ("" if sys.prefix == sys.base_prefix else f" (venv of {sys.base_prefix})"),
                None if impl == "cpython" else "the bridge hosts CPython: use a CPython 3.11+")
    try:
        lib, include = build.libpython()
    except build.BuildError as exc:
        if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
            fix = ("use a Python built with --enable-shared (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared pyenv "
                   "install <version>), then recreate the venv with it")
        elif "Python.h" in str(exc):
            fix = "install the Python development headers (Debian: apt-get install python3-dev)"
        else:
            fix = "reinstall this Python: its shared libpython is missing"
        yield Check("libpython", FAIL, str(exc), fix)
        return
    yield Check("libpython", OK, f"{lib} (shared; headers in {include})")


# --- 2. JPype ----------------------------------------------------------------------------------

def _check_jpype(ctx: _Context) -> Iterator[Check]:
    from .jvm import build

    pin = f"pip install JPype1=={JPYPE_PIN}"
    try:
        import jpype
    except Exception as exc:
        yield Check("jpype", FAIL, f"not importable ({type(exc).__name__}: {exc})", pin)
        yield Check("org.jpype.jar", FAIL, "not checked: JPype is not importable", pin)
        return
    version = getattr(jpype, "__version__", "?")
    where = Path(jpype.__file__).resolve().parent
    if JPYPE_PIN is None:
        yield Check("jpype", WARN, f"JPype1 {version} at {where}; the pinned version is unknown: spark-cuda-bridge "
                                   f"is not installed as a package here", "pip install the spark-cuda-bridge wheel")
    elif version == JPYPE_PIN:
        yield Check("jpype", OK, f"JPype1 {version} at {where}")
    else:
        yield Check("jpype", FAIL, f"JPype1 {version} at {where}; the bridge relies on {JPYPE_PIN}'s behaviour "
                                   f"(pinned in pyproject.toml)", pin)
    try:
        jar = build.jpype_jar()
    except build.BuildError as exc:
        yield Check("org.jpype.jar", FAIL, str(exc), f"pip install --force-reinstall JPype1=={JPYPE_PIN}")
        return
    problem = _zip_problem(jar, JPYPE_CHECK_CLASS)
    if problem:
        yield Check("org.jpype.jar", FAIL, problem, f"pip install --force-reinstall JPype1=={JPYPE_PIN}")
    else:
        yield Check("org.jpype.jar", OK, f"{jar} (with {JPYPE_CHECK_CLASS[:-6].replace('/', '.')})")


# --- 3. the JNI library ------------------------------------------------------------------------

def _check_library(ctx: _Context) -> Iterator[Check]:
    from .jvm import build

    lib = ctx.native(build.library_path())
    props_path = ctx.native(build.NATIVE_DIR / build.PROPERTIES_NAME)
    if not lib.is_file():
        yield Check("jni-library", FAIL, f"{lib} is missing", REBUILD_LIBRARY)
        yield Check("jni-python", FAIL, "not checked: the library is missing", REBUILD_LIBRARY)
        return
    props = build.read_properties(props_path)
    size = lib.stat().st_size
    if not props:
        yield Check("jni-library", FAIL, f"{lib} ({size} bytes) has no build record: {props_path} is missing or "
                                         f"empty, so its size and SHA-256 cannot be checked", REBUILD_LIBRARY)
    else:
        recorded_size, recorded_sha = props.get("library.size"), props.get("library.sha256")
        named = Path(props.get("library", "")).name
        if named and named != lib.name:
            yield Check("jni-library", FAIL, f"{props_path} describes {named}, not {lib.name}", REBUILD_LIBRARY)
        elif recorded_size is None or recorded_sha is None:
            yield Check("jni-library", FAIL, f"{props_path} records no library.size / library.sha256", REBUILD_LIBRARY)
        elif recorded_size.strip() != str(size):
            yield Check("jni-library", FAIL, f"{lib} is {size} bytes, the build recorded {recorded_size.strip()}: "
                                             f"damaged (truncated or overwritten) since its build", REBUILD_LIBRARY)
        else:
            sha = build.file_sha256(lib)
            if sha != recorded_sha.strip().lower():
                yield Check("jni-library", FAIL, f"{lib}: SHA-256 {sha[:16]}... differs from the build's "
                                                 f"{recorded_sha.strip()[:16]}... (same size): changed since its build",
                            REBUILD_LIBRARY)
            else:
                yield Check("jni-library", OK, f"{lib}: {size} bytes, SHA-256 {sha[:16]}... as recorded")
    yield _library_python(lib, props)


def _library_python(lib: Path, props: Mapping[str, str]) -> Check:
    """The Python the library was built for against the running one, and the libpython it links."""
    from .jvm import build

    running = sysconfig.get_python_version()
    built_for = props.get("python.version")
    if built_for is None:
        return Check("jni-python", FAIL, "the build record names no python.version", REBUILD_LIBRARY)
    if built_for != running:
        return Check("jni-python", FAIL, f"built for Python {built_for}, this is Python {running}", REBUILD_LIBRARY)
    try:
        names, runpath = elf_dynamic(lib)
    except (OSError, ValueError, struct.error) as exc:
        return Check("jni-python", FAIL, f"built for Python {built_for}, but the library's dynamic section cannot "
                                         f"be read: {exc}", REBUILD_LIBRARY)
    needed = next((n for n in names if n.startswith("libpython")), None)
    if needed is None:
        return Check("jni-python", FAIL, f"{lib.name} links no libpython (needed: {', '.join(names) or 'none'})",
                     REBUILD_LIBRARY)
    # where the dynamic loader finds it at System.load: the run path, then LD_LIBRARY_PATH (a
    # libpython only in the system's default directories is not one the build links)
    dirs = [d.replace("${ORIGIN}", str(lib.parent)).replace("$ORIGIN", str(lib.parent)) for d in runpath]
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    found = next((Path(d) / needed for d in dirs if (Path(d) / needed).is_file()), None)
    if found is None:
        return Check("jni-python", FAIL, f"built for Python {built_for}, but the {needed} it links is in none of its "
                                         f"run path {runpath or '(none)'} nor LD_LIBRARY_PATH", REBUILD_LIBRARY)
    recorded = props.get("libpython")          # the libpython it dlopens, where the build records it
    if recorded and not Path(recorded).is_file():
        return Check("jni-python", FAIL, f"built for Python {built_for}, but the libpython it records, {recorded}, "
                                         f"is missing", REBUILD_LIBRARY)
    detail = f"built for Python {built_for} (running {running}); links {found}"
    try:
        ours, _ = build.libpython()
    except build.BuildError:
        ours = None
    if ours is not None and not _same_file(found, ours):
        return Check("jni-python", WARN, f"{detail}, not the running interpreter's {ours}: a JVM would run "
                                         f"that installation's Python", REBUILD_LIBRARY)
    default = props.get("python")
    if default and not _same_interpreter(default, sys.executable):
        exists = "" if Path(default).exists() else ", which does not exist"
        return Check("jni-python", WARN, f"{detail}; CudaBridge.start runs {default}{exists} unless told otherwise "
                                         f"(-Dcudabridge.python, CUDABRIDGE_PYTHON)",
                     f"{REBUILD_LIBRARY} with this python, or set cudabridge.python")
    return Check("jni-python", OK, detail + (", the running interpreter's" if ours is not None else ""))


def _same_interpreter(a: str, b: str) -> bool:
    """The same python by path: a venv's python is a symlink to its base interpreter, so two venvs'
    pythons are the same file but not the same interpreter; the directories are compared resolved."""
    pa, pb = Path(a), Path(b)
    return pa.name == pb.name and _same_file(pa.parent, pb.parent)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def elf_dynamic(path: Path) -> tuple[list[str], list[str]]:
    """(DT_NEEDED names, DT_RUNPATH/DT_RPATH directories) of an ELF shared object, read from its
    dynamic section; ValueError when the file is not a readable ELF file."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or len(data) < 64:
        raise ValueError(f"{path} is not an ELF file")
    bits = {1: 32, 2: 64}.get(data[4])
    order = {1: "<", 2: ">"}.get(data[5])
    if bits is None or order is None:
        raise ValueError(f"{path}: unknown ELF class or byte order")
    if bits == 64:
        shoff, = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
        section = order + "IIQQQQIIQQ"        # name type flags addr offset size link info align entsize
        entry = order + "qQ"
    else:
        shoff, = struct.unpack_from(order + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x2E)
        section = order + "IIIIIIIIII"
        entry = order + "iI"
    if shoff == 0 or shoff + shentsize * shnum > len(data):
        raise ValueError(f"{path}: section headers missing or past the end of the file (truncated?)")
    sections = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    dynamic = next((s for s in sections if s[1] == 6), None)     # SHT_DYNAMIC
    if dynamic is None:
        raise ValueError(f"{path} has no dynamic section")
    strtab = sections[dynamic[6]]
    str_off, str_size = strtab[4], strtab[5]
    if dynamic[4] + dynamic[5] > len(data) or str_off + str_size > len(data):
        raise ValueError(f"{path}: dynamic section past the end of the file (truncated?)")

    def string(at: int) -> str:
        end = data.index(b"\0", str_off + at)
        return data[str_off + at:end].decode(errors="replace")

    needed, runpath = [], []
    step = struct.calcsize(entry)
    for off in range(dynamic[4], dynamic[4] + dynamic[5] - step + 1, step):
        tag, value = struct.unpack_from(entry, data, off)
        if tag == 0:                                  # DT_NULL
            break
        if tag == 1:                                  # DT_NEEDED
            needed.append(string(value))
        elif tag in (15, 29):                         # DT_RPATH, DT_RUNPATH
            runpath += [d for d in string(value).split(":") if d]
    return needed, runpath


# --- 4. C fast paths ---------------------------------------------------------------------------

def _check_fast_paths(ctx: _Context) -> Iterator[Check]:
    for module, what in ctx.fast_paths:
        yield _fast_path(module, what)


def _fast_path(module: str, what: str) -> Check:
    from .config import check_value
    from .memory import native

    short = module.rsplit(".", 1)[-1]
    switch = native.ENV_SWITCH
    value = os.environ.get(switch)
    if value is not None:
        try:
            check_value("nativeFastPath", value, name=switch)
        except Exception as exc:
            return Check(short, FAIL, f"{exc}", f"unset {switch} or set it to true/false")
    loaded = native.load(module)
    if loaded is not None:
        return Check(short, OK, f"{module}, {what} C twin, loaded from {getattr(loaded, '__file__', '?')}")
    ok, why = native.supported()
    if not ok and value is not None and switch in why:
        return Check(short, WARN, f"{module}, {what} C twin, switched off by {switch}={value}: its Python "
                                  f"reference runs (about 3x slower)", f"unset {switch}")
    if not ok:
        return Check(short, FAIL, f"{module} cannot be used: {why}; its Python reference runs (about 3x slower)",
                     "use a CPython built with the GIL")
    try:                                               # load() said None: say why it did not import
        importlib.import_module(module)
        reason = "load() returned None although it imports"
    except ImportError as exc:
        reason = f"not built ({exc})"
    return Check(short, FAIL, f"{module}, {what} C twin: {reason}; its Python reference runs (about 3x slower)",
                 f"{BUILD_FAST_PATHS} (needs gcc and Python.h)")


# --- 5. jars and java --------------------------------------------------------------------------

def _zip_problem(path: Path, member: str) -> str | None:
    """Why ``path`` is not a readable zip holding ``member`` (None when it is)."""
    if not path.is_file():
        return f"{path} is missing"
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                return f"{path}: {bad} is corrupt (CRC mismatch)"
            if member not in z.namelist():
                return f"{path} has no {member}"
            return None
    except (zipfile.BadZipFile, OSError, EOFError, RuntimeError) as exc:
        return f"{path} is not a readable zip ({type(exc).__name__}: {exc})"


def _check_jars(ctx: _Context) -> Iterator[Check]:
    from .jvm import build
    from .spark import build as spark_build

    for path, member, fix in ((ctx.native(build.jar_path()), CORE_MAIN_CLASS,
                               "python -m cudabridge build (needs javac; an installed package ships the jar: reinstall "
                               "it)"),
                              (ctx.native(spark_build.plugin_jar_path()), PLUGIN_MAIN_CLASS,
                               "python -m cudabridge.spark build --no-examples (needs pyspark==4.3.0 and javac)")):
        problem = _zip_problem(path, member)
        if problem:
            yield Check(path.name, FAIL, problem, fix)
        else:
            yield Check(path.name, OK, f"{path} ({path.stat().st_size} bytes, {member[:-6].replace('/', '.')} inside)")
    yield _check_java()


def _check_java() -> Check:
    fix = "install a JDK 17+ (Debian: apt-get install openjdk-17-jdk-headless) or set JAVA_HOME"
    java = None
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        java = str(Path(home) / "bin" / "java")
    java = java or shutil.which("java")
    if java is None:
        return Check("java", WARN, "no java in JAVA_HOME/bin nor on PATH (only the Java tests and the jars' build "
                                   "need one here; Spark's driver and executors bring their own JVM)", fix)
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("java", WARN, f"{java} -version failed: {type(exc).__name__}: {exc}", fix)
    first = (proc.stderr or proc.stdout).strip().splitlines()[:1]
    text = first[0] if first else "(no output)"
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    major = None if m is None else (int(m.group(2)) if m.group(1) == "1" and m.group(2) else int(m.group(1)))
    if proc.returncode != 0 or major is None:
        return Check("java", WARN, f"{java} -version: rc {proc.returncode}, {text}", fix)
    if major < JAVA_MIN:
        return Check("java", WARN, f"{java}: Java {major} ({text}); the jars need {JAVA_MIN}+", fix)
    return Check("java", OK, f"{java}: {text}")


# --- 6. device ---------------------------------------------------------------------------------

def _check_device(ctx: _Context) -> Iterator[Check]:
    from .device import gpu_visible, open_backend

    visible, why = gpu_visible()
    if ctx.backend_name == "auto":
        ctx.chosen = "cuda" if visible else "emulated"
        picked = f"auto picks {ctx.chosen}: {why}"
    else:
        ctx.chosen = ctx.backend_name
        picked = f"backend {ctx.chosen} (a GPU {'is' if visible else 'is not'} visible: {why})"
    if ctx.chosen == "cuda":
        try:
            ctx.backend = open_backend("cuda")
        except Exception as exc:
            ctx.backend_error = f"{type(exc).__name__}: {exc}"
            detail = (f"backend cuda needs a GPU and none is visible: {why}" if not visible
                      else f"{picked}; the cuda backend does not open: {ctx.backend_error}")
            yield Check("device", FAIL, detail,
                        "install the NVIDIA driver and make a GPU visible (nvidia-smi, CUDA_VISIBLE_DEVICES), or "
                        "use --backend emulated / spark.cudabridge.backend=emulated")
            yield Check("kernels", FAIL, "not checked: no GPU")
            return
        yield from _cuda_devices(ctx.backend, picked)
        yield from _nvrtc(ctx.backend)
        return
    try:
        ctx.backend = open_backend("emulated")
    except Exception as exc:
        ctx.backend_error = f"{type(exc).__name__}: {exc}"
        yield Check("device", FAIL, f"{picked}; the emulated backend does not open: {ctx.backend_error}",
                    "check CUDABRIDGE_EMULATED_DEVICES / CUDABRIDGE_EMULATED_MEMORY")
        return
    b = ctx.backend
    sizes = []
    for i in range(b.device_count()):
        b.set_device(i)
        sizes.append(b.mem_get_info()[1])
    shape = ", ".join(f"GPU {i}: {total / 2**30:.1f} GiB" for i, total in enumerate(sizes))
    status = WARN if ctx.backend_name == "auto" else OK
    yield Check("device", status, f"{picked}: the emulated device, a CPU model of a CUDA device, no GPU ({shape}; "
                                  f"race detector {'on' if b.race_check else 'off'})",
                "make a GPU visible for the cuda backend" if status == WARN else None)
    yield _host_kernels(ctx)


def _cuda_devices(b: Any, picked: str) -> Iterator[Check]:
    rt = b.rt
    driver = b._check("cudaDriverGetVersion", rt.cudaDriverGetVersion())
    runtime = b._check("cudaRuntimeGetVersion", rt.cudaRuntimeGetVersion())
    count = b.device_count()
    yield Check("device", OK, f"{picked}: CUDA driver {_cuda_version(driver)}, runtime {_cuda_version(runtime)}, "
                              f"{count} GPU(s)")
    for i in range(count):
        try:
            props = b._check("cudaGetDeviceProperties", rt.cudaGetDeviceProperties(i))
            name = props.name
            name = name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
            b.set_device(i)
            free, total = b.mem_get_info()
            yield Check(f"gpu{i}", OK, f"{name} ({b.compute_arch(i)}), {b.device_uuid(i)}, "
                                       f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
        except Exception as exc:
            yield Check(f"gpu{i}", FAIL, f"{type(exc).__name__}: {exc}",
                        "nvidia-smi; a GPU in an error state needs a reset by its administrator")


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _nvrtc(b: Any) -> Iterator[Check]:
    """NVRTC as the kernels' loader uses it (``backend.nvrtc``, ``compile_to_ptx``): its version
    and one small compile for GPU 0's architecture; then the CUDA headers it would be given."""
    from .kernels.cuda_headers import cuda_headers, nvrtc_major
    from .kernels.cuda_module import compile_to_ptx
    from .kernels.modules import ModuleSource

    fix = "pip install 'cuda-bindings[all]' (NVRTC wheels for the bindings' CUDA major), or a CUDA toolkit's " \
          "libnvrtc on the library path"
    nv = b.nvrtc
    try:
        result = nv.nvrtcVersion()
        if result[0] != nv.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"nvrtcVersion returned {getattr(result[0], 'name', result[0])}")
        major, minor = int(result[1]), int(result[2])
    except Exception as exc:
        yield Check("kernels", FAIL, f"NVRTC (kernel compiles) is not usable: {type(exc).__name__}: "
                                     f"{str(exc).splitlines()[0] if str(exc) else ''}", fix)
        return
    arch = b.compute_arch(0)
    headers = cuda_headers(nvrtc_major(nv))
    try:
        ptx, _ = compile_to_ptx(nv, ModuleSource.of(_TEST_KERNEL), arch, headers)
    except Exception as exc:
        yield Check("kernels", FAIL, f"NVRTC {major}.{minor} did not compile a test kernel for {arch}: "
                                     f"{type(exc).__name__}: {exc}", fix)
        return
    yield Check("kernels", OK, f"NVRTC {major}.{minor} compiled a test kernel for {arch} ({len(ptx)} bytes of PTX)")
    if headers.include_dirs:
        yield Check("cuda-headers", OK, f"for NVRTC compiles: {', '.join(headers.include_dirs)}")
    else:
        yield Check("cuda-headers", WARN, f"none found: kernels that #include CUDA headers (cuda_fp16.h, "
                                          f"cuda/std/...) will not compile (looked in: {', '.join(headers.looked_in)})",
                    "set CUDA_PATH to a CUDA toolkit, or install the CUDA runtime headers wheel (docs/kernels.md, "
                    "CUDA headers)")


def _host_kernels(ctx: _Context) -> Check:
    from .config import BY_KEY

    setting = BY_KEY["emulatedKernels"]
    value = (ctx.environ.get(setting.env_name) or "").strip()
    base = "no NVRTC on the emulated device: kernels run as host kernels (@host_kernel functions in the modules " \
           f"{setting.spark_key} names)"
    if not value:
        return Check("kernels", OK, f"{base}; {setting.env_name} names none")
    missing = []
    for name in (n.strip() for n in value.split(",")):
        if not name:
            continue
        try:
            found = importlib.util.find_spec(name) is not None
        except Exception:
            found = False
        if not found:
            missing.append(name)
    if missing:
        return Check("kernels", FAIL, f"{base}; {setting.env_name} names {', '.join(missing)}, not importable here "
                                      f"(the service would not start)", f"fix {setting.env_name} or the Python path")
    return Check("kernels", OK, f"{base}: {value} (importable)")


# --- 7. pinned memory --------------------------------------------------------------------------

def _check_pinned(ctx: _Context) -> Iterator[Check]:
    from .memory.pinned_pool import POOL, PinnedHostPool

    b = ctx.backend
    if b is None:
        yield Check("pinned-memory", FAIL, f"not checked: the {ctx.chosen or ctx.backend_name} backend did not "
                                           f"open (see device)")
        return
    what = "cudaMallocHost" if b.name == "cuda" else "host memory standing in for pinned memory on the emulated device"
    buf = b.alloc_pinned(PINNED_BYTES)
    try:
        pattern = bytes(range(256)) * (PINNED_BYTES // 256)
        ctypes.memmove(buf, pattern, PINNED_BYTES)
        b.set_device(0)
        back = _round_trip(b, buf, PINNED_BYTES)
        if back != pattern:
            yield Check("pinned-memory", FAIL, f"{PINNED_BYTES} bytes copied to GPU 0 and back came back different")
            return
    finally:
        b.free_pinned(buf)
    pool = PinnedHostPool(b, 1 << 20)
    block = pool.allocate(PINNED_BYTES)
    try:
        kind = block.kind
    finally:
        pool.free(block)
        pool.close()
    if kind != POOL:
        yield Check("pinned-memory", FAIL, f"{PINNED_BYTES} bytes ({what}) copied to GPU 0 and back, but the pinned "
                                           f"pool could not reserve 1 MiB (it served a {kind} block)",
                    "raise the locked-memory limit (ulimit -l) or lower spark.cudabridge.pinnedPool")
        return
    yield Check("pinned-memory", OK, f"{PINNED_BYTES} bytes ({what}) allocated, copied to GPU 0 and back, freed; "
                                     f"the pinned pool reserved and gave back 1 MiB")


def _round_trip(b: Any, buf: Any, nbytes: int) -> bytes:
    stream = b.stream_create()
    ptr = None
    try:
        ptr = b.malloc(nbytes)
        b.copy_to_device_async(ptr, buf, stream)
        out = (ctypes.c_char * nbytes)()
        b.copy_from_device_async(out, ptr, stream)
        b.stream_synchronize(stream)
        return bytes(out)
    finally:
        if ptr is not None:
            b.free(ptr)
        b.stream_destroy(stream)


# --- running -----------------------------------------------------------------------------------

CHECKS: tuple[tuple[str, Callable[[_Context], Iterator[Check]]], ...] = (
    ("python", _check_interpreter),
    ("jpype", _check_jpype),
    ("jni-library", _check_library),
    ("fast-path", _check_fast_paths),
    ("jars", _check_jars),
    ("device", _check_device),
    ("pinned-memory", _check_pinned),
)


def run_checks(backend: str | None = None, *, native_dir: Path | str | None = None,
               fast_paths: Sequence[tuple[str, str]] = FAST_PATHS,
               environ: Mapping[str, str] | None = None) -> list[Check]:
    """Every check, in order.

    ``backend``: auto, cuda or emulated; None: the configured one (``ServiceConfig.from_env``).
    ``native_dir``: where the library, its ``cudabridge-native.properties`` and the two jars are
    (default: the package's ``_native/``), e.g. a copy to check. ``fast_paths``: the C extensions
    to import, as (module, what it is). ``environ``: the variables the configuration is read from
    (default ``os.environ``; the fast-path switch is always read from ``os.environ``, as the
    service does).
    """
    environ = os.environ if environ is None else environ
    name, config = resolve_backend(backend, environ)
    ctx = _Context(backend_name=name, native_dir=None if native_dir is None else Path(native_dir),
                   fast_paths=fast_paths, environ=environ)
    checks = [config]
    try:
        for label, check in CHECKS:
            try:
                for result in check(ctx):
                    checks.append(result)
            except (Exception, SystemExit) as exc:
                checks.append(Check(label, FAIL, f"the check raised {type(exc).__name__}: {exc}"))
    finally:
        if ctx.backend is not None:
            try:
                ctx.backend.close()
            except Exception as exc:
                checks.append(Check("close", FAIL, f"closing the {ctx.backend.name} backend raised "
                                                   f"{type(exc).__name__}: {exc}"))
    return checks


def exit_status(checks: Sequence[Check]) -> int:
    """1 when a check failed, else 0."""
    return 1 if any(c.status == FAIL for c in checks) else 0


def main(args: argparse.Namespace) -> int:
    """The ``doctor`` subcommand (``args.backend``, ``args.json``)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    checks = run_checks(args.backend)
    if args.json:
        print(json.dumps([dataclasses.asdict(c) for c in checks], indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            print(c.line(width))
    return exit_status(checks)
