"""chaos.py's raw database access: the protected tables, tagging, session kills (server
restarts: ``_chaos_server.py``).

No dblock code here except dblock.fencing (the helper under test) and dblock's URL parser.
Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import dblock.fencing
from dblock.tools import parse_url

T = TypeVar("T")

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
#: dialect -> a log table's ``seq`` column: its rows' order of insertion (of commit, where a
#: row lock taken before the insert serialises the transactions)
SEQ = {
    "sqlite": "seq INTEGER PRIMARY KEY AUTOINCREMENT",
    "postgresql": "seq BIGSERIAL PRIMARY KEY",
    "mysql": "seq BIGINT AUTO_INCREMENT PRIMARY KEY",
}


def members(url: str) -> list[str]:
    """The stores of a quorum URL (URLs separated by spaces), or ``[url]``."""
    parts = url.split()
    return parts if len(parts) > 1 and all("://" in p for p in parts) else [url]


def dialect_of(url: str) -> str:
    if len(members(url)) > 1:
        return "quorum"
    return parse_url(url).dialect


def safe(url: str) -> str:
    """The URL (each store's, for a quorum) without secrets."""
    return " ".join(parse_url(m).safe for m in members(url))


def check_loopback(url: str) -> None:
    for member in members(url):
        _check_loopback(member)


def _check_loopback(url: str) -> None:
    parsed = parse_url(url)
    hosts = [parsed.host or "localhost"]
    if parsed.dialect == "zookeeper":  # host:port[,host:port...]
        hosts = [h.rpartition(":")[0] or h for h in hosts[0].split(",")]
    if parsed.dialect == "etcd":  # every endpoint of the cluster
        from dblock.stores.etcd.rpc import endpoints

        hosts = [host for host, _ in endpoints(parsed)]
    if parsed.dialect != "sqlite" and any(h not in LOOPBACK for h in hosts):
        raise SystemExit(f"chaos: refusing {parsed.safe}: the soak only talks to loopback")


def with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query.update(params)
    return urlunsplit(parts._replace(query=urlencode(query)))


def with_user(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def connect(url: str, *, autocommit: bool) -> Any:
    """A plain driver connection with short timeouts (not dblock's); for Redis a redis-py
    client that has reached the server."""
    parsed = parse_url(url)
    if parsed.dialect == "zookeeper":
        return _Kazoo(parsed.host or "")
    if parsed.dialect == "etcd":  # its first endpoint (a cluster's: the node chaos restarts)
        import pyetcd

        from dblock.stores.etcd.rpc import endpoints

        host, port = endpoints(parsed)[0]
        client = pyetcd.client(host, port, timeout=5)
        try:
            client.status()
        except BaseException:
            client.close()
            raise
        return client
    if parsed.dialect == "redis":
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=15)
        client.ping()  # a failed connection leaves no socket open
        return client
    if parsed.dialect == "sqlite":
        return sqlite3.connect(parsed.database, timeout=10, isolation_level=None)
    if parsed.dialect == "postgresql":
        import psycopg

        return psycopg.connect(
            url,
            autocommit=autocommit,
            connect_timeout=5,
            options="-c statement_timeout=10000 -c lock_timeout=10000",
        )
    import pymysql

    return pymysql.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.user or "root",
        password=parsed.password or "",
        database=parsed.database or None,
        autocommit=autocommit,
        connect_timeout=5,
        read_timeout=15,
        write_timeout=15,
        charset="utf8mb4",
    )


def q(dialect: str, name: str) -> str:
    return f"`{name}`" if dialect == "mysql" else f'"{name}"'


def mark(dialect: str) -> str:
    return "?" if dialect == "sqlite" else "%s"


