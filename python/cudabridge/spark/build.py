"""Builds the plugin jar and the examples jar with plain ``javac --release 17`` and a zip writer.

The core jar and the bridge library come from :mod:`cudabridge.jvm.build` (built first when
stale). The plugin is a second jar, not part of ``cudabridge.jar``: it needs Spark's jars at
compile time, and the core API must stay usable with no Spark present (the Java harness on the
GPU machine). Both jars go on the system class path (``spark.{driver,executor}.extraClassPath``,
with JPype's ``org.jpype.jar``: :func:`classpath`) or in Spark's child class loader (``--jars``:
:func:`jars`; the bridge then puts ``org.jpype.jar`` on the system class loader itself).
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from pathlib import Path

from ..jvm import build as core

log = logging.getLogger(__name__)

PLUGIN_JAR = "cudabridge-spark.jar"
EXAMPLES_JAR = "cudabridge-examples.jar"
PLUGIN_CLASS = "org.cudabridge.spark.CudaBridgePlugin"


class SparkBuildError(core.BuildError):
    pass


def repo_root() -> Path | None:
    root = core.PACKAGE_DIR.parent.parent
    return root if (root / "jvm" / "src" / "spark" / "java").is_dir() else None


def plugin_jar_path() -> Path:
    return core.NATIVE_DIR / PLUGIN_JAR


def examples_jar_path() -> Path:
    root = repo_root()
    if root is None:
        raise SparkBuildError("the examples are only in a source tree (spark-examples/)")
    return root / "spark-examples" / "build" / EXAMPLES_JAR


def pyspark_home() -> Path:
    try:
        import pyspark
    except ImportError as exc:
        raise SparkBuildError("pyspark is not installed: pip install 'spark-cuda-bridge[spark]' "
                              f"(pyspark==4.3.0), or ./dev/setup ({exc})") from exc
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "jars").is_dir():
        raise SparkBuildError(f"pyspark at {home} has no jars/ directory")
    return home


def spark_submit() -> Path:
    return pyspark_home() / "bin" / "spark-submit"


def _sources(base: Path) -> list[Path]:
    found = sorted(base.rglob("*.java"))
    if not found:
        raise SparkBuildError(f"no Java sources under {base}")
    return found


def _stale(out: Path, inputs: list[Path]) -> bool:
    return not out.is_file() or any(p.stat().st_mtime > out.stat().st_mtime for p in inputs)


def _javac_jar(sources: list[Path], cp: list[str], out: Path, title: str) -> None:
    javac = core._java_tool("javac")
    if javac is None:
        raise SparkBuildError("javac not found (JAVA_HOME/bin, PATH): build the jars where a JDK 17+ exists")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cudabridge-spark-javac-") as classes:
        cmd = [javac, "--release", "17", "-Xlint:all,-processing,-classfile,-options,-path", "-Werror", "-encoding", "UTF-8",
               "-cp", os.pathsep.join(cp), "-d", classes, *map(str, sources)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SparkBuildError(f"javac failed ({proc.returncode}) for {title}:\n{proc.stdout}{proc.stderr}")
        core.write_jar(out, Path(classes), title)
    log.info("built %s from %d sources", out, len(sources))


def build_plugin(force: bool = False, native_dir: Path = core.NATIVE_DIR) -> Path:
    """The plugin jar in ``native_dir`` (beside the core jar it compiles against), from a source
    tree; an installed package has it already."""
    root = repo_root()
    out = native_dir / PLUGIN_JAR
    if root is None:
        if out.is_file():
            return out
        raise SparkBuildError(f"{out} is missing and the plugin sources are only in a source tree")
    sources = _sources(root / "jvm" / "src" / "spark" / "java")
    core_jar = core.build_jar(native_dir=native_dir)
    if force or _stale(out, sources + [core_jar]):
        spark_jars = str(pyspark_home() / "jars" / "*")
        _javac_jar(sources, [str(core_jar), spark_jars], out, "spark-cuda-bridge Spark plugin")
    return out


def build_examples(force: bool = False) -> Path:
    root = repo_root()
    if root is None:
        raise SparkBuildError("the examples are only in a source tree (spark-examples/)")
    out = examples_jar_path()
    sources = _sources(root / "spark-examples" / "src" / "main" / "java")
    plugin = build_plugin()
    core_jar = core.jar_path()
    if force or _stale(out, sources + [plugin, core_jar]):
        spark_jars = str(pyspark_home() / "jars" / "*")
        _javac_jar(sources, [str(core_jar), str(plugin), spark_jars], out,
                   "spark-cuda-bridge examples")
    return out


def build(force: bool = False, examples: bool = True) -> dict[str, Path]:
    """The bridge library and core jar (when stale), the plugin jar, and the examples jar."""
    out = dict(core.build(force=force))
    out["plugin"] = build_plugin(force)
    if examples:
        out["examples"] = build_examples(force)
    return out


def classpath() -> str:
    """What ``spark.{driver,executor}.extraClassPath`` needs for the plugin: the core jar, the
    plugin jar and JPype's ``org.jpype.jar``."""
    for jar in (core.jar_path(), plugin_jar_path()):
        if not jar.is_file():
            raise SparkBuildError(f"{jar} is not built: run python -m cudabridge.spark build")
    return os.pathsep.join([str(core.jar_path()), str(plugin_jar_path()), str(core.jpype_jar())])


def jars() -> str:
    """What ``--jars`` (``spark.jars``) needs for the plugin: the core jar and the plugin jar,
    comma-separated. The bridge then runs in Spark's child class loader and puts JPype's
    ``org.jpype.jar`` from the executor's Python environment on the system class loader itself."""
    for jar in (core.jar_path(), plugin_jar_path()):
        if not jar.is_file():
            raise SparkBuildError(f"{jar} is not built: run python -m cudabridge.spark build")
    return ",".join([str(core.jar_path()), str(plugin_jar_path())])


def submit_conf(extra: dict[str, str] | None = None) -> list[str]:
    """``--conf`` arguments for ``spark-submit``: the class path on the system class path of the
    driver and the executors, and the plugin."""
    cp = classpath()
    conf = {"spark.driver.extraClassPath": cp, "spark.executor.extraClassPath": cp, "spark.plugins": PLUGIN_CLASS}
    conf.update(extra or {})
    args: list[str] = []
    for k, v in conf.items():
        args += ["--conf", f"{k}={v}"]
    return args
