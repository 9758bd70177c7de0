"""PostgreSQL connections borrowed from a pool the application holds: a SQLAlchemy engine's
(stores/_sqla.py) or a psycopg_pool ``ConnectionPool``/``AsyncConnectionPool`` given to
``connect`` in place of a URL (docs/configuration.md, "A client you already have"). Each is
pinned to what dblock needs while borrowed and restored before it goes back; the LISTEN and
session connections are dblock's own, opened with the pool's parameters."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

from ..._errors import ConfigurationError
from ..._runtime import THREADS
from ..._url import redact
from .._lending import Lending, bounded, opened
from . import ENTRY

if TYPE_CHECKING:
    from ..._contract import Store
    from ..._runtime import Runtime

#: what a pool's connection kwargs may hold that is no libpq parameter
_PSYCOPG_KWARGS = {"autocommit", "prepare_threshold", "row_factory", "cursor_factory", "context"}


#: PostgreSQL: the session's synchronous_commit, saved and pinned in one round trip (OFFSET 0
#: keeps the subquery, so the old value is read before set_config changes it)
_PG_PIN = (
    "SELECT old.value, set_config('synchronous_commit', 'on', false) "
    "FROM (SELECT current_setting('synchronous_commit') AS value OFFSET 0) old"
)
_PG_UNPIN = "SELECT set_config('synchronous_commit', %s, false)"


class PostgresLending(Lending):
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
            from ..._green import await_

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
        from ..._green import await_

        raw = conn._conn  # the GreenConnection's AsyncConnection
        if old != "on":
            conn.execute(_PG_UNPIN, (old,))
        raw.row_factory = row_factory
        await_(raw.set_autocommit(autocommit))

    def _green(self, conn: Any) -> Any:
        from .green import GreenConnection

        return GreenConnection(conn)

    def _connect(self) -> Any:
        conn = super()._connect()
        self._pids[id(conn)] = conn.info.backend_pid  # see PostgresStore._interrupted
        return conn

    def _close_connection(self, conn: Any) -> None:
        self._pids.pop(id(conn), None)
        super()._close_connection(conn)


async def _fetch_one(conn: Any, query: str) -> Any:
    cur = await conn.execute(query)
    return await cur.fetchone()


def borrow(
    pool: Any, schema: str | None, table: str, asked: int | None, runtime: Runtime | None
) -> Store:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from .store import PostgresStore

    asynchronous = runtime is not None
    is_async = any(c.__name__ == "AsyncConnectionPool" for c in type(pool).__mro__)
    if is_async and not asynchronous:
        raise TypeError(
            "dblock.connect() got a psycopg_pool.AsyncConnectionPool: use "
            "await dblock.connect_async(pool), or pass a psycopg_pool.ConnectionPool"
        )
    if not is_async and asynchronous:
        raise TypeError(
            "dblock.connect_async() got a blocking psycopg_pool.ConnectionPool: use "
            "dblock.connect(pool), or pass a psycopg_pool.AsyncConnectionPool"
        )

    if pool.closed:
        raise ConfigurationError(f"the {type(pool).__name__} is closed: open it first")
    if callable(pool.conninfo) or callable(pool.kwargs):
        raise ConfigurationError(
            f"dblock reads the {type(pool).__name__}'s connection parameters for its own "
            "LISTEN and session connections: give the pool a conninfo string and a kwargs "
            "dict, not functions"
        )
    kwargs = {k: v for k, v in (pool.kwargs or {}).items() if k not in _PSYCOPG_KWARGS}
    params = conninfo_to_dict(make_conninfo(pool.conninfo or "", **kwargs))
    netloc = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    if password is not None:
        netloc += ":" + quote(str(password), safe="")
    host = str(params.pop("host", ""))
    port = params.pop("port", None)
    where = f"{quote(host, safe='')}:{port}" if port else quote(host, safe="")
    database = quote(str(params.pop("dbname", "")), safe="")
    query = "&".join(f"{quote(k)}={quote(str(v), safe='')}" for k, v in params.items())
    raw = f"postgresql://{netloc}@{where}/{database}" + (f"?{query}" if query else "")
    url = bounded(ENTRY.parse(raw, ENTRY.name, redact(raw)), asked, pool.max_size)
    store = opened(PoolLending, PostgresStore, url, schema, table, runtime=runtime)
    store.lend_from(pool, None)
    return cast("Store", store)


class PoolLending(PostgresLending):
    """Statement connections borrowed from a psycopg_pool pool (``getconn``/``putconn``),
    pinned and restored as those of a SQLAlchemy engine are (``PostgresLending``)."""

    def _borrow(self) -> tuple[Any, Any]:

        if self.rt is THREADS:
            conn = self._engine.getconn()
        else:
            from ..._green import await_

            conn = await_(self._engine.getconn())
        return conn, conn

    def _give_back(self, handle: Any, *, invalidate: bool) -> None:

        if invalidate:  # the pool replaces a closed connection
            with contextlib.suppress(Exception):
                if self.rt is THREADS:
                    handle.close()
                else:
                    from ..._green import await_

                    await_(handle.close())
        if self.rt is THREADS:
            self._engine.putconn(handle)
        else:
            from ..._green import await_

            await_(self._engine.putconn(handle))
