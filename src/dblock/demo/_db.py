"""The demo's own database access: one plain driver connection per process, and its tables."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from pathlib import Path
from typing import Any

from .._url import DatabaseURL

SKU = "sku-42"
#: strategy 8's SKUs: its orders take 1-5 of them
SKUS = tuple(f"sku-{n}" for n in range(41, 47))
WAREHOUSE = "WH1"
PREFIX = "dblock_demo_"
CONNECT_TIMEOUT = 5
SQLITE_BUSY_TIMEOUT = 60.0


class DemoDB:
    """An autocommit connection; SQL is written with ``%s`` placeholders for every dialect."""

    def __init__(self, url: DatabaseURL) -> None:
        self.dialect = url.dialect
        self._conn: Any = _connect(url)

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        """Run one statement; return the number of rows it changed."""
        cur = self._conn.cursor()
        try:
            cur.execute(self._sql(sql), params)
            return int(cur.rowcount)
        finally:
            cur.close()

    def one(self, sql: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        """Run a query; return its first row."""
        cur = self._conn.cursor()
        try:
            cur.execute(self._sql(sql), params)
            row = cur.fetchone()
            return None if row is None else tuple(row)
        finally:
            cur.close()

    @property
    def connection(self) -> Any:
        """The driver's connection (what ``lock.guard`` runs its statement on)."""
        return self._conn

    def begin(self) -> None:
        """Start a transaction (SQLite: ``BEGIN IMMEDIATE``, which takes the write lock)."""
        self.execute("BEGIN IMMEDIATE" if self.dialect == "sqlite" else "BEGIN")

    def commit(self) -> None:
        self.execute("COMMIT")

    def rollback(self) -> None:
        self.execute("ROLLBACK")

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing is best effort
            self._conn.close()

    def _sql(self, sql: str) -> str:
        return sql.replace("%s", "?") if self.dialect == "sqlite" else sql


def _connect(url: DatabaseURL) -> Any:
    if url.dialect == "sqlite":
        path = Path(url.database).expanduser()
        if url.database != ":memory:":
            path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            str(path), timeout=SQLITE_BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
        except BaseException:
            conn.close()
            raise
        return conn
    if url.dialect == "postgresql":
        import psycopg

        options: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in url.query:
            options["connect_timeout"] = CONNECT_TIMEOUT
        if "application_name" not in url.query:
            options["application_name"] = "dblock-demo"
        return psycopg.connect(url.raw, **options)
    import pymysql

    from ..stores.mysql.store import connection_kwargs

    kwargs = connection_kwargs(url, CONNECT_TIMEOUT)
    if "init_command" in url.query:
        kwargs["init_command"] = url.query["init_command"]
    return pymysql.connect(**kwargs)


def create_inventory(db: DemoDB, table: str, stock: int) -> None:
    """(Re)create the demo's inventory table with one SKU holding ``stock`` units."""
    db.execute(f"DROP TABLE IF EXISTS {table}")
    engine = " ENGINE=InnoDB" if db.dialect == "mysql" else ""
    db.execute(
        f"CREATE TABLE {table} (\n"
        "    sku       VARCHAR(64) NOT NULL,\n"
        "    warehouse VARCHAR(16) NOT NULL,\n"
        "    available INTEGER     NOT NULL,\n"
        "    version   INTEGER     NOT NULL DEFAULT 0,\n"
        # strategy 9a's fencing: the token of the newest holder that claimed the row
        "    fence_token BIGINT    NULL,\n"
        "    PRIMARY KEY (sku, warehouse)\n"
        f"){engine}"
    )
    reset_inventory(db, table, stock)


def reset_inventory(db: DemoDB, table: str, stock: int, skus: tuple[str, ...] = (SKU,)) -> None:
    """Put the stock back to ``stock`` units of each of ``skus`` before a strategy runs."""
    db.execute(f"DELETE FROM {table}")
    for sku in skus:
        db.execute(
            f"INSERT INTO {table} (sku, warehouse, available, version) VALUES (%s, %s, %s, 0)",
            (sku, WAREHOUSE, stock),
        )


def stocks_left(db: DemoDB, table: str, skus: tuple[str, ...]) -> dict[str, int]:
    """Each SKU's stock."""
    return {sku: stock_left(db, table, sku) for sku in skus}


def stock_left(db: DemoDB, table: str, sku: str = SKU) -> int:
    row = db.one(
        f"SELECT available FROM {table} WHERE sku = %s AND warehouse = %s", (sku, WAREHOUSE)
    )
    if row is None:
        raise RuntimeError(f"the inventory row of {sku} vanished from {table}")
    return int(row[0])


_CREATED = re.compile(
    r"CREATE\s+(TABLE|SEQUENCE)\s+(?:IF\s+NOT\s+EXISTS\s+)?([\"`]?[\w.]+[\"`]?(?:\.[\"`]?\w+[\"`]?)?)",
    re.IGNORECASE,
)


def lock_table_objects(ddl: list[str]) -> list[tuple[str, str]]:
    """(kind, quoted name) of the tables and sequences that dblock's DDL creates."""
    found: list[tuple[str, str]] = []
    for statement in ddl:
        for kind, name in _CREATED.findall(statement):
            if (kind.upper(), name) not in found:
                found.append((kind.upper(), name))
    return found


def drop_objects(db: DemoDB, objects: list[tuple[str, str]]) -> None:
    """Drop the demo's own tables (and sequences), tables first."""
    for kind, name in sorted(objects, key=lambda o: o[0] != "TABLE"):
        bare = name.replace('"', "").replace("`", "").rsplit(".", 1)[-1]
        if not bare.startswith(PREFIX):
            raise RuntimeError(f"refusing to drop {name}: not one of the demo's own objects")
        if kind == "SEQUENCE" and db.dialect == "sqlite":
            continue
        db.execute(f"DROP {kind} IF EXISTS {name}")
