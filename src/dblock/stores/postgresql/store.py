"""PostgreSQL backend (psycopg 3).

Time is ``statement_timestamp()``: the server's clock at the start of the statement (each lock
statement runs in its own autocommit transaction, so ``now()`` would be the same, but
``statement_timestamp()`` stays right if a caller ever wraps several in one transaction).

Tokens come from one sequence shared by all keys (``<table>_token_seq``): a sequence never goes
back, across purges, restarts and crashes (its WAL record is flushed with the commit of the
acquisition that used it; we pin ``synchronous_commit=on`` so a client never sees a token whose
acquisition a crash could undo).

Releases are handed over: the release statement gives the lock to the head of the key's wait
queue (a new token, a lease of the waiter's own ttl but no longer than its queue entry would
have lived) and NOTIFYs that waiter with the token, so the waiter holds the lock the moment it
hears of it, with no statement of its own on the way. Waiters of one client share one LISTEN
connection, on the table's channel and on one of the client's own, which its waiters' queue
entries name: a hand-over wakes the one client it is for. A missed notification costs latency
only: waiters still poll, rarely, and a waiter's own acquire also takes a lock that was handed
to it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import select
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Final, cast

import psycopg

from ... import _forksafe
from ..._bounded import remember
from ..._contract import (
    CommitGuards,
    FairManyKeys,
    FairQueue,
    FencedGrants,
    FencedManyGrants,
    LeaderPush,
    LeaderValues,
    LossPush,
    OnceRecords,
    QueueJoin,
    QueueView,
    SchemaScript,
    SessionHolds,
    SharedHolds,
    Subscription,
    Wakeups,
)
from ..._errors import ConfigurationError, DBLockError
from ..._types import Kind, LockInfo
from ..._url import MAX_URL_TIMEOUT, DatabaseURL, scrub, scrub_exception, url_number
from .._listener import Listener, PushedWakeups
from .._pool import ABANDONED_CONNECT_TIMEOUT, MAINTENANCE_DEADLINE, ROW_LOCK_WAIT, Failure
from .._schema import HOLDERS, MAIN, missing, refuse_foreign
from .._sessions import DelegatedSessionHolds
from .._sql_ops import Busy, StatementOperations
from .doorbell import BELL_IDLE, Bells
from .session import PgSessions
from .statements import BELL_CHANNEL, MANY_TAKEN_PARTLY, NOT_DURABLE, PostgresStatements

log = logging.getLogger("dblock")

_TRANSIENT = {"40001", "40P01"}  # serialization failure, deadlock detected
#: the columns that make the token sequence dblock's (a sequence's columns in pg_attribute)
SEQUENCE: Final = frozenset({"last_value", "is_called"})
#: what the server refuses for good at connect: (SQLSTATEs, message patterns, what to change);
#: a failed connect carries no SQLSTATE, only the server's message (an outage's look alike:
#: 'database "x" is not currently accepting connections', 'too many connections for role')
_REFUSALS = (
    (
        {"28000", "28P01"},
        re.compile(
            r'password authentication failed|no pg_hba\.conf entry|role "[^"]*" does not exist'
            r'|role "[^"]*" is not permitted to log in'
        ),
        "check the user and password in the URL",
    ),
    (
        {"3D000"},
        re.compile(r'database "[^"]*" does not exist'),
        "check the database name in the URL",
    ),
    (
        {"42704", "22023", "55P02"},
        re.compile(r"unrecognized configuration parameter|invalid value for parameter"),
        "check the options in the URL",
    ),
)


#: how many holds taken by newcomers a client remembers the join count of (see release)
_QUIET_MEMORY = 10_000


def _utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc)


class PostgresStore(
    PushedWakeups,
    StatementOperations[psycopg.Connection[Any]],
    DelegatedSessionHolds,
    FairQueue,
    SharedHolds,
    OnceRecords,
    Wakeups,
    QueueJoin,
    LossPush,
    SessionHolds,
    QueueView,
    FencedManyGrants,
    FencedGrants,
    SchemaScript,
    FairManyKeys,
    CommitGuards,
    LeaderValues,
    LeaderPush,
):
    """Lock table in PostgreSQL."""

    #: a release rings the queue's head, or everyone only if the queue was joined meanwhile
    wakes_unqueued = False
    #: observers hear proclaims, and the releases of holds that proclaimed in this client
    #: (``~ <key>`` on the table's channel), force-releases and rings, not every grant and
    #: release: a NOTIFY in every lock statement would cost every lock user
    tells_every_hold = False

    name = dialect = "postgresql"

    @staticmethod
    def _row_info(row: Any) -> LockInfo:
        return _info(row)

    sql: PostgresStatements
    _sessions: PgSessions

    def __init__(self, url: DatabaseURL, schema: str | None, table: str) -> None:
        super().__init__(url, f"{schema}.{table}" if schema else table)
        # libpq gets keywords, never the URL: it would parse a malformed URL differently from
        # dblock, and quote it (password included) in its error messages
        self._options: dict[str, Any] = {
            k: v
            for k, v in {
                "host": url.host,
                "port": url.port,
                "user": url.user,
                "password": url.password,
                "dbname": url.database or None,
            }.items()
            if v is not None
        }
        self._options.update(url.query)
        # libpq waits forever with 0 or less: a connect is bounded by it alone
        self._options["connect_timeout"] = int(
            url_number(
                url.query.get("connect_timeout"),
                "connect_timeout",
                5,
                safe=url.safe,
                minimum=1,
                maximum=MAX_URL_TIMEOUT,
                integer=True,
            )
        )
        if "application_name" not in url.query:
            self._options["application_name"] = "dblock"
        # dblock's own settings for its sessions, after any the URL gives (the last one wins):
        # durable commits for whatever issues a token; and plain index scans, which mark the
        # dead index entries they meet (a bitmap scan does not), so that the queue entries a
        # busy key churns through cost a scan nothing once it has seen them, vacuum or not
        # (see docs/how-it-works.md)
        pinned = "-c synchronous_commit=on -c enable_bitmapscan=off"
        # a row lock waited for no longer than ROW_LOCK_WAIT, unless the URL says otherwise
        # (before its options: the last one wins)
        waits = f"-c lock_timeout={round(ROW_LOCK_WAIT * 1000)}"
        self._options["options"] = f"{waits} {url.query.get('options', '')} {pinned}".strip()
        try:  # libpq's names for parameters, checked without connecting
            psycopg.conninfo.make_conninfo("", **self._options)
        except psycopg.ProgrammingError as exc:
            raise self._misconfigured(exc) from None
        self.sql = PostgresStatements(schema, table)
        self.channel = self.sql.channel
        # (key, owner) -> the key's join count when owner took it as a newcomer
        self._quiet: dict[tuple[str, str], int] = {}
        self._quiet_lock = _forksafe.lock()
        #: (key, owner) -> the token of this client's hold that proclaimed in it: its release
        #: tells the key's observers (an election's resign)
        self._proclaimers: dict[tuple[str, str], int] = {}
        #: id(connection) -> its server process (a closed connection no longer tells it)
        self._pids: dict[int, int] = {}
        self._sessions = PgSessions(self)
        #: the doorbells of plain locks' waiters (doorbell.py)
        self._bells = Bells(self)

    # -- connections ----------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        conn = self._open_connection()
        self._pids[id(conn)] = conn.info.backend_pid
        return conn

    def _bell_connection(self) -> psycopg.Connection[Any]:
        """A connection for doorbells (doorbell.py): TCP keepalives both ways, as a session
        hold's, and ended by the server once idle ``BELL_IDLE`` s (PostgreSQL 14 and later)."""
        conn = self._open_connection(self._sessions.connection_options())
        self._pids[id(conn)] = conn.info.backend_pid
        idle = f"'{BELL_IDLE * 1000}'"
        settings = f", set_config('idle_session_timeout', {idle}, false)"
        try:
            sql = f"SELECT pg_backend_pid(){settings if conn.info.server_version >= 140000 else ''}"
            row = conn.execute(sql).fetchone()
        except BaseException:
            self._close_connection(conn)
            raise
        if row is None or row[0] != conn.info.backend_pid:
            # a pooler (PgBouncer) between: in its transaction mode a session's advisory
            # lock stays on a server connection that others get; waiters hear releases
            self._close_connection(conn)
            self._bells.give_up()
            raise psycopg.OperationalError("a connection pooler sits between: no doorbells")
        return conn

    def _open_connection(self, options: dict[str, Any] | None = None) -> psycopg.Connection[Any]:
        options = self._options if options is None else options
        try:
            if self.on_loop:
                from .green import GreenConnection

                # the async client's code runs in a greenlet: it awaits psycopg's asyncio
                # connection where this code looks blocking (the same calls, one subset)
                green = GreenConnection.connect(autocommit=True, **options)
                return cast("psycopg.Connection[Any]", green)
            return psycopg.connect(autocommit=True, **options)
        except psycopg.ProgrammingError as exc:  # psycopg's own check of a parameter's value
            raise self._misconfigured(exc) from exc
        except psycopg.OperationalError as exc:
            # libpq checks the values before it connects: "invalid sslmode value: ..."
            if str(exc).startswith("connection is bad: invalid "):
                raise self._misconfigured(exc) from exc
            raise

    def _misconfigured(self, exc: psycopg.Error) -> ConfigurationError:
        """A URL parameter libpq or psycopg refused: the user's to fix (never retried)."""
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        detail = detail.removeprefix("connection is bad: ")
        scrub_exception(exc, self._secrets)  # it travels on as the __cause__
        detail = scrub(detail, self._secrets)
        return ConfigurationError(f"invalid PostgreSQL URL parameter in {self.safe_url}: {detail}")

    def _close_connection(self, conn: psycopg.Connection[Any]) -> None:
        self._pids.pop(id(conn), None)
        with contextlib.suppress(psycopg.Error):
            conn.close()

    def _interrupted(self, conn: psycopg.Connection[Any]) -> None:
        """psycopg answers an interruption by asking the server to cancel the statement and
        waiting for it to end; interrupted again meanwhile, it closes the connection without
        knowing. The server does not notice a closed client while a statement waits for a
        lock: once it gets the lock the statement commits, a grant nobody knows of. End that
        server process first (waiting until it has exited), so what it did is settled before
        the acquire looks for a grant to undo."""
        pid = self._pids.get(id(conn))
        if pid is None or not (conn.closed or conn.broken):
            return  # the statement ended, cancelled or done: the connection still answers
        try:
            self.run("ending an interrupted statement", lambda c: _terminate(c, pid))
        except DBLockError as exc:
            log.warning("could not end the interrupted statement of process %s: %s", pid, exc)

    def _end_abandoned(self, conn: psycopg.Connection[Any]) -> Callable[[], None] | None:
        pid = self._pids.get(id(conn))
        if pid is None:
            return None
        options = {**self._options, "connect_timeout": ABANDONED_CONNECT_TIMEOUT}

        def end() -> None:
            with psycopg.connect(autocommit=True, **options) as side:
                _terminate(side, pid)

        return end

    def _refused(self, exc: BaseException) -> str | None:
        if not isinstance(exc, psycopg.Error):
            return None
        # a failed connect carries no SQLSTATE, only the server's FATAL message
        text = str(exc)
        for states, pattern, fix in _REFUSALS:
            if exc.sqlstate in states or pattern.search(text):
                return fix
        return None

    def _classify(self, exc: BaseException) -> Failure | None:
        if not isinstance(exc, psycopg.Error):
            return None
        if exc.sqlstate in _TRANSIENT:
            return Failure.TRANSIENT
        if exc.sqlstate == "55P03":  # lock_not_available: lock_timeout ran out
            return Failure.ROW_LOCKED
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) and (
            exc.sqlstate is None or exc.sqlstate.startswith(("08", "57P"))
        ):
            return Failure.DISCONNECT
        return Failure.FATAL

    def _abort(self, conn: psycopg.Connection[Any]) -> None:
        _shutdown(conn.pgconn.socket)

    def _reset(self, conn: psycopg.Connection[Any]) -> None:
        if conn.closed or conn.broken:
            raise psycopg.InterfaceError("connection is closed")

    # -- schema ---------------------------------------------------------------------------
    def ensure_schema(self, create: bool) -> None:
        required = {"t": MAIN, "s": SEQUENCE, "h": HOLDERS}

        def look(conn: psycopg.Connection[Any]) -> dict[str, set[str]]:
            found: dict[str, set[str]] = {}
            for name, column in conn.execute(self.sql.find_tables, self.sql.table_names).fetchall():
                found.setdefault(name, set()).update([column] if column else [])
            return found

        def complete(found: dict[str, set[str]]) -> bool:
            return all(columns <= found.get(key, set()) for key, columns in required.items())

        def op(conn: psycopg.Connection[Any]) -> None:
            if complete(look(conn)):
                return
            # Anything less is judged under the transaction-scoped advisory lock that
            # serialises creations (CREATE ... IF NOT EXISTS races on the catalog when many
            # processes start at once): a creation in flight elsewhere can show a table
            # without all its columns for a moment, which is not a foreign table.
            with conn.transaction():
                conn.execute(self.sql.lock_for_ddl, (self.sql.ddl_lock_id,))
                found = look(conn)
                refuse_foreign(
                    self.table,
                    self.safe_url,
                    {self.sql.table_names[k]: v for k, v in found.items()},
                    {self.sql.table_names[k]: v for k, v in required.items()},
                )
                if len(found) == len(required):
                    return
                if not create:
                    raise missing(self.table, self.safe_url, self.dialect)
                for statement in self.sql.ddl:
                    conn.execute(statement)

        self.run("creating the lock table", op, deadline=MAINTENANCE_DEADLINE)

    # -- operations -----------------------------------------------------------------------
    # (acquire, renew, grant_fenced, release_owned, claim_once, once_state: stores/_sql_ops.py)
    def release(self, key: str, owner: str, token: int) -> bool:
        with self._quiet_lock:
            joins = self._quiet.pop((key, owner), None)
            told = self._proclaimers.pop((key, owner), None) == token
        params: dict[str, Any] = {"key": key, "owner": owner, "token": token, "joins": joins}
        try:
            # a hold that waited keeps the key's doorbell: its release lets go of it too
            at_bell = self._bells.release_holding(
                key, owner, lambda conn, bell: self._release_at_bell(conn, params, bell, told)
            )
        except Exception:
            # it failed, which closed the bell's connection (rolling back what it had not
            # committed, and freeing the bell): the plain release, which first checks whether
            # that one committed
            log.debug("dblock: the release on the doorbell's connection failed", exc_info=True)
            return self._release_lease(params, told, after_failure=True)
        if at_bell is not None:
            return at_bell
        return self._release_lease(params, told)

    def _release_at_bell(
        self,
        conn: psycopg.Connection[Any],
        params: dict[str, Any],
        bell: tuple[int, int],
        told: bool,
    ) -> bool:
        """End the hold and let go of the key's doorbell, on the bell's connection."""
        sql = self.sql.release_at_bell_told if told else self.sql.release_at_bell
        lock = {"bc": bell[0], "bo": bell[1]}
        if conn.execute(sql, {**params, **lock}).fetchone() is not None:
            return True
        conn.execute(self.sql.bell_unlock, lock)  # nothing ended: the bell is let go of alone
        return False

    def _release_lease(
        self, params: dict[str, Any], told: bool, *, after_failure: bool = False
    ) -> bool:
        joins = params["joins"]
        sql = self.sql
        unwaited = sql.release_unwaited_told if told else sql.release_unwaited
        handing = sql.release_and_hand_over_told if told else sql.release_and_hand_over
        calls = 1 if after_failure else 0

        def op(conn: psycopg.Connection[Any]) -> bool:
            nonlocal calls
            calls += 1
            quiet = joins is not None and calls == 1  # (after a failure, calls starts at 1)
            if quiet and conn.execute(unwaited, params).rowcount == 1:
                return True
            if conn.execute(handing, params).fetchone() is not None:
                return True
            # After a retry the first attempt may have committed: released by us is success.
            if calls == 1:
                return False
            row = conn.execute(self.sql.released_by, params).fetchone()
            return row is not None and bool(row[0])

        return self.run("release", op, key=params["key"])

    def proclaim(self, key: str, owner: str, token: int, value: str | None) -> bool:
        """LeaderValues' proclaim (its statement also tells the key's observers); the hold
        is remembered, so that its release tells them too."""
        if not super().proclaim(key, owner, token, value):
            return False
        with self._quiet_lock:
            remember(self._proclaimers, (key, owner), token, _QUIET_MEMORY)
        return True

    # -- ManyKeys: the common case in one statement each ---------------------------------
    def acquire_many(self, keys: Sequence[str], owner: str, ttl: float) -> dict[str, int] | None:
        keys = sorted(keys)
        params = {"keys": json.dumps(keys), "owner": owner, "ttl": ttl}

        def op(conn: psycopg.Connection[Any]) -> dict[str, int] | None:
            # undone: a key was taken meanwhile, so it is busy
            rows = _unless_undone(conn, self.sql.acquire_many_as_newcomer, params)
            if not rows:
                return None
            self._taken_quietly_many(rows, owner)
            return {key: int(token) for key, token, _, _ in rows}

        return self.run("acquire", op, key=keys[0])

    def release_many(self, tokens: Mapping[str, int], owner: str) -> bool:
        keys = sorted(tokens)
        with self._quiet_lock:
            joins = [self._quiet.pop((k, owner), None) for k in keys]
        if None in joins:
            return super().release_many(tokens, owner)
        holds = [{"k": k, "tok": tokens[k], "j": j} for k, j in zip(keys, joins, strict=True)]
        params = {"holds": json.dumps(holds), "owner": owner}
        calls = 0

        def op(conn: psycopg.Connection[Any]) -> bool | None:
            nonlocal calls
            calls += 1
            # undone: someone joined a queue meanwhile, to be handed the key
            rows = _unless_undone(conn, self.sql.release_many_unwaited, params)
            if rows is None:
                return None
            if rows and rows[0][0] == len(keys):
                return True
            # after a retry the first attempt may have committed: released by us is success
            if calls > 1 and all(self._ended_by(conn, k, owner, tokens[k]) for k in keys):
                return True
            return None

        # someone queued for a key since it was taken: release it the way that hands over
        return self.run("release", op, key=keys[0]) or super().release_many(tokens, owner)

    # -- ManyKeys' other cases (one transaction: stores/_sql_ops.py), statements pipelined --
    # Each step is the single-key statement of each key, all sent at once (psycopg's pipeline
    # mode): one round trip for them, in key order, instead of one a key.
    def _take_all_in_turn(
        self, conn: psycopg.Connection[Any], keys: list[str], owner: str, ttl: float
    ) -> dict[str, int]:
        # each key's queued acquire, which also deletes owner's entry (or, after a lost
        # reply, takes again a key that is owner's already)
        return _take_each(conn, self.sql.acquire_in_turn, keys, owner, ttl)

    def _queue_params(self, keys: Sequence[str], owner: str, ttl: float) -> dict[str, Any]:
        # the release that frees a key with the waiter at the head rings it here
        return {**super()._queue_params(keys, owner, ttl), "channel": self._own_channel()}

    def subscribe_many(self, keys: Sequence[str], owner: str) -> Subscription | None:
        return self._with_listener(lambda listener: listener.subscribe_many(keys, owner))

    def _extend_all(
        self,
        conn: psycopg.Connection[Any],
        keys: list[str],
        tokens: Mapping[str, int],
        owner: str,
        ttl: float,
    ) -> list[bool]:
        params = [{"key": k, "owner": owner, "token": tokens[k], "ttl": ttl} for k in keys]
        return [count == 1 for _, count in _pipelined(conn, self.sql.renew, params)]

    def _end_all(
        self, conn: psycopg.Connection[Any], keys: list[str], tokens: Mapping[str, int], owner: str
    ) -> list[bool]:
        # each key's release that hands over; where none of them handed a key over (issued a
        # token), the transaction commits without waiting for the disk, as a single release
        # with nobody to hand over to does (see NOT_DURABLE): one more short statement, one
        # disk wait less
        with self._quiet_lock:
            for key in keys:
                self._quiet.pop((key, owner), None)
        params = [{"key": k, "owner": owner, "token": tokens[k]} for k in keys]
        rows = [row for row, _ in _pipelined(conn, self.sql.release_and_hand_over, params)]
        if not any(row is not None and row[1] for row in rows):
            conn.execute(f"SELECT {NOT_DURABLE}")
        return [row is not None for row in rows]

    def _ended_by(self, conn: psycopg.Connection[Any], key: str, owner: str, token: int) -> bool:
        params = {"key": key, "owner": owner, "token": token}
        row = conn.execute(self.sql.released_by, params).fetchone()
        return row is not None and bool(row[0])

    # -- CommitGuards (lock.guard) --------------------------------------------------------
    def guard_sql(self, n: int) -> str:
        return self.sql.guard(n)

    def guard_identity_sql(self) -> str:
        return self.sql.guard_identity

    def guard_identity(self, row: Sequence[object]) -> str | None:
        return None if row[0] is None else f"postgresql {row[0]} {row[1]}"

    def renew_after_guard(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        keys = sorted(tokens)
        params = {"keys": keys, "tokens": [tokens[k] for k in keys], "owner": owner, "ttl": ttl}

        def op(conn: psycopg.Connection[Any]) -> bool:
            return conn.execute(self.sql.renew_after_guard, params).rowcount == len(keys)

        return self.run("renew", op, key=keys[0] if keys else None)

    # -- FencedGrants ---------------------------------------------------------------------
    def identity(self) -> str | None:
        # the cluster's system identifier (its data directory's, whatever address reached
        # it) and the database; a role that may not read it cannot tell
        def op(conn: psycopg.Connection[Any]) -> str | None:
            row = conn.execute(self.sql.guard_identity).fetchone()
            return None if row is None else self.guard_identity(row)

        try:
            return self.run("reading the server's identity", op)
        except DBLockError:
            return None

    def fence(self, key: str) -> int:
        def op(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(self.sql.fence, {"key": key}).fetchone()
            return int(row[0]) if row is not None else 0

        return self.run("reading the fence", op, key=key)

    def acquire_fair(self, key: str, owner: str, ttl: float, queued: bool) -> int | None:
        params = {"key": key, "kind": "lock", "owner": owner, "ttl": ttl}
        bell = self._bells.ringing(key, owner)
        if bell is not None:
            # next at the key's doorbell: served before the waiters behind it at the bell
            bell.won = False
            sql, newcomer = self.sql.acquire_at_bell, False
        elif queued:
            sql, newcomer = self.sql.acquire_in_turn, False
        else:
            sql, newcomer = self.sql.acquire_as_newcomer, True

        def op(conn: psycopg.Connection[Any]) -> int | None:
            row = conn.execute(sql, params).fetchone()
            if row is None:
                return None
            if newcomer:
                self._taken_quietly(key, owner, row[1])
            return int(row[0])

        token = self.run("acquire", op, key=key)
        if bell is not None:
            bell.won = token is not None  # the bell stays with the hold
        return token

    def _taken_quietly(self, key: str, owner: str, joins: int | None) -> None:
        """``owner`` took ``key`` as a newcomer, so nobody waited for it then: remember the
        key's join count, so that its release can tell whether anyone has come since. None:
        someone may have joined as it took the lock (see unchanged_joins): nothing to trust."""
        if joins is None:
            return
        with self._quiet_lock:
            remember(self._quiet, (key, owner), joins, _QUIET_MEMORY)

    def _taken_quietly_many(self, rows: Sequence[Any], owner: str) -> None:
        """``_taken_quietly`` of each (key, token, joins, ...) row of a many-key take, under
        one take of the lock."""
        with self._quiet_lock:
            if len(self._quiet) + len(rows) > _QUIET_MEMORY:
                self._quiet.clear()
            for key, _, joins, _ in rows:
                if joins is not None:
                    self._quiet[key, owner] = joins

    def acquire_or_enqueue(self, key: str, owner: str, ttl: float, queue_ttl: float) -> int | None:
        """Take the lock like a newcomer, or else join its queue: one statement."""
        params = {
            "key": key,
            "kind": "lock",
            "owner": owner,
            "ttl": ttl,
            "qttl": queue_ttl,
            **self._entry(key, owner, ttl),
        }

        def op(conn: psycopg.Connection[Any]) -> int | None:
            row = conn.execute(self.sql.acquire_or_enqueue, params).fetchone()
            if row is not None and row[0] is None:
                self._bells.queued(key, int(row[4]))
            if row is not None and row[0] is not None:
                self._taken_quietly(key, owner, row[3])
                return int(row[0])
            if row is None or not row[1]:
                return None
            # freed while we joined, by a release that could not see us: our turn, unless
            # others queued ahead of us (they were seen by it, or they try again themselves)
            row = conn.execute(self.sql.acquire_in_turn, params).fetchone()
            return None if row is None else int(row[0])

        return self.run("acquire", op, key=key)

    def close(self) -> None:
        super().close()
        self._sessions.close()
        self._bells.close()

    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        """A plain lock's waiter sleeps at the key's doorbell where its queue is long
        (doorbell.py), unless this client has ``MAX_BELLS`` in use; other waiters hear
        releases on the listener."""
        if queue == "lock" and self._bells.crowded(key):
            bell = self._bells.doorbell(key, owner, self.rt.event())
            if bell is not None:
                try:
                    bell.ready()
                except BaseException:  # interrupted: the engine never gets it to close
                    bell.close()
                    raise
                return bell
        return super().subscribe(key, owner, queue)

    def info(self, key: str) -> LockInfo | None:
        def op(conn: psycopg.Connection[Any]) -> LockInfo | None:
            row = conn.execute(self.sql.info, {"key": key}).fetchone()
            if row is None:
                rows = self._holder_rows(conn, key=key)
                row = rows[0] if rows else None
            if row is None:
                sessions = self._sessions.infos(conn, key)
                return sessions[0] if sessions else None
            return _info(row)

        return self.run("info", op, key=key)

    def list_holds(self, prefix: str) -> list[LockInfo]:
        def op(conn: psycopg.Connection[Any]) -> list[LockInfo]:
            if prefix:
                cur = conn.execute(self.sql.list_by_prefix, {"n": len(prefix), "prefix": prefix})
            else:
                cur = conn.execute(self.sql.list_all)
            rows = [*cur.fetchall(), *self._holder_rows(conn, prefix=prefix)]
            return sorted((_info(row) for row in rows), key=lambda i: (i.key, i.acquired_at))

        return self.run("list", op, deadline=MAINTENANCE_DEADLINE)

    def force_release(self, key: str) -> bool:
        def op(conn: psycopg.Connection[Any]) -> bool:
            freed = conn.execute(self.sql.force_release, {"key": key}).fetchone() is not None
            # a session hold ends with its holder's connection
            ended = conn.execute(self.sql.session_terminate, {"key": key}).fetchall()
            return self._force_holders(conn, key) > 0 or freed or any(r[0] for r in ended)

        return self.run("force_release", op, key=key)

    def purge(self, older_than: float, include_once: bool) -> int:
        params = {"older": older_than, "inc": include_once}

        def op(conn: psycopg.Connection[Any]) -> int:
            purged = conn.execute(self.sql.purge, params).rowcount
            purged += self._purge_holders(conn, older_than)
            return purged + self._purge_values(conn, older_than)

        return self.run("purge", op, deadline=MAINTENANCE_DEADLINE)

    # -- dialect hooks for the multi-holder operations ------------------------------------
    def _exec(
        self, conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]
    ) -> tuple[int, list[Any]]:
        cur = conn.execute(sql, params)
        return cur.rowcount, cur.fetchall() if cur.description else []

    @contextmanager
    def _transaction(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        with conn.transaction():
            yield

    def _next_token(self, conn: psycopg.Connection[Any], key: str) -> int:
        return int(conn.execute(self.sql.next_token).fetchall()[0][0])

    def _announce_force(self, conn: psycopg.Connection[Any], key: str) -> None:
        """Tell the holders of the live shared holds of ``key`` that they are being freed
        (delivered when the transaction that frees them commits)."""
        conn.execute(self.sql.announce_force, {"key": key})

    def _notify(self, conn: psycopg.Connection[Any], key: str) -> None:
        conn.execute(self.sql.ring_everyone, {"key": key})

    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        params = {
            "key": key,
            "owner": owner,
            "kind": kind,
            "ttl": ttl,
            **self._entry(key, owner, lease),
        }
        row = self.run(
            "queueing", lambda conn: conn.execute(self.sql.enqueue, params).fetchone(), key=key
        )
        if row is not None:
            self._bells.queued(key, int(row[0]))

    def _entry(self, key: str, owner: str, lease: float | None) -> dict[str, Any]:
        """The ``lease`` and ``channel`` of ``owner``'s queue entry for ``key``, and how many
        others queued its statement counts (``crowd``): a waiter at the key's doorbell takes
        no hand-over and hears no ring (see doorbell.py), and takes the lock itself with that
        lease once it has the bell."""
        crowd = self._bells.crowd()
        bell = self._bells.waiting(key, owner)
        if bell is None:
            return {"lease": lease, "channel": self._own_channel(), "crowd": crowd}
        bell.ttl = lease
        return {"lease": None, "channel": BELL_CHANNEL, "crowd": crowd}

    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        params = {"key": key, "owner": owner, "ttl": ttl}
        return self.run(
            "queueing", lambda conn: conn.execute(self.sql.requeue, params).rowcount == 1, key=key
        )

    def dequeue(self, key: str, owner: str) -> None:
        """Leave the queue; and if the lock was handed to ``owner`` meanwhile, hand it on."""
        params = {"key": key, "owner": owner, "token": None}

        def op(conn: psycopg.Connection[Any]) -> None:
            if conn.execute(self.sql.dequeue_and_ring, params).fetchone() is None:
                # the entry was gone: a hand-over may have taken it (a new statement, so that
                # it sees a hand-over that committed while this one waited for the entry)
                conn.execute(self.sql.hand_on, params)

        self.run("leaving the queue", op, key=key)

    # -- pushed wake-ups (subscribe, watch, joining, close: PushedWakeups) ---------------
    def _new_listener(self) -> Listener:
        return _Listener(self)


class _Listener(Listener):
    """The client's LISTEN connection (see stores/_listener.py); for the async client
    psycopg's AsyncConnection, its notifications an async iterator.

    Dear: PostgreSQL signals every listening backend of the database at every NOTIFY, and
    each runs a transaction to read it, so the connection listens only while a waiter, watch
    or observer is registered (and the linger after). Its wait for a message also watches a
    socket pair that ``_use_changed`` writes to, so it starts listening at once."""

    dear = True

    def __init__(self, backend: PostgresStore) -> None:
        self._backend = backend
        self._conn: psycopg.Connection[Any] | None = None
        #: held while ``_conn`` is set or cleared, and while ``_interrupt`` shuts its socket
        #: down: never a descriptor the connection has closed (and another may have reused)
        self._conn_lock = _forksafe.lock()
        #: the wake-up pair (read end, write end; sockets, which select takes everywhere);
        #: None once closed, under ``_conn_lock``
        self._pipe: tuple[socket.socket, socket.socket] | None = socket.socketpair()
        for end in self._pipe:
            end.setblocking(False)
        super().__init__(backend.rt, f"dblock_{secrets.token_hex(8)}")

    def _use_changed(self) -> None:
        with self._conn_lock:
            if self._pipe is not None:
                with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending
                    self._pipe[1].send(b"\0")

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            with self._conn_lock:
                pipe, self._pipe = self._pipe, None
            if pipe is not None:
                for end in pipe:
                    end.close()

    def _serve(self) -> None:
        pause = 0.1
        sql = self._backend.sql
        lost = False  # a connection was lost: its messages may be, too
        while not self._stopped.is_set():
            try:
                # a connection of its own (not a statement connection, which may be borrowed
                # from a SQLAlchemy engine's pool: see stores/_sqla.py)
                conn = self._backend._open_connection()
                with self._conn_lock:
                    self._conn = conn
                listening, heard = False, True
                while not self._stopped.is_set():
                    wanted, recheck = self._listen_wanted()
                    lost = lost and wanted  # (with nobody registered, nobody to tell)
                    if wanted != listening:
                        conn.execute(sql.listen(self.channel) if wanted else sql.unlisten)
                        listening, heard = wanted, True
                        if wanted:
                            self._ready.set()
                            pause = 0.1
                        if wanted and lost:  # what was released meanwhile: look again
                            lost = False
                            self._wake(None)
                    if heard:  # (or kept by psycopg from the reply to a statement)
                        for note in conn.notifies(timeout=0.0):
                            self._heard(note.payload)
                    if self._idle_out():
                        break
                    heard = self._await_input(conn, recheck)
            except psycopg.Error as exc:
                self._ready.clear()
                lost = True
                if not self._stopped.is_set():
                    log.debug("dblock listener reconnecting after: %s", exc)
                    self._wake(None)
                    self._stopped.wait(pause)
                    pause = min(pause * 2, 5.0)
            finally:
                with self._conn_lock:
                    conn_, self._conn = self._conn, None
                if conn_ is not None:
                    self._backend._close_connection(conn_)

    def _await_input(self, conn: psycopg.Connection[Any], timeout: float) -> bool:
        """Wait up to ``timeout`` s for a message or a wake-up (then empty the pipe): whether
        the connection has input."""
        pipe = self._pipe
        if pipe is None:
            return True
        wait = getattr(conn, "wait_readable", None)  # the async client's connection
        wake = pipe[0].fileno()
        if wait is not None:
            heard, woken = wait(wake, timeout)
        else:
            sock = conn.pgconn.socket
            fired = select.select([sock, wake], [], [], timeout)[0]
            heard, woken = sock in fired, wake in fired
        if woken:
            with self._conn_lock, contextlib.suppress(BlockingIOError):
                if self._pipe is not None:
                    self._pipe[0].recv(4096)
        return bool(heard)

    def _interrupt(self) -> None:
        # the wait for notifications fails at once on a socket shut down; _run, stopped, ends
        with self._conn_lock:
            conn = self._conn
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    _shutdown(conn.pgconn.socket)


def _take_each(
    conn: psycopg.Connection[Any], sql: str, keys: list[str], owner: str, ttl: float
) -> dict[str, int]:
    """Run the acquire ``sql`` for each key (sorted), pipelined: each key's token; Busy if
    one was not taken."""
    params = [{"key": k, "kind": "lock", "owner": owner, "ttl": ttl} for k in keys]
    rows = _pipelined(conn, sql, params)
    if any(row is None for row, _ in rows):
        raise Busy
    return {k: int(row[0]) for k, (row, _) in zip(keys, rows, strict=True)}


def _unless_undone(
    conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]
) -> list[Any] | None:
    """The rows of a many-key statement, or None if it undid itself: it changed only some of
    its keys, so it failed (MANY_TAKEN_PARTLY, see statements.py) and nothing stays changed."""
    try:
        return conn.execute(sql, params).fetchall()
    except psycopg.errors.InvalidTextRepresentation as exc:
        if MANY_TAKEN_PARTLY not in str(exc):
            raise
        return None


def _pipelined(
    conn: psycopg.Connection[Any], sql: str, params: list[dict[str, Any]]
) -> list[tuple[Any, int]]:
    """Run ``sql`` once for each of ``params``, sent together: (first row or None, rowcount)
    of each, in order."""
    with conn.pipeline():
        cursors = [conn.execute(sql, p) for p in params]
    return [(c.fetchone() if c.description else None, c.rowcount) for c in cursors]


def _terminate(conn: psycopg.Connection[Any], pid: int) -> None:
    """End server process ``pid``; from PostgreSQL 14 on, return once it has exited."""
    if conn.info.server_version >= 140000:
        conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
    else:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _shutdown(fd: int) -> None:
    """Shut a connection's socket down, so a read blocked on it returns at once."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def _info(row: Any) -> LockInfo:
    key, owner, token, acquired_at, expires_at, kind = row
    kind_value: Kind = kind
    return LockInfo(key, owner, int(token), _utc(acquired_at), _utc(expires_at), kind_value)
