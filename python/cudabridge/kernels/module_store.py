"""Compiled CUDA modules on disk (``spark.cudabridge.moduleCacheDir``): an executor's first load of
a source reads the PTX another process compiled instead of running NVRTC again.

An entry is one JSON file per module, named by the module cache key (``ModuleSource.digest``:
the source, options, headers, name expressions, declared signatures, the GPU's architecture,
NVRTC's version and the CUDA include directories), holding the PTX and the lowered names of its
name expressions. Invariants:

* an entry is whole or absent: it is written to a temporary file in the same directory, synced,
  then renamed over its name (``os.replace``, atomic on one filesystem), so a reader (another
  executor on the host, say) never sees half of one, and two writers of one key both write the
  same bytes;
* an entry that cannot be read or does not check out (not JSON, another format, another key, a
  PTX whose checksum differs) is ignored, logged and counted (``ignored``); the module is then
  compiled and the entry written again;
* only what compiled and loaded is written: a failed compile never reaches the disk (the
  in-memory cache keeps it for the process), nor does PTX the driver refused;
* a directory that cannot be written costs the disk cache only, never the load (logged,
  ``write_failures``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import threading
from typing import Any

from ..errors import InvalidArgument

log = logging.getLogger(__name__)

_DIGEST = re.compile(r"[0-9a-f]{64}")   # ModuleSource.digest: a sha256 in hex (also path-safe)


class ModuleStore:
    FORMAT = 1

    def __init__(self, directory: str) -> None:
        if not isinstance(directory, str) or not directory.strip():
            raise InvalidArgument(f"a module store needs a directory, got {directory!r}")
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self._lock = threading.Lock()
        self.hits = 0             # loads served from disk (no compile)
        self.misses = 0           # loads that found no usable entry (then compiled)
        self.writes = 0           # entries written
        self.ignored = 0          # entries found unusable (damaged, another format or key)
        self.write_failures = 0   # entries that could not be written

    def path(self, digest: str) -> str:
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise InvalidArgument(f"a module cache key is a sha256 in lower-case hex, got {digest!r}")
        return os.path.join(self.directory, f"{digest}.json")

    def _count(self, counter: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)

    def get(self, digest: str) -> tuple[str, dict[str, str]] | None:
        """(PTX, lowered names) stored for ``digest``, or None (absent, or unusable: logged)."""
        path = self.path(digest)
        try:
            with open(path, encoding="utf-8") as f:
                entry = json.load(f)
            compiled = self._checked(entry, digest)
        except FileNotFoundError:
            self._count("misses")
            return None
        except (OSError, ValueError) as exc:   # unreadable, not JSON, or not an entry of this key
            log.warning("module cache: ignoring %s (it will be compiled and written again): %s", path, exc)
            self._count("ignored")
            self._count("misses")
            return None
        self._count("hits")
        return compiled

    @classmethod
    def _checked(cls, entry: Any, digest: str) -> tuple[str, dict[str, str]]:
        if not isinstance(entry, dict) or entry.get("format") != cls.FORMAT:
            raise ValueError(f"not a format-{cls.FORMAT} entry")
        if entry.get("digest") != digest:
            raise ValueError(f"the entry is of key {entry.get('digest')!r}")
        ptx, lowered = entry.get("ptx"), entry.get("lowered")
        if not isinstance(ptx, str) or ".version" not in ptx:
            raise ValueError("no PTX in the entry")
        if hashlib.sha256(ptx.encode()).hexdigest() != entry.get("ptx_sha256"):
            raise ValueError("the PTX's checksum differs")
        if not isinstance(lowered, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in lowered.items()):
            raise ValueError("the lowered names are not a map of strs")
        return ptx, dict(lowered)

    def put(self, digest: str, compiled: tuple[str, dict[str, str]], target: str = "") -> bool:
        """Store a module's (PTX, lowered names) under ``digest``, atomically; False (logged) when
        the directory cannot be written."""
        path = self.path(digest)
        ptx, lowered = compiled
        data = json.dumps({"format": self.FORMAT, "digest": digest, "target": target, "lowered": lowered,
                           "ptx_sha256": hashlib.sha256(ptx.encode()).hexdigest(), "ptx": ptx})
        tmp = None
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{digest}.", suffix=".tmp", dir=self.directory)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)        # the entry appears whole, or not at all
            tmp = None
        except OSError as exc:
            log.warning("module cache: could not write %s (the module stays compiled in memory): %s", path, exc)
            self._count("write_failures")
            return False
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        self._count("writes")
        return True

    def discard(self, digest: str) -> None:
        """Remove the entry of ``digest`` (one whose PTX the driver refused), if there is one."""
        try:
            os.unlink(self.path(digest))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("module cache: could not remove %s: %s", self.path(digest), exc)

    def statistics(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "writes": self.writes, "ignored": self.ignored,
                    "write_failures": self.write_failures}
