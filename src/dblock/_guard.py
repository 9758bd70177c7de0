"""``lock.guard(conn)``: the caller's own transaction checks its hold and holds the hold's row
in the lock table still until it ends (docs/guarantees.md).

The store writes the statement (:class:`~dblock._contract.CommitGuards`); this module runs it
on the caller's connection, whatever that is: a DB-API connection of psycopg 3, PyMySQL,
aiomysql, sqlite3 or aiosqlite, or a SQLAlchemy ``Connection``/``Session`` (or their asyncio
forms). A connection is recognised by its class's module, so no driver is imported here, and
SQLAlchemy only for a connection that is one of its own. An asyncio connection is awaited
through the async client's greenlet bridge (:mod:`dblock._green`), so one code path serves
``Lock.guard`` and ``await AsyncLock.guard``.

The hold learns of the guard before its statement is sent (``Hold.guards``): from then until
that transaction ends, the client sends nothing that would wait for the row (a renewal is
held back, ``release()`` and ``renew()`` refuse), since the transaction's owner may be the
very thread that would wait.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from . import _green
from ._contract import CommitGuards, lacking, provides
from ._errors import BackendError, ConfigurationError, DBLockError, LockLost
from .stores._sql_holders import colon_style

if TYPE_CHECKING:
    from ._core import Core
    from ._engine import Hold

#: a DB-API driver's top-level module -> the store it speaks to
DRIVERS = {
    "psycopg": "postgresql",
    "pymysql": "mysql",
    "aiomysql": "mysql",
    "sqlite3": "sqlite",
    "aiosqlite": "sqlite",
}
#: a SQLAlchemy dialect's name -> the store
SQLALCHEMY_DIALECTS = {
    "postgresql": "postgresql",
    "mysql": "mysql",
    "mariadb": "mysql",
    "sqlite": "sqlite",
}
ACCEPTED = (
    "a DB-API connection of psycopg 3, PyMySQL, aiomysql, sqlite3 or aiosqlite, or a "
    "SQLAlchemy Connection, Session, AsyncConnection or AsyncSession"
)


class Lock(Protocol):
    """What the guard asks of the lock whose hold it guards (``dblock.Lock``)."""

    _core: Core

    def _lost_error(self, hold: Hold) -> LockLost: ...

    def _found_lost(self, hold: Hold) -> None: ...


@dataclass
class Result:
    """What the statement answered: its rows (if it returns any) and the rows it changed."""

    rows: list[Any]
    rowcount: int


@dataclass
class Conn:
    """The caller's connection, as the guard uses it."""

    #: what it is, for messages ("a psycopg Connection")
    described: str
    #: the store whose database it speaks to ("postgresql", "mysql", "sqlite")
    dialect: str
    #: an asyncio connection (its calls return awaitables)
    awaited: bool
    #: whether SQLAlchemy runs it (``:name`` parameters)
    sqlalchemy: bool
    #: runs a statement in the connection's transaction (an awaitable if ``awaited``)
    execute: Callable[[str, Mapping[str, object]], Any]
    #: whether the connection's transaction is open now (a flag of the driver: no I/O)
    in_transaction: Callable[[], bool]
    #: whether a statement would commit at once: autocommit, and no transaction open
    autocommits: Callable[[], bool]
    #: after the statement: how to tell, from then on, that its transaction is still open
    #: (SQLAlchemy's transaction objects tell it apart from one begun later)
    settle: Callable[[], Callable[[], bool]] | None = None

    def run(self, sql: str, params: Mapping[str, object]) -> Result:
        result = self.execute(sql, params)
        return _green.await_(result) if self.awaited else result  # type: ignore[no-any-return]


