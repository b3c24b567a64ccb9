"""What the Java start checks before it loads or starts anything, with a real ``java`` process:

* the Python executable (checked by the bridge library before Python starts): it must exist, be
  an executable regular file, and be a venv of the Python version the library is linked to or
  that installation's own interpreter. Before, ``/bin/false`` or another version's interpreter
  started the library's own interpreter and failed much later ("JPype is not importable ...
  /bin/false -m pip install JPype1");
* the bridge library (checked in Java before ``System.load``): the size and SHA-256 the build
  recorded, and its ELF header and layout. Before, a truncated library killed the JVM with SIGBUS
  inside the dynamic loader (exit 134), so ``tryStart`` could not report anything.

Each start here goes through ``CudaBridge.tryStart`` (the harness's ``startfail`` scenario): the
JVM must exit normally, the failure be recorded, and ``CudaBridge.get()`` fail fast with it.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import stat
import struct
import sys
import sysconfig
from pathlib import Path

import pytest

from cudabridge.jvm import build as jvm_build
from test_jvm_bridge import Run, _message, bare_jar, harness, run_java  # noqa: F401  (fixtures)

LINKED = sysconfig.get_python_version()


def start_fails(cp: str, python: str, jvm: list[str]) -> tuple[Run, str]:
    r = run_java(cp, "startfail", python, jvm=jvm, timeout=120)
    r.ok()  # exit 0, no FAIL: get() after the failed start failed fast with the recorded reason
    assert r["started"] == "false"
    return r, " ".join(_message(r).split())


# --- the Python executable ------------------------------------------------------------------------

def _not_a_python(python: str, msg: str) -> None:
    assert f"cudabridge.python={python} is not a Python {LINKED} interpreter or venv: no pyvenv.cfg beside it " \
           f"and it is not {jvm_build.base_interpreter()}" in msg, msg
    # refused before Python started: not the late "JPype is not importable" of the wrong interpreter
    assert "JPype" not in msg and "Traceback" not in msg, msg


def test_nonexistent_python_is_refused(bare_jar):
    cp, jvm = bare_jar
    r, msg = start_fails(cp, "/nonexistent/venv/bin/python", jvm)
    assert r["failure_type"] == "startup"
    assert "no such Python executable: /nonexistent/venv/bin/python (No such file or directory)" in msg, msg


def test_dangling_symlink_python_says_where_it_points(bare_jar, tmp_path):
    cp, jvm = bare_jar
    link = tmp_path / "python"
    os.symlink(tmp_path / "gone" / "python3", link)
    _, msg = start_fails(cp, str(link), jvm)
    assert f"no such Python executable: {link} (a symlink to {tmp_path / 'gone' / 'python3'}, which does not exist" \
           in msg, msg


def test_directory_as_python_is_refused(bare_jar, tmp_path):
    cp, jvm = bare_jar
    _, msg = start_fails(cp, str(tmp_path), jvm)
    assert f"cudabridge.python={tmp_path} is a directory, not a Python executable" in msg, msg


def test_non_executable_file_is_refused(bare_jar, tmp_path):
    cp, jvm = bare_jar
    f = tmp_path / "python"
    f.write_text("#!/bin/sh\n")
    f.chmod(0o644)
    if os.access(f, os.X_OK):
        pytest.skip("running as a user for whom every file is executable")
    _, msg = start_fails(cp, str(f), jvm)
    assert f"cudabridge.python={f} is not executable (mode 0644" in msg, msg


def test_bin_false_is_refused_before_python_starts(bare_jar):
    cp, jvm = bare_jar
    false = shutil.which("false") or "/bin/false"
    r, msg = start_fails(cp, false, jvm)
    assert r["failure_type"] == "startup"
    _not_a_python(false, msg)


def _other_version_interpreters() -> list[str]:
    found = []
    for pattern in ("/usr/bin/python3.*", "/usr/local/bin/python3.*", "/root/.pyenv/versions/*/bin/python[23].*",
                    os.path.expanduser("~/.pyenv/versions/*/bin/python[23].*")):
        for path in sorted(glob.glob(pattern)):
            name = os.path.basename(path)
            version = name[len("python"):]
            if version.replace(".", "").isdigit() and version != LINKED and os.access(path, os.X_OK) \
                    and path not in found:
                found.append(path)
    return found


def test_plain_interpreter_of_another_version_is_refused(bare_jar):
    others = _other_version_interpreters()
    if not others:
        pytest.skip(f"no Python other than {LINKED} on this machine")
    cp, jvm = bare_jar
    other = others[-1]
    _, msg = start_fails(cp, other, jvm)
    _not_a_python(other, msg)
    assert f"by its name ({os.path.basename(other)}) it is Python {os.path.basename(other)[6:]}" in msg, msg


def test_other_installation_of_the_linked_version_is_refused(bare_jar):
    base = Path(os.path.realpath(jvm_build.base_interpreter()))
    other = next((p for p in [f"/usr/bin/python{LINKED}", f"/usr/local/bin/python{LINKED}"]
                  if os.access(p, os.X_OK) and Path(os.path.realpath(p)) != base), None)
    if other is None:
        pytest.skip(f"no second Python {LINKED} installation on this machine")
    cp, jvm = bare_jar
    _, msg = start_fails(cp, other, jvm)
    _not_a_python(other, msg)
    assert "of another installation" in msg, msg


def test_venv_whose_home_has_no_such_python_is_refused(bare_jar, tmp_path):
    cp, jvm = bare_jar
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    (venv / "pyvenv.cfg").write_text(f"home = {tmp_path / 'removed'}\nversion = {sys.version.split()[0]}\n")
    _, msg = start_fails(cp, str(venv / "bin" / "python"), jvm)
    assert f"says home = {tmp_path / 'removed'}" in msg and f"no executable {tmp_path / 'removed'}/python{LINKED}" \
           in msg, msg


def test_venv_without_home_line_is_refused(bare_jar, tmp_path):
    cp, jvm = bare_jar
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    (venv / "pyvenv.cfg").write_text(f"version_info = {sys.version.split()[0]}.final.0\n")
    _, msg = start_fails(cp, str(venv / "bin" / "python"), jvm)
    assert "has no 'home' line" in msg, msg


def test_the_venv_passes_the_check_and_starts(bare_jar):
    """A venv of the linked version is accepted (its base interpreter is too: the start-up tests
    in test_jvm_bridge.py get past the check to the bootstrap's import with it)."""
    cp, jvm = bare_jar
    r = run_java(cp, "startfail", sys.executable, jvm=jvm, timeout=120)
    r.ok()
    assert r["started"] == "true", r.out


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
    assert props["python.base"] == str(jvm_build.base_interpreter())


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


def test_stale_recorded_checksum_rebuilds(harness, tmp_path):
    """``build`` does not take a damaged library as current (it would record the damage as the
    reference): a library whose bytes differ from the recorded ones is rebuilt."""
    native = tmp_path / "_native"
    shutil.copytree(jvm_build.NATIVE_DIR, native)
    jvm_build.build_native(native_dir=native)   # its own record (a copy records no interpreter)
    lib = native / jvm_build.LIBRARY_NAME
    good = lib.read_bytes()
    with open(lib, "r+b") as f:
        f.truncate(len(good) // 2)
    os.utime(lib)  # newer than the sources: only the recorded checksum says it is stale
    jvm_build.build_native(native_dir=native)
    props = jvm_build.read_properties(native / jvm_build.PROPERTIES_NAME)
    assert lib.stat().st_size == int(props["library.size"])
    assert hashlib.sha256(lib.read_bytes()).hexdigest() == props["library.sha256"]
    assert stat.S_ISREG(lib.stat().st_mode) and lib.stat().st_size > len(good) // 2
