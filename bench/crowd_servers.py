"""Servers for the crowd scenarios (waiters, clients): hundreds of connections, counted.

The shared PostgreSQL (``max_connections`` 100), MariaDB (151) and ZooKeeper (60 connections
per address) refuse the hundreds of connections these scenarios open, so those three run on
private servers of the run's own, started on free loopback ports with the limits raised and
removed afterwards (the test suite's helpers, ``tests/_private_servers.py`` and
``tests/_zk_ensemble.py``). Redis (10,000 clients) and etcd take the crowd on the shared
servers; SQLite is a file in the run's directory.

Each store's **work** is what its server counts, read before and after a cell: PostgreSQL
``xact_commit + xact_rollback`` over the private server's databases (a backend publishes its
counts when it exits, so the cell's clients are gone before the second read; a LISTENing
backend runs a transaction of its own to read the queue each time a NOTIFY of its database
signals it, so this counts NOTIFY's fan-out too), MariaDB ``Questions``, Redis the ``calls``
of ``INFO commandstats`` of the commands a client sends (scripts, pings, subscriptions: not
those a script calls, which commandstats counts too), etcd the gRPC messages it received
(``grpc_server_msg_received_total``), ZooKeeper the packets ``srvr`` reports as received;
each minus the reads of the counting itself. SQLite has no server: None.
The server's **CPU** is that of its process tree (the process listening on its port, its
children, and the children it has reaped), from ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import servers
from bench.contenders import Targets

#: the stores the crowd scenarios (clients, waiters) run on, in their order
STORES = ("sqlite", "postgresql", "mysql", "redis", "etcd", "zookeeper")
CONNECTIONS = 1200
TICKS = os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def crowd_targets(t: Targets, backends: list[str], tmp: str) -> Iterator[Targets]:
    """``t`` with PostgreSQL, MariaDB and ZooKeeper moved to private servers that take
    ``CONNECTIONS`` connections (each only if it is among ``backends``)."""
    from tests._private_servers import private_mariadb, private_postgresql
    from tests._zk_ensemble import private_ensemble

    with contextlib.ExitStack() as stack:
        moved: dict[str, str] = {}
        if "postgresql" in backends:
            pg = stack.enter_context(
                private_postgresql([f"max_connections={CONNECTIONS}", "fsync=on"])
            )
            moved["postgresql"] = pg.url
        if "mysql" in backends:
            root = Path(tempfile.mkdtemp(prefix="dblock-crowd-mariadb-", dir=tmp))
            stack.callback(shutil.rmtree, root, True)
            my = stack.enter_context(
                private_mariadb(
                    root, [f"--max-connections={CONNECTIONS}", "--thread-cache-size=64"]
                )
            )
            moved["mysql"] = my.url
        if "zookeeper" in backends:
            root = Path(tempfile.mkdtemp(prefix="dblock-crowd-zk-", dir=tmp))
            zk = stack.enter_context(private_ensemble(root, 1, ["maxClientCnxns=0"]))
            moved["zookeeper"] = zk.url
        yield replace(t, **moved)


def port_of(t: Targets, backend: str) -> int | None:
    if backend == "sqlite":
        return None
    url = t.url(backend)
    if backend == "zookeeper":
        return int(urlsplit(url).netloc.split(",")[0].rsplit(":", 1)[1])
    return urlsplit(url).port or {"postgresql": 5432, "mysql": 3306, "redis": 6379}.get(
        backend, 2379
    )


def listener_pid(port: int) -> int | None:
    """The process listening on loopback TCP ``port``, from /proc (None if not found)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                        return int(pid)
    return None


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and of the children it reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return int(fields[1]), (utime + stime + cutime + cstime) / TICKS


def tree_cpu(root: int | None) -> float | None:
    """CPU seconds of ``root``'s process tree so far (live descendants and reaped ones)."""
    if root is None:
        return None
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        s = _stat(int(pid))
        if s is not None:
            stats[int(pid)] = s
    if root not in stats:
        return None
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return total