def guard(lock: Lock, hold: Hold, conn: object) -> None:
    """Run the guard of ``hold`` (``lock``'s) in ``conn``'s transaction (see Lock.guard)."""
    store = lock._core.store
    key = hold.key
    if hold.spec.session:
        raise ConfigurationError(
            f"lock.guard(conn) of {key!r}: a session hold (ttl=None) has no row in the lock "
            "table for a transaction to hold still; guard needs a lease hold (a ttl)"
        )
    if hold.spec.shared:
        raise ConfigurationError(
            f"lock.guard(conn) of {key!r}: a {hold.spec.kind} hold is one of several holds of "
            "the key; guard needs a hold that excludes all others (a lock, lock_many, a write "
            "lock, once)"
        )
    if not provides(store, CommitGuards):
        raise lacking(store, CommitGuards, "lock.guard(conn) (on sqlite, postgresql or mysql)")
    c = connection(conn)
    _check(c, store, key)
    if hold.lost:
        raise lock._lost_error(hold)
    tokens = hold.spec.tokens_of(hold.token)
    keys = sorted(tokens)
    params: dict[str, object] = {"owner": hold.owner}
    for i, k in enumerate(keys):
        params[f"k{i}"], params[f"t{i}"] = k, tokens[k]
    sql = store.guard_sql(len(keys))
    if c.sqlalchemy and store.guard_paramstyle == "pyformat":
        sql = colon_style(sql)
    probe = _Probe(c.in_transaction)
    hold.guards.append(probe)  # before the statement: see the module
    try:
        result = c.run(sql, params)
    except Exception as exc:
        raise _failed(exc, store.table, store.safe_url, key, c) from exc
    if c.settle is not None:
        probe.open = c.settle()
    found = len(result.rows) if store.guard_counts == "rows" else result.rowcount
    if found == len(keys):
        return
    _not_live(lock, hold, c, store)


def _check(c: Conn, store: Any, key: str) -> None:
    """Refuse a connection the guard cannot use (before any statement)."""
    if c.dialect != store.name:
        raise ConfigurationError(
            f"lock.guard(conn) of {key!r}: conn is {c.described}, a {c.dialect} connection, "
            f"but the lock table {store.table} is in {store.safe_url}; guard needs a "
            "connection to the database that holds the lock table"
        )
    if c.awaited and not _green.bridged():
        raise TypeError(
            f"lock.guard(conn) of {key!r}: conn is {c.described}, an asyncio connection: "
            "use the async client (await lock.guard(conn))"
        )
    if not c.awaited and _green.bridged():
        raise TypeError(
            f"lock.guard(conn) of {key!r}: conn is {c.described}, a blocking connection, and "
            "its statement would block the event loop: the async client's guard needs an "
            "asyncio connection (psycopg AsyncConnection, aiomysql, aiosqlite, SQLAlchemy "
            "AsyncConnection or AsyncSession)"
        )
    if c.autocommits():
        raise ConfigurationError(
            f"lock.guard(conn) of {key!r}: conn ({c.described}) is in autocommit mode with no "
            "transaction open, so the guard would end with its own statement; open the "
            "transaction to guard first (psycopg: `with conn.transaction():`, sqlite3: "
            "BEGIN, SQLAlchemy: `with conn.begin():`)"
        )


class _Probe:
    """Whether a guard's transaction is still open (``Hold.guards``); the precise test, once
    the statement has run, replaces the driver's flag."""

    def __init__(self, open_: Callable[[], bool]) -> None:
        self.open = open_

    def __call__(self) -> bool:
        try:
            return self.open()
        except Exception:  # noqa: BLE001 - a closed connection: its transaction is over
            return False


def _not_live(lock: Lock, hold: Hold, c: Conn, store: Any) -> None:
    """The statement found the hold (or some of its keys) not live: a connection to another
    database (ConfigurationError), else the hold is lost (LockLost)."""
    try:
        row = c.run(store.guard_identity_sql(), {}).rows[0]
        theirs = store.guard_identity(row)
        ours = store.identity()
    except Exception:  # noqa: BLE001 - cannot tell: the hold is taken for lost
        theirs = ours = None
    if theirs is not None and ours is not None and theirs != ours:
        raise ConfigurationError(
            f"lock.guard(conn) of {hold.key!r}: conn ({c.described}) is connected to another "
            f"database than the lock table {store.table} ({store.safe_url}); guard needs a "
            "connection to the database that holds the lock table"
        )
    with hold.mutex:
        hold.lost = True
        hold.cancel_job()
    lock._found_lost(hold)
    raise LockLost(
        f"lock.guard(conn): the hold of {hold.key!r} (token {hold.token}, table "
        f"{store.table}) is gone: its lease ran out, or another owner took the key, or an "
        "operator force-released it. Roll the transaction back: its writes would not be "
        "protected",
        key=hold.key,
    )


