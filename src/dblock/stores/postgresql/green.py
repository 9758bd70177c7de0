"""psycopg's ``AsyncConnection``, seen by the PostgreSQL store's code as a blocking one.

The async client runs the store's code in a greenlet (:mod:`dblock._green`); each call here
awaits the asyncio connection's coroutine on the event loop. Only what the store uses is
offered: ``execute`` and its cursor's results, ``transaction``, ``pipeline``, ``notifies``
(psycopg's async iterator of LISTEN notifications), ``close``, and the state the pool checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from typing import Any

import psycopg

from ..._green import await_


class GreenCursor:
    __slots__ = ("_cursor",)

    def __init__(self, cursor: psycopg.AsyncCursor[Any]) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def description(self) -> Any:
        return self._cursor.description

    def fetchone(self) -> Any:
        return await_(self._cursor.fetchone())

    def fetchall(self) -> list[Any]:
        return await_(self._cursor.fetchall())


class GreenConnection:
    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    @classmethod
    def connect(cls, **options: Any) -> GreenConnection:
        return cls(await_(psycopg.AsyncConnection.connect(**options)))

    @property
    def info(self) -> Any:
        return self._conn.info

    @property
    def pgconn(self) -> Any:
        return self._conn.pgconn

    @property
    def closed(self) -> bool:
        return self._conn.closed

    @property
    def broken(self) -> bool:
        return self._conn.broken

    def execute(self, query: Any, params: Any = None) -> GreenCursor:
        return GreenCursor(await_(self._conn.execute(query, params)))

    def transaction(self) -> AbstractContextManager[None]:
        return _entered(self._conn.transaction())

    def pipeline(self) -> AbstractContextManager[None]:
        return _entered(self._conn.pipeline())

    def notifies(
        self, *, timeout: float, stop_after: int | None = None
    ) -> Iterator[psycopg.Notify]:
        stream = self._conn.notifies(timeout=timeout, stop_after=stop_after)
        while True:
            try:
                yield await_(stream.__anext__())
            except StopAsyncIteration:
                return

    def wait_readable(self, wake: int, timeout: float) -> tuple[bool, bool]:
        """Wait up to ``timeout`` s until the connection's socket or ``wake`` has input:
        whether each has."""
        sock = self._conn.pgconn.socket
        fired = await_(_readable((sock, wake), timeout))
        return sock in fired, wake in fired

    def cancel_safe(self, *, timeout: float = 30.0) -> None:
        await_(self._conn.cancel_safe(timeout=timeout))

    def close(self) -> None:
        await_(self._conn.close())


async def _readable(fds: tuple[int, ...], timeout: float) -> set[int]:
    """The ones of ``fds`` that have input, once one has (empty after ``timeout`` s)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fired: set[int] = set()

    def done(fd: int | None = None) -> None:
        if fd is not None:
            fired.add(fd)
        if not ready.done():
            ready.set_result(None)

    for fd in fds:
        loop.add_reader(fd, done, fd)
    timer = loop.call_later(timeout, done)
    try:
        await ready
    finally:
        timer.cancel()
        for fd in fds:
            loop.remove_reader(fd)
    return fired


@contextmanager
def _entered(manager: AbstractAsyncContextManager[Any]) -> Iterator[None]:
    """An async context manager of psycopg's, entered and left as a blocking one."""
    await_(manager.__aenter__())
    try:
        yield
    except BaseException as exc:
        if not await_(manager.__aexit__(type(exc), exc, exc.__traceback__)):
            raise
    else:
        await_(manager.__aexit__(None, None, None))