class Work:
    """The server's count of requests (see the module), read by one connection of its own."""

    def __init__(self, t: Targets, backend: str) -> None:
        self.t, self.backend = t, backend
        self.conn: Any = None
        if backend in ("postgresql", "mysql", "redis"):
            self.conn = servers.raw(t, backend)
        #: what one read adds to the count itself
        self.own = {"postgresql": 1, "mysql": 1, "redis": 1, "zookeeper": 1, "etcd": 0}.get(
            backend, 0
        )

    def read(self) -> int | None:
        b = self.backend
        if b == "postgresql":
            cur = self.conn.cursor()
            cur.execute("SELECT sum(xact_commit + xact_rollback)::bigint FROM pg_stat_database")
            return int(cur.fetchone()[0])
        if b == "mysql":
            cur = self.conn.cursor()
            cur.execute("SHOW GLOBAL STATUS LIKE 'Questions'")
            return int(cur.fetchone()[1])
        if b == "redis":
            stats = self.conn.info("commandstats")
            return sum(int(v["calls"]) for k, v in stats.items() if _top_level(k))
        if b == "zookeeper":
            return _zk_stat(port_of(self.t, b) or 2181, "Received")
        if b == "etcd":
            return _etcd_received(self.t.etcd)
        return None

    def delta(self, before: int | None, after: int | None) -> int | None:
        if before is None or after is None:
            return None
        return max(0, after - before - self.own)

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()


#: commands dblock sends itself, beside its scripts (commandstats also counts each command a
#: script calls: those are the script's work, not requests)
_REDIS_OWN = ("ping", "hello", "client", "script", "subscribe", "unsubscribe", "info", "time")


def _top_level(stat: str) -> bool:
    name = stat.removeprefix("cmdstat_")
    return name.startswith(("eval", "fcall")) or name.split("|")[0] in _REDIS_OWN


def _zk_stat(port: int, field: str) -> int | None:
    """A number of ZooKeeper's ``srvr`` answer (None if it does not answer)."""
    from tests._zk_ensemble import srvr

    m = re.search(rf"{field}: (\d+)", srvr(port) or "")
    return int(m.group(1)) if m else None


def _etcd_received(url: str) -> int | None:
    p = urlsplit(url)
    with urllib.request.urlopen(f"http://{p.hostname}:{p.port or 2379}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("grpc_server_msg_received_total"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def connections(t: Targets, backend: str, work: Work) -> int | None:
    """Connections the server has open now (clients' and the counting one)."""
    b = backend
    if b == "postgresql":
        cur = work.conn.cursor()
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
        return int(cur.fetchone()[0])
    if b == "mysql":
        cur = work.conn.cursor()
        cur.execute("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
        return int(cur.fetchone()[1])
    if b == "redis":
        return int(work.conn.info("clients")["connected_clients"])
    if b == "zookeeper":
        return _zk_stat(port_of(t, b) or 2181, "Connections")
    if b == "etcd":
        pid = listener_pid(port_of(t, b) or 2379)
        if pid is None:
            return None
        return sum(1 for _ in _established(pid))
    return None


def _established(pid: int) -> Iterator[str]:
    """The server's accepted TCP sockets (etcd reports no client count of its own)."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:"):
                yield link


# -- what both crowd scenarios do and report -------------------------------------------------
def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def each_store(
    scenario: str,
    t: Targets,
    backends: list[str],
    tmp: str,
    table: str,
    measure: Callable[[Targets, str, dict[str, Any]], None],
) -> dict[str, Any]:
    """Per store of ``backends`` (on the crowd's servers, in :data:`STORES`' order): its table
    made, then ``measure(targets, store, cells)`` fills the store's cells; a store that fails
    reports its error instead."""
    stores = [s for s in STORES if s in backends]
    out: dict[str, Any] = {}
    if not stores:
        return out
    import dblock  # before any cell forks: the processes find it imported

    with crowd_targets(t, stores, tmp) as there:
        for backend in stores:
            cells: dict[str, Any] = {}
            out[backend] = cells
            try:
                with dblock.connect(there.url(backend), table=table):
                    pass
                measure(there, backend, cells)
            except Exception as exc:
                cells.clear()
                cells["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                log(f"[{scenario}] {backend}: {cells['error']}")
    return out


def summarise(v: dict[str, Any], fields: tuple[str, ...]) -> None:
    """A cell's figures: each field's median over its repeats, and whether every repeat
    excluded (no lost update, no overlap)."""
    from dblock.bench import median

    reps = v["repeats"]
    for field in fields:
        values = [x[field] for x in reps if x.get(field) is not None]
        v[field] = median(values) if values else None
    v["exclusive"] = all(x["exclusive"] for x in reps)
    v["lost_updates"] = sum(x["lost_updates"] for x in reps)
    v["overlaps"] = sum(x["overlaps"] for x in reps)


def fmt(x: Any, spec: str = ",.0f") -> str:
    return "–" if x is None else format(x, spec)