def create_tables(url: str, resource: str, audit: str, keys: int) -> None:
    """The protected resource (one row per key) and the audit of accepted writes.

    The audit row is inserted in the transaction of the accepted write, after the UPDATE
    took the row lock, so its ``seq`` orders the accepted writes of one resource by commit.
    """
    d = dialect_of(url)
    seq = SEQ[d]
    conn = connect(url, autocommit=True)
    try:
        cur = conn.cursor()
        cur.execute(
            f"CREATE TABLE {q(d, resource)} (rid INTEGER PRIMARY KEY, writer VARCHAR(255), "
            "writes INTEGER NOT NULL DEFAULT 0, fence_token BIGINT)"
        )
        cur.execute(
            f"CREATE TABLE {q(d, audit)} ({seq}, rid INTEGER NOT NULL, token BIGINT NOT NULL, "
            "owner VARCHAR(255) NOT NULL)"
        )
        for rid in range(keys):
            cur.execute(
                f"INSERT INTO {q(d, resource)} (rid, writes, fence_token) "
                f"VALUES ({mark(d)}, 0, NULL)",
                (rid,),
            )
    finally:
        conn.close()


def resource_url(url: str, directory: str) -> str:
    """Where the protected resource lives: the database of the locks, or for a store that is
    no SQL database (Redis) an SQLite file of the run's (fencing protects any resource)."""
    if dialect_of(url) in ("redis", "zookeeper", "etcd", "quorum"):
        return f"sqlite:///{directory}/resource.sqlite3"
    return url


def drop_tables(url: str, names: list[str]) -> None:
    """Drop tables, and for a dblock lock table what lives beside it (Redis: its keys)."""
    from dblock.stores._names import aux_name

    d = dialect_of(url)
    if d == "quorum":
        for member in members(url):
            drop_tables(member, names)
        return
    if d == "zookeeper":
        _zookeeper_drop(url, names)
        return
    if d == "etcd":  # a table's keys (as in dblock.stores.etcd.store)
        client = connect(url, autocommit=True)
        try:
            for name in names:
                client.delete_prefix(f"dblock/{name}/".encode())
                client.delete(f"dblock/{name}\0".encode())
        finally:
            client.close()
        return
    conn = connect(url, autocommit=True)
    if d == "redis":
        try:
            for name in names:
                for found in conn.scan_iter(match=f"dblock:{{{name}}}:*", count=500):
                    conn.delete(found)
        finally:
            conn.close()
        return
    try:
        cur = conn.cursor()
        for name in names:
            for table in (name, aux_name(name, "_meta"), aux_name(name, "_holders")):
                cur.execute(f"DROP TABLE IF EXISTS {q(d, table)}")
            if d == "postgresql":
                cur.execute(f"DROP SEQUENCE IF EXISTS {q(d, aux_name(name, '_token_seq'))}")
    finally:
        conn.close()


class _Kazoo:
    """A started kazoo client (the ensemble has a quorum); ``close`` stops it."""

    def __init__(self, hosts: str) -> None:
        from kazoo.client import KazooClient

        self.zk = KazooClient(hosts=hosts, timeout=10)
        try:
            self.zk.start(timeout=5)
        except BaseException:
            self.zk.close()
            raise

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()


def _zookeeper_drop(url: str, names: list[str]) -> None:
    """Delete a lock table's nodes (as laid out by dblock.stores.zookeeper.store)."""
    from kazoo.client import KazooClient

    from dblock.stores.zookeeper.store import _encode

    parsed = parse_url(url)
    zk = KazooClient(hosts=parsed.host, timeout=10)
    zk.start(timeout=10)
    try:
        chroot = f"/{parsed.database}" if parsed.database else ""
        for name in names:
            zk.delete(f"{chroot}/{_encode(name)}", recursive=True)
    finally:
        zk.stop()
        zk.close()


