"""A store whose statement connections are borrowed from a pool the application holds (a
SQLAlchemy engine's, a psycopg_pool pool): each connection checked out is borrowed, pinned to
what dblock needs, and given back (restored) when checked in, never kept idle. The dialects'
pinning is in their store packages (``borrowed.py``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .._runtime import THREADS, Runtime

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.pool import PoolProxiedConnection

    from .._url import DatabaseURL


@dataclass
class Loan:
    """A connection borrowed from the engine's pool, and what to give back with it."""

    proxied: Any  # PoolProxiedConnection (blocking) or AsyncConnection (async)
    saved: tuple[Any, ...]


class Lending:
    """The pool of a SQL store (stores/_pool.py) over the engine's: every connection checked out
    is borrowed from the engine, and given back (not kept idle) when checked in."""

    _loans: dict[int, Loan]
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
        self._loans[id(conn)] = Loan(handle, saved)
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


def bounded(url: DatabaseURL, asked: int | None, pool_size: int | None) -> DatabaseURL:
    """dblock's bound on loans: as asked (else 10), and never more than the pool has, so that
    a thread waits in dblock's own line (with its deadline), not in the pool's."""
    bound = asked or 10
    if pool_size:
        bound = min(bound, pool_size)
    return replace(url, max_connections=bound)


def opened(
    lending: type[Any],
    store: type[Any],
    url: DatabaseURL,
    schema: str | None,
    table: str,
    *,
    runtime: Runtime | None,
) -> Any:
    """A store of class ``store`` that borrows what ``lending`` says, on ``runtime``."""
    made = type(f"Client{store.__name__}", (lending, store), {})(url, schema, table)
    if runtime is not None:
        made.use_runtime(runtime)
    return made
