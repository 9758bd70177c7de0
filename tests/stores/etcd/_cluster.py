"""A private etcd cluster of a test's own: three nodes on free loopback ports under a
temporary directory, each of which the test may SIGKILL, SIGSTOP and start again. The shared
node on 2379 is never touched."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._private_servers import free_ports
from tests._servers import REQUIRE_SERVERS

#: fast elections (as the shared node's): leases down to 1 s, a leader lost is replaced fast
TIMING = ["--heartbeat-interval", "50", "--election-timeout", "500"]


class Node:
    """One member: ``start``, ``kill`` (SIGKILL), ``pause``/``resume`` (SIGSTOP/SIGCONT)."""

    def __init__(self, name: str, command: list[str], log: Path, client_port: int) -> None:
        self.name = name
        self.command = command
        self.log = log
        self.client_port = client_port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Cluster:
    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.url = "etcd://" + ",".join(f"127.0.0.1:{n.client_port}" for n in nodes)

    def client(self, node: Node) -> object:
        import pyetcd

        return pyetcd.client("127.0.0.1", node.client_port, timeout=2)

    def leader(self, timeout: float = 20.0) -> Node:
        """The member that leads now (waits for an election)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if not node.alive:
                    continue
                c = self.client(node)
                try:
                    status = c.status()  # type: ignore[attr-defined]
                    if status.leader is not None:
                        ids = {m.name: m.id for m in c.members}  # type: ignore[attr-defined]
                        for n in self.nodes:
                            if ids.get(n.name) == status.leader.id:
                                return n
                except Exception:  # noqa: S112 - a node still starting
                    continue
                finally:
                    c.close()  # type: ignore[attr-defined]
            time.sleep(0.1)
        raise AssertionError("the private etcd cluster elected no leader")


def etcd_binary() -> str:
    """The etcd server's path; the test fails without it under DBLOCK_REQUIRE_SERVERS=1, else
    it is skipped."""
    binary = shutil.which("etcd")
    if binary is None:
        if REQUIRE_SERVERS:
            pytest.fail("a private etcd server needs etcd (DBLOCK_REQUIRE_SERVERS=1)")
        pytest.skip("a private etcd server needs etcd")
    return binary


@contextlib.contextmanager
def private_cluster(size: int = 3) -> Iterator[Cluster]:
    """A fresh ``size``-node cluster, removed afterwards."""
    binary = etcd_binary()
    root = Path(tempfile.mkdtemp(prefix="dblock-etcd-"))
    ports = free_ports(2 * size)
    names = [f"n{i}" for i in range(size)]
    initial = ",".join(f"{n}=http://127.0.0.1:{ports[2 * i + 1]}" for i, n in enumerate(names))
    nodes = []
    for i, name in enumerate(names):
        client, peer = ports[2 * i], ports[2 * i + 1]
        command = [
            binary,
            "--name", name,
            "--data-dir", str(root / name),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", initial,
            "--initial-cluster-token", root.name,
            "--initial-cluster-state", "new",
            *TIMING,
        ]  # fmt: skip
        nodes.append(Node(name, command, root / f"{name}.log", client))
    cluster = Cluster(nodes)
    try:
        for node in nodes:
            node.start()
        cluster.leader()
        yield cluster
    finally:
        for node in nodes:
            node.kill()
        if os.environ.get("DBLOCK_KEEP_ETCD") is None:
            shutil.rmtree(root, ignore_errors=True)


class ClusterMember:
    """A private cluster as the contract suite's private server: ``url`` reaches the whole
    cluster; ``kill``, ``start`` and ``command`` are those of its first member, so a soak that
    restarts "the server" kills one node of three (the others keep the quorum)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.node = cluster.nodes[0]
        self.url = cluster.url
        self.command = self.node.command

    def kill(self) -> None:
        self.node.kill()

    def start(self) -> None:
        self.node.start()


@contextlib.contextmanager
def private_member(_root: Path) -> Iterator[ClusterMember]:
    with private_cluster() as cluster:
        yield ClusterMember(cluster)
