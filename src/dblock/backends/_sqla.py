"""dblock's SQL stores on a SQLAlchemy ``Engine`` or ``AsyncEngine`` (docs/sqlalchemy.md).

Where the engine's driver is the one the store speaks (psycopg 3, sync or async; the stdlib's
sqlite3), each operation borrows a connection of the engine's pool and gives it back as it
found it: autocommit (or sqlite3's ``isolation_level``), the row factory, and the session
settings dblock pins (PostgreSQL's ``synchronous_commit``; SQLite's ``busy_timeout`` and
``synchronous``) are saved when it is borrowed and restored before it goes back. A connection
that fails, or cannot be restored, is invalidated: the pool closes it and opens a new one.
dblock holds a borrowed connection for one operation only, never while it waits.

Connections that live longer than one operation are dblock's own, opened beside the pool with
the engine's URL: PostgreSQL's LISTEN connection and its session-lock connections (libpq
keepalives), SQLite's change watches of waiters.

Any other driver (psycopg2, asyncpg, PyMySQL, mysqlclient, aiomysql, asyncmy, aiosqlite) gets a
store of dblock's own on the same database, made from the engine's URL. PyMySQL's connections of
an engine cannot be borrowed: SQLAlchemy opens them with ``CLIENT.FOUND_ROWS`` (dblock reads
changed rows) and without ``MULTI_STATEMENTS`` (a hand-over is one packet of statements).
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from .._errors import ConfigurationError
from .._runtime import THREADS, Runtime
from .._url import DatabaseURL, parse_url
from . import open_backend
from ._contract import Store

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Engine
    from sqlalchemy.pool import PoolProxiedConnection

#: SQLAlchemy's backend name -> dblock's store
_STORES = {"postgresql": "postgresql", "sqlite": "sqlite", "mysql": "mysql", "mariadb": "mysql"}
#: URL query parameters the MySQL and SQLite stores accept (an engine's others are its driver's)
_MYSQL_PARAMS = {
    "connect_timeout",
    "read_timeout",
    "write_timeout",
    "unix_socket",
    "ssl_ca",
    "ssl_cert",
    "ssl_key",
    "init_command",
}
#: SQLAlchemy's own PostgreSQL URL parameters, which are no libpq parameters
_SQLA_PG_PARAMS = {
    "async_fallback",
    "prepared_statement_cache_size",
    "prepared_statement_name_func",
}


def engine_store(
    engine: Any,
    schema: str | None,
    table: str,
    max_connections: int | None,
    runtime: Runtime | None,
) -> Store:
    """The store for ``engine`` (see the module's docstring); ``runtime``: the async client's."""
    sync_engine = _sync_engine(engine, asynchronous=runtime is not None)
    url = sync_engine.url
    dialect = _STORES.get(url.get_backend_name())
    if dialect is None:
        raise ConfigurationError(
            f"dblock keeps no locks in a {url.get_backend_name()} database: use an engine on "
            "PostgreSQL, MySQL/MariaDB or SQLite"
        )
    parsed = dblock_url(url, dialect)
    if max_connections is not None:
        parsed = replace(parsed, max_connections=max_connections)
    driver = url.get_driver_name()
    if dialect == "postgresql" and driver == "psycopg":
        from .postgresql import PostgresBackend

        store: Store = _lending(PostgresBackend)(parsed, schema, table)
    elif dialect == "sqlite" and driver == "pysqlite" and runtime is None:
        from .sqlite import SqliteBackend

        store = _lending(SqliteBackend)(parsed, schema, table)
    else:  # a store of dblock's own beside the engine (its driver missing is said here)
        return open_backend(parsed, schema, table, runtime)
    cast("_Lending", store).lend_from(engine, sync_engine)
    if runtime is not None:
        store.rt = runtime
    return store


def _sync_engine(engine: Any, *, asynchronous: bool) -> Engine:
    from sqlalchemy.engine import Engine

    sync = getattr(engine, "sync_engine", None)  # an AsyncEngine's
    if isinstance(sync, Engine):
        if not asynchronous:
            raise ConfigurationError(
                "dblock.connect() got an AsyncEngine: use await dblock.connect_async(engine)"
            )
        return sync
    if isinstance(engine, Engine):
        if asynchronous:
            raise ConfigurationError(
                "dblock.connect_async() got a blocking Engine: use dblock.connect(engine), or "
                "pass an AsyncEngine (sqlalchemy.ext.asyncio.create_async_engine)"
            )
        return engine
    raise ConfigurationError(
        f"expected a database URL or a SQLAlchemy Engine, not {type(engine).__name__}"
    )


def dblock_url(url: URL, dialect: str) -> DatabaseURL:
    """dblock's URL for the database of the SQLAlchemy ``url`` (password kept, never shown:
    ``safe`` hides it). Query parameters of the engine's driver that the store does not take
    are left out."""
    query = {k: v if isinstance(v, str) else v[-1] for k, v in url.query.items() if v}
    if dialect == "sqlite":
        path = url.database or ""
        if path in ("", ":memory:"):
            raise ConfigurationError(
                "an in-memory SQLite engine cannot hold dblock's locks (no other process, nor "
                "dblock's own connections, would see them): use a file"
            )
        if path.startswith("file:"):
            raise ConfigurationError(
                "dblock takes a SQLite engine on a file path, not a URI filename ('file:...')"
            )
        timeout = f"?timeout={query['timeout']}" if "timeout" in query else ""
        return parse_url(f"sqlite:///{path}{timeout}")
    if dialect == "mysql":
        query = {k: v for k, v in query.items() if k in _MYSQL_PARAMS}
    else:
        if "ssl" in query and "sslmode" not in query:  # asyncpg's name for it
            query["sslmode"] = query["ssl"]
        query = {k: v for k, v in query.items() if k not in _SQLA_PG_PARAMS and k != "ssl"}
    plain = url.set(drivername=dialect, query=query)
    return parse_url(plain.render_as_string(hide_password=False))


@dataclass
class _Loan:
    """A connection borrowed from the engine's pool, and what to give back with it."""

    proxied: Any  # PoolProxiedConnection (blocking) or AsyncConnection (async)
    saved: tuple[Any, ...]


