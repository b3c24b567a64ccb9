"""Compiled CUDA modules on disk (``spark.cudabridge.moduleCacheDir``): an executor's first load of
a source reads the PTX another process compiled instead of running NVRTC again.

An entry is one JSON file per module, named by the module cache key (``ModuleSource.digest``:
the source, options, headers, name expressions, declared signatures, the GPU's architecture,
NVRTC's version and the CUDA include directories), holding the PTX and the lowered names of its
name expressions. Invariants:

* only the executor's user can have written what is read: an entry's PTX is loaded and launched
  over the tasks' memory, and its checks (key, checksum) are computed from the file itself, so
  anyone able to write an entry could run code as a task's kernel. The directory is used only if
  it belongs to the executor's user (``st_uid == os.geteuid()``) and neither group nor others may
  write it; otherwise nothing is read from or written to it (logged once, ``untrusted_directory``
  counts the reads and writes skipped) and modules are compiled. An entry is read only if it is
  a plain file (opened with ``O_NOFOLLOW``: a symbolic link is refused), of that user, that
  neither group nor others may write; otherwise it is ignored like a damaged one (logged,
  ``untrusted_entries``) and written again. The checks are made on the opened directory and
  file (``fstat``), so a rename between a check and the read cannot swap what is read;
* the directory, and each parent the store creates, is made with mode 0700; entries are written
  with mode 0600;
* an entry is whole or absent: it is written to a temporary file in the same directory, synced,
  then renamed over its name (``os.replace``, atomic on one filesystem), so a reader (another
  executor of the same user on the host, say) never sees half of one, and two writers of one
  key both write the same bytes;
* an entry that cannot be read or does not check out (not JSON, nested too deep to decode,
  another format, another key, a PTX whose checksum differs) is ignored, logged and counted
  (``ignored``); the module is then compiled and the entry written again;
* only what compiled and loaded is written: a failed compile never reaches the disk (the
  in-memory cache keeps it for the process), nor does PTX the driver refused;
* a directory that cannot be written costs the disk cache only, never the load (logged,
  ``write_failures``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import threading
from typing import Any

from ..errors import InvalidArgument

log = logging.getLogger(__name__)

_DIGEST = re.compile(r"[0-9a-f]{64}")   # ModuleSource.digest: a sha256 in hex (also path-safe)
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted as an entry opens at once (then refused as not a plain file) instead
# of blocking the load; it changes nothing for a plain file
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _distrust(st: os.stat_result, what: str) -> str | None:
    """Why ``what`` (stat'ed) may hold what another user wrote, or None: it must belong to the
    executor's user and be writable by that user alone."""
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"{what} is owned by uid {st.st_uid}, not by the executor's user (uid {uid})"
    if st.st_mode & _OTHERS_WRITE:
        return f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):#o})"
    return None


