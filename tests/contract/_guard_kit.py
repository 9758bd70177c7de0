"""The application's own connection for ``lock.guard(conn)`` tests: each driver and SQLAlchemy,
blocking and asyncio, behind one small interface (begin, write, guard, commit, roll back).

A guarded table here is a business table with no token column: ``guarded_<hex>`` with rows
``(seq, who)``, ``seq`` given by the writer (the count of rows it saw plus one), so two
transactions that overlap would both write the same ``seq`` (a primary key: one fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

#: how a test reaches the database: a DB-API connection, a SQLAlchemy Connection or Session
SYNC_KINDS = ("dbapi", "sqlalchemy", "session")
ASYNC_KINDS = ("async-dbapi", "async-sqlalchemy", "async-session")
KINDS = SYNC_KINDS + ASYNC_KINDS


def dialect_of(url: str) -> str:
    scheme = urlsplit(url).scheme
    return {"postgres": "postgresql", "mariadb": "mysql"}.get(scheme, scheme)


def _sqlalchemy_url(url: str, awaited: bool) -> str:
    parts = urlsplit(url)
    dialect = dialect_of(url)
    if dialect == "sqlite":
        return f"sqlite+{'aiosqlite' if awaited else 'pysqlite'}:///{parts.path[1:]}"
    driver = {"postgresql": "psycopg", "mysql": "aiomysql" if awaited else "pymysql"}[dialect]
    return f"{dialect}+{driver}://{parts.netloc}{parts.path}"


class App:
    """The application's connection of one kind, blocking: ``run`` awaits an asyncio kind's
    calls on a loop of its own (``loop``, so that ``await lock.guard`` runs there too)."""

    def __init__(self, url: str, kind: str, loop: asyncio.AbstractEventLoop | None = None):
        self.url, self.kind, self.dialect = url, kind, dialect_of(url)
        self.awaited = kind.startswith("async")
        self.loop = loop
        self.q = "`" if self.dialect == "mysql" else '"'
        self.mark = "?" if self.dialect == "sqlite" and kind == "dbapi" else "%s"
        self._engine: Any = None
        self._task: asyncio.Task[None] | None = None
        self._calls: asyncio.Queue[tuple[Any, asyncio.Future[Any]]] = asyncio.Queue()
        self.conn: Any = self.run(self._open())

    def run(self, awaitable: Awaitable[T] | T) -> T:
        """``awaitable``'s result (an asyncio kind's), awaited by the one task that makes
        every call of this side: the async client's holds belong to the task that took them."""
        if not self.awaited:
            return awaitable  # type: ignore[return-value]
        assert self.loop is not None
        if self._task is None:
            self._task = self.loop.create_task(self._serve())
        done = self.loop.create_future()
        self._calls.put_nowait((awaitable, done))
        return self.loop.run_until_complete(done)  # type: ignore[no-any-return]

    async def _serve(self) -> None:
        while True:
            awaitable, done = await self._calls.get()
            try:
                done.set_result(await awaitable)
            except Exception as exc:
                done.set_exception(exc)

    async def _aopen(self) -> Any:
        kind, dialect, parts = self.kind, self.dialect, urlsplit(self.url)
        if kind == "async-dbapi":
            if dialect == "postgresql":
                import psycopg

                return await psycopg.AsyncConnection.connect(self.url)
            if dialect == "mysql":
                import aiomysql

                return await aiomysql.connect(
                    host=parts.hostname, port=parts.port or 3306, user=parts.username or "root",
                    password=parts.password or "", db=parts.path[1:], autocommit=False,
                )  # fmt: skip
            import aiosqlite

            return await aiosqlite.connect(parts.path[1:], timeout=30)
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

        self._engine = create_async_engine(_sqlalchemy_url(self.url, True))
        if kind == "async-sqlalchemy":
            return await self._engine.connect()
        return AsyncSession(self._engine)

    def _open(self) -> Any:
        if self.awaited:
            return self._aopen()
        kind, dialect, parts = self.kind, self.dialect, urlsplit(self.url)
        if kind == "dbapi":
            if dialect == "postgresql":
                import psycopg

                return psycopg.connect(self.url)
            if dialect == "mysql":
                import pymysql

                return pymysql.connect(
                    host=parts.hostname, port=parts.port or 3306, user=parts.username or "root",
                    password=parts.password or "", database=parts.path[1:], autocommit=False,
                )  # fmt: skip
            import sqlite3

            return sqlite3.connect(parts.path[1:], timeout=30, check_same_thread=False)
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        self._engine = create_engine(_sqlalchemy_url(self.url, False))
        if kind == "sqlalchemy":
            return self._engine.connect()
        return Session(self._engine)

    # -- statements --------------------------------------------------------------------------
    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        """Run ``sql`` (``%s`` placeholders) in the connection's transaction; its rows."""
        return self.run(self._execute(sql, params))

    def _execute(self, sql: str, params: tuple[Any, ...]) -> Any:
        kind, conn = self.kind, self.conn
        if kind in ("sqlalchemy", "session", "async-sqlalchemy", "async-session"):
            from sqlalchemy import text

            names = {f"p{i}": v for i, v in enumerate(params)}
            for i in range(len(params)):
                sql = sql.replace("%s", f":p{i}", 1)
            if self.awaited:

                async def go() -> Any:
                    res = await conn.execute(text(sql), names)
                    return list(res.fetchall()) if res.returns_rows else []

                return go()
            res = conn.execute(text(sql), names)
            return list(res.fetchall()) if res.returns_rows else []
        if self.dialect == "sqlite":
            sql = sql.replace("%s", "?")
        if kind == "dbapi":
            cur = conn.cursor()
            cur.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []

        async def go_dbapi() -> Any:
            if self.dialect == "mysql":
                async with conn.cursor() as cur:
                    await cur.execute(sql, params)
                    return list(await cur.fetchall()) if cur.description else []
            cur = await conn.execute(sql, params)
            return list(await cur.fetchall()) if cur.description else []

        return go_dbapi()

    def begin(self) -> None:
        """Open a transaction (a DB-API connection begins one at its first statement; MySQL's
        is begun here, SQLite's by the guard's or the write's statement)."""
        if self.kind == "dbapi" and self.dialect == "mysql":
            self.conn.begin()
        elif self.kind == "async-dbapi" and self.dialect == "mysql":
            self.run(self.conn.begin())

    def guard(self, lock: Any) -> None:
        self.run(lock.guard(self.conn))

    def commit(self) -> None:
        self.run(self.conn.commit())

    def rollback(self) -> None:
        self.run(self.conn.rollback())

    def close(self) -> None:
        closed = self.conn.close()  # aiomysql's close is not a coroutine
        if closed is not None:
            self.run(closed)
        if self._engine is not None:
            self.run(self._engine.dispose())
        if self._task is not None and self.loop is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                self.loop.run_until_complete(self._task)

    # -- the business table -------------------------------------------------------------------
    def create_table(self) -> str:
        name = "guarded_" + uuid.uuid4().hex[:10]
        q = self.q
        self.execute(f"CREATE TABLE {q}{name}{q} (seq INTEGER PRIMARY KEY, who VARCHAR(40))")
        self.commit()
        return name

    def write(self, table: str, who: str) -> None:
        """Append a row after those this transaction sees (see the module)."""
        q = self.q
        (seen,) = self.execute(f"SELECT COUNT(*) FROM {q}{table}{q}")[0]
        self.execute(f"INSERT INTO {q}{table}{q} (seq, who) VALUES (%s, %s)", (seen + 1, who))

    def rows(self, table: str) -> list[tuple[int, str]]:
        rows = [
            (int(s), str(w))
            for s, w in self.execute(f"SELECT seq, who FROM {self.q}{table}{self.q} ORDER BY seq")
        ]
        self.commit()
        return rows

    def drop(self, table: str) -> None:
        self.execute(f"DROP TABLE IF EXISTS {self.q}{table}{self.q}")
        self.commit()


def on_loop(loop: asyncio.AbstractEventLoop, make: Callable[[], Awaitable[T]]) -> T:
    return loop.run_until_complete(make())