def _failed(exc: Exception, table: str, url: str, key: str, c: Conn) -> DBLockError:
    """The error for the guard's statement failing on the caller's connection."""
    if isinstance(exc, DBLockError):
        return exc
    orig = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the driver's error
    sqlstate = getattr(orig, "sqlstate", None)
    errno = orig.args[0] if orig.args and isinstance(orig.args[0], int) else None
    text = str(orig)
    if sqlstate == "42P01" or errno == 1146 or "no such table" in text:
        return ConfigurationError(
            f"lock.guard(conn) of {key!r}: the lock table {table} is not in the database of "
            f"conn ({c.described}); guard needs a connection to the database that holds the "
            f"lock table ({url})"
        )
    if sqlstate == "42501" or errno in (1142, 1143):
        return ConfigurationError(
            f"lock.guard(conn) of {key!r}: the role of conn ({c.described}) may not lock rows "
            f"of the lock table {table}; grant it SELECT and UPDATE on that table"
        )
    return BackendError(
        f"lock.guard(conn) of {key!r}: the guard's statement failed on conn ({c.described}): "
        f"{type(orig).__name__}: {text.splitlines()[0] if text else ''}; roll back the "
        "transaction"
    )


# -- connections ------------------------------------------------------------------------------
def connection(conn: object) -> Conn:
    """``conn`` as the guard uses it; TypeError for anything else."""
    cls = type(conn)
    root = cls.__module__.split(".", 1)[0]
    if root == "sqlalchemy":
        return _sqlalchemy(conn)
    dialect = DRIVERS.get(root)
    if dialect is not None:
        make = _DBAPI.get((root, cls.__name__.startswith("Async") or root.startswith("aio")))
        if make is not None:
            return make(conn, dialect)
    raise TypeError(
        f"lock.guard(conn): conn must be {ACCEPTED}, not {cls.__module__}.{cls.__qualname__}"
    )


def _psycopg(conn: Any, dialect: str) -> Conn:
    def status() -> int:
        return int(conn.info.transaction_status)  # IDLE 0, ACTIVE 1, INTRANS 2, INERROR 3

    def in_transaction() -> bool:
        return not conn.closed and status() in (1, 2, 3)

    def execute(sql: str, params: Mapping[str, object]) -> Result:
        cur = conn.execute(sql, params)
        return Result(cur.fetchall() if cur.description else [], cur.rowcount)

    return Conn(
        f"a psycopg {type(conn).__name__}",
        dialect,
        False,
        False,
        execute,
        in_transaction,
        lambda: bool(conn.autocommit) and status() == 0,
    )


def _psycopg_async(conn: Any, dialect: str) -> Conn:
    c = _psycopg(conn, dialect)

    async def execute(sql: str, params: Mapping[str, object]) -> Result:
        cur = await conn.execute(sql, params)
        return Result(await cur.fetchall() if cur.description else [], cur.rowcount)

    c.awaited, c.execute = True, execute
    return c


def _pymysql(conn: Any, dialect: str) -> Conn:
    def in_transaction() -> bool:
        return bool(conn.open) and bool(conn.server_status & 1)  # SERVER_STATUS_IN_TRANS

    def execute(sql: str, params: Mapping[str, object]) -> Result:
        with conn.cursor() as cur:
            changed = cur.execute(sql, params)
            return Result(list(cur.fetchall()) if cur.description else [], changed)

    return Conn(
        f"a PyMySQL {type(conn).__name__}",
        dialect,
        False,
        False,
        execute,
        in_transaction,
        lambda: bool(conn.get_autocommit()) and not in_transaction(),
    )


def _aiomysql(conn: Any, dialect: str) -> Conn:
    def in_transaction() -> bool:
        return not conn.closed and bool(conn.get_transaction_status())

    async def execute(sql: str, params: Mapping[str, object]) -> Result:
        async with conn.cursor() as cur:
            changed = await cur.execute(sql, params)
            return Result(list(await cur.fetchall()) if cur.description else [], changed)

    return Conn(
        f"an aiomysql {type(conn).__name__}",
        dialect,
        True,
        False,
        execute,
        in_transaction,
        lambda: bool(conn.get_autocommit()) and not in_transaction(),
    )


