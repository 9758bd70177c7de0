"""Raw access to the servers: reachability, set-up and clean-up of tables, query counters."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import Callable, Iterable
from typing import Any

from bench.contenders import (
    Kazoo,
    Targets,
    _my_connect,
    _pg_connect,
    _redis_client,
    etcd_client,
    floor_ddl,
)


def raw(t: Targets, backend: str) -> Any:
    if backend == "postgresql":
        return _pg_connect(t.postgresql)
    if backend == "mysql":
        return _my_connect(t.mysql)
    if backend == "sqlite":
        return sqlite3.connect(t.sqlite_path, isolation_level=None, timeout=30)
    if backend == "zookeeper":
        return Kazoo(t.zookeeper)
    if backend == "etcd":
        return etcd_client(t.etcd)
    return _redis_client(t.redis)


def reachable(t: Targets, backend: str) -> str | None:
    """None if the backend answers, else why not."""
    try:
        conn = raw(t, backend)
        if backend == "redis":
            conn.ping()
        conn.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    return None


def version(t: Targets, backend: str) -> str:
    with contextlib.suppress(Exception):
        conn = raw(t, backend)
        try:
            if backend == "redis":
                return "Redis " + str(conn.info("server")["redis_version"])
            if backend == "zookeeper":
                return "ZooKeeper " + ".".join(map(str, conn.zk.server_version()))
            if backend == "etcd":
                return "etcd " + str(conn.status().version)
            if backend == "sqlite":
                return "SQLite " + sqlite3.sqlite_version
            cur = conn.cursor()
            cur.execute("SELECT version()")
            return str(cur.fetchone()[0]).split(" on ")[0]
        finally:
            conn.close()
    return "?"


def execute(t: Targets, backend: str, statements: list[str]) -> None:
    conn = raw(t, backend)
    try:
        cur = conn.cursor()
        for s in statements:
            cur.execute(s)
    finally:
        conn.close()


def create_floor_table(t: Targets, backend: str) -> None:
    if backend in ("postgresql", "mysql", "sqlite"):
        execute(t, backend, floor_ddl(backend, t.floor_table))


def each_store(
    stores: Iterable[str],
    t: Targets,
    table: str,
    tag: str,
    measure: Callable[[str, str, dict[str, Any]], None],
) -> dict[str, Any]:
    """``measure(store, table, result)`` per store, on a table of its own (``<t.table>_<table>``,
    dropped afterwards); an error ends that store's measurement, noted in its result."""
    out: dict[str, Any] = {}
    for store in stores:
        name = f"{t.table}_{table}"
        res: dict[str, Any] = {}
        out[store] = res
        try:
            measure(store, name, res)
        except Exception as exc:
            res["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            print(f"[{tag}] {store}: {res['error']}", file=sys.stderr, flush=True)
        finally:
            drop_dblock_tables(t, store, name)
    return out


def drop_dblock_tables(t: Targets, backend: str, table: str) -> None:
    """Drop ``table`` and everything dblock keeps beside it (``<table>_meta``, ``_holders``,
    the token sequence...): whatever is named ``<table>_*``. Run ids keep the names unique."""
    if backend == "zookeeper":  # its nodes, and kazoo's recipe's
        with contextlib.suppress(Exception):
            from dblock.stores.zookeeper.store import _encode

            k = Kazoo(t.zookeeper)
            try:
                for path in (f"{k.chroot}/{_encode(table)}", f"{k.chroot}/kazoo_bench"):
                    k.zk.delete(path, recursive=True)
            finally:
                k.close()
        return
    if backend == "etcd":  # its keys, as in dblock.stores.etcd.store
        with contextlib.suppress(Exception):
            from bench._chaos_db import drop_tables

            drop_tables(t.etcd, [table])
        return
    if backend == "redis":  # its keys: dblock:{<table>}:*
        with contextlib.suppress(Exception):
            client = raw(t, backend)
            try:
                for name in client.scan_iter(match=f"dblock:{{{table}}}:*", count=500):
                    client.delete(name)
            finally:
                client.close()
        return
    if backend not in ("postgresql", "mysql"):
        return  # SQLite lives in the run's temporary directory
    with contextlib.suppress(Exception):
        conn = raw(t, backend)
        try:
            cur = conn.cursor()
            like = table.replace("_", "\\_") + "\\_%"
            if backend == "postgresql":
                cur.execute(
                    "SELECT c.relname, c.relkind FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'S') "
                    "AND (c.relname = %s OR c.relname LIKE %s)",
                    (table, like),
                )
                for name, kind in cur.fetchall():
                    what = "SEQUENCE" if kind == "S" else "TABLE"
                    cur.execute(f'DROP {what} IF EXISTS "{name}" CASCADE')
            else:
                cur.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = "
                    "DATABASE() AND (table_name = %s OR table_name LIKE %s)",
                    (table, like),
                )
                for (name,) in cur.fetchall():
                    cur.execute(f"DROP TABLE IF EXISTS `{name}`")
        finally:
            conn.close()