class FencedWriter:
    """A worker's own connection to the protected table: one fenced write per hold."""

    def __init__(self, url: str, resource: str, audit: str) -> None:
        self.url = url
        self.dialect = dialect_of(url)
        self.stmt = dblock.fencing.fenced_update(
            self.dialect,
            resource,
            ["writer"],
            ["rid"],
            token_column="fence_token",  # noqa: S106
        )
        self.audit_sql = (
            f"INSERT INTO {q(self.dialect, audit)} (rid, token, owner) "
            f"VALUES ({mark(self.dialect)}, {mark(self.dialect)}, {mark(self.dialect)})"
        )
        self.conn: Any = None

    def write(self, rid: int, token: int, owner: str) -> bool:
        """True if accepted, False if fenced off; raises the driver's error on failure."""
        if self.conn is None:
            self.conn = connect(self.url, autocommit=self.dialect == "sqlite")
        conn = self.conn
        try:
            cur = conn.cursor()
            if self.dialect == "sqlite":
                cur.execute("BEGIN IMMEDIATE")
            accepted = self.stmt.execute(cur, [owner], [rid], token)
            if accepted:
                cur.execute(self.audit_sql, (rid, token, owner))
            if self.dialect == "sqlite":
                cur.execute("COMMIT")
            else:
                conn.commit()
        except BaseException:
            self.close()
            raise
        return accepted

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def create_guarded_tables(url: str, counter: str, glog: str, keys: int) -> None:
    """The guarded writers' business tables, with no token column: a counter per key and a
    log of the committed read-modify-writes (``n``: the counter value the transaction
    wrote). Two holders' transactions that interleave both write the same ``n``, and the
    counter ends below the number of log rows (a lost update)."""
    d = dialect_of(url)
    seq = SEQ[d]
    conn = connect(url, autocommit=True)
    try:
        cur = conn.cursor()
        cur.execute(f"CREATE TABLE {q(d, counter)} (rid INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        cur.execute(
            f"CREATE TABLE {q(d, glog)} ({seq}, rid INTEGER NOT NULL, n INTEGER NOT NULL, "
            "owner VARCHAR(255) NOT NULL, token BIGINT NOT NULL)"
        )
        for rid in range(keys):
            cur.execute(f"INSERT INTO {q(d, counter)} (rid, n) VALUES ({mark(d)}, 0)", (rid,))
    finally:
        conn.close()


class GuardedWriter:
    """A worker's own application connection (the store's driver, its tagged session, so
    that connection kills hit it too) for a read-modify-write on the business tables in one
    transaction; the worker runs ``lock.guard`` on ``conn`` between ``begin`` and ``read``.
    """

    def __init__(self, url: str, counter: str, glog: str) -> None:
        self.url = url
        self.dialect = dialect_of(url)
        m = mark(self.dialect)
        self.read_sql = f"SELECT n FROM {q(self.dialect, counter)} WHERE rid = {m}"
        self.update_sql = f"UPDATE {q(self.dialect, counter)} SET n = {m} WHERE rid = {m}"
        self.log_sql = (
            f"INSERT INTO {q(self.dialect, glog)} (rid, n, owner, token) "
            f"VALUES ({m}, {m}, {m}, {m})"
        )
        self.conn: Any = None

    def begin(self) -> Any:
        """Open a transaction (a deferred one on SQLite: the guard makes it the writer);
        the connection."""
        if self.conn is None:
            self.conn = connect(self.url, autocommit=False)
        try:
            if self.dialect == "sqlite":
                self.conn.execute("BEGIN")
            elif self.dialect == "mysql":
                self.conn.begin()
            # psycopg (autocommit off) opens the transaction with the first statement
        except BaseException:
            self.close()
            raise
        return self.conn

    def read(self, rid: int) -> int:
        cur = self.conn.cursor()
        cur.execute(self.read_sql, (rid,))
        return int(cur.fetchone()[0])

    def write(self, rid: int, n: int, owner: str, token: int) -> None:
        cur = self.conn.cursor()
        cur.execute(self.update_sql, (n, rid))
        cur.execute(self.log_sql, (rid, n, owner, token))

    def commit(self) -> None:
        if self.dialect == "sqlite":
            self.conn.execute("COMMIT")
        else:
            self.conn.commit()

    def rollback(self) -> None:
        """Best effort; a connection that cannot roll back is closed (its transaction ends
        with it) and opened afresh next time."""
        if self.conn is None:
            return
        try:
            if self.dialect == "sqlite":
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
            else:
                self.conn.rollback()
        except Exception:
            self.close()
            return
        if getattr(self.conn, "closed", False):  # psycopg: a killed session rolls back quietly
            self.close()

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _read(url: str, what: str, read: Callable[[Any, str], T]) -> T:
    """``read(cursor, dialect)`` on a fresh connection, once the server answers again (it may
    be restarting when the run ends): tried for 30 s."""
    d = dialect_of(url)
    last: Exception | None = None
    for _ in range(30):
        try:
            conn = connect(url, autocommit=True)
        except Exception as exc:
            last = exc
            time.sleep(1)
            continue
        try:
            return read(conn.cursor(), d)
        finally:
            conn.close()
    raise RuntimeError(f"cannot read the {what}: {last}")


