"""MariaDB session holds (``ttl=None``): the server's ``GET_LOCK``, on a connection set aside
for the hold.

- The lock is ``GET_LOCK('dblock-s:' + SHA-1 of database, table and key)``: 49 characters,
  under the 64 the server allows, and distinct for keys that differ only in case (the hash is
  of the key's bytes; the server compares names case-insensitively).
- Waiting is the server's queue: a blocking ``GET_LOCK`` with the caller's timeout, on the
  waiter's own connection. A release hands the lock to the waiter that asked first, with no
  wake-up message.
- Grant and token are one round trip (one packet of statements, each its own autocommit
  transaction): after ``GET_LOCK``, a locking read of the key's row waits for a lease being
  taken or released and reads what it committed; a live lease: the lock is given back, the
  engine waits. Else the token is ``GREATEST(NEXTVAL(<table>_token_seq), row token + 1)``: the
  sequence every lease token also exceeds (sql/mysql.py), so the tokens of a key increase
  whatever the mix of kinds. No row is written but a MEMORY row naming the holder (info,
  list): no commit waits for the disk.
- A key without a row (never taken, or purged) first gets a free one: a lease can check for the
  session (``IS_USED_LOCK``) only before it inserts a new row, so the session grant makes the
  row, or waits for the insert in flight and then sees it; a later lease finds the row and
  checks with its lock held.
- Every connection of a hold or waiter is outside the pool; up to ``_IDLE_KEPT`` of them are
  kept for the next hold. They set TCP keepalives (client side) and a ``wait_timeout`` of
  ``SERVER_IDLE`` s (the server closes a connection idle that long, freeing its lock: a holder's
  checks keep it busy, so it frees the lock of a holder cut off or frozen that long).
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import time
from functools import partial
from typing import Any

import pymysql

from .. import _forksafe
from .._errors import BackendError
from .sql.base import Failure
from .sql.mysql import session_lock_name
from .sql.watchdog import Watchdog

log = logging.getLogger("dblock")

#: idle session connections kept for the next hold
_IDLE_KEPT = 4
#: a keep-alive check of a hold's connection that takes longer than this marks it lost
CHECK_DEADLINE = 2.0
#: the server closes a session connection idle this long (``wait_timeout``), which frees its
#: lock; a hold's checks (every second) keep it busy
SERVER_IDLE = 30
#: "the table is full": the sessions table (MEMORY) reached max_heap_table_size
_TABLE_FULL = 1114
#: a GET_LOCK wait without a timeout: a year (the server takes no "forever")
_FOREVER = 365 * 24 * 3600
#: the watchdog's margin over a grant's own wait
_GRANT_SLACK = 5.0
#: client-side TCP settings of session connections: a peer that stopped answering is dropped
#: after about 10 s (a blocked GET_LOCK fails then, instead of waiting for its timeout)
_DROP_AFTER_MS = 10_000
_KEEPALIVE = (
    ("SO_KEEPALIVE", socket.SOL_SOCKET, 1),
    ("TCP_KEEPIDLE", socket.IPPROTO_TCP, 3),
    ("TCP_KEEPINTVL", socket.IPPROTO_TCP, 2),
    ("TCP_KEEPCNT", socket.IPPROTO_TCP, 3),
    ("TCP_USER_TIMEOUT", socket.IPPROTO_TCP, _DROP_AFTER_MS),
)


class MysqlSessions:
    """The MySQL store's session holds: its ``SessionHolds`` operations delegate here."""

    def __init__(self, store: Any, scope: str) -> None:
        #: the MysqlBackend (typed loosely: importing it here would make a cycle); its
        #: connections, pool lock, statements and error handling are used
        self.store = store
        #: database and table, which every GET_LOCK name is made of
        self.scope = scope
        self._pid = _forksafe.pid()
        # the store's watchdog gives every statement at least its 5 s: checks get their own
        self._watchdog = Watchdog(f"dblock-session-watchdog[{store.table}]", CHECK_DEADLINE)
        #: (connection, when it was put back)
        self._idle: list[tuple[Any, float]] = []
        #: (key, owner, token) -> the hold's connection
        self._conns: dict[tuple[str, str, int], Any] = {}
        #: the highest mark of the token sequence this client knows to be on disk: a value
        #: below it is safe to hand out (see MysqlStatements._build_sessions)
        self._durable = 0

    def name(self, key: str) -> str:
        return session_lock_name(self.scope, key)

    @property
    def gate(self) -> str:
        """The GET_LOCK held while the sequence is made durable (a name no key has)."""
        return session_lock_name(self.scope, "") + ":d"

    # -- connections ----------------------------------------------------------------------
    def _checkout(self) -> tuple[Any, bool]:
        """(a connection for one hold or waiter, whether it was kept from an earlier one)."""
        stale = []
        with self.store._pool_lock:
            self.store._check_pool()
            if self._pid != _forksafe.pid():
                # forked: the parent's connections (and the locks they hold) are the parent's;
                # forget them without closing, as closing would end the parent's sessions
                self._idle.clear()
                self._conns.clear()
                self._pid = _forksafe.pid()
            kept = None
            while self._idle and kept is None:
                conn, since = self._idle.pop()
                if time.monotonic() - since < SERVER_IDLE / 2:
                    kept = conn
                else:
                    stale.append(conn)  # the server may have closed it by now
        for conn in stale:
            self.store._close_connection(conn)
        if kept is not None:
            return kept, True
        try:
            conn = self.store._session_connection(f"SET SESSION wait_timeout = {SERVER_IDLE}")
        except Exception as exc:
            failure = self.store._classify(exc)
            if failure is None:
                raise
            raise self.store._wrap(exc, f"cannot connect to {self.store.safe_url}", None) from exc
        _keepalive(self.store._socket_of(conn))
        return conn, False

    def _checkin(self, conn: Any) -> None:
        with self.store._pool_lock:
            if not self.store._closed and len(self._idle) < _IDLE_KEPT:
                self._idle.append((conn, time.monotonic()))
                return
        self.store._close_connection(conn)

    def _drop(self, conn: Any, interrupted: bool) -> None:
        """Close a session connection whose state is unknown: the server frees its lock. An
        interrupted wait is ended in the server first (KILL), so it cannot be granted later."""
        if interrupted:
            self.store._interrupted(conn)
        self.store._close_connection(conn)

    # -- the capability -------------------------------------------------------------------
    def acquire_session(self, key: str, owner: str, timeout: float) -> int | None:
        for attempt in (1, 2):
            conn, kept = self._checkout()
            try:
                token = self._grant(conn, key, owner, timeout)
            except BaseException as exc:
                self._drop(conn, interrupted=not isinstance(exc, Exception))
                if not isinstance(exc, Exception):
                    raise  # a cancellation: nothing is left held, the connection is gone
                failure = self.store._classify(exc)
                if failure is Failure.DISCONNECT and kept and attempt == 1:
                    continue  # a kept connection died meanwhile (a server restart): a fresh one
                if failure is None:
                    raise
                raise self.store._wrap(
                    exc, f"session acquire failed on {self.store.safe_url}", key
                ) from exc
            if token is None:
                self._checkin(conn)
                return None
            with self.store._pool_lock:
                self._conns[key, owner, token] = conn
            return token
        raise AssertionError("unreachable")

    def _grant(self, conn: Any, key: str, owner: str, timeout: float) -> int | None:
        """The token if granted; None if not had in time, or a live lease holds the key (the
        lock is given back)."""
        sql = self.store.sql
        wait = _FOREVER if math.isinf(timeout) else max(0.0, timeout)
        params = {"key": key, "owner": owner, "sname": self.name(key), "s": wait}
        store = self.store
        ident, _ = store._watchdog.watch(wait + _GRANT_SLACK, partial(store._abort, conn))
        try:
            code = self._look(conn, sql.session_grant, params, 1)
            status = 3 if code is not None else self._status(conn, key)
            if status == 1:
                # no row for the key: one is made, and the look runs again, lock in hand
                code = self._look(conn, sql.session_grant_new_row, params, 1)
                status = 3 if code is not None else 2
            if status == 2:  # a live lease holds the key: the lock goes back
                with conn.cursor() as cur:
                    cur.execute(sql.session_unlock, params)
        finally:
            store._watchdog.done(ident)
        if code is None:
            return None
        token, from_row = code >> 1, code & 1
        if from_row:
            # the row's token was ahead of the sequence (a client that does not draw lease
            # tokens from it): later tokens, drawn from it, must exceed this one
            with conn.cursor() as cur:
                cur.execute(sql.push_sequence(token))
            self._make_durable(conn, key)
        elif token >= self._durable:
            self._make_durable(conn, key, token)
        return token

    def _status(self, conn: Any, key: str) -> int:
        """Why the look granted nothing: 0 the lock was not had, 1 the key has no row, 2 a
        live lease holds it."""
        with conn.cursor() as cur:
            cur.execute(self.store.sql.session_status, {"key": key})
            return int(cur.fetchone()[0])

    def _look(self, conn: Any, grant: str, params: dict[str, Any], index: int) -> int | None:
        """Run a grant's statements, whose ``index``-th is the look: its insert id (twice the
        token, plus 1 if it came from the row), or None if it granted nothing."""
        sql = self.store.sql
        try:
            return _granted(conn, grant, params, index)
        except pymysql.err.MySQLError as exc:
            if not exc.args or exc.args[0] != _TABLE_FULL:
                raise
        # the sessions table is full of rows of holds that ended: they go, and the look runs
        # again (GET_LOCK, if it was in the statements, was had: the look came after it)
        with conn.cursor() as cur:
            cur.execute(sql.session_purge)
        return _granted(conn, sql.session_look, params, 0)

    def _make_durable(self, conn: Any, key: str, value: int | None = None) -> None:
        """Make sure the sequence is on disk past ``value`` (None: past where it is now) before
        a token drawn from it is handed out: by the table's mark, if it is past ``value`` and
        on disk, else by a new mark (see MysqlStatements._build_sessions)."""
        sql = self.store.sql
        gate = {"gate": self.gate}
        with conn.cursor() as cur:
            if value is not None:
                cur.execute(sql.session_mark, gate)
                mark, on_disk = cur.fetchone()
                if on_disk == 1 and int(mark) > value:
                    self._durable = max(self._durable, int(mark))
                    return
            cur.execute(sql.sequence_reserved)
            reserved = int(cur.fetchone()[0])
        if _first_row(conn, sql.make_durable, {**gate, "n": reserved})[0] != 1:
            raise BackendError(
                f"session acquire on {self.store.safe_url} (key {key!r}, table "
                f"{self.store.table}): the token sequence's gate stayed taken for 10 s",
                key=key,
            )
        self._durable = max(self._durable, reserved)

    def check_session(self, key: str, owner: str, token: int) -> bool:
        with self.store._pool_lock:
            conn = self._conns.get((key, owner, token))
        if conn is None:
            return False
        row = self._on_hold(conn, self.store.sql.session_alive, {"sname": self.name(key)})
        if row is not None and row[0] == 1:
            return True
        self._forget(key, owner, token)
        if row is not None:  # alive, but the lock is not its own: it was freed under it
            self.store._close_connection(conn)
        log.warning("the session of lock %r (token %d) ended", key, token)
        return False

    def release_session(self, key: str, owner: str, token: int) -> bool:
        conn = self._forget(key, owner, token)
        if conn is None:
            return False
        params = {"key": key, "sname": self.name(key)}
        row = self._on_hold(conn, self.store.sql.session_release, params)
        if row is None:
            return False
        self._checkin(conn)
        return bool(row[0] == 1)

    def _on_hold(self, conn: Any, sql: str, params: dict[str, Any]) -> Any:
        """Run ``sql`` on a hold's connection within ``CHECK_DEADLINE``: the first row of its
        first result; None, the connection closed (which frees the server's lock if it still
        had it), if it failed or overran."""
        watchdog = self._watchdog
        ident, watch = watchdog.watch(CHECK_DEADLINE, partial(self.store._abort, conn))
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                row = cur.fetchone()
                while cur.nextset():
                    pass
        except BaseException as exc:
            watchdog.done(ident)
            self.store._close_connection(conn)
            if not isinstance(exc, Exception):
                raise
            log.debug("a session connection failed: %s", exc)
            return None
        watchdog.done(ident)
        if watch.aborted:
            self.store._close_connection(conn)
            return None
        return row

    def _forget(self, key: str, owner: str, token: int) -> Any:
        with self.store._pool_lock:
            return self._conns.pop((key, owner, token), None)

    # -- inspection -----------------------------------------------------------------------
    def holder(self, conn: Any, key: str) -> int | None:
        """The connection id of ``key``'s session holder, or None."""
        with conn.cursor() as cur:
            cur.execute(self.store.sql.session_holder, {"sname": self.name(key)})
            row = cur.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def infos(self, conn: Any, key: str | None = None, prefix: str = "") -> list[Any]:
        """Rows (key, owner, token, acquired_at, None, 'session') of the current session holds
        of ``key``, or of the keys ``prefix`` starts."""
        sql = self.store.sql
        with conn.cursor() as cur:
            if key is not None:
                cur.execute(sql.session_info, {"key": key})
            elif prefix:
                cur.execute(sql.session_list_by_prefix, {"n": len(prefix), "prefix": prefix})
            else:
                cur.execute(sql.session_list)
            return list(cur.fetchall())

    def close(self) -> None:
        """Close every session connection (the server frees their locks); in a forked child,
        forget the parent's instead."""
        with self.store._pool_lock:
            conns = [*(conn for conn, _ in self._idle), *self._conns.values()]
            self._idle.clear()
            self._conns.clear()
        self._watchdog.stop()
        if self._pid != _forksafe.pid():
            return
        for conn in conns:
            self.store._close_connection(conn)


def _granted(conn: Any, sql: str, params: dict[str, Any], index: int) -> int | None:
    """Run the statements ``sql`` (one packet); the insert id of the ``index``-th if it
    affected rows, else None."""
    found = None
    with conn.cursor() as cur:
        cur.execute(sql, params)
        at = 0
        while True:
            if at == index and cur.rowcount in (1, 2):
                found = int(cur.lastrowid)
            at += 1
            if not cur.nextset():
                break
    return found


def _first_row(conn: Any, sql: str, params: dict[str, Any]) -> Any:
    """Run the statements ``sql`` (one packet); the first row of the first result."""
    with conn.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
        while cur.nextset():
            pass
    return row


def _keepalive(sock: socket.socket | None) -> None:
    """TCP keepalives (and a bound on unacknowledged data) on a session connection's socket,
    where the platform has them (not on a Unix socket)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    for name, level, value in _KEEPALIVE:
        option = getattr(socket, name, None)
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, option, value)