def drop_floor_table(t: Targets, backend: str) -> None:
    if backend in ("postgresql", "mysql", "sqlite"):
        with contextlib.suppress(Exception):
            execute(t, backend, [f"DROP TABLE IF EXISTS {t.floor_table}"])


# -- (d) many keys -----------------------------------------------------------------------------
def fill_held(t: Targets, backend: str, table: str, n: int, prefix: str = "held-") -> None:
    """Insert ``n`` live holds straight into dblock's table (its documented DDL): fast set-up
    for the many-keys scenario, which would otherwise need n acquisitions."""
    conn = raw(t, backend)
    try:
        cur = conn.cursor()
        if backend == "postgresql":
            cur.execute(
                f'INSERT INTO "{table}" (lock_key, kind, owner, token, acquired_at, expires_at) '
                "SELECT %s || g, 'lock', 'bench-holder', g, now(), now() + interval '1 hour' "
                "FROM generate_series(1, %s) g",
                (prefix, n),
            )
            cur.execute(f'ANALYZE "{table}"')
            return
        batch = 5000
        for start in range(0, n, batch):
            rows = [(f"{prefix}{i}", i) for i in range(start + 1, min(n, start + batch) + 1)]
            if backend == "mysql":
                cur.executemany(
                    f"INSERT INTO `{table}` (lock_key, kind, owner, token, acquired_at, "
                    "expires_at) VALUES (%s, 'lock', 'bench-holder', %s, UTC_TIMESTAMP(6), "
                    "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
                    rows,
                )
            else:
                now = "((julianday('now') - 2440587.5) * 86400.0)"
                cur.execute("BEGIN")
                cur.executemany(
                    f'INSERT INTO "{table}" (lock_key, kind, owner, token, acquired_at, '
                    f"expires_at) VALUES (?, 'lock', 'bench-holder', ?, {now}, {now} + 3600)",
                    rows,
                )
                cur.execute("COMMIT")
        if backend == "mysql":
            cur.execute(f"ANALYZE TABLE `{table}`")
            cur.fetchall()
    finally:
        conn.close()


def expire_all(t: Targets, backend: str, table: str) -> None:
    if backend == "postgresql":
        sql = f"UPDATE \"{table}\" SET owner = NULL, expires_at = now() - interval '1 hour'"
    elif backend == "mysql":
        sql = f"UPDATE `{table}` SET owner = NULL, expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR"
    else:
        sql = (
            f'UPDATE "{table}" SET owner = NULL, '
            "expires_at = (julianday('now') - 2440587.5) * 86400.0 - 3600"
        )
    execute(t, backend, [sql])


# -- (e) query counters --------------------------------------------------------------------
class QueryCounter:
    """Statements the server has run, all clients together (so other load shows up as noise,
    which is why the scenario quotes the smallest of its repeats and subtracts a baseline).

    PostgreSQL: ``xact_commit + xact_rollback`` of this database in ``pg_stat_database`` (each
    autocommitted statement is one transaction; a backend flushes its counts within ~1 s).
    MariaDB/MySQL: ``SHOW GLOBAL STATUS LIKE 'Questions'``. Redis: the sum of INFO commandstats.
    """

    what = {
        "postgresql": "pg_stat_database xact_commit+xact_rollback",
        "mysql": "SHOW GLOBAL STATUS 'Questions'",
        "redis": "INFO commandstats calls",
    }

    def __init__(self, t: Targets, backend: str) -> None:
        self.backend = backend
        self.conn = raw(t, backend)

    def read(self) -> int:
        if self.backend == "redis":
            stats = self.conn.info("commandstats")
            return sum(int(v["calls"]) for v in stats.values())
        cur = self.conn.cursor()
        if self.backend == "postgresql":
            cur.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                "WHERE datname = current_database()"
            )
        else:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Questions'")
            return int(cur.fetchone()[1])
        return int(cur.fetchone()[0])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


def private_pg_database(t: Targets, name: str) -> Targets | None:
    """A fresh PostgreSQL database for scenario (e), so that pg_stat_database counts only what
    the bench itself runs there (other clients of the shared server use other databases).
    None if it cannot be created (then (e) counts in the shared database)."""
    from dataclasses import replace
    from urllib.parse import urlsplit, urlunsplit

    try:
        execute(t, "postgresql", [f'CREATE DATABASE "{name}"'])
    except Exception:
        return None
    p = urlsplit(t.postgresql)
    mine = replace(t, postgresql=urlunsplit((p.scheme, p.netloc, "/" + name, p.query, "")))
    create_floor_table(mine, "postgresql")
    return mine


def drop_pg_database(t: Targets, name: str) -> None:
    with contextlib.suppress(Exception):
        execute(t, "postgresql", [f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'])
