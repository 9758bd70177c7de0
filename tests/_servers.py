"""Where the test servers are, and raw access to them (no dblock code involved)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from functools import cache
from typing import Any
from urllib.parse import urlsplit

BACKENDS = ("sqlite", "postgresql", "mysql")
POSTGRESQL_URL = os.environ.get(
    "DBLOCK_TEST_POSTGRESQL_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("DBLOCK_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
REDIS_URL = os.environ.get("DBLOCK_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ZOOKEEPER_URL = os.environ.get(
    "DBLOCK_TEST_ZOOKEEPER_URL", "zookeeper://127.0.0.1:2181/dblock_test"
)
ETCD_URL = os.environ.get("DBLOCK_TEST_ETCD_URL", "etcd://127.0.0.1:2379")
REQUIRE_SERVERS = os.environ.get("DBLOCK_REQUIRE_SERVERS") == "1"


def server_url(dialect: str, tmp_dir: str) -> str:
    if dialect == "sqlite":
        return f"sqlite:///{tmp_dir}/locks.sqlite3"
    return POSTGRESQL_URL if dialect == "postgresql" else MYSQL_URL


def raw_connect(url: str) -> Any:
    """A plain driver connection in autocommit mode (to inspect or break things in tests)."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return sqlite3.connect(parts.path[1:], isolation_level=None, timeout=30)
    if parts.scheme in ("postgresql", "postgres"):
        import psycopg

        return psycopg.connect(url, autocommit=True, connect_timeout=5)
    if parts.scheme in ("redis", "rediss"):
        return raw_redis(url)
    if parts.scheme in ("zookeeper", "zk"):
        return raw_zookeeper(url)
    if parts.scheme.startswith("etcd"):
        return raw_etcd(url)
    import pymysql

    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=parts.path.lstrip("/"),
        autocommit=True,
        connect_timeout=5,
        charset="utf8mb4",
    )


def raw_redis(url: str) -> Any:
    """A plain redis-py client (answers str), its server reached now (ping)."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5, decode_responses=True)
    client.ping()  # a failed connection leaves no socket open
    return client


def raw_zookeeper(url: str) -> Any:
    """A started kazoo client (``.zk``) of the URL's servers; paths are absolute."""
    from bench.contenders import Kazoo

    return Kazoo(url)


def zookeeper_base(url: str, table: str) -> str:
    """The node under which dblock keeps ``table`` (as in dblock.stores.zookeeper.store)."""
    from dblock.stores.zookeeper.store import _encode

    chroot = urlsplit(url).path.strip("/")
    return f"/{chroot}/{_encode(table)}" if chroot else f"/{_encode(table)}"


def raw_etcd(url: str) -> Any:
    """A plain etcd client (pyetcd) of the URL's first endpoint, its server reached now."""
    from bench._chaos_db import connect

    return connect(url, autocommit=True)


def redis_prefix(table: str) -> str:
    """The prefix of a lock table's keys in Redis (as in dblock.stores.redis.store)."""
    return f"dblock:{{{table}}}:"


def reachable(url: str, raw: Callable[[str], Any] | None = None) -> str | None:
    """None if the server answers (``raw``: a store's own plain client), else the reason."""
    try:
        conn = (raw or raw_connect)(url)
        conn.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@cache
def _reachable_once(url: str, raw: Callable[[str], Any] | None = None) -> str | None:
    return reachable(url, raw)


def require_server(name: str, url: str, raw: Callable[[str], Any] | None = None) -> None:
    """Skip the test if the server is unreachable, or fail it under DBLOCK_REQUIRE_SERVERS=1."""
    import pytest

    reason = _reachable_once(url, raw)
    if reason is not None:
        message = f"{name} server at {url} unreachable: {reason}"
        if REQUIRE_SERVERS:
            pytest.fail(message + " (DBLOCK_REQUIRE_SERVERS=1)")
        pytest.skip(message)


def drop_tables(url: str, table: str) -> None:
    """Drop the lock table and what lives beside it (names as in dblock.stores._names)."""
    from dblock.stores._names import aux_name

    conn = raw_connect(url)
    if urlsplit(url).scheme in ("zookeeper", "zk"):
        try:
            conn.zk.delete(zookeeper_base(url, table), recursive=True)
        finally:
            conn.close()
        return
    if urlsplit(url).scheme.startswith("etcd"):
        try:
            conn.delete_prefix(f"dblock/{table}/".encode())
            conn.delete(f"dblock/{table}\0".encode())
        finally:
            conn.close()
        return
    if urlsplit(url).scheme in ("redis", "rediss"):
        try:
            match = redis_prefix(table).replace("[", "\\[").replace("]", "\\]") + "*"
            for found in conn.scan_iter(match=match, count=500):
                conn.delete(found)
        finally:
            conn.close()
        return
    try:
        cur = conn.cursor()
        scheme = urlsplit(url).scheme
        q = "`" if scheme in ("mysql", "mariadb") else '"'
        aux = ("_meta", "_holders", "_sessions") if q == "`" else ("_meta", "_holders")
        for name in (table, *(aux_name(table, suffix) for suffix in aux)):
            cur.execute(f"DROP TABLE IF EXISTS {q}{name}{q}")
        if scheme in ("postgresql", "postgres", "mysql", "mariadb"):
            cur.execute(f"DROP SEQUENCE IF EXISTS {q}{aux_name(table, '_token_seq')}{q}")
    finally:
        conn.close()


def columns(url: str, name: str) -> list[str] | None:
    """The columns of table ``name`` (None if there is no such relation), read without dblock."""
    conn: Any = raw_connect(url)
    try:
        cur = conn.cursor()
        scheme = urlsplit(url).scheme
        if scheme == "sqlite":
            cur.execute("SELECT name FROM sqlite_master WHERE name = ?", (name,))
            if cur.fetchone() is None:
                return None
            cur.execute(f'PRAGMA table_info("{name}")')
            return [row[1] for row in cur.fetchall()]
        if scheme == "postgresql":
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{name}"',))
            if not cur.fetchone()[0]:
                return None
            cur.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                (f'"{name}"',),
            )
            return [row[0] for row in cur.fetchall()]
        cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND table_name = %s ORDER BY ordinal_position",
            (name,),
        )
        found = [row[0] for row in cur.fetchall()]
        return found or None
    finally:
        conn.close()


def execute(url: str, *statements: str) -> None:
    conn: Any = raw_connect(url)
    try:
        cur = conn.cursor()
        for statement in statements:
            cur.execute(statement)
        if urlsplit(url).scheme == "sqlite":
            conn.commit()
    finally:
        conn.close()


def demo_tables(url: str) -> set[str]:
    """The tables of ``url``'s database (schema) whose names start ``dblock_demo_``."""
    conn = raw_connect(url)
    try:
        cur = conn.cursor()
        if url.startswith("sqlite"):
            cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        else:
            cur.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
                if url.startswith("postgres")
                else "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = DATABASE()"
            )
        return {str(row[0]) for row in cur.fetchall() if str(row[0]).startswith("dblock_demo_")}
    finally:
        conn.close()
