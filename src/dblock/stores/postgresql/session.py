"""PostgreSQL session holds (``ttl=None``): the server's advisory lock, on a connection set
aside for the hold.

- The lock is ``pg_advisory_lock`` on a 64-bit hash of table and key (``hashtextextended``,
  stable across servers, as hash partitioning needs). Two keys whose hashes collide share one
  lock: with n keys held at once the chance is about n²/2⁶⁵, negligible.
- Waiting is the server's queue: a blocking ``pg_advisory_lock`` with ``lock_timeout``, on the
  waiter's own connection. A release hands the lock to the next waiter in the server, first
  come first served, with no wake-up message.
- Grant and token are one round trip: the lock statement and the grant statement (token from
  the table's token sequence, and a look for a live lease of the key, with a snapshot taken
  after the grant) go in one pipeline. A live lease: the lock is given back, the engine waits.
- Every connection of a hold or waiter is outside the pool; up to ``_IDLE_KEPT`` of them are
  kept for the next hold. They set TCP keepalives both ways and ``tcp_user_timeout``, so a
  dead peer is noticed (by the server: the lock is freed) within about ``_DROP_AFTER`` s.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timezone
from typing import Any

import psycopg

from ..._types import LockInfo
from .._sessions import SessionConnections

log = logging.getLogger("dblock")

#: TCP settings of session connections, client side (libpq) and server side (GUCs): a peer
#: that stopped answering is dropped after about 10 s
_DROP_AFTER = 10
_LIBPQ_KEEPALIVE = {
    "keepalives": 1,
    "keepalives_idle": 3,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": _DROP_AFTER * 1000,
}
_SERVER_KEEPALIVE = (
    "-c tcp_keepalives_idle=3 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3 "
    f"-c tcp_user_timeout={_DROP_AFTER * 1000}"
)


class PgSessions(SessionConnections):
    """The PostgreSQL store's session holds: its ``SessionHolds`` operations delegate here."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self._warned_pooler = False
        #: id(connection) -> it has the grant function (one statement), else the pipeline
        self._one_statement: dict[int, bool] = {}

    # -- connections ----------------------------------------------------------------------
    def connection_options(self) -> dict[str, Any]:
        """Options of a connection set aside (a session hold's, a waiter's doorbell's): the
        store's, with TCP keepalives both ways."""
        options = {**_LIBPQ_KEEPALIVE, **self.store._options}
        options["options"] = f"{_SERVER_KEEPALIVE} {options.get('options', '')}".strip()
        return options

    def _open(self) -> psycopg.Connection[Any]:
        try:
            conn: psycopg.Connection[Any] = self.store._open_connection(self.connection_options())
        except psycopg.Error as exc:
            raise self.store._connect_error(exc, None) from exc
        self.store._pids[id(conn)] = conn.info.backend_pid
        try:
            conn.execute(self.store.sql.session_function)
            self._one_statement[id(conn)] = True
        except psycopg.Error as exc:  # no TEMP privilege on the database: two statements
            log.debug("session grants in a pipeline (%s)", exc)
            self._one_statement[id(conn)] = False
        except BaseException:
            self._close(conn)
            raise
        return conn

    def _close(self, conn: psycopg.Connection[Any]) -> None:
        self._one_statement.pop(id(conn), None)
        self.store._close_connection(conn)

    def _drop(self, conn: psycopg.Connection[Any], interrupted: bool) -> None:
        """As the base, and a connection that still answers gives its locks back first: the
        statement may have been granted as it was interrupted (its reply unread), and closing
        frees the lock only once the server process has noticed and exited, which the next
        look for the key can beat."""
        self.store._interrupted(conn)
        if not (conn.closed or conn.broken):
            self._on_hold(conn, self.store.sql.session_unlock_all)
        self._close(conn)

    def _timed_out(self, exc: Exception) -> bool:
        return isinstance(exc, psycopg.errors.LockNotAvailable)  # lock_timeout

    def _answer(
        self, conn: psycopg.Connection[Any], sql: str, params: dict[str, Any] | None
    ) -> Any:
        """The first row."""
        return conn.execute(sql, params).fetchone()

    # -- the capability -------------------------------------------------------------------
    def _pooler_between(self) -> None:
        """The server process differs from the one the connection started with: a pooler
        (PgBouncer) sits between. In its session mode the hold is safe; in transaction mode
        the next statement may reach another server process, and the checks then find the
        hold lost (see _alive)."""
        if not self._warned_pooler:
            self._warned_pooler = True
            log.warning(
                "dblock session locks on %s go through a connection pooler: they need its "
                "session mode (in transaction mode an advisory lock stays on a server "
                "connection others get); see docs/session-locks.md",
                self.store.safe_url,
            )

    def _grant(
        self, conn: psycopg.Connection[Any], key: str, owner: str, timeout: float
    ) -> tuple[int, int] | None:
        """(token, server process) if granted, else None."""
        lock_ms = "0" if math.isinf(timeout) else str(max(1, round(timeout * 1000)))
        params = {"key": key, "owner": owner, "lt": lock_ms}
        sql = self.store.sql
        if self._one_statement.get(id(conn)):
            one = sql.session_try_one if timeout <= 0 else sql.session_lock_one
            row = conn.execute(one, params).fetchone()
            if row is None:  # a try that did not get the lock
                return None
            return self._granted(conn, row)
        with conn.pipeline():
            got = conn.execute(
                self.store.sql.session_try if timeout <= 0 else self.store.sql.session_lock, params
            )
            grant = conn.execute(self.store.sql.session_grant, params)
        granted, row = got.fetchone(), grant.fetchone()
        if granted is None or not granted[2] or row is None:
            return None
        return self._granted(conn, row)

    def _granted(self, conn: psycopg.Connection[Any], row: Any) -> tuple[int, int] | None:
        """(token, server process) of a grant's row, or None if a live lease holds the key:
        the server lock is given back, and the caller waits."""
        token, busy, _name, pid = row
        if busy:
            conn.execute(self.store.sql.session_unlock_all)
            return None
        if pid != conn.info.backend_pid:
            self._pooler_between()
        return int(token), int(pid)

    def _alive(self, conn: psycopg.Connection[Any], key: str, seen: Any) -> bool | None:
        """The connection reaches the server process that granted the hold (a pooler in
        transaction mode may move it to another: False)."""
        row = self._on_hold(conn, self.store.sql.session_alive)
        return None if row is None else row[0] == seen

    def _release(self, conn: psycopg.Connection[Any], key: str) -> bool | None:
        row = self._on_hold(conn, self.store.sql.session_release, {"key": key})
        return None if row is None else True

    # -- inspection -----------------------------------------------------------------------
    def infos(self, conn: psycopg.Connection[Any], key: str) -> list[LockInfo]:
        """The session holds of ``key``, from the server's lock table and the application name
        each holder's connection set at the grant (``d:<token>:<ms in hex>:<owner>``, 63 bytes at
        most: a long owner is cut short)."""
        infos = []
        for (name,) in conn.execute(self.store.sql.session_holders, {"key": key}).fetchall():
            parts = (name or "").split(":", 3)
            try:
                ms = int(parts[2], 16) if len(parts) > 2 and parts[0] == "d" else None
            except ValueError:
                ms = None
            if ms is None or not parts[1].isdigit():
                continue  # a lease statement's momentary try-lock, not a session hold
            at = datetime.fromtimestamp(ms / 1000, timezone.utc)
            infos.append(
                LockInfo(
                    key, parts[3] if len(parts) > 3 else "", int(parts[1]), at, None, "session"
                )
            )
        return infos
