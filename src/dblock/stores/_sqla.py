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

from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from .._contract import Store
from .._errors import ConfigurationError
from .._runtime import Runtime
from .._url import DatabaseURL
from . import open_url
from ._lending import Lending
from ._registry import parse_url

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Engine

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
        from .postgresql.store import PostgresStore

        store: Store = _lending(PostgresStore)(parsed, schema, table)
    elif dialect == "sqlite" and driver == "pysqlite" and runtime is None:
        from .sqlite.store import SqliteStore

        store = _lending(SqliteStore)(parsed, schema, table)
    else:  # a store of dblock's own beside the engine (its driver missing is said here)
        return open_url(parsed, schema, table, runtime)
    cast("Lending", store).lend_from(engine, sync_engine)
    if runtime is not None:
        store.use_runtime(runtime)
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


def _lending(store: type[Any]) -> type[Any]:
    """``store``'s class whose statement connections are borrowed from an engine's pool."""
    mixin: type[Lending]
    if store.dialect == "postgresql":
        from .postgresql.borrowed import PostgresLending

        mixin = PostgresLending
    else:
        from .sqlite.borrowed import SqliteLending

        mixin = SqliteLending
    return type(f"Engine{store.__name__}", (mixin, store), {})
