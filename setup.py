"""The wheel's build: setuptools with ``ext_modules`` (docs/deploy.md, "Building the wheel", says
why this backend). ``pip wheel .``, ``python -m build`` and ``pip install .`` all run it; so does
``./dev/setup``, as an editable install.

Besides the Python package it builds, as required parts, into the package's ``_native/``
directory (the wheel's, or the source tree's for an editable install):

* the service's four C extensions and the allocator plug-ins' compiled part (``cudabridge/memory/native.py`` lists them): a failed compile
  fails the build with the compiler's message. ``CUDABRIDGE_NATIVE_FAST_PATH=0`` in the build's
  environment is the one, explicit, opt-out: none is built, and the service runs their Python
  twins and says so (a WARN line at start, ``c_paths_missing`` in its statistics);
* the JNI bridge library, linked against the building interpreter's shared libpython, with its
  complete C source and headers (to rebuild it for another interpreter:
  ``python -m cudabridge build --native-only``) and ``cudabridge-native.properties``;
* ``cudabridge.jar`` and the Spark plugin's ``cudabridge-spark.jar`` (``javac --release 17``; the
  plugin compiles against Spark's jars, so ``pyspark==4.3.0`` is a build requirement).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
PACKAGE = Path("python") / "cudabridge"
sys.path.insert(0, str(ROOT / "python"))   # the build code is the package's own (standard library only)

from cudabridge.jvm import build as bridge_build  # noqa: E402
from cudabridge.memory import native as c_paths  # noqa: E402
from cudabridge.spark import build as spark_build  # noqa: E402


def c_extensions() -> list[Extension]:
    wanted, why = c_paths.supported()
    if not wanted:
        print(f"spark-cuda-bridge: building WITHOUT the C fast paths ({why}); the service will run their Python "
              f"twins, about 3x slower per allocation", file=sys.stderr)
        return []
    out = []
    for module, c_path in c_paths.EXTENSIONS.items():
        src = PACKAGE / c_path.source
        out.append(Extension(module, [src.as_posix()], include_dirs=[d.as_posix() for d in c_paths.include_dirs(src)],
                             depends=[p.as_posix() for p in c_paths.inputs(src)[1:]],
                             extra_compile_args=list(c_paths.COMPILE_ARGS), libraries=list(c_paths.LIBRARIES)))
    for module, part in c_paths.ALLOCATOR_PARTS.items():   # C++, no Python twin: built wherever the C paths are
        src = PACKAGE / part.source
        out.append(Extension(module, [src.as_posix()], language="c++",
                             extra_compile_args=[*c_paths.COMPILE_ARGS, "-fvisibility=hidden"]))
    return out


class BuildExtAndBridge(build_ext):
    """The C extensions, then the bridge library and the jars into the package's ``_native/``."""

    def run(self) -> None:
        self._preflight()
        super().run()
        base = ROOT / "python" if self.inplace else Path(self.build_lib)
        native_dir = base / "cudabridge" / "_native"
        try:
            library = bridge_build.build_native(force=self.force, native_dir=native_dir)
            plugin = spark_build.build_plugin(force=self.force, native_dir=native_dir)
        except bridge_build.BuildError as exc:
            raise SystemExit(f"spark-cuda-bridge: {exc}") from None
        print(f"spark-cuda-bridge: built {library}, {native_dir / bridge_build.JAR_NAME} and {plugin}")


    @staticmethod
    def _preflight() -> None:
        """What every native part needs, named before anything compiles: a C compiler (and a C++
        one for the torch allocator's part) and a Python built with a shared libpython (which the
        JVM loads)."""
        import shlex
        import shutil
        import sysconfig

        cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "gcc"
        if shutil.which(shlex.split(cc)[0]) is None:
            raise SystemExit(f"spark-cuda-bridge: no C compiler: {cc!r} is not found (install gcc, or set CC); the "
                             f"C extensions and the bridge library are required parts of this package")
        cxx = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "g++"
        if c_paths.supported()[0] and shutil.which(shlex.split(cxx)[0]) is None:
            raise SystemExit(f"spark-cuda-bridge: no C++ compiler: {cxx!r} is not found (install g++, or set CXX); "
                             f"the torch allocator's part (cudabridge/allocators/_torch_allocator.cpp) is built with "
                             f"the C extensions")
        try:
            bridge_build.libpython()
        except bridge_build.BuildError as exc:
            raise SystemExit(f"spark-cuda-bridge: {exc}") from None


class BinaryDistribution(Distribution):
    """Platform-specific whatever the C extensions: the bridge library and its libpython are."""

    def has_ext_modules(self) -> bool:
        return True


setup(
    distclass=BinaryDistribution,
    ext_modules=c_extensions(),
    cmdclass={"build_ext": BuildExtAndBridge},
)