class _Lending:
    """The pool of a SQL store (sql/base.py) over the engine's: every connection checked out
    is borrowed from the engine, and given back (not kept idle) when checked in."""

    _loans: dict[int, _Loan]
    _engine: Any
    _sync_engine: Engine
    rt: Runtime

    def lend_from(self, engine: Any, sync_engine: Engine) -> None:
        self._engine = engine
        self._sync_engine = sync_engine
        self._loans = {}

    # what a dialect does to a borrowed connection
    def _pin(self, conn: Any) -> tuple[Any, ...]:
        raise NotImplementedError

    def _unpin(self, conn: Any, saved: tuple[Any, ...]) -> None:
        raise NotImplementedError

    def _borrow(self) -> tuple[Any, Any]:
        """(the loan's handle, the driver's connection)"""
        if self.rt is THREADS:
            proxied: PoolProxiedConnection = self._sync_engine.raw_connection()
            return proxied, proxied.driver_connection
        from .._green import await_

        conn = await_(self._engine.connect())  # an AsyncConnection
        raw = await_(conn.get_raw_connection())
        return conn, raw.driver_connection

    def _give_back(self, handle: Any, *, invalidate: bool) -> None:
        if self.rt is THREADS:
            if invalidate:
                handle.invalidate()
            else:
                handle.close()
            return
        from .._green import await_

        await_(handle.invalidate() if invalidate else handle.close())

    def _connect(self) -> Any:
        handle, conn = self._borrow()
        try:
            saved = self._pin(conn)
        except BaseException:
            self._give_back(handle, invalidate=True)
            raise
        if self.rt is not THREADS:
            conn = self._green(conn)
        self._loans[id(conn)] = _Loan(handle, saved)
        return conn

    def _green(self, conn: Any) -> Any:
        return conn

    def _checkin(self, conn: Any) -> None:
        loan = self._loans.pop(id(conn), None)
        if loan is None:  # not borrowed
            super()._checkin(conn)  # type: ignore[misc]
            return
        try:
            self._unpin(conn, loan.saved)
        except Exception:  # noqa: BLE001 - a connection that cannot be restored is dropped
            self._give_back(loan.proxied, invalidate=True)
        else:
            self._give_back(loan.proxied, invalidate=False)
        self._returned(conn)

    def _close_connection(self, conn: Any) -> None:
        loan = self._loans.pop(id(conn), None)
        if loan is None:
            super()._close_connection(conn)  # type: ignore[misc]
            return
        with contextlib.suppress(Exception):  # a dead connection may fail in many ways
            self._give_back(loan.proxied, invalidate=True)
        self._returned(conn)

    def _returned(self, conn: Any) -> None:
        """``conn`` went back to the engine: room in dblock's count for another loan."""
        self._forget(1)  # type: ignore[attr-defined]


