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
import hashlib
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import psycopg

from .. import _forksafe
from .._errors import ConfigurationError
from .._types import Kind, LockInfo
from .._url import MAX_URL_TIMEOUT, DatabaseURL, scrub, scrub_exception, url_number
from ._contract import (
    FairQueue,
    LossPush,
    OnceRecords,
    QueueJoin,
    SchemaScript,
    SharedHolds,
    Subscription,
    Wakeups,
)
from .sql.base import MAINTENANCE_DEADLINE, Failure
from .sql.holders import HoldersMixin, Rows
from .sql.names import aux_name, qualify
from .sql.schema import HOLDERS, MAIN, SEQUENCE, missing, refuse_foreign

log = logging.getLogger("dblock")

NOW = "statement_timestamp()"
_TRANSIENT = {"40001", "40P01"}  # serialization failure, deadlock detected


#: SQL that commits the statement's transaction without waiting for its WAL to reach disk.
#: For statements that issue no token:
#: - joining a queue: a crash may lose the entry, but every client loses its connections then
#:   too, and its waiters find their entries gone and queue again;
#: - a release with nobody to hand the lock to: a crash may undo it, and the lock is then held
#:   until its lease ends, as if its holder had died holding it. It cannot cost exclusion or
#:   a token: WAL reaches the disk in order, so the commit of any later acquisition, which
#:   waits for the disk, makes the release durable first.
#: A statement that issues a token (an acquisition, a hand-over) always waits for the disk.
_NOT_DURABLE = "set_config('synchronous_commit', 'off', true)"


#: how many holds taken by newcomers a client remembers the join count of (see release)
_QUIET_MEMORY = 10_000


def _utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc)


