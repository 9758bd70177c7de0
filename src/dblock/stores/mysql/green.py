"""aiomysql's asyncio connection, seen by the MySQL store's code as a PyMySQL one.

The async client runs the store's code in a greenlet (:mod:`dblock._green`); each call here
awaits the asyncio connection's coroutine on the event loop, so a statement, and a doorbell's
``GET_LOCK`` sleep, never blocks the loop. Only what the store and its doorbells use is
offered: ``cursor()`` (``execute``, ``fetchone``, ``fetchall``, ``nextset``, ``rowcount``,
``lastrowid``, ``description``), ``begin``/``commit``/``rollback``, ``thread_id``, ``close``.

aiomysql speaks PyMySQL's protocol code and raises PyMySQL's exception classes
(``pymysql.err``), so the store classifies its errors as it does PyMySQL's. What PyMySQL does
at the socket and aiomysql does not is done here, with the same outcome:

- ``read_timeout``: PyMySQL's socket timeout ends a read with ``OperationalError(2013)``; here a
  timer aborts the connection of a statement that has not answered in time (the same error).
- ``connect_timeout`` bounds the whole connect, the server's greeting included.
- :meth:`GreenConnection.abort` may be called from another thread (the watchdog): it shuts the
  socket down, so the statement awaiting it fails with ``OperationalError(2013)``.
- TLS: the URL's ``ssl_*`` options make the context PyMySQL would make; without them the
  connection is plain (aiomysql has no "TLS if the server offers it" mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import aiomysql
import pymysql
from pymysql.constants import CR

from ..._green import await_, bridged

T = TypeVar("T")
#: what the store's PyMySQL arguments are called in aiomysql (the rest it takes as they are)
_RENAMED = {"database": "db"}
#: PyMySQL arguments aiomysql has no use for: done here (timeouts, TLS) or always on
_DONE_HERE = {"read_timeout", "write_timeout", "ssl_ca", "ssl_cert", "ssl_key", "init_command"}


class _QuietCursor(aiomysql.Cursor):  # type: ignore[misc]
    """aiomysql's cursor, without its ``SHOW WARNINGS`` after a statement that had some, and
    the ``warnings.warn`` of each (PyMySQL does neither; dblock reads no warnings): a round
    trip saved, and no warning about another client's table that a look at
    ``information_schema`` skipped because its DDL was in flight."""

    async def _show_warnings(self, conn: Any) -> None:
        return None


class GreenCursor:
    """A PyMySQL-shaped cursor over an aiomysql one (a context manager, as PyMySQL's is)."""

    __slots__ = ("_conn", "_cursor")

    def __init__(self, conn: GreenConnection, cursor: aiomysql.Cursor) -> None:
        self._conn = conn
        self._cursor = cursor

    def __enter__(self) -> GreenCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        # aiomysql's close() only drains unread results: none are left unread by the store
        # but on an error, after which the connection is reset or dropped anyway
        self._cursor._result = None  # what its close() would end with

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @property
    def lastrowid(self) -> int | None:
        return self._cursor.lastrowid  # type: ignore[no-any-return]

    @property
    def description(self) -> Any:
        return self._cursor.description

    def execute(self, sql: str, params: Any = None) -> int:
        return int(self._conn.call(self._cursor.execute(sql, params)))

    # buffered: the rows are here, in a future already done (nothing to await)
    def fetchone(self) -> Any:
        return _done(self._cursor.fetchone())

    def fetchall(self) -> list[Any]:
        return list(_done(self._cursor.fetchall()))

    def nextset(self) -> bool | None:
        return self._conn.call(self._cursor.nextset())  # type: ignore[no-any-return]


class GreenConnection:
    """A PyMySQL-shaped connection over an aiomysql one, for code in a greenlet."""

    __slots__ = ("_conn", "_loop", "_read_timeout", "_timed_out")

    def __init__(self, conn: aiomysql.Connection, read_timeout: float | None) -> None:
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._read_timeout = read_timeout
        self._timed_out = False

    @classmethod
    def connect(
        cls,
        *,
        user_init: str | None,
        init_errors: Callable[[Callable[[], None]], AbstractContextManager[None]],
        init_command: str | None,
        **kwargs: Any,
    ) -> GreenConnection:
        """Open a connection with PyMySQL's arguments (as ``connection_kwargs`` gives them),
        autocommit; run ``user_init`` (the URL's) inside ``init_errors(close)`` (the store's
        judge of its errors), then ``init_command`` (dblock's own)."""
        timeout = float(kwargs.get("connect_timeout") or 10)
        options = {_RENAMED.get(k, k): v for k, v in kwargs.items() if k not in _DONE_HERE}
        options["ssl"] = _ssl_context(kwargs)
        options["autocommit"] = None  # set below, after the user's statement (as PyMySQL)
        raw = aiomysql.Connection(**options)
        try:
            # aiomysql.connect() is this, without a bound on the greeting and the login
            await_(asyncio.wait_for(raw._connect(), timeout))
        except BaseException as exc:
            raw.close()
            if isinstance(exc, asyncio.TimeoutError):
                raise pymysql.err.OperationalError(
                    CR.CR_CONN_HOST_ERROR,
                    f"Can't connect to MySQL server on {kwargs.get('host')!r} (timed out)",
                ) from None
            raise
        conn = cls(raw, kwargs.get("read_timeout"))
        try:
            with conn.cursor() as cur:
                if user_init:
                    with init_errors(conn.close):
                        cur.execute(user_init)  # may hold several statements: each is checked
                        while cur.nextset():
                            pass
                if init_command:
                    cur.execute(init_command)
                cur.execute("SET autocommit = 1")
            conn._conn.autocommit_mode = True  # what aiomysql's autocommit() records
        except BaseException:
            conn.close()
            raise
        return conn

    def call(self, step: Awaitable[T]) -> T:
        """Await one of the driver's steps; abort it once ``read_timeout`` has passed (PyMySQL's
        socket timeout: ``OperationalError(2013)``, the connection closed)."""
        if self._read_timeout is None:
            return await_(step)
        timer = self._loop.call_later(self._read_timeout, self._time_out)
        try:
            return await_(step)
        except pymysql.err.OperationalError as exc:
            if self._timed_out:
                raise pymysql.err.OperationalError(
                    CR.CR_SERVER_LOST, "Lost connection to MySQL server during query (timed out)"
                ) from exc
            raise
        finally:
            timer.cancel()

    def _time_out(self) -> None:
        self._timed_out = True
        transport = self._transport()
        if transport is not None:
            transport.abort()

    def _transport(self) -> asyncio.Transport | None:
        writer = self._conn._writer  # aiomysql keeps its stream here
        return None if writer is None else writer.transport

    def cursor(self) -> GreenCursor:
        # what aiomysql's cursor() makes, without the future it wraps it in (to be awaited)
        return GreenCursor(self, _QuietCursor(self._conn, False))

    def begin(self) -> None:
        self.call(self._conn.begin())

    def commit(self) -> None:
        self.call(self._conn.commit())

    def rollback(self) -> None:
        self.call(self._conn.rollback())

    @property
    def open(self) -> bool:
        return not self._conn.closed

    def thread_id(self) -> int:
        return int(self._conn.thread_id())

    def abort(self) -> None:
        """Make the statement in flight fail now, from any thread: the socket is shut down
        (safe from another thread), and the transport aborted on the loop's thread."""
        transport = self._transport()
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing awaits it
            self._loop.call_soon_threadsafe(transport.abort)

    def close(self) -> None:
        """Say goodbye to the server (as PyMySQL does) and close the socket; off the loop's
        greenlets (a close from a finalizer, say), only close the socket, on the loop."""
        if bridged() and not self._timed_out:
            with contextlib.suppress(Exception):
                await_(self._conn.ensure_closed())
        self._on_loop(self._conn.close)

    def _on_loop(self, fn: Callable[[], None]) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            fn()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn)


def _done(value: Any) -> Any:
    """aiomysql's fetch methods return their rows in a done future; the rows."""
    return value.result() if isinstance(value, asyncio.Future) else value


def _ssl_context(kwargs: dict[str, Any]) -> Any:
    """The TLS context PyMySQL makes for the URL's ``ssl_*`` options, or None."""
    ca, cert, key = (kwargs.get(name) for name in ("ssl_ca", "ssl_cert", "ssl_key"))
    if not (ca or cert or key):
        return None
    # PyMySQL's options -> its context, as PyMySQL's Connection.__init__ does (without
    # ssl_verify_cert/identity, which dblock's URL does not take: no verification unless a
    # CA is given, and then no host name check)
    sslp: dict[str, Any] = {"ca": ca, "check_hostname": False, "verify_mode": False}
    if cert is not None:
        sslp["cert"] = cert
    if key is not None:
        sslp["key"] = key
    return pymysql.connections.Connection._create_ssl_ctx(None, sslp)
