"""A GPU test's code in a Python process of its own (an allocator plug-in is process-wide, and
PyTorch and Numba take one only before their first allocation): ``prelude`` then ``body``, which
fills the dict ``out``; the process prints it, and :func:`run` returns it. Skips the test where
``library`` is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest


def run(prelude: str, library: str, body: str, timeout: float = 300) -> dict:
    try:
        __import__(library)
    except ImportError:
        pytest.skip(f"{library} is not installed here")
    code = prelude + textwrap.dedent(body) + "\nservice.close()\nprint('RESULT ' + json.dumps(out))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])
