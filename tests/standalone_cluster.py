"""A real Spark standalone cluster for the tests: one master and N workers, each a separate JVM on
127.0.0.1, started and stopped by Spark's own ``sbin/spark-daemon.sh`` as ``sbin/start-master.sh``
and ``sbin/start-worker.sh`` do (the pyspark package ships ``spark-daemon.sh`` but not those two:
they only call ``spark-daemon.sh start org.apache.spark.deploy.master.Master 1 --host H --port P
--webui-port W`` and ``spark-daemon.sh start org.apache.spark.deploy.worker.Worker N spark://H:P``).

Everything the daemons write (logs, pid files, the workers' application directories, a conf
directory of our own so that no ``spark-env.sh`` or ``spark-defaults.conf`` of the installation
applies) lies under one directory of the test's; every port, the web UIs' included, is picked free
at run time. Each worker offers ``gpus`` GPUs through ``spark.worker.resource.gpu.discoveryScript``
(``tests/emulated_gpu_discovery.sh`` by default: one emulated GPU, address "0").

:class:`StandaloneCluster` is a context manager that always stops the cluster, whatever ends the
block (a failed assertion, a timeout, KeyboardInterrupt): ``spark-daemon.sh stop`` for every daemon
(SIGTERM: a worker's shutdown hook kills its executors), then SIGKILL for every process of the
cluster still alive (found by the pids it started and by scanning /proc for JVMs whose class path
names this cluster's conf directory or whose working directory is under its directory:
the executors). An exception leaving the block gets the logs' tails as a note; :meth:`explain`
gives the same text for an assertion's message. Inside the block SIGTERM raises SystemExit (so a
cancelled CI job still stops the cluster), and an ``atexit`` hook stops a cluster left running if
the interpreter exits inside it (SIGKILL of pytest itself cannot be caught: the daemons run in
sessions of their own and would be left).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DISCOVERY_SCRIPT = Path(__file__).resolve().parent / "emulated_gpu_discovery.sh"
LOG_TAIL_CHARS = 6000      # of each log, in explain()


def executors_conf(workers: int = 2) -> dict[str, str]:
    """An application's settings for a cluster of ``workers`` workers of 2 cores and 1 GPU each (the
    defaults of :class:`StandaloneCluster`): one executor per worker, its GPU shared by its two task
    slots (two tasks at a time on it), and no task before every executor registered."""
    return {
        "spark.executor.resource.gpu.amount": "1",
        "spark.task.resource.gpu.amount": "0.5",
        "spark.executor.cores": "2",
        "spark.executor.memory": "512m",
        "spark.cores.max": str(2 * workers),
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    }


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it; a daemon binds it a moment later)."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chars))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"(unreadable: {exc})"
    return ("..." if size > chars else "") + text


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass
class Daemon:
    kind: str            # MASTER_CLASS or WORKER_CLASS
    instance: int
    args: list[str]
    env: dict[str, str]
    pid: int | None = None
    log: Path | None = None
    start_output: str = ""


@dataclass
class StandaloneCluster:
    base: Path                    # everything of the cluster lies under it
    workers: int = 2
    cores: int = 2                # per worker
    memory: str = "1g"            # per worker
    gpus: int = 1                 # per worker, offered through the discovery script
    discovery_script: Path = DISCOVERY_SCRIPT
    start_timeout: float = 90.0
    stop_timeout: float = 20.0
    host: str = "127.0.0.1"
    # each worker on an address of its own (127.0.0.2, 127.0.0.3, ...: all loopback on Linux), so
    # that Spark sees its executors on different hosts: speculation places a copy of a task only on
    # a host that runs no attempt of it
    hosts_per_worker: bool = False
    daemons: list[Daemon] = field(default_factory=list)
    master_port: int = 0
    master_ui_port: int = 0
    stop_output: list[str] = field(default_factory=list)   # what spark-daemon.sh stop said, per daemon
    killed: dict[int, str] = field(default_factory=dict)   # {pid: command line} SIGKILLed after the stop
    _started: bool = False
    _stopped: bool = False
    _previous_sigterm: tuple | None = None   # (SIGTERM's handler before the block,) while inside it

    # --- layout ----------------------------------------------------------------------------------

    @property
    def conf_dir(self) -> Path:
        return self.base / "conf"

    @property
    def log_dir(self) -> Path:
        return self.base / "logs"

    @property
    def pid_dir(self) -> Path:
        return self.base / "pids"

    def worker_host(self, instance: int) -> str:
        """The address worker ``instance`` (1-based) and its executors bind."""
        return f"127.0.0.{instance + 1}" if self.hosts_per_worker else self.host

    def worker_dir(self, instance: int) -> Path:
        """SPARK_WORKER_DIR of worker ``instance`` (1-based): its executors' ``app-*/<id>/`` live there."""
        return self.base / f"work-{instance}"

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"

    @property
    def master_ui(self) -> str:
        return f"http://{self.host}:{self.master_ui_port}"

    # --- start -----------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        home = spark_home()
        env = dict(os.environ)
        for name in ("SPARK_CONF_DIR", "SPARK_WORKER_OPTS", "SPARK_MASTER_OPTS", "SPARK_DAEMON_JAVA_OPTS",
                     "SPARK_WORKER_INSTANCES", "SPARK_MASTER", "SPARK_NO_DAEMONIZE"):
            env.pop(name, None)
        env.update({
            "SPARK_HOME": str(home),
            "SPARK_CONF_DIR": str(self.conf_dir),
            "SPARK_LOG_DIR": str(self.log_dir),
            "SPARK_PID_DIR": str(self.pid_dir),
            "SPARK_IDENT_STRING": f"cbtest{os.getpid()}",
            "SPARK_LOCAL_IP": self.host,
            "SPARK_MASTER_HOST": self.host,
            "SPARK_NICENESS": "0",
        })
        return env

    def _daemon_script(self) -> Path:
        script = spark_home() / "sbin" / "spark-daemon.sh"
        if not script.is_file():
            raise RuntimeError(f"{script} is missing: this pyspark does not ship Spark's daemon script")
        return script

    def _spawn(self, action: str, d: Daemon) -> subprocess.Popen:
        return subprocess.Popen(["bash", str(self._daemon_script()), action, d.kind, str(d.instance), *d.args],
                                env=d.env, cwd=self.base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)

    def _pid_file(self, d: Daemon) -> Path:
        return self.pid_dir / f"spark-{d.env['SPARK_IDENT_STRING']}-{d.kind}-{d.instance}.pid"

    def _start_daemons(self, daemons: list[Daemon]) -> None:
        """spark-daemon.sh start for each (at once: each waits about 3 s for its JVM to show)."""
        self.daemons.extend(daemons)
        procs = [(d, self._spawn("start", d)) for d in daemons]
        for d, p in procs:
            try:
                out, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
                out += "\n(spark-daemon.sh start ran past 60 s)"
            d.start_output = out
            pid_file = self._pid_file(d)
            if pid_file.is_file():
                d.pid = int(pid_file.read_text().strip())
            d.log = next(iter(sorted(self.log_dir.glob(f"spark-*-{d.kind}-{d.instance}-*.out"))), None)
            if p.returncode != 0 or d.pid is None or not alive(d.pid):
                raise RuntimeError(f"{d.kind} {d.instance} did not start (spark-daemon.sh rc={p.returncode}, "
                                   f"pid {d.pid}):\n{out}")

    def master_state(self) -> dict:
        """The master web UI's /json: its status and workers (state ALIVE once registered)."""
        with urllib.request.urlopen(f"{self.master_ui}/json", timeout=5) as r:
            return json.loads(r.read().decode())

    def alive_workers(self) -> list[dict]:
        try:
            state = self.master_state()
        except (OSError, ValueError, urllib.error.URLError):
            return []
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def _await(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [d for d in self.daemons if d.pid is not None and not alive(d.pid)]
            if dead:
                raise RuntimeError(f"waiting for {what}: {', '.join(f'{d.kind} {d.instance}' for d in dead)} exited")
            time.sleep(0.25)
        raise TimeoutError(f"{what} not within {timeout:.0f} s")

    def start(self) -> "StandaloneCluster":
        for d in (self.conf_dir, self.log_dir, self.pid_dir):
            d.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        self._started = True
        env = self._env()
        self.master_port, self.master_ui_port = free_port(), free_port()
        master_env = dict(env, SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
        self._start_daemons([Daemon(MASTER_CLASS, 1, ["--host", self.host, "--port", str(self.master_port),
                                                      "--webui-port", str(self.master_ui_port)], master_env)])
        self._await("the master's web UI", lambda: self._master_up(), self.start_timeout)
        workers = []
        for i in range(1, self.workers + 1):
            self.worker_dir(i).mkdir(parents=True, exist_ok=True)
            opts = [f"-Dspark.worker.resource.gpu.amount={self.gpus}",
                    f"-Dspark.worker.resource.gpu.discoveryScript={self.discovery_script}"]
            wenv = dict(env, SPARK_WORKER_DIR=str(self.worker_dir(i)), SPARK_WORKER_OPTS=" ".join(opts),
                        SPARK_LOCAL_IP=self.worker_host(i))
            workers.append(Daemon(WORKER_CLASS, i,
                                  ["--host", self.worker_host(i), "--port", str(free_port()), "--webui-port", str(free_port()),
                                   "--cores", str(self.cores), "--memory", self.memory,
                                   "--work-dir", str(self.worker_dir(i)), self.master_url], wenv))
        self._start_daemons(workers)
        self._await(f"{self.workers} ALIVE workers at {self.master_ui}/json",
                    lambda: len(self.alive_workers()) >= self.workers, self.start_timeout)
        return self

    def _master_up(self) -> bool:
        try:
            return self.master_state().get("status") == "ALIVE"
        except (OSError, ValueError, urllib.error.URLError):
            return False

    # --- processes -------------------------------------------------------------------------------

    def processes(self) -> dict[int, str]:
        """{pid: command line} of every live process of this cluster: the daemons it started and any
        JVM whose command line names its conf directory (the daemons put SPARK_CONF_DIR first on
        their class path) or whose working directory lies under it (executors run in
        ``<worker dir>/app-*/<id>/``)."""
        base = str(self.base.resolve())
        conf = str(self.conf_dir.resolve())
        found: dict[int, str] = {}
        known = {d.pid for d in self.daemons if d.pid}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid == os.getpid():
                continue
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                cwd = ""
            java = "java" in cmd.split(" ", 1)[0]
            if pid in known or (java and (conf in cmd or cwd == base or cwd.startswith(base + os.sep))):
                if alive(pid):
                    found[pid] = cmd
        return found

    def stop(self) -> None:
        """spark-daemon.sh stop for every daemon (workers first), then SIGKILL for whatever of the
        cluster is left; waits until none is alive. Safe to call twice, and after a failed start."""
        if not self._started or self._stopped:
            return
        for d in sorted(self.daemons, key=lambda d: d.kind == MASTER_CLASS):
            try:
                p = self._spawn("stop", d)
                out, _ = p.communicate(timeout=30)
                self.stop_output.append(f"{d.kind} {d.instance}: {out.strip()}")
            except BaseException as exc:   # a KeyboardInterrupt here must not leave the rest running
                self.stop_output.append(f"{d.kind} {d.instance}: stop failed: {exc!r}")
        deadline = time.monotonic() + self.stop_timeout
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.25)
        for _ in range(3):
            left = self.processes()
            if not left:
                break
            for pid, cmd in left.items():
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed[pid] = cmd
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        # only now: a stop cut short (a second Ctrl-C) is tried again at exit
        self._stopped = True
        atexit.unregister(self.stop)

    # --- context manager ---------------------------------------------------------------------------

    def __enter__(self) -> "StandaloneCluster":
        # SIGTERM (a CI runner cancelling the job) becomes SystemExit inside the block, so that
        # __exit__ stops the cluster: the daemons run in sessions of their own and would outlive us
        self._previous_sigterm = None
        if threading.current_thread() is threading.main_thread():
            def terminate(signum, frame):
                raise SystemExit(128 + signum)
            self._previous_sigterm = (signal.signal(signal.SIGTERM, terminate),)
        try:
            return self.start()
        except BaseException as exc:
            self._leave(exc)
            raise

    def __exit__(self, exc_type, exc, tb) -> None:
        self._leave(exc)

    def _leave(self, exc: BaseException | None) -> None:
        try:
            self.stop()
        finally:
            if self._previous_sigterm is not None:
                previous, = self._previous_sigterm
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
                self._previous_sigterm = None
        if exc is not None and not isinstance(exc, AssertionError):
            exc.add_note(self.explain())    # an assertion's message has explain() already

    # --- logs --------------------------------------------------------------------------------------

    def executor_logs(self) -> list[Path]:
        """Every executor's stderr and stdout (``<worker dir>/app-*/<executor id>/``)."""
        out = []
        for i in range(1, self.workers + 1):
            out += sorted(self.worker_dir(i).glob("app-*/*/stderr")) + sorted(self.worker_dir(i).glob("app-*/*/stdout"))
        return out

    def explain(self, *parts: str) -> str:
        """``parts`` (e.g. the spark-submit output), then the tails of the master's, the workers' and
        the executors' logs."""
        text = [p for p in parts if p]
        for d in self.daemons:
            if d.start_output and ("failed" in d.start_output or d.pid is None):
                text.append(f"--- spark-daemon.sh start {d.kind} {d.instance}:\n{d.start_output}")
        logs = sorted(self.log_dir.glob("*.out*")) if self.log_dir.is_dir() else []
        for path in logs + self.executor_logs():
            if path.name == "stderr":   # an executor's: the bridge's own lines first (its start comes early)
                try:
                    lines = [ln for ln in path.read_text(errors="replace").splitlines()
                             if "cudabridge: " in ln or " cudabridge." in ln]   # Java's and Python's loggers
                except OSError:
                    lines = []
                if lines:
                    text.append(f"--- {path.relative_to(self.base)} (the bridge's first lines):\n"
                                + "\n".join(ln[:600] for ln in list(dict.fromkeys(lines))[:15]))
            text.append(f"--- {path.relative_to(self.base)} (tail):\n{_tail(path)}")
        if self.killed:
            text.append("--- killed with SIGKILL after spark-daemon.sh stop: "
                        + "; ".join(f"{pid}: {cmd[:200]}" for pid, cmd in self.killed.items()))
        return "\n".join(text)


def submit(cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None):
    """Runs a spark-submit command line in ``cwd`` with ``env`` (default: this process's) and
    SPARK_LOCAL_IP=127.0.0.1, at most ``timeout`` seconds (then raises TimeoutError with its output);
    returns spark_harness.Run."""
    from spark_harness import Run

    cwd.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if env is None else env, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("CUDABRIDGE_BACKEND", None)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise TimeoutError(f"spark-submit ran past its {timeout:.0f} s timeout\nstdout:\n{out}\n"
                           f"stderr tail:\n{err[-6000:]}") from None
    (cwd / "spark-submit.stdout").write_text(proc.stdout)   # kept beside the job's files
    (cwd / "spark-submit.stderr").write_text(proc.stderr)
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0, cwd)
