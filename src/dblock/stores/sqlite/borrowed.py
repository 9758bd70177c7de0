"""SQLite connections borrowed from a SQLAlchemy engine's pool (stores/_sqla.py): pinned to
what dblock needs while borrowed, restored before they go back."""

from __future__ import annotations

import sqlite3
from typing import Any

from .._lending import Lending


class SqliteLending(Lending):
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