#: PostgreSQL: the session's synchronous_commit, saved and pinned in one round trip (OFFSET 0
#: keeps the subquery, so the old value is read before set_config changes it)
_PG_PIN = (
    "SELECT old.value, set_config('synchronous_commit', 'on', false) "
    "FROM (SELECT current_setting('synchronous_commit') AS value OFFSET 0) old"
)
_PG_UNPIN = "SELECT set_config('synchronous_commit', %s, false)"


class _PostgresLending(_Lending):
    """Borrowed psycopg connections: autocommit, tuple rows, ``synchronous_commit=on`` (a
    token's acquisition is durable before the client sees it). dblock's other session
    setting, ``enable_bitmapscan=off``, is left alone on the user's connections."""

    _pids: dict[int, int]

    def _pin(self, conn: Any) -> tuple[Any, ...]:
        from psycopg.rows import tuple_row

        saved = (conn.autocommit, conn.row_factory)
        if self.rt is THREADS:
            conn.autocommit = True
            conn.row_factory = tuple_row
            old = conn.execute(_PG_PIN).fetchone()[0]
        else:
            from .._green import await_

            await_(conn.set_autocommit(True))
            conn.row_factory = tuple_row
            old = await_(_fetch_one(conn, _PG_PIN))[0]
        return (*saved, old)

    def _unpin(self, conn: Any, saved: tuple[Any, ...]) -> None:
        autocommit, row_factory, old = saved
        self._pids.pop(id(conn), None)
        if self.rt is THREADS:
            if old != "on":
                conn.execute(_PG_UNPIN, (old,))
            conn.row_factory = row_factory
            conn.autocommit = autocommit
            return
        from .._green import await_

        raw = conn._conn  # the GreenConnection's AsyncConnection
        if old != "on":
            conn.execute(_PG_UNPIN, (old,))
        raw.row_factory = row_factory
        await_(raw.set_autocommit(autocommit))

    def _green(self, conn: Any) -> Any:
        from ._pg_green import GreenConnection

        return GreenConnection(conn)

    def _connect(self) -> Any:
        conn = super()._connect()
        self._pids[id(conn)] = conn.info.backend_pid  # see PostgresBackend._interrupted
        return conn

    def _close_connection(self, conn: Any) -> None:
        self._pids.pop(id(conn), None)
        super()._close_connection(conn)


async def _fetch_one(conn: Any, query: str) -> Any:
    cur = await conn.execute(query)
    return await cur.fetchone()


class _SqliteLending(_Lending):
    """Borrowed sqlite3 connections: no implicit transactions (``isolation_level=None``),
    tuple rows, dblock's short busy timeout (it retries busy statements itself) and
    ``synchronous=FULL`` (an acquisition whose token a client saw survives a power cut)."""

    _INNER_BUSY_MS: int

    def _pin(self, conn: sqlite3.Connection) -> tuple[Any, ...]:
        saved = (
            conn.isolation_level,
            conn.row_factory,
            conn.execute("PRAGMA busy_timeout").fetchone()[0],
            conn.execute("PRAGMA synchronous").fetchone()[0],
        )
        conn.isolation_level = None
        conn.row_factory = None
        conn.execute(f"PRAGMA busy_timeout = {int(self._INNER_BUSY_MS)}")
        conn.execute("PRAGMA synchronous = FULL")
        return saved

    def _unpin(self, conn: sqlite3.Connection, saved: tuple[Any, ...]) -> None:
        isolation_level, row_factory, busy_timeout, synchronous = saved
        if conn.in_transaction:  # never: every operation ends its own
            conn.rollback()
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout)}")
        conn.execute(f"PRAGMA synchronous = {int(synchronous)}")
        conn.row_factory = row_factory
        conn.isolation_level = isolation_level


def _lending(store: type[Any]) -> type[Any]:
    """``store``'s class whose statement connections are borrowed from an engine's pool."""
    mixin = _PostgresLending if store.dialect == "postgresql" else _SqliteLending
    return type(f"Engine{store.__name__}", (mixin, store), {})