def read_guarded(url: str, counter: str, glog: str) -> dict[str, Any]:
    """The business tables at the end: ``counters`` {rid: n} and ``log`` rows (seq, rid, n,
    owner, token) in seq order."""

    def read(cur: Any, d: str) -> dict[str, Any]:
        cur.execute(f"SELECT rid, n FROM {q(d, counter)} ORDER BY rid")
        counters = {int(rid): int(n) for rid, n in cur.fetchall()}
        cur.execute(f"SELECT seq, rid, n, owner, token FROM {q(d, glog)} ORDER BY seq")
        log = [(int(a), int(b), int(c), str(e), int(f)) for a, b, c, e, f in cur.fetchall()]
        return {"counters": counters, "log": log}

    return _read(url, "guarded tables", read)


def read_audit(url: str, audit: str, resource: str) -> tuple[list[tuple[int, int, int, str]], Any]:
    """(seq, rid, token, owner) in commit order per resource, and the final resource rows."""

    def read(cur: Any, d: str) -> tuple[list[tuple[int, int, int, str]], Any]:
        cur.execute(f"SELECT seq, rid, token, owner FROM {q(d, audit)} ORDER BY seq")
        rows = [(int(a), int(b), int(c), str(e)) for a, b, c, e in cur.fetchall()]
        cur.execute(f"SELECT rid, writer, fence_token FROM {q(d, resource)} ORDER BY rid")
        return rows, cur.fetchall()

    return _read(url, "audit table", read)


# -- tagging the workers' sessions (server-side faults touch only these) -------------------
def mysql_create_user(admin_url: str, user: str, password: str) -> None:
    conn = connect(admin_url, autocommit=True)
    try:
        cur = conn.cursor()
        db = parse_url(admin_url).database or "test"
        for host in ("%", "localhost", "127.0.0.1"):
            cur.execute("CREATE USER IF NOT EXISTS %s@%s IDENTIFIED BY %s", (user, host, password))
            cur.execute(f"GRANT ALL PRIVILEGES ON `{db}`.* TO %s@%s", (user, host))
    finally:
        conn.close()


def mysql_drop_user(admin_url: str, user: str) -> None:
    conn = connect(admin_url, autocommit=True)
    try:
        cur = conn.cursor()
        for host in ("%", "localhost", "127.0.0.1"):
            cur.execute(f"DROP USER IF EXISTS '{user}'@'{host}'")
    finally:
        conn.close()


def kill_sessions(admin_url: str, tag: str) -> int:
    """Terminate the tagged sessions from the server side; return how many."""
    d = dialect_of(admin_url)
    conn = connect(admin_url, autocommit=True)
    try:
        if d == "redis":  # the workers' connections carry the tag as their client name
            found = [c["id"] for c in conn.client_list() if c.get("name") == tag.encode()]
            for sid in found:
                with contextlib.suppress(Exception):  # gone already
                    conn.client_kill_filter(_id=sid)
            return len(found)
        cur = conn.cursor()
        if d == "postgresql":
            cur.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (tag,),
            )
            return int(cur.fetchone()[0])
        cur.execute("SELECT id FROM information_schema.processlist WHERE user = %s", (tag,))
        killed = 0
        for (sid,) in cur.fetchall():
            try:
                cur.execute(f"KILL {int(sid)}")
                killed += 1
            except Exception as exc:  # 1094: gone already
                if not exc.args or exc.args[0] != 1094:
                    raise
        return killed
    finally:
        conn.close()
