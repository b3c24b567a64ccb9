"""What the Java start checks before it loads anything, with a real ``java`` process: the bridge
library (checked in Java before ``System.load``): the size and SHA-256 the build recorded, and
its ELF header and layout. Before, a truncated library killed the JVM with SIGBUS inside the
dynamic loader (exit 134), so ``tryStart`` could not report anything.

Each start here goes through ``CudaBridge.tryStart`` (the harness's ``startfail`` scenario): the
JVM must exit normally, the failure be recorded, and ``CudaBridge.get()`` fail fast with it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import struct
import sys
from pathlib import Path

import pytest

from cudabridge.jvm import build as jvm_build
from test_jvm_bridge import Run, _message, bare_jar, harness, run_java  # noqa: F401  (fixtures)

def start_fails(cp: str, python: str, jvm: list[str]) -> tuple[Run, str]:
    r = run_java(cp, "startfail", python, jvm=jvm, timeout=120)
    r.ok()  # exit 0, no FAIL: get() after the failed start failed fast with the recorded reason
    assert r["started"] == "false"
    return r, " ".join(_message(r).split())


# --- the bridge library ---------------------------------------------------------------------------

def _end_of_loaded_bytes(lib: Path) -> int:
    """Where the last PT_LOAD segment's file bytes end (what the dynamic loader maps)."""
    data = lib.read_bytes()
    phoff, = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    end = 0
    for i in range(phnum):
        ptype, _, offset, _, _, filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if ptype == 1:
            end = max(end, offset + filesz)
    return end


@pytest.fixture
def lib_copy(harness, tmp_path):
    """A copy of the built library with its properties beside it, the jar alone elsewhere."""
    d = tmp_path / "native"
    d.mkdir()
    lib = d / jvm_build.LIBRARY_NAME
    shutil.copyfile(jvm_build.library_path(), lib)
    shutil.copyfile(jvm_build.NATIVE_DIR / jvm_build.PROPERTIES_NAME, d / jvm_build.PROPERTIES_NAME)
    jar_dir = tmp_path / "jar"
    jar_dir.mkdir()
    shutil.copyfile(jvm_build.jar_path(), jar_dir / "cudabridge.jar")
    classes = harness.split(os.pathsep)[-1]
    cp = os.pathsep.join([str(jar_dir / "cudabridge.jar"), str(jvm_build.jpype_jar()), classes])
    return cp, lib


def _truncate_into_segments(lib: Path) -> int:
    size = _end_of_loaded_bytes(lib) // 2  # inside a mapped segment: SIGBUS when the loader touches it
    with open(lib, "r+b") as f:
        f.truncate(size)
    return size


def test_build_records_size_and_sha256(harness):
    props = jvm_build.read_properties()
    lib = jvm_build.library_path()
    assert props["library.size"] == str(lib.stat().st_size)
    assert props["library.sha256"] == hashlib.sha256(lib.read_bytes()).hexdigest()


def test_truncated_library_is_refused_not_a_jvm_crash(lib_copy):
    cp, lib = lib_copy
    recorded = lib.stat().st_size
    size = _truncate_into_segments(lib)
    r, msg = start_fails(cp, sys.executable, [f"-Dcudabridge.library={lib}"])
    assert r["failure_type"] == "java"
    assert f"{jvm_build.LIBRARY_NAME} at {lib} is {size} bytes, the build recorded {recorded}: rebuild with " \
           "`python -m cudabridge build`" in msg, msg


def test_truncated_library_without_recorded_checksum_fails_the_elf_check(lib_copy):
    cp, lib = lib_copy
    (lib.parent / jvm_build.PROPERTIES_NAME).unlink()  # -Dcudabridge.library, nothing recorded
    size = _truncate_into_segments(lib)
    _, msg = start_fails(cp, sys.executable, [f"-Dcudabridge.library={lib}"])
    assert f"at {lib} is {size} bytes, but its ELF program header" in msg and "(PT_LOAD) reaches byte" in msg \
           and "the file is truncated" in msg, msg


def test_library_changed_after_build_fails_the_checksum(lib_copy):
    cp, lib = lib_copy
    data = bytearray(lib.read_bytes())
    data[-1] ^= 0xFF  # same size, one byte different
    lib.write_bytes(bytes(data))
    _, msg = start_fails(cp, sys.executable, [f"-Dcudabridge.library={lib}"])
    assert f"at {lib} has SHA-256 {hashlib.sha256(bytes(data)).hexdigest()}, the build recorded " \
           f"{jvm_build.read_properties()['library.sha256']}" in msg, msg


def test_not_an_elf_file_is_refused(lib_copy):
    cp, lib = lib_copy
    (lib.parent / jvm_build.PROPERTIES_NAME).unlink()
    lib.write_bytes(b"<!DOCTYPE html>" + b"\0" * 200)  # a download that went wrong
    _, msg = start_fails(cp, sys.executable, [f"-Dcudabridge.library={lib}"])
    assert f"at {lib} is not an ELF file (it starts with 3c 21 44 4f)" in msg, msg


def test_library_for_another_machine_is_refused(lib_copy):
    cp, lib = lib_copy
    (lib.parent / jvm_build.PROPERTIES_NAME).unlink()
    data = bytearray(lib.read_bytes())
    machine, = struct.unpack_from("<H", data, 18)
    other = 183 if machine != 183 else 62  # AArch64, or x86-64 on an AArch64 machine
    struct.pack_into("<H", data, 18, other)
    lib.write_bytes(bytes(data))
    _, msg = start_fails(cp, sys.executable, [f"-Dcudabridge.library={lib}"])
    assert f"is built for ELF machine {other}" in msg, msg


def test_intact_copy_with_its_properties_starts(lib_copy):
    """The checks pass an intact library wherever it was copied with its properties."""
    cp, lib = lib_copy
    r = run_java(cp, "startfail", "/nonexistent/python", "-", sys.executable, jvm=[f"-Dcudabridge.library={lib}"],
                 timeout=120)
    r.ok()
    assert r["retry_started"] == "true"


def test_stale_recorded_checksum_rebuilds(harness, monkeypatch, tmp_path):
    """``build`` does not take a damaged library as current (it would record the damage as the
    reference): a library whose bytes differ from the recorded ones is rebuilt."""
    native = tmp_path / "_native"
    shutil.copytree(jvm_build.NATIVE_DIR, native)
    monkeypatch.setattr(jvm_build, "NATIVE_DIR", native)
    lib = native / jvm_build.LIBRARY_NAME
    good = lib.read_bytes()
    with open(lib, "r+b") as f:
        f.truncate(len(good) // 2)
    os.utime(lib)  # newer than the sources: only the recorded checksum says it is stale
    jvm_build.build_native()
    assert lib.stat().st_size == int(jvm_build.read_properties()["library.size"])
    assert hashlib.sha256(lib.read_bytes()).hexdigest() == jvm_build.read_properties()["library.sha256"]
    assert stat.S_ISREG(lib.stat().st_mode) and lib.stat().st_size > len(good) // 2