def _sqlite_autocommits(conn: Any) -> bool:
    if conn.in_transaction:
        return False
    # Python 3.12's autocommit attribute (True: PEP 249 autocommit); before it, and with its
    # legacy default, isolation_level None means no implicit BEGIN
    return getattr(conn, "autocommit", -1) is True or conn.isolation_level is None


def _sqlite3(conn: Any, dialect: str) -> Conn:
    def execute(sql: str, params: Mapping[str, object]) -> Result:
        cur = conn.execute(sql, params)
        return Result(cur.fetchall() if cur.description else [], cur.rowcount)

    return Conn(
        "a sqlite3 Connection",
        dialect,
        False,
        False,
        execute,
        lambda: bool(conn.in_transaction),
        lambda: _sqlite_autocommits(conn),
    )


def _aiosqlite(conn: Any, dialect: str) -> Conn:
    async def execute(sql: str, params: Mapping[str, object]) -> Result:
        cur = await conn.execute(sql, params)
        try:
            rows = list(await cur.fetchall()) if cur.description else []
            return Result(rows, cur.rowcount)
        finally:
            await cur.close()

    return Conn(
        "an aiosqlite Connection",
        dialect,
        True,
        False,
        execute,
        lambda: bool(conn.in_transaction),
        lambda: _sqlite_autocommits(conn),
    )


_DBAPI: dict[tuple[str, bool], Callable[[Any, str], Conn]] = {
    ("psycopg", False): _psycopg,
    ("psycopg", True): _psycopg_async,
    ("pymysql", False): _pymysql,
    ("aiomysql", True): _aiomysql,
    ("sqlite3", False): _sqlite3,
    ("aiosqlite", True): _aiosqlite,
}


def _sqlalchemy(conn: Any) -> Conn:
    from sqlalchemy import text
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    name = type(conn).__name__
    if isinstance(conn, Connection | AsyncConnection):
        sync_conn = conn.sync_connection if isinstance(conn, AsyncConnection) else conn
        if sync_conn is None:
            raise TypeError(f"lock.guard(conn): the SQLAlchemy {name} is not connected")
        dialect_name = sync_conn.dialect.name

        def transaction() -> Callable[[], bool]:
            tx = sync_conn.get_transaction()
            return lambda: tx is not None and tx.is_active and not sync_conn.closed

        def connected() -> Any:
            return conn

        in_transaction = sync_conn.in_transaction
    elif isinstance(conn, Session | AsyncSession):
        session = conn.sync_session if isinstance(conn, AsyncSession) else conn
        dialect_name = session.get_bind().dialect.name

        def transaction() -> Callable[[], bool]:
            tx = session.get_transaction()
            return lambda: tx is not None and tx.is_active

        def connected() -> Any:
            return conn.connection()

        in_transaction = session.in_transaction
    else:
        raise TypeError(f"lock.guard(conn): conn must be {ACCEPTED}, not sqlalchemy {name}")
    dialect = SQLALCHEMY_DIALECTS.get(dialect_name, dialect_name)
    awaited = isinstance(conn, AsyncConnection | AsyncSession)

    def result(res: Any) -> Result:
        return Result(list(res.fetchall()) if res.returns_rows else [], res.rowcount)

    if awaited:

        async def execute(sql: str, params: Mapping[str, object]) -> Result:
            c = connected()
            c = (await c) if not isinstance(c, AsyncConnection) else c
            return result(await c.execute(text(sql), dict(params)))

    else:

        def execute(sql: str, params: Mapping[str, object]) -> Result:  # type: ignore[misc]
            return result(connected().execute(text(sql), dict(params)))

    def autocommits() -> bool:
        engine = conn.bind if isinstance(conn, Session | AsyncSession) else conn
        options: Mapping[str, object] = getattr(engine, "get_execution_options", dict)()
        return bool(options.get("isolation_level") == "AUTOCOMMIT")

    return Conn(
        f"a SQLAlchemy {name}",
        dialect,
        awaited,
        True,
        execute,
        in_transaction,
        autocommits,
        transaction,
    )
