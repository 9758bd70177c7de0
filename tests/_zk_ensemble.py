"""A private ZooKeeper ensemble of a test's own: three servers (Debian's ``zookeeperd``
classes) on free loopback ports in a temporary directory, which the test may kill, pause
(SIGSTOP) and start again; everything is killed and removed afterwards.

A JVM takes seconds to start: share one ensemble per test module where the tests allow it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from bench._chaos_procs import kill_group

from tests._private_servers import free_ports
from tests._servers import REQUIRE_SERVERS

JAR = Path("/usr/share/java/zookeeper.jar")
CONF = Path("/etc/zookeeper/conf")  # log4j.properties
#: a tick of 250 ms: sessions may last 0.5 s to 5 s (2 to 20 ticks)
TICK_MS = 250


def srvr(port: int) -> str | None:
    """The server's answer to the ``srvr`` four-letter word, or None if it does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"srvr")
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None


class Ensemble:
    """``size`` servers in ``root``; ``url`` names them all, with chroot ``/test``;
    ``settings``: more lines of each server's zoo.cfg (``maxClientCnxns=0``)."""

    def __init__(self, root: Path, size: int = 3, settings: Sequence[str] = ()) -> None:
        java = shutil.which("java")
        if java is None or not JAR.exists():
            message = "a private ZooKeeper ensemble needs java and Debian's zookeeperd"
            if REQUIRE_SERVERS:
                pytest.fail(message + " (DBLOCK_REQUIRE_SERVERS=1)")
            pytest.skip(message)
        assert java is not None
        self.java = java
        self.root = root
        ports = free_ports(3 * size)
        self.client_ports = ports[:size]
        peers = [
            f"server.{i + 1}=127.0.0.1:{ports[size + i]}:{ports[2 * size + i]}" for i in range(size)
        ]
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * size
        for i in range(size):
            home = root / f"zk{i + 1}"
            (home / "data").mkdir(parents=True)
            (home / "data" / "myid").write_text(f"{i + 1}\n")
            (home / "zoo.cfg").write_text(
                "\n".join(
                    [
                        f"tickTime={TICK_MS}",
                        "initLimit=40",
                        "syncLimit=20",
                        f"dataDir={home / 'data'}",
                        f"clientPort={self.client_ports[i]}",
                        "clientPortAddress=127.0.0.1",
                        "admin.enableServer=false",
                        "4lw.commands.whitelist=srvr",
                        *settings,
                        *peers,
                        "",
                    ]
                )
            )
        (root / "client_ports").write_text(" ".join(map(str, self.client_ports)))
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.client_ports)
        self.hosts = hosts
        self.url = f"zookeeper://{hosts}/test"

    def url_with(self, **params: object) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"{self.url}?{query}" if query else self.url

    @classmethod
    def load(cls, root: Path) -> Ensemble:
        """The ensemble made in ``root`` before (same ports, same data)."""
        self = cls.__new__(cls)
        self.java = shutil.which("java") or "java"
        self.root = root
        self.client_ports = [int(p) for p in (root / "client_ports").read_text().split()]
        self._procs = [None] * len(self.client_ports)
        self.hosts = ",".join(f"127.0.0.1:{p}" for p in self.client_ports)
        self.url = f"zookeeper://{self.hosts}/test"
        return self

    def start(self, i: int, *, own_group: bool = True) -> None:
        """Start server ``i`` (0-based); it serves once the ensemble has a quorum."""
        home = self.root / f"zk{i + 1}"
        command = [
            self.java,
            "-Xmx96m",
            f"-Dzookeeper.log.dir={home}",
            "-Dzookeeper.root.logger=INFO,CONSOLE",
            "-cp",
            f"{CONF}:{JAR}",
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(home / "zoo.cfg"),
        ]
        with (home / "server.log").open("ab") as log:
            self._procs[i] = subprocess.Popen(
                command, stdout=log, stderr=log, start_new_session=own_group, env=dict(os.environ)
            )

    def start_all(self) -> None:
        for i in range(len(self._procs)):
            if self._procs[i] is None:
                self.start(i)
        self.wait_serving()

    def wait_serving(self, timeout: float = 90.0) -> None:
        """Until every running server answers as leader or follower."""
        deadline = time.monotonic() + timeout
        while True:
            modes = [self.mode(i) for i, p in enumerate(self._procs) if p is not None]
            if all(m in ("leader", "follower", "standalone") for m in modes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the private ensemble did not form: {modes}")
            time.sleep(0.2)

    def wait_serving_all(self, timeout: float = 90.0) -> None:
        """Until every server answers as leader or follower (started by someone else)."""
        deadline = time.monotonic() + timeout
        while True:
            modes = [self.mode(i) for i in range(len(self.client_ports))]
            if all(m in ("leader", "follower") for m in modes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the private ensemble did not form: {modes}")
            time.sleep(0.2)

    def mode(self, i: int) -> str | None:
        answer = srvr(self.client_ports[i])
        if answer is None:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None  # "This ZooKeeper instance is not currently serving requests"

    def leader(self) -> int:
        for i, proc in enumerate(self._procs):
            if proc is not None and self.mode(i) == "leader":
                return i
        raise RuntimeError("the private ensemble has no leader")

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` (and its group)."""
        proc, self._procs[i] = self._procs[i], None
        if proc is not None:
            kill_group(proc)

    def kill_all(self) -> None:
        for i in range(len(self._procs)):
            self.kill(i)


@contextlib.contextmanager
def private_ensemble(root: Path, size: int = 3, settings: Sequence[str] = ()) -> Iterator[Ensemble]:
    """A running ensemble in ``root`` (one server: standalone), killed and removed on the way
    out."""
    ensemble = Ensemble(root, size, settings)
    try:
        ensemble.start_all()
        yield ensemble
    finally:
        ensemble.kill_all()
        shutil.rmtree(root, ignore_errors=True)


def pause(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def resume(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


class EnsembleProcess:
    """The whole ensemble as one process group (``python -m tests._zk_ensemble ROOT``), for
    chaos.py's ``--server-cmd``: its restart fault SIGKILLs all three servers at once and
    starts them again on the same data (the ``restart`` capability of the provider)."""

    def __init__(self, root: Path) -> None:
        self.ensemble = Ensemble(root)
        self.url = self.ensemble.url
        self.command = [sys.executable, "-m", "tests._zk_ensemble", str(root)]
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.ensemble.root / "launcher.log").open("ab") as log:
            self._proc = subprocess.Popen(
                self.command, cwd=ROOT, stdout=log, stderr=log, start_new_session=True
            )
        self.ensemble.wait_serving_all()

    def kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            kill_group(proc)


@contextlib.contextmanager
def private_ensemble_process(root: Path) -> Iterator[EnsembleProcess]:
    server = EnsembleProcess(root)
    try:
        server.start()
        yield server
    finally:
        server.kill()


ROOT = Path(__file__).resolve().parents[1]


def _run_in_foreground(root: Path) -> None:
    """Start every server of the ensemble in ``root`` in this process group; wait."""
    ensemble = Ensemble.load(root)
    for i in range(len(ensemble.client_ports)):
        ensemble.start(i, own_group=False)
    signal.pause()


if __name__ == "__main__":
    _run_in_foreground(Path(sys.argv[1]))
