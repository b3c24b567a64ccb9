"""The staging ring's split host copy (bridge/host_copy.h) built on its own with the system's C
compiler and run: callers copying at once, sizes around the split threshold, every byte checked
(tests/native/host_copy_test.c); again under ThreadSanitizer where the compiler supports it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CC = shutil.which("cc") or shutil.which("gcc")


def build(out: Path, *flags: str) -> Path | None:
    exe = out / "host_copy_test"
    proc = subprocess.run([CC, "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-pthread",
                           f"-I{ROOT / 'bridge'}", *flags, str(ROOT / "tests" / "native" / "host_copy_test.c"),
                           "-o", str(exe)], capture_output=True, text=True)
    if proc.returncode != 0:
        return None if "-fsanitize=thread" in flags else pytest.fail(proc.stderr)
    return exe


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.parametrize("flags", [("-O2",), ("-O1", "-g", "-fsanitize=thread")], ids=["O2", "tsan"])
def test_split_host_copies_from_many_threads_copy_every_byte(tmp_path, flags):
    exe = build(tmp_path, *flags)
    if exe is None:
        pytest.skip("the C compiler has no ThreadSanitizer")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "WARNING: ThreadSanitizer" not in proc.stderr, proc.stderr[-4000:]
    ok, split, _by_helpers, helpers = proc.stdout.split()
    assert ok == "ok" and int(split) > 0 and 1 <= int(helpers) <= 11
