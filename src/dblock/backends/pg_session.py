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
from functools import partial
from typing import Any

import psycopg

from .. import _forksafe
from .._types import LockInfo
from .sql.base import Failure
from .sql.watchdog import Watchdog

log = logging.getLogger("dblock")

#: idle session connections kept for the next hold
_IDLE_KEPT = 4
#: a keep-alive check of a hold's connection that takes longer than this marks it lost
CHECK_DEADLINE = 2.0
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


class PgSessions:
    """The PostgreSQL store's session holds: its ``SessionHolds`` operations delegate here."""

    def __init__(self, store: Any) -> None:
        #: the PostgresBackend (typed loosely: importing it here would make a cycle); its
        #: connections, pool lock, watchdog, statements and error handling are used
        self.store = store
        self._pid = _forksafe.pid()
        # the store's watchdog gives every statement at least its 5 s: checks get their own
        self._watchdog = Watchdog(f"dblock-session-watchdog[{store.table}]", CHECK_DEADLINE)
        self._session_idle: list[psycopg.Connection[Any]] = []
        #: (key, owner, token) -> the hold's connection, and the server process that
        #: granted it
        self._session_conns: dict[tuple[str, str, int], tuple[psycopg.Connection[Any], int]] = {}
        self._warned_pooler = False
        #: id(connection) -> it has the grant function (one statement), else the pipeline
        self._one_statement: dict[int, bool] = {}

    # -- connections ----------------------------------------------------------------------
    def _session_options(self) -> dict[str, Any]:
        options = {**_LIBPQ_KEEPALIVE, **self.store._options}
        options["options"] = f"{_SERVER_KEEPALIVE} {options.get('options', '')}".strip()
        return options

    def _session_checkout(self) -> tuple[psycopg.Connection[Any], bool]:
        """(a connection for one hold or waiter, whether it was kept from an earlier one)."""
        with self.store._pool_lock:
            self.store._check_pool()
            if self._pid != _forksafe.pid():
                # forked: the parent's connections (and the locks they hold) are the parent's;
                # forget them without closing, as closing would end the parent's sessions
                self._session_idle.clear()
                self._session_conns.clear()
                self._pid = _forksafe.pid()
            if self._session_idle:
                return self._session_idle.pop(), True
        try:
            conn = self.store._open_connection(self._session_options())
        except psycopg.Error as exc:
            raise self.store._wrap(exc, f"cannot connect to {self.store.safe_url}", None) from exc
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
        return conn, False

    def _session_checkin(self, conn: psycopg.Connection[Any]) -> None:
        with self.store._pool_lock:
            if not self.store._closed and len(self._session_idle) < _IDLE_KEPT:
                self._session_idle.append(conn)
                return
        self._close(conn)

    def _close(self, conn: psycopg.Connection[Any]) -> None:
        self._one_statement.pop(id(conn), None)
        self.store._close_connection(conn)

    def _session_drop(self, conn: psycopg.Connection[Any]) -> None:
        """Close a session connection whose state is unknown: the server frees its lock (an
        interrupted wait is ended in the server first, so it cannot be granted later)."""
        self.store._interrupted(conn)
        self._close(conn)

    # -- the capability -------------------------------------------------------------------
    def acquire_session(self, key: str, owner: str, timeout: float) -> int | None:
        for attempt in (1, 2):
            conn, kept = self._session_checkout()
            try:
                granted = self._grant(conn, key, owner, timeout)
            except BaseException as exc:
                self._session_drop(conn)
                if not isinstance(exc, Exception):
                    raise  # a cancellation: nothing is left held, the connection is gone
                if isinstance(exc, psycopg.errors.LockNotAvailable):
                    return None  # lock_timeout: and the close freed a lock granted as it came
                failure = self.store._classify(exc)
                if failure is Failure.DISCONNECT and kept and attempt == 1:
                    continue  # a kept connection died meanwhile (a server restart): a fresh one
                if failure is None:
                    raise
                raise self.store._wrap(
                    exc, f"session acquire failed on {self.store.safe_url}", key
                ) from exc
            if granted is None:
                self._session_checkin(conn)
                return None
            token, pid = granted
            if pid != conn.info.backend_pid:
                self._pooler_between()
            with self.store._pool_lock:
                self._session_conns[key, owner, token] = (conn, pid)
            return token
        raise AssertionError("unreachable")

    def _pooler_between(self) -> None:
        """The server process differs from the one the connection started with: a pooler
        (PgBouncer) sits between. In its session mode the hold is safe; in transaction mode
        the next statement may reach another server process, and the checks then find the
        hold lost (see check_session)."""
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
            if row is None or row[0] is None:
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
        return int(token), int(pid)

    def check_session(self, key: str, owner: str, token: int) -> bool:
        with self.store._pool_lock:
            held = self._session_conns.get((key, owner, token))
        if held is None:
            return False
        conn, pid = held
        row = self._on_hold(conn, self.store.sql.session_alive)
        if row is not None and row[0] == pid:
            return True
        self._forget_session(key, owner, token)
        if row is not None:  # alive, but another server process: a pooler moved it
            self._close(conn)
            log.warning("lock %r (token %d): its server session changed", key, token)
        else:
            log.warning("the session of lock %r (token %d) ended", key, token)
        return False

    def release_session(self, key: str, owner: str, token: int) -> bool:
        held = self._forget_session(key, owner, token)
        if held is None:
            return False
        conn = held[0]
        if self._on_hold(conn, self.store.sql.session_release, {"key": key}) is None:
            return False
        self._session_checkin(conn)
        return True

    def _on_hold(
        self, conn: psycopg.Connection[Any], sql: str, params: dict[str, Any] | None = None
    ) -> Any:
        """Run ``sql`` on a hold's connection within ``CHECK_DEADLINE``: its row; None, the
        connection closed (which frees the server's lock if it still had it), if it failed
        or overran."""
        watchdog = self._watchdog
        ident, watch = watchdog.watch(CHECK_DEADLINE, partial(self.store._abort, conn))
        try:
            row = conn.execute(sql, params).fetchone()
        except BaseException as exc:
            watchdog.done(ident)
            # nothing of this statement can grant anything later: just close (ending the
            # server's process first would wait for a server that may not answer)
            self._close(conn)
            if not isinstance(exc, Exception):
                raise
            log.debug("a session connection failed: %s", exc)
            return None
        watchdog.done(ident)
        if watch.aborted:
            self._close(conn)
            return None
        return row

    def _forget_session(
        self, key: str, owner: str, token: int
    ) -> tuple[psycopg.Connection[Any], int] | None:
        with self.store._pool_lock:
            return self._session_conns.pop((key, owner, token), None)

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

    def close(self) -> None:
        """Close every session connection (the server frees their locks); in a forked child,
        forget the parent's instead."""
        with self.store._pool_lock:
            conns = [*self._session_idle, *(held[0] for held in self._session_conns.values())]
            self._session_idle.clear()
            self._session_conns.clear()
        self._watchdog.stop()
        if self._pid != _forksafe.pid():
            return
        for conn in conns:
            self._close(conn)