class PostgresBackend(
    HoldersMixin[psycopg.Connection[Any]],
    FairQueue,
    SharedHolds,
    OnceRecords,
    Wakeups,
    QueueJoin,
    LossPush,
    SchemaScript,
):
    """Lock table in PostgreSQL."""

    name = dialect = "postgresql"

    def __init__(  # noqa: PLR0915 - one named SQL constant per operation, built once here
        self, url: DatabaseURL, schema: str | None, table: str
    ) -> None:
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
                10,
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
        self._options["options"] = f"{url.query.get('options', '')} {pinned}".strip()
        try:  # libpq's names for parameters, checked without connecting
            psycopg.conninfo.make_conninfo("", **self._options)
        except psycopg.ProgrammingError as exc:
            raise self._misconfigured(exc) from None
        t = qualify(schema, table, '"')
        seq = qualify(schema, aux_name(table, "_token_seq"), '"')
        holders = qualify(schema, aux_name(table, "_holders"), '"')
        self.channel = aux_name(table if schema is None else f"{schema}_{table}", "_released")
        self._ddl = [
            f"CREATE TABLE IF NOT EXISTS {t} (\n"
            '    lock_key    text COLLATE "C" NOT NULL PRIMARY KEY,\n'
            "    kind        varchar(16) NOT NULL DEFAULT 'lock',\n"
            "    owner       varchar(255),\n"
            "    token       bigint NOT NULL,\n"
            "    acquired_at timestamptz NOT NULL,\n"
            "    expires_at  timestamptz NOT NULL,\n"
            "    state       varchar(16),\n"
            "    note        text,\n"
            "    joins       bigint NOT NULL DEFAULT 0  -- counts joins to the key's wait queue\n"
            ")",
            f"CREATE SEQUENCE IF NOT EXISTS {seq}",
            f"CREATE TABLE IF NOT EXISTS {holders} (\n"
            '    lock_key    text COLLATE "C" NOT NULL,\n'
            "    holder      varchar(255) NOT NULL,  -- the owner of a hold or queue entry\n"
            "    kind        varchar(16) NOT NULL,\n"
            "    waiting     smallint NOT NULL DEFAULT 0,  -- 1: a queue entry, not a hold\n"
            "    token       bigint NOT NULL,\n"
            "    acquired_at timestamptz NOT NULL,\n"
            "    expires_at  timestamptz NOT NULL,\n"
            "    lease       double precision,  -- a queue entry: the ttl (s) a hand-over gives\n"
            "    channel     varchar(63),  -- a queue entry: where its client LISTENs\n"
            "    PRIMARY KEY (lock_key, holder)\n"
            ")",
        ]
        # dialect pieces for the multi-holder operations (see sql/holders.py)
        self._main, self._holders, self._now, self._seq = t, holders, NOW, seq
        self._ensure_parent = (
            f"INSERT INTO {t} (lock_key, kind, owner, token, acquired_at, expires_at)\n"
            f"VALUES (%(key)s, 'lock', NULL, nextval('{seq}'), {NOW}, {NOW})\n"
            "ON CONFLICT (lock_key) DO NOTHING"
        )
        self._lock_parent = (
            f"SELECT owner, owner IS NOT NULL AND expires_at > {NOW} FROM {t} "
            "WHERE lock_key = %(key)s FOR UPDATE"
        )
        self._upsert_holder = (
            f"INSERT INTO {holders} AS x (lock_key, holder, kind, waiting, token, acquired_at,\n"
            "    expires_at)\n"
            "VALUES (%(key)s, %(owner)s, %(kind)s, %(waiting)s, %(token)s,\n"
            f"    {NOW}, {NOW} + make_interval(secs => %(ttl)s))\n"
            "ON CONFLICT (lock_key, holder) DO UPDATE SET kind = EXCLUDED.kind,\n"
            "    token = EXCLUDED.token, expires_at = EXCLUDED.expires_at,\n"
            "    acquired_at = CASE WHEN x.waiting = 1 AND EXCLUDED.waiting = 1\n"
            "        THEN x.acquired_at ELSE EXCLUDED.acquired_at END,\n"
            "    waiting = EXCLUDED.waiting"
        )
        self._prefix_match = "left(lock_key, %(n)s) = %(prefix)s"

        # key kind owner ttl -> one row (the new token) if taken, no row if held. A live row is
        # taken only by its own owner (an idempotent retry); a `once` record never by a lock.
        # A newcomer's also returns the key's join count, if no join came between the
        # statement's snapshot and its row lock: a join that committed meanwhile is counted in
        # the row it updates (it waited for the join's row lock) but its queue entry was
        # invisible to the fairness clause; for a new row, a join found nothing to count
        # itself on. NULL then: the release will not trust the count (see release) and hands
        # over to whoever queued.
        unchanged_joins = (
            f"CASE WHEN joins = (SELECT s.joins FROM {t} s WHERE s.lock_key = %(key)s) "
            "THEN joins END AS joins"
        )

        def acquire_sql(fair: str = "", *, newcomer: bool = False) -> str:
            # the casts settle the parameter types, which the queue clause uses too
            values = (
                "%(key)s::text, %(kind)s::varchar, %(owner)s::varchar, "
                f"nextval('{seq}'), {NOW},\n    {NOW} + make_interval(secs => %(ttl)s)"
            )
            # A row visibly held by someone else is skipped before the insert: ON CONFLICT DO
            # UPDATE ... WHERE false would still lock that row and write WAL (a durable commit
            # per failed try, competing with the holder's release).
            busy = (
                f"NOT EXISTS (SELECT 1 FROM {t} b WHERE b.lock_key = %(key)s AND "
                f"(b.owner IS NULL OR b.owner <> %(owner)s) AND b.expires_at > {NOW})"
            )
            return (
                f"INSERT INTO {t} AS l (lock_key, kind, owner, token, acquired_at, expires_at)\n"
                f"SELECT {values} WHERE {busy}{fair and ' AND ' + fair}\n"
                "ON CONFLICT (lock_key) DO UPDATE SET kind = EXCLUDED.kind,\n"
                "    owner = EXCLUDED.owner, token = EXCLUDED.token,\n"
                "    acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,\n"
                "    state = NULL, note = NULL\n"
                f"WHERE (l.expires_at <= {NOW} AND l.kind <> 'once') OR l.owner = EXCLUDED.owner\n"
                f"RETURNING token{', ' + unchanged_joins if newcomer else ''}"
            )

        # The fairness clause is tested once, in the SELECT: the ON CONFLICT condition would
        # read the holders table with the same statement snapshot, so it adds nothing there.
        self._acquire = acquire_sql()
        # the same, when no live waiter is ahead of %(owner)s (a newcomer has no queue entry,
        # so for it that is: when nobody waits), or when the lock is already %(owner)s's: handed
        # over to it (its notification missed), or taken by a try whose reply was lost
        mine = (
            f"EXISTS (SELECT 1 FROM {t} m WHERE m.lock_key = %(key)s AND "
            f"m.owner = %(owner)s AND m.expires_at > {NOW})"
        )
        newcomer = acquire_sql(f"({self._nobody_queued} OR {mine})", newcomer=True)
        in_turn = acquire_sql(f"({self._queue_clause} OR {mine})")
        self._acquire_or_enqueue = self._join_sql(newcomer)
        # a queued waiter's success also deletes its queue entry, in the same statement
        self._acquire_fair = {
            False: newcomer,
            True: f"WITH a AS ({in_turn}),\n"
            f"d AS (DELETE FROM {self._holders} WHERE lock_key = %(key)s AND holder = %(owner)s "
            "AND waiting = 1 AND EXISTS (SELECT 1 FROM a))\nSELECT token FROM a",
        }
        # key owner ttl note -> one row (the token) if the once-record was claimed: absent,
        # failed, or processing with an expired lease (its holder crashed)
        self._claim_once = (
            f"INSERT INTO {t} AS l (lock_key, kind, owner, token, acquired_at, expires_at, state, "
            "note)\n"
            f"VALUES (%(key)s, 'once', %(owner)s, nextval('{seq}'), {NOW},\n"
            f"        {NOW} + make_interval(secs => %(ttl)s), 'processing', %(note)s)\n"
            "ON CONFLICT (lock_key) DO UPDATE SET kind = 'once', owner = EXCLUDED.owner,\n"
            "    token = EXCLUDED.token, acquired_at = EXCLUDED.acquired_at,\n"
            "    expires_at = EXCLUDED.expires_at, state = 'processing', note = EXCLUDED.note\n"
            f"WHERE (l.kind <> 'once' AND l.expires_at <= {NOW}) OR (l.kind = 'once' AND\n"
            f"    (l.state = 'failed' OR (l.state = 'processing' AND l.expires_at <= {NOW})))\n"
            "    OR l.owner = EXCLUDED.owner\n"
            "RETURNING token"
        )
        self._once_state = (
            f"SELECT kind, state, expires_at > {NOW} FROM {t} WHERE lock_key = %(key)s"
        )
        mine = "lock_key = %(key)s AND owner = %(owner)s AND token = %(token)s"
        # key owner token state -> 1 row if the outcome was recorded (and the hold ended)
        self._finish_once = (
            f"UPDATE {t} SET state = %(state)s, owner = NULL, expires_at = {NOW} "
            f"WHERE {mine} AND kind = 'once'"
        )
        least = "acquired_at + make_interval(secs => %(least)s)"
        # key owner token least -> 1 row if ended, or kept until `least` s after the start
        self._finish_least = (
            f"UPDATE {t} SET owner = CASE WHEN {least} > {NOW} THEN owner END, "
            f"expires_at = GREATEST({least}, {NOW}) WHERE {mine}"
        )
        live = (
            f"lock_key = %(key)s AND owner = %(owner)s AND token = %(token)s AND expires_at > {NOW}"
        )
        # key owner token -> one row if the live hold was ended (and handed over, see below)
        self._release = self._release_sql(live)
        # key owner token joins -> one row if the live hold was ended while nobody joined its
        # queue since it was taken (``joins`` as the acquisition saw it): then there is nobody
        # to hand over to, and this plain UPDATE does what the statement above would, cheaper.
        # It issues no token, so it commits without waiting for the disk (see _NOT_DURABLE).
        self._release_quiet = (
            f"UPDATE {t} SET owner = NULL, expires_at = {NOW} WHERE {live} AND joins = %(joins)s"
            f" RETURNING {_NOT_DURABLE}"
        )
        # key owner -> one row if owner's hold (a hand-over to a waiter that has given up) was
        # ended and handed on
        self._release_mine = self._release_sql(
            f"lock_key = %(key)s AND owner = %(owner)s AND expires_at > {NOW}"
        )
        # key owner token -> whether the row shows that (owner, token) released it: free with
        # our token, or handed over by us (the hand-over marks the row with the token it ended)
        self._released_by = (
            f"SELECT (owner IS NULL AND token = %(token)s) OR note = %(token)s::text "
            f"FROM {t} WHERE lock_key = %(key)s"
        )
        # key owner token ttl -> one row changed if the live hold was extended
        self._renew = (
            f"UPDATE {t} SET expires_at = {NOW} + make_interval(secs => %(ttl)s) WHERE {live}"
        )
        cols = "lock_key, owner, token, acquired_at, expires_at, kind"
        held = f"owner IS NOT NULL AND expires_at > {NOW}"
        self._info = f"SELECT {cols} FROM {t} WHERE lock_key = %(key)s AND {held}"
        self._list = (
            f"SELECT {cols} FROM {t} WHERE {held} AND left(lock_key, %(n)s) = %(prefix)s "
            "ORDER BY lock_key"
        )
        self._list_all = f"SELECT {cols} FROM {t} WHERE {held} ORDER BY lock_key"
        self._owner_token = f"SELECT owner, token FROM {t} WHERE lock_key = %(key)s"
        # key -> one row if a live hold was ended; the head of the queue (or, with nobody
        # queued, everyone) is rung ("<owner> <key>") and takes its turn itself
        ring = (
            f"pg_notify('{self.channel}', coalesce({self._head('r.lock_key')}, '') || ' ' || "
            "r.lock_key)"
        )
        # ... and the holder's client hears "!<owner> <key>" (see watch): its on_lost fires
        # at once instead of at its next renewal
        lost = f"pg_notify('{self.channel}', '!' || r.old || ' ' || r.lock_key)"
        self._force = (
            f"WITH r AS (UPDATE {t} SET owner = NULL, expires_at = {NOW} FROM (SELECT lock_key "
            f"AS k, owner AS old FROM {t} WHERE lock_key = %(key)s FOR UPDATE) o\n"
            f"    WHERE lock_key = o.k AND {held} RETURNING lock_key, o.old)\n"
            f"SELECT {ring}, {lost} FROM r"
        )
        # key owner -> one row if owner's queue entry was there to delete. A waiter that gives
        # up leaves the queue and, if the lock is free, rings the next head so a notification
        # meant for it is not lost. No row: the lock may have been handed to it meanwhile.
        self._dequeue_ring = (
            f"WITH d AS (DELETE FROM {self._holders} WHERE lock_key = %(key)s AND "
            "holder = %(owner)s AND waiting = 1 RETURNING lock_key)\n"
            f"SELECT CASE WHEN EXISTS (SELECT 1 FROM {t} WHERE lock_key = %(key)s "
            f"AND (owner IS NULL OR expires_at <= {NOW})) THEN pg_notify('{self.channel}', "
            f"coalesce({self._head('d.lock_key', besides=' AND holder <> %(owner)s')}, '') "
            "|| ' ' || d.lock_key) END FROM d"
        )
        # key owner kind ttl lease -> make or refresh a queue entry (a refresh keeps its place)
        self._enqueue = (
            f"WITH {self._count_join()}\n"
            f"INSERT INTO {holders} AS x (lock_key, holder, kind, waiting, token, acquired_at,\n"
            "    expires_at, lease, channel)\n"
            f"VALUES (%(key)s, %(owner)s, %(kind)s, 1, 0, {NOW},\n"
            f"    {NOW} + make_interval(secs => %(ttl)s), %(lease)s, %(channel)s)\n"
            "ON CONFLICT (lock_key, holder) DO UPDATE SET kind = EXCLUDED.kind,\n"
            "    expires_at = EXCLUDED.expires_at, lease = EXCLUDED.lease,\n"
            "    channel = EXCLUDED.channel,\n"
            "    acquired_at = CASE WHEN x.waiting = 1 THEN x.acquired_at\n"
            "        ELSE EXCLUDED.acquired_at END, waiting = 1, token = 0"
        )
        # key owner ttl -> one row if owner's live queue entry was still there (never re-made:
        # an entry a hand-over removed must stay gone; an expired one lost its place, and the
        # waiter joins again, which counts on the lock's row)
        self._requeue = (
            f"UPDATE {holders} SET expires_at = {NOW} + make_interval(secs => %(ttl)s) "
            "WHERE lock_key = %(key)s AND holder = %(owner)s AND waiting = 1 "
            f"AND expires_at > {NOW}"
        )
        # older inc -> deleted rows; tokens come from the sequence, so nothing to remember
        self._purge = (
            f"DELETE FROM {t} WHERE expires_at <= {NOW} - make_interval(secs => %(older)s) "
            "AND (kind <> 'once' OR (%(inc)s AND state IN ('succeeded', 'failed'))) "
            f"AND {self._no_live_holders(t)}"
        )
        # (object, column) of every object the schema has that exists (column NULL if none;
        # a sequence's columns are last_value, log_cnt, is_called)
        self._columns = (
            "SELECT n.k, a.attname FROM (VALUES ('t', to_regclass(%(t)s)), "
            "('s', to_regclass(%(s)s)), ('h', to_regclass(%(h)s))) AS n (k, oid) "
            "LEFT JOIN pg_attribute a ON a.attrelid = n.oid AND a.attnum > 0 "
            "AND NOT a.attisdropped WHERE n.oid IS NOT NULL"
        )
        self._names = {"t": t, "s": seq, "h": holders}
        digest = hashlib.sha1(t.encode(), usedforsecurity=False).digest()
        self._ddl_lock_id = int.from_bytes(digest[:8], "big", signed=True)
        self._listener: _Listener | None = None
        self._listener_lock = _forksafe.lock()
        # (key, owner) -> the key's join count when owner took it as a newcomer
        self._quiet: dict[tuple[str, str], int] = {}
        self._quiet_lock = _forksafe.lock()

    def _join_sql(self, newcomer: str) -> str:
        """key kind owner ttl qttl -> one row (token, free, -, joins): the token and the key's
        join count if taken; otherwise the caller joins the queue in the same statement (for a
        waiter already subscribed to wake-ups), and ``free`` says the lock was freed meanwhile
        by a release that could not see the join (see _release_sql): try again."""
        return (
            f"WITH a AS ({newcomer}),\n"
            f"q AS (INSERT INTO {self._holders} (lock_key, holder, kind, waiting, token,\n"
            "    acquired_at, expires_at, lease, channel)\n"
            f"    SELECT %(key)s, %(owner)s, 'lock', 1, 0, {NOW},\n"
            f"        {NOW} + make_interval(secs => %(qttl)s), %(ttl)s, %(channel)s\n"
            "    WHERE NOT EXISTS (SELECT 1 FROM a)\n"
            "    ON CONFLICT (lock_key, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at,\n"
            "        channel = EXCLUDED.channel),\n"
            f"{self._count_join('AND NOT EXISTS (SELECT 1 FROM a)')}\n"
            "SELECT (SELECT token FROM a), (SELECT free FROM j), (SELECT "
            f"{_NOT_DURABLE} WHERE NOT EXISTS (SELECT 1 FROM a)), (SELECT joins FROM a)"
        )

    def _count_join(self, condition: str = "") -> str:
        """A CTE ``j`` that counts a join to the queue of %(key)s on its row (``joins``): the
        release of a lock waits for it, and so notices a waiter its snapshot missed; ``free``:
        the row, as it is after that wait, is not held."""
        return (
            f"j AS (UPDATE {self._main} SET joins = joins + 1 WHERE lock_key = %(key)s "
            f"{condition}\n    RETURNING expires_at <= {NOW} AS free)"
        )

    def _release_sql(self, match: str) -> str:
        """SQL that ends the hold matched by ``match`` and hands the lock over: one row if ended.

        The head of the key's wait queue gets the lock with a new token and a lease of its own
        ttl, but no longer than its queue entry's (a waiter that died or froze holds it up no
        longer than its place in the queue would), and its queue entry goes; the NOTIFY
        ``=<token> <owner> <key>`` tells it, on its client's own channel (the entry's
        ``channel``; the table's for an entry without one), so other clients sleep on. The
        head is locked with SKIP LOCKED: a waiter that is leaving the queue (or refreshing its
        entry) just now is passed over, not granted.
        The row remembers the token that handed it over (``note``), for a retried release.
        Without a waiter that takes hand-overs (an entry without a lease: its client hears no
        releases) it is freed, and the head, or for a write lock everyone, is rung instead
        (``<owner> <key>``).

        A waiter that joins the queue while the lock is released would be missed by both: the
        release's snapshot predates its entry, and its own statement saw the lock held. So a
        join also counts itself on the lock's row (``joins``), and locks that row doing so.
        If the join came first, the release's UPDATE waits for it and then sees the count
        changed: with nobody to hand over to, it rings everyone (`` <key>``). If the release
        came first, the join waits for it and then sees the row free: it tries again itself.
        """
        t, seq, ch = self._main, self._seq, self.channel
        head = (
            "SELECT holder, lease, channel, "
            f"LEAST({NOW} + make_interval(secs => lease), expires_at) AS "
            f"until FROM {self._holders} WHERE lock_key = %(key)s AND waiting = 1 AND "
            f"kind = 'lock' AND expires_at > {NOW} ORDER BY acquired_at, holder LIMIT 1 "
            "FOR UPDATE SKIP LOCKED"
        )
        given = "g.holder IS NOT NULL"
        told = f"coalesce(h.channel, '{ch}')"  # where the head's client listens
        return (
            f"WITH h AS ({head}),\n"
            f"r AS (UPDATE {t} SET owner = g.holder,\n"
            f"    kind = CASE WHEN {given} THEN 'lock' ELSE {t}.kind END,\n"
            f"    token = CASE WHEN {given} THEN nextval('{seq}') ELSE {t}.token END,\n"
            f"    acquired_at = CASE WHEN {given} THEN {NOW} ELSE {t}.acquired_at END,\n"
            f"    expires_at = coalesce(g.until, {NOW}),\n"
            f"    note = CASE WHEN {given} THEN %(token)s::text END\n"
            "    FROM (SELECT 1) one LEFT JOIN h g ON g.lease IS NOT NULL\n"
            f"    WHERE {match}\n"
            f"    RETURNING {t}.lock_key, {t}.kind, {t}.owner, {t}.token, {t}.joins),\n"
            f"d AS (DELETE FROM {self._holders} x USING r WHERE x.lock_key = %(key)s\n"
            "    AND x.holder = r.owner AND x.waiting = 1)\n"
            "SELECT CASE WHEN r.owner IS NOT NULL\n"
            f"    THEN pg_notify({told}, '=' || r.token || ' ' || r.owner || ' ' || r.lock_key)\n"
            f"    WHEN r.joins <> (SELECT s.joins FROM {t} s WHERE s.lock_key = r.lock_key)\n"
            f"    THEN pg_notify('{ch}', ' ' || r.lock_key)\n"
            "    WHEN r.kind = 'write' OR h.holder IS NOT NULL\n"
            f"    THEN pg_notify({told}, coalesce(h.holder, '') || ' ' || r.lock_key) END\n"
            "FROM r LEFT JOIN h ON true"
        )

    # -- connections ----------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(autocommit=True, **self._options)
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
        with contextlib.suppress(psycopg.Error):
            conn.close()

    def _classify(self, exc: BaseException) -> Failure | None:
        if not isinstance(exc, psycopg.Error):
            return None
        if exc.sqlstate in _TRANSIENT:
            return Failure.TRANSIENT
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
    def ddl(self) -> list[str]:
        return list(self._ddl)

    def ensure_schema(self, create: bool) -> None:
        required = {"t": MAIN, "s": SEQUENCE, "h": HOLDERS}

        def op(conn: psycopg.Connection[Any]) -> None:
            found: dict[str, set[str]] = {}
            for name, column in conn.execute(self._columns, self._names).fetchall():
                found.setdefault(name, set()).update([column] if column else [])
            refuse_foreign(
                self.table,
                self.safe_url,
                {self._names[k]: v for k, v in found.items()},
                {self._names[k]: v for k, v in required.items()},
            )
            if len(found) == len(required):
                return
            if not create:
                raise missing(self.table, self.safe_url, self.dialect)
            # CREATE ... IF NOT EXISTS races on the catalog when many processes start at
            # once; a transaction-scoped advisory lock serialises them.
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._ddl_lock_id,))
                for statement in self._ddl:
                    conn.execute(statement)

        self.run("creating the lock table", op, deadline=MAINTENANCE_DEADLINE)

    # -- operations -----------------------------------------------------------------------
    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        params = {"key": key, "kind": kind, "owner": owner, "ttl": ttl}

        def op(conn: psycopg.Connection[Any]) -> int | None:
            row = conn.execute(self._acquire, params).fetchone()
            return None if row is None else int(row[0])

        return self.run("acquire", op, key=key)

    def release(self, key: str, owner: str, token: int) -> bool:
        with self._quiet_lock:
            joins = self._quiet.pop((key, owner), None)
        params = {"key": key, "owner": owner, "token": token, "joins": joins}
        calls = 0

        def op(conn: psycopg.Connection[Any]) -> bool:
            nonlocal calls
            calls += 1
            quiet = joins is not None and calls == 1
            if quiet and conn.execute(self._release_quiet, params).rowcount == 1:
                return True
            if conn.execute(self._release, params).fetchone() is not None:
                return True
            # After a retry the first attempt may have committed: released by us is success.
            if calls == 1:
                return False
            row = conn.execute(self._released_by, params).fetchone()
            return row is not None and bool(row[0])

        return self.run("release", op, key=key)

    def claim_once(self, key: str, owner: str, ttl: float, note: str | None) -> int | None:
        params = {"key": key, "owner": owner, "ttl": ttl, "note": note}

        def op(conn: psycopg.Connection[Any]) -> int | None:
            row = conn.execute(self._claim_once, params).fetchone()
            return None if row is None else int(row[0])

        return self.run("once", op, key=key)

    def once_state(self, key: str) -> tuple[str, str | None, bool] | None:
        def op(conn: psycopg.Connection[Any]) -> tuple[str, str | None, bool] | None:
            row = conn.execute(self._once_state, {"key": key}).fetchone()
            return None if row is None else (row[0], row[1], bool(row[2]))

        return self.run("state", op, key=key)

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        params = {"key": key, "owner": owner, "token": token, "ttl": ttl}
        return self.run(
            "renew",
            lambda conn: conn.execute(self._renew, params).rowcount == 1,
            key=key,
        )

    def acquire_fair(self, key: str, owner: str, ttl: float, queued: bool) -> int | None:
        params = {"key": key, "kind": "lock", "owner": owner, "ttl": ttl}

        def op(conn: psycopg.Connection[Any]) -> int | None:
            row = conn.execute(self._acquire_fair[queued], params).fetchone()
            if row is None:
                return None
            if not queued:
                self._taken_quietly(key, owner, row[1])
            return int(row[0])

        return self.run("acquire", op, key=key)

    def _taken_quietly(self, key: str, owner: str, joins: int | None) -> None:
        """``owner`` took ``key`` as a newcomer, so nobody waited for it then: remember the
        key's join count, so that its release can tell whether anyone has come since. None:
        someone may have joined as it took the lock (see unchanged_joins): nothing to trust."""
        if joins is None:
            return
        with self._quiet_lock:
            if len(self._quiet) >= _QUIET_MEMORY:  # holds never released: forget them
                self._quiet.clear()
            self._quiet[key, owner] = joins

    def joining(self) -> bool:
        """True if this client's LISTEN connection is up (subscribing costs nothing then)."""
        listener = self._listener
        return listener is not None and listener.alive() and listener.ready()

    def acquire_or_enqueue(self, key: str, owner: str, ttl: float, queue_ttl: float) -> int | None:
        """Take the lock like a newcomer, or else join its queue: one statement."""
        params = {
            "key": key,
            "kind": "lock",
            "owner": owner,
            "ttl": ttl,
            "qttl": queue_ttl,
            "channel": self._own_channel(),
        }

        def op(conn: psycopg.Connection[Any]) -> int | None:
            row = conn.execute(self._acquire_or_enqueue, params).fetchone()
            if row is not None and row[0] is not None:
                self._taken_quietly(key, owner, row[3])
                return int(row[0])
            if row is None or not row[1]:
                return None
            # freed while we joined, by a release that could not see us: our turn, unless
            # others queued ahead of us (they were seen by it, or they try again themselves)
            row = conn.execute(self._acquire_fair[True], params).fetchone()
            return None if row is None else int(row[0])

        return self.run("acquire", op, key=key)

    def info(self, key: str) -> LockInfo | None:
        def op(conn: psycopg.Connection[Any]) -> LockInfo | None:
            row = conn.execute(self._info, {"key": key}).fetchone()
            if row is None:
                rows = self._holder_rows(conn, key=key)
                row = rows[0] if rows else None
            return None if row is None else _info(row)

        return self.run("info", op, key=key)

    def list(self, prefix: str) -> list[LockInfo]:
        def op(conn: psycopg.Connection[Any]) -> list[LockInfo]:
            if prefix:
                cur = conn.execute(self._list, {"n": len(prefix), "prefix": prefix})
            else:
                cur = conn.execute(self._list_all)
            rows = [*cur.fetchall(), *self._holder_rows(conn, prefix=prefix)]
            return sorted((_info(row) for row in rows), key=lambda i: (i.key, i.acquired_at))

        return self.run("list", op, deadline=MAINTENANCE_DEADLINE)

    def force_release(self, key: str) -> bool:
        def op(conn: psycopg.Connection[Any]) -> bool:
            freed = conn.execute(self._force, {"key": key}).fetchone() is not None
            return self._force_holders(conn, key) > 0 or freed

        return self.run("force_release", op, key=key)

    def purge(self, older_than: float, include_once: bool) -> int:
        params = {"older": older_than, "inc": include_once}

        def op(conn: psycopg.Connection[Any]) -> int:
            return conn.execute(self._purge, params).rowcount + self._purge_holders(
                conn, older_than
            )

        return self.run("purge", op, deadline=MAINTENANCE_DEADLINE)

    # -- dialect hooks for the multi-holder operations ------------------------------------
    def _later(self, name: str) -> str:
        return f"{NOW} + make_interval(secs => %({name})s)"

    def _earlier(self, name: str) -> str:
        return f"{NOW} - make_interval(secs => %({name})s)"

    def _exec(
        self, conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]
    ) -> tuple[int, Rows]:
        cur = conn.execute(sql, params)
        return cur.rowcount, cur.fetchall() if cur.description else []

    @contextmanager
    def _transaction(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        with conn.transaction():
            yield

    def _next_token(self, conn: psycopg.Connection[Any], key: str) -> int:
        return int(conn.execute(f"SELECT nextval('{self._seq}')").fetchall()[0][0])

    def _announce_force(self, conn: psycopg.Connection[Any], key: str) -> None:
        """Tell the holders of the live shared holds of ``key`` that they are being freed
        (delivered when the transaction that frees them commits)."""
        conn.execute(
            f"SELECT pg_notify('{self.channel}', '!' || holder || ' ' || lock_key) FROM "
            f"{self._holders} WHERE lock_key = %(key)s AND waiting = 0 AND expires_at > {NOW}",
            {"key": key},
        )

    def watch(self, key: str, owner: str, heard: Callable[[], None]) -> Callable[[], None]:
        """Call ``heard`` (on the listener's thread: it must return quickly) when a
        force-release of ``owner``'s hold of ``key`` commits; returns the call that stops it.
        One LISTEN connection per client serves every watch and every waiter."""
        with self._listener_lock:
            if self._listener is None or not self._listener.alive():
                self._listener = _Listener(self)
            listener = self._listener
        return listener.watch(key, owner, heard)

    def _notify(self, conn: psycopg.Connection[Any], key: str) -> None:
        conn.execute(f"SELECT pg_notify('{self.channel}', ' ' || %(key)s)", {"key": key})

    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        params = {
            "key": key,
            "owner": owner,
            "kind": kind,
            "ttl": ttl,
            "lease": lease,
            "channel": self._own_channel(),
        }
        self.run("queueing", lambda conn: conn.execute(self._enqueue, params), key=key)

    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        params = {"key": key, "owner": owner, "ttl": ttl}
        return self.run(
            "queueing", lambda conn: conn.execute(self._requeue, params).rowcount == 1, key=key
        )

    def dequeue(self, key: str, owner: str) -> None:
        """Leave the queue; and if the lock was handed to ``owner`` meanwhile, hand it on."""
        params = {"key": key, "owner": owner, "token": None}

        def op(conn: psycopg.Connection[Any]) -> None:
            if conn.execute(self._dequeue_ring, params).fetchone() is None:
                # the entry was gone: a hand-over may have taken it (a new statement, so that
                # it sees a hand-over that committed while this one waited for the entry)
                conn.execute(self._release_mine, params)

        self.run("leaving the queue", op, key=key)

    # -- pushed wake-ups ------------------------------------------------------------------
    def _own_channel(self) -> str | None:
        """The channel this client's listener hears its own notices on (None: no listener)."""
        listener = self._listener
        return listener.channel if listener is not None and listener.alive() else None

    def subscribe(self, key: str, owner: str, queue: str | None = None) -> _Subscription:
        with self._listener_lock:
            if self._listener is None or not self._listener.alive():
                # first use, or a forked child: the parent's listener thread is not ours
                self._listener = _Listener(self)
            listener = self._listener
        return listener.subscribe(key, owner)

    def close(self) -> None:
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()
        super().close()


class _Subscription(Subscription):
    targeted = True
    latched = False

    def __init__(self, listener: _Listener, key: str, owner: str, live: bool) -> None:
        self._listener = listener
        self.key = key
        self.owner = owner
        self.live = live
        self.granted: int | None = None
        self.event = threading.Event()

    def wait(self, timeout: float) -> bool:
        woken = self.event.wait(timeout)
        self.event.clear()
        return woken

    def close(self) -> None:
        self._listener.unsubscribe(self)


class _Listener:
    """One LISTEN connection per client, on its own thread, waking the waiters of a key.

    It listens on the table's channel (releases that ring everyone) and on a channel of its
    own, named in its waiters' queue entries, for what only they need to hear: a hand-over
    to one of them, or their turn. A release then wakes one client, not all of them.
    """

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend
        self.channel = f"dblock_{secrets.token_hex(8)}"
        self._subs: dict[str, set[_Subscription]] = {}
        self._watches: dict[tuple[str, str], Callable[[], None]] = {}
        self._lock = _forksafe.lock()
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._run, name="dblock-listener", daemon=True)
        self._thread.start()

    def subscribe(self, key: str, owner: str) -> _Subscription:
        # Wait (briefly) until LISTEN is active, so no release after our next try is missed.
        live = self._ready.wait(2.0)
        sub = _Subscription(self, key, owner, live)
        with self._lock:
            self._subs.setdefault(key, set()).add(sub)
        return sub

    def watch(self, key: str, owner: str, heard: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            self._watches[key, owner] = heard

        def unwatch() -> None:
            with self._lock:
                if self._watches.get((key, owner)) is heard:
                    del self._watches[key, owner]

        return unwatch

    def unsubscribe(self, sub: _Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.key)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.key]

    def _wake(self, key: str | None, owner: str = "", granted: int | None = None) -> None:
        """Wake ``owner``'s subscription to ``key`` (everyone's if no owner; all if no key),
        telling it the token of a lock ``granted`` to it."""
        with self._lock:
            targets = [
                s
                for k, subs in self._subs.items()
                if key in (None, k)
                for s in subs
                if not owner or s.owner == owner
            ]
        for sub in targets:
            if granted is not None:
                sub.granted = granted
            sub.event.set()

    def _heard(self, payload: str) -> None:
        """``<owner> <key>``: a release rings; ``=<token> <owner> <key>``: a hand-over;
        ``!<owner> <key>``: owner's hold was force-released."""
        if payload.startswith("!"):
            owner, _, key = payload[1:].partition(" ")
            with self._lock:
                heard = self._watches.get((key, owner))  # ends when the hold does
            if heard is not None:
                try:
                    heard()
                except Exception:  # a watcher's failure must not stop the wake-ups
                    log.exception("dblock loss watch of %r failed", key)
            return
        granted = None
        if payload.startswith("="):
            token, _, payload = payload[1:].partition(" ")
            if not token.isdigit():
                return
            granted = int(token)
        owner, _, key = payload.partition(" ")
        if granted is not None and not owner:
            return
        self._wake(key, owner, granted)

    def _run(self) -> None:
        pause = 0.1
        while not self._stopped.is_set():
            try:
                conn = self._backend._connect()
                self._conn = conn
                conn.execute(f'LISTEN "{self._backend.channel}"; LISTEN "{self.channel}"')
                self._ready.set()
                self._wake(None)  # anything released while we were away: look again
                pause = 0.1
                while not self._stopped.is_set():
                    for note in conn.notifies(timeout=0.5, stop_after=64):
                        self._heard(note.payload)
            except psycopg.Error as exc:
                self._ready.clear()
                if not self._stopped.is_set():
                    log.debug("dblock listener reconnecting after: %s", exc)
                    self._wake(None)
                    self._stopped.wait(pause)
                    pause = min(pause * 2, 5.0)
            finally:
                conn_, self._conn = self._conn, None
                if conn_ is not None:
                    self._backend._close_connection(conn_)

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopped.is_set()

    def ready(self) -> bool:
        return self._ready.is_set()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)


def _shutdown(fd: int) -> None:
    """Shut a connection's socket down, so a read blocked on it returns at once."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def _info(row: Any) -> LockInfo:
    key, owner, token, acquired_at, expires_at, kind = row
    kind_value: Kind = kind
    return LockInfo(key, owner, int(token), _utc(acquired_at), _utc(expires_at), kind_value)
