"""MariaDB session holds (``ttl=None``): the server's ``GET_LOCK``, on a connection set aside
for the hold.

- The lock is ``GET_LOCK('dblock-s:' + SHA-1 of database, table and key)``: 49 characters,
  under the 64 the server allows, and distinct for keys that differ only in case (the hash is
  of the key's bytes; the server compares names case-insensitively).
- Waiting is the server's queue: a blocking ``GET_LOCK`` with the caller's timeout, on the
  waiter's own connection. A release hands the lock to the waiter that asked first, with no
  wake-up message.
- Grant and token are one round trip: ``GET_LOCK``, then one ``INSERT ... SELECT`` (prepared
  once per connection) whose locking read of the key's row waits for a lease being taken or
  released and reads what it committed; if the row is free it writes a MEMORY row naming the
  holder (info, list) with the token, ``GREATEST(NEXTVAL(<table>_token_seq), row token +
  1)``, which comes back as the insert id. The sequence is the one every lease token also
  exceeds (statements.py), so the tokens of a key increase whatever the mix of kinds. Nothing
  granted: one more statement says why (a live lease: the lock is given back, the engine
  waits). No commit waits for the disk, but one per cache of the sequence, which is not
  durable by itself (see _make_durable).
- A key without a row (never taken, or purged) first gets a free one: a lease can check for the
  session (``IS_USED_LOCK``) only before it inserts a new row, so the session grant makes the
  row, or waits for the insert in flight and then sees it; a later lease finds the row and
  checks with its lock held.
- A release is ``RELEASE_LOCK`` alone: the MEMORY row stays, no longer a hold, until the key's
  next grant replaces it or purge deletes it (a grant that finds the table full deletes the
  rows of holds that ended first). Releases and checks answer by the rows they matched (an
  OK packet, which PyMySQL reads faster than a result set).
- Every connection of a hold or waiter is outside the pool (stores/_sessions.py); idle ones are
  kept for the next hold. They set TCP keepalives (client side) and a ``wait_timeout`` of
  ``SERVER_IDLE`` s (the server closes a connection idle that long, freeing its lock: a holder's
  checks keep it busy, so it frees the lock of a holder cut off or frozen that long).
"""

from __future__ import annotations

import contextlib
import math
import socket
import time
from functools import partial
from typing import Any

import pymysql

from ..._errors import BackendError
from .._sessions import SessionConnections
from .statements import PREPARED_LOOK, session_lock_name

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


class MysqlSessions(SessionConnections):
    """The MySQL store's session holds: its ``SessionHolds`` operations delegate here."""

    def __init__(self, store: Any, scope: str) -> None:
        super().__init__(store)
        #: database and table, which every GET_LOCK name is made of
        self.scope = scope
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
    def _fresh(self, since: float) -> bool:
        return time.monotonic() - since < SERVER_IDLE / 2

    def _open(self) -> Any:
        store, conn = self.store, None
        try:
            conn = store._session_connection(f"SET SESSION wait_timeout = {SERVER_IDLE}")
            _keepalive(store._socket_of(conn))
            with conn.cursor() as cur:  # the grant's look, parsed once (statements.py)
                cur.execute(f"PREPARE {PREPARED_LOOK} FROM %s", (store.sql.session_look_text,))
        except Exception as exc:
            if conn is not None:
                self._close(conn)
            if store._classify(exc) is None:
                raise
            if conn is None:
                raise store._connect_error(exc, None) from exc
            raise store._wrap(exc, f"session setup failed on {store.safe_url}", None) from exc
        return conn

    def _drop(self, conn: Any, interrupted: bool) -> None:
        """Close a session connection whose state is unknown: the server frees its lock. An
        interrupted wait is ended in the server first (KILL), so it cannot be granted later. A
        wait that failed otherwise ended with its error; one whose connection died ends when
        the server next writes to it, which frees a lock granted meanwhile."""
        if interrupted:
            self.store._interrupted(conn)
        self._close(conn)

    def _answer(self, conn: Any, sql: str, params: dict[str, Any] | None) -> Any:
        """The number of rows the statement matched: a hold's checks and release are
        ``SELECT ... INTO``, whose answer is an OK packet (a result set costs PyMySQL three
        more packets to parse, on the path from one holder to the next)."""
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.rowcount

    def _alive(self, conn: Any, key: str, seen: Any) -> bool | None:
        matched = self._on_hold(conn, self.store.sql.session_alive, {"sname": self.name(key)})
        return None if matched is None else matched == 1

    def _release(self, conn: Any, key: str) -> bool | None:
        matched = self._on_hold(conn, self.store.sql.session_release, {"sname": self.name(key)})
        return None if matched is None else matched == 1

    # -- granting -------------------------------------------------------------------------
    def _grant(self, conn: Any, key: str, owner: str, timeout: float) -> tuple[int, None] | None:
        """(the token, -) if granted; None if not had in time, or a live lease holds the key
        (the lock is given back)."""
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
        return token, None

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


def _first_row(conn: Any, sql: str, params: dict[str, Any] | None) -> Any:
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
