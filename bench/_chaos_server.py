"""The database server that chaos.py's ``restart`` faults take down and start again.

* ``OwnServer`` (``--server-cmd``): a server chaos runs itself, as its child in a process
  group of its own (a private server: its own data directory and loopback port). A restart
  is a crash: SIGKILL to the whole group (what the server had not written to its files is
  lost), then the command again. Chaos SIGKILLs it on exit too.
* ``HostService`` (``--restart-server``, for runs by hand): this host's PostgreSQL or
  MariaDB service on its default port (Debian's layout), stopped cleanly and started again.
  Every other client of that server is disturbed: never while anybody else uses it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Protocol

import _chaos_db as db
from _chaos_procs import kill_group

#: the host service's port, per dialect (``--restart-server`` refuses any other URL)
SERVICE_PORTS = {"postgresql": 5432, "mysql": 3306}


class Server(Protocol):
    def up(self) -> bool:
        """True if the server answers now."""
        ...

    def stop(self) -> None:
        """Take the server down; returns once it is down."""
        ...

    def start(self, wait: float = 60) -> bool:
        """Start the server (nothing if it runs); True once it answers, within ``wait`` s."""
        ...

    def close(self) -> None:
        """The run is over (the tables are dropped already)."""
        ...


def reachable(url: str) -> bool:
    try:
        conn = db.connect(url, autocommit=True)
    except Exception:  # the driver's errors: refused, starting up, shutting down
        return False
    with contextlib.suppress(Exception):
        conn.close()
    return True


class OwnServer:
    """``argv`` (a server in the foreground) run by chaos; ``url`` reaches it."""

    def __init__(self, argv: list[str], url: str, log: Path) -> None:
        self.argv = argv
        self.url = url
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def up(self) -> bool:
        return self.running() and reachable(self.url)

    def start(self, wait: float = 60) -> bool:
        if not self.running():
            self.stop()  # what is left of a server that died on its own
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,  # the server and all its processes: one group
                )
        deadline = time.monotonic() + wait
        while not reachable(self.url):
            if not self.running() or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def stop(self) -> None:
        """SIGKILL to every process of the server; returns once they are all gone."""
        proc, self.proc = self.proc, None
        if proc is not None:
            kill_group(proc)

    def pause(self) -> None:
        """SIGSTOP the server's process group: it keeps its data and its connections, and
        stops answering (unreachable, as behind a partition)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.stop()  # the server's files are crash-safe, and a crash is what a restart does

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


# -- this host's service (Debian's layout) ---------------------------------------------------
def _run(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


#: the pid file of the machine's MariaDB server (Debian's default). Its pid, not any process
#: named mariadbd, is the server's: another one (a private server) may run beside it.
MARIADB_PIDFILE = "/run/mysqld/mysqld.pid"


class HostService:
    """This host's PostgreSQL (the first cluster ``main``) or MariaDB service."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect

    def up(self) -> bool:
        if self.dialect == "postgresql":
            return _run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"], 10).returncode == 0
        ping = ["mariadb-admin", "-uroot", "-h127.0.0.1", "-P3306", "ping"]
        return _run(ping, 10).returncode == 0

    @staticmethod
    def _pg_ctl(action: str, *options: str) -> None:
        cluster = sorted(os.listdir("/etc/postgresql"))[0]
        _run(["pg_ctlcluster", "--skip-systemctl-redirect", *options, cluster, "main", action])

    def stop(self) -> None:
        if self.dialect == "postgresql":
            self._pg_ctl("stop", "-m", "fast")
            return
        pid = self._mariadb_pid()
        _run(["mariadb-admin", "-uroot", "-h127.0.0.1", "-P3306", "shutdown"], 60)
        for _ in range(300):  # wait until the process is gone before starting a new one
            if pid is None or not _alive(pid):
                return
            time.sleep(0.1)

    @staticmethod
    def _mariadb_pid() -> int | None:
        """The running server's pid, from its pid file; None if it is not running."""
        try:
            pid = int(Path(MARIADB_PIDFILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def start(self, wait: float = 60) -> bool:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.dialect == "postgresql":
                if not self.up():
                    self._pg_ctl("start")
            elif self._mariadb_pid() is None:
                _run(
                    [
                        "start-stop-daemon",
                        "--start",
                        "--oknodo",
                        "--background",
                        "--pidfile",
                        MARIADB_PIDFILE,
                        "--exec",
                        "/usr/sbin/mariadbd",
                    ],
                    30,
                )
            for _ in range(20):
                if self.up():
                    return True
                time.sleep(0.25)
        return self.up()

    def close(self) -> None:
        pass  # the service keeps running
