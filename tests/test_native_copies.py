"""The C parts of staged copies built on their own with the system's C compiler and run, with no
GPU and no JVM (tests/native/): the split host copy (bridge/host_copy.h; callers copying at once,
sizes around the split threshold, every byte checked), plain and under ThreadSanitizer where the
compiler has it; and the staging ring (bridge/staging_ring.h) against a model device whose DMAs
run late from an in-order queue (every byte, chunk order, a partial last chunk, zero-length
copies, slot reuse only after its event, a failing driver call, idle slots, retiring a ring). The
C probes of bench/ that drive the ring on a GPU are compiled too."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CC = shutil.which("cc") or shutil.which("gcc")


def build(out: Path, source: str, *flags: str) -> Path | None:
    """The program built from tests/native/<source>.c, or None where the compiler lacks
    ThreadSanitizer (asked for in flags); any other build failure fails the test."""
    from cudabridge.jvm.build import java_home

    jdk = java_home() / "include"   # jni.h: the ring's types (no JVM runs)
    exe = out / source
    proc = subprocess.run([CC, "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function",
                           "-pthread", f"-I{ROOT / 'bridge'}", f"-I{ROOT / 'python' / 'cudabridge' / 'jvm'}",
                           f"-I{jdk}", f"-I{jdk / 'linux'}", *flags, str(ROOT / "tests" / "native" / f"{source}.c"),
                           "-o", str(exe), "-ldl"], capture_output=True, text=True)
    if proc.returncode != 0:
        return None if "-fsanitize=thread" in flags else pytest.fail(proc.stderr)
    return exe


def run(exe: Path) -> list[str]:
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "WARNING: ThreadSanitizer" not in proc.stderr, proc.stderr[-4000:]
    return proc.stdout.split()


def host_copy_counts(split: str, _by_helpers: str, helpers: str) -> None:
    assert int(split) > 0 and 1 <= int(helpers) <= 11    # copies were split; helpers bounded


def ring_counts(ops: str) -> None:
    assert int(ops) > 100                                  # the model device ran the DMAs


PROGRAMS = {"host_copy_test": host_copy_counts, "staging_ring_test": ring_counts}


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.parametrize("flags", [("-O2",), ("-O1", "-g", "-fsanitize=thread")], ids=["O2", "tsan"])
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_the_native_copy_parts_on_their_own(tmp_path, program, flags):
    exe = build(tmp_path, program, *flags)
    if exe is None:
        pytest.skip("the C compiler has no ThreadSanitizer")
    ok, *counts = run(exe)
    assert ok == "ok"
    PROGRAMS[program](*counts)


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.parametrize("probe", ["staging_probe", "small_copy_probe"])
def test_the_bench_probes_of_the_ring_still_build(probe):
    """bench/'s C probes drive the ring from C on a GPU only; here they are compiled (warnings are
    errors), so that a change to the ring's functions cannot leave them behind unnoticed."""
    from cudabridge.jvm.build import java_home

    jdk = java_home() / "include"
    proc = subprocess.run([CC, "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function",
                           "-fsyntax-only", f"-I{ROOT / 'bridge'}", f"-I{ROOT / 'python' / 'cudabridge' / 'jvm'}",
                           f"-I{jdk}", f"-I{jdk / 'linux'}", str(ROOT / "bench" / f"{probe}.c")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
