"""The one door from tests into a client's internals.

Tests that must reach the store behind a :class:`dblock.Client` (its contract operations, its
pool, a fault seam) go through :func:`store_of`, so that renaming the attribute in the core
is a one-line change here. :func:`store_call` runs one of the store's operations the way the
client itself would: directly for a blocking client, in a greenlet on the loop for the async
one (tests/_async_facade.py), whose store awaits its I/O.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import dblock
from dblock.stores._pool import PooledStore


def store_of(client: dblock.Client | dblock.AsyncClient) -> Any:
    """The store object behind ``client`` (blocking or async)."""
    return getattr(client, "_sync", client)._store


def pool_busy(client: dblock.Client | dblock.AsyncClient) -> tuple[int, int]:
    """(connections of the client's pool checked out now, callers waiting for one): both 0
    once nothing runs. (0, 0) for a store without a pool."""
    store = store_of(client)
    if not hasattr(store, "_idle"):
        return 0, 0
    with store._pool_lock:
        return store._open - len(store._idle), len(store._turns)


class ConnectionTracker:
    """Every connection the store opens from now on, to find those left open.

    It wraps the store's ``_connect`` (the pool's, and PostgreSQL's LISTEN and SQLite's
    change-watch connections are made by it too) and keeps each connection it made, so one
    dropped without being closed stays visible instead of being closed by the collector.
    """

    def __init__(self, client: dblock.Client | dblock.AsyncClient) -> None:
        self._store = store = store_of(client)
        self._made: list[Any] = []
        self.peak = 0
        # a store with a pool of its own (SQL); redis-py keeps its connections itself
        connect = store._connect if isinstance(store, PooledStore) else None
        if connect is None:  # a store without connections of its own
            return

        def tracked() -> Any:
            conn = connect()
            self._made.append(conn)
            self.peak = max(self.peak, len(self.open()))
            return conn

        store._connect = tracked

    def forget(self) -> None:
        """Track only the connections made from now on."""
        self._made.clear()

    def open(self) -> list[Any]:
        """The connections it saw made that are still open."""
        return [conn for conn in self._made if not _closed(conn)]

    def stray(self) -> list[Any]:
        """Open connections that are neither idle in the pool nor the store's listener's: a
        connection checked out and never given back, or dropped without being closed."""
        store = self._store
        listener = getattr(store, "_listener", None)
        kept = [*getattr(store, "_idle", ()), getattr(listener, "_conn", None)]
        return [conn for conn in self.open() if not any(conn is k for k in kept)]


def _closed(conn: Any) -> bool:
    if isinstance(conn, sqlite3.Connection):
        try:
            conn.total_changes  # noqa: B018 - raises on a closed connection
        except sqlite3.ProgrammingError:
            return True
        return False
    if hasattr(conn, "closed"):  # psycopg (and its green adapter)
        return bool(conn.closed)
    if hasattr(conn, "connection_pool"):  # redis-py: close() lets go of its connection
        return conn.connection is None
    return not conn.open  # PyMySQL


def store_call(client: dblock.Client, operation: str, *args: Any) -> Any:
    """``store_of(client).<operation>(*args)``, run as the client runs its store's code."""
    from tests._async_facade import Client as Facade

    method = getattr(store_of(client), operation)
    if isinstance(client, Facade):
        return client.run_green(method, *args)
    return method(*args)