def _make_private_dirs(path: str) -> None:
    """Create ``path`` and each missing parent with mode 0700 (``os.makedirs`` gives the parents
    the umask's mode). One that exists already is left as it is (and checked where it is used)."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:      # made meanwhile (another executor), or not a directory: the
            pass                     # open that follows tells which


class ModuleStore:
    FORMAT = 1

    def __init__(self, directory: str) -> None:
        if not isinstance(directory, str) or not directory.strip():
            raise InvalidArgument(f"a module store needs a directory, got {directory!r}")
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self._lock = threading.Lock()
        self._warned_untrusted = False
        self.hits = 0             # loads served from disk (no compile)
        self.misses = 0           # loads that found no usable entry (then compiled)
        self.writes = 0           # entries written
        self.ignored = 0          # entries found unusable (damaged, another format or key)
        self.write_failures = 0   # entries that could not be written
        self.untrusted_directory = 0   # reads and writes skipped: others may write the directory
        self.untrusted_entries = 0     # entries ignored: a link, not a plain file, or others may write it

    def path(self, digest: str) -> str:
        return os.path.join(self.directory, self._name(digest))

    @staticmethod
    def _name(digest: str) -> str:
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise InvalidArgument(f"a module cache key is a sha256 in lower-case hex, got {digest!r}")
        return f"{digest}.json"

    def _count(self, counter: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)

    def _open_directory(self, create: bool) -> int | None:
        """A descriptor of the directory, or None where it may hold what another user wrote
        (counted; logged the first time). Raises OSError where it cannot be opened (absent:
        FileNotFoundError)."""
        if create:
            _make_private_dirs(self.directory)
        fd = os.open(self.directory, _DIR_FLAGS)
        try:
            why = _distrust(os.stat(fd), f"the directory {self.directory}")
        except BaseException:
            os.close(fd)
            raise
        if why is None:
            return fd
        os.close(fd)
        with self._lock:
            self.untrusted_directory += 1
            first, self._warned_untrusted = not self._warned_untrusted, True
        if first:
            log.warning("module cache: not using the module cache directory %s: %s. Anyone who can write "
                        "there can have the executor load their code as a task's kernel; it must belong to the "
                        "executor's user and be writable by it alone (chmod 700). Modules are compiled instead, "
                        "and nothing is written there", self.directory, why)
        return None

    def get(self, digest: str) -> tuple[str, dict[str, str]] | None:
        """(PTX, lowered names) stored for ``digest``, or None (absent, untrusted or unusable: logged)."""
        name = self._name(digest)
        path = self.path(digest)
        try:
            dfd = self._open_directory(create=False)
        except FileNotFoundError:
            dfd = None
        except OSError as exc:
            log.warning("module cache: cannot read the directory %s (compiling instead): %s", self.directory, exc)
            dfd = None
        if dfd is None:
            self._count("misses")
            return None
        try:
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
            except FileNotFoundError:
                self._count("misses")
                return None
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                return self._untrusted(path, "it is a symbolic link")
            with open(fd, "rb") as f:
                st = os.fstat(f.fileno())
                why = "it is not a plain file" if not stat.S_ISREG(st.st_mode) else _distrust(st, "it")
                if why is not None:
                    return self._untrusted(path, why)
                data = f.read()
            compiled = self._checked(json.loads(data.decode("utf-8")), digest)
        except (OSError, ValueError, RecursionError) as exc:
            # unreadable, not JSON (or nested deeper than the decoder goes), or not an entry of this key
            log.warning("module cache: ignoring %s (it will be compiled and written again): %s", path,
                        f"{type(exc).__name__}: {exc}" if isinstance(exc, RecursionError) else exc)
            self._count("ignored")
            self._count("misses")
            return None
        finally:
            os.close(dfd)
        self._count("hits")
        return compiled

    def _untrusted(self, path: str, why: str) -> None:
        log.warning("module cache: ignoring %s (it will be compiled and written again): %s; an entry must be a "
                    "plain file of the executor's user, writable by it alone", path, why)
        self._count("untrusted_entries")
        self._count("misses")
        return None

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
        """Store a module's (PTX, lowered names) under ``digest``, atomically, readable and writable
        by the executor's user alone; False (logged) when the directory cannot be written or is
        not trusted (the module stays compiled in memory)."""
        name = self._name(digest)
        path = self.path(digest)
        ptx, lowered = compiled
        data = json.dumps({"format": self.FORMAT, "digest": digest, "target": target, "lowered": lowered,
                           "ptx_sha256": hashlib.sha256(ptx.encode()).hexdigest(), "ptx": ptx}).encode()
        dfd = created = None
        try:
            dfd = self._open_directory(create=True)
            if dfd is None:
                return False
            tmp = f".{digest}.{secrets.token_hex(8)}.tmp"
            fd = os.open(tmp, _WRITE_FLAGS, 0o600, dir_fd=dfd)
            created = tmp
            with open(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)   # the entry appears whole, or not at all
            created = None
        except OSError as exc:
            log.warning("module cache: could not write %s (the module stays compiled in memory): %s", path, exc)
            self._count("write_failures")
            return False
        finally:
            if created is not None:
                try:
                    os.unlink(created, dir_fd=dfd)
                except OSError:
                    pass
            if dfd is not None:
                os.close(dfd)
        self._count("writes")
        return True

    def discard(self, digest: str) -> None:
        """Remove the entry of ``digest`` (one whose PTX the driver refused), if there is one."""
        name = self._name(digest)
        try:
            dfd = self._open_directory(create=False)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("module cache: could not remove %s: %s", self.path(digest), exc)
            return
        if dfd is None:
            return
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("module cache: could not remove %s: %s", self.path(digest), exc)
        finally:
            os.close(dfd)

    def statistics(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "writes": self.writes, "ignored": self.ignored,
                    "write_failures": self.write_failures, "untrusted_directory": self.untrusted_directory,
                    "untrusted_entries": self.untrusted_entries}
