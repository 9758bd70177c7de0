"""PostgreSQL's statements: ``%(name)s`` parameters, time ``statement_timestamp()``, tokens
from one sequence, releases that hand the lock to the head of the queue and NOTIFY it (see
the store, ``store.py``)."""

from __future__ import annotations

import functools
import hashlib

from .._names import aux_name, qualify
from .._sql_holders import FOREVER
from .._sql_ops import OperationStatements

NOW = "statement_timestamp()"

#: SQL that commits the statement's transaction without waiting for its WAL to reach disk.
#: For statements that issue no token:
#: - joining a queue: a crash may lose the entry, but every client loses its connections then
#:   too, and its waiters find their entries gone and queue again;
#: - a release with nobody to hand the lock to: a crash may undo it, and the lock is then held
#:   until its lease ends, as if its holder had died holding it. It cannot cost exclusion or
#:   a token: WAL reaches the disk in order, so the commit of any later acquisition, which
#:   waits for the disk, makes the release durable first.
#: A statement that issues a token (an acquisition, a hand-over) always waits for the disk.
NOT_DURABLE = "set_config('synchronous_commit', 'off', true)"
#: the queue entry of a waiter at the key's doorbell names this channel (none can be empty)
BELL_CHANNEL = ""
#: the message of the error a many-key statement raises to undo itself (see _many_keys)
MANY_TAKEN_PARTLY = "dblock: a many-key statement changed only some of its keys, undone:"


def _advisory_key(table: str, key: str) -> str:
    """SQL for the 64-bit server lock of a session hold: a hash of the table's name and the
    key (the SQL expression ``key``), stable across servers."""
    return f"hashtextextended('{table}:' || {key}, 0)"


class PostgresStatements(OperationStatements):
    """Every statement of the PostgreSQL store, for one lock table."""

    def __init__(self, schema: str | None, table: str) -> None:
        t = qualify(schema, table, '"')
        seq = qualify(schema, aux_name(table, "_token_seq"), '"')
        holders = qualify(schema, aux_name(table, "_holders"), '"')
        super().__init__(t, holders, NOW)
        self.seq = seq
        #: the table's channel: releases that ring every client
        self.channel = aux_name(table if schema is None else f"{schema}_{table}", "_released")
        # The server lock of the key's session holds (ttl=None): a 64-bit hash of table and
        # key. A lease is taken only while no session holds it: the try-lock lasts until the
        # statement commits, so a session acquire that gets the server lock after it sees the
        # committed lease (see session_grant) and steps back.
        plain = (f"{schema}." if schema else "") + table
        self.advisory_key = _advisory_key(plain, "%(key)s::text")
        self._schema(t, seq, holders)
        self._holder_pieces(t, seq, holders)
        self._fenced_grants(t, seq)
        # crowd -> how many waiters other than %(owner)s are queued for %(key)s (the
        # snapshot's), counted up to %(crowd)s: the count only says whether the queue is a
        # crowd, and while a crowd waits at doorbells, the queue's dead entries stay (each
        # waiter's statement holds a snapshot), so a full count read a heap page per entry
        self.others_queued = (
            f"(SELECT count(*) FROM (SELECT FROM {holders} w WHERE {self.live_waiter} "
            "AND w.holder <> %(owner)s LIMIT %(crowd)s) o)"
        )
        self._acquiring(t, seq)
        self._once_records(t, seq)
        self._lease(t)
        self._inspection(t)
        self._fair_queue(t, holders)
        self._session_statements(t, plain)
        self._shared_holds(seq)
        self._many_keys(t, seq, plain)
        self._guards(t)
        # ... and a proclaim tells the key's observers (LeaderPush) on the table's channel
        self.proclaim = (
            f"WITH p AS ({self.proclaim})\n"
            f"SELECT p.token, pg_notify('{self.channel}', '~ ' || %(key)s) FROM p"
        )

    def _guards(self, t: str) -> None:
        """lock.guard(conn) (CommitGuards): run on the caller's connection, so written
        without ``::`` casts (SQLAlchemy's text() reads ``:name`` as a parameter)."""
        #: n -> owner k0.. t0.. -> a row per live hold of owner, each locked FOR SHARE: no
        #: takeover, force-release or purge changes it until the caller's transaction ends
        #: (a READ COMMITTED locking read sees the latest committed row, after waiting for a
        #: writer of it)
        self.guard = functools.cache(
            lambda n: f"SELECT token FROM {t}\nWHERE {self.guard_where(n)}\nFOR SHARE"
        )
        # keys tokens owner ttl -> one row per hold (key, token) of owner extended, its lease
        # run out or not: a renewal a guarded transaction held back (see CommitGuards)
        self.renew_after_guard = (
            f"UPDATE {t} SET expires_at = {NOW} + make_interval(secs => %(ttl)s)\n"
            "WHERE owner = %(owner)s AND (lock_key, token) IN (\n"
            "    SELECT * FROM unnest(%(keys)s::text[], %(tokens)s::bigint[]))"
        )
        self.guard_identity = (
            "SELECT (SELECT system_identifier FROM pg_control_system()), current_database()"
        )

    def _schema(self, t: str, seq: str, holders: str) -> None:
        """The schema's DDL, the objects it has, the lock that serialises its creation."""
        # -- schema
        self.create_main_table = (
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
            ")"
        )
        self.create_token_sequence = f"CREATE SEQUENCE IF NOT EXISTS {seq}"
        self.create_holders_table = (
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
            ")"
        )
        self.ddl = [self.create_main_table, self.create_token_sequence, self.create_holders_table]
        # (object, column) of every object the schema has that exists (column NULL if none;
        # a sequence's columns are last_value, log_cnt, is_called)
        self.find_tables = (
            "SELECT n.k, a.attname FROM (VALUES ('t', to_regclass(%(t)s)), "
            "('s', to_regclass(%(s)s)), ('h', to_regclass(%(h)s))) AS n (k, oid) "
            "LEFT JOIN pg_attribute a ON a.attrelid = n.oid AND a.attnum > 0 "
            "AND NOT a.attisdropped WHERE n.oid IS NOT NULL"
        )
        self.table_names = {"t": t, "s": seq, "h": holders}
        digest = hashlib.sha1(t.encode(), usedforsecurity=False).digest()
        self.ddl_lock_id = int.from_bytes(digest[:8], "big", signed=True)

        # lock id -> serialises schema creation (CREATE ... IF NOT EXISTS races on the catalog)
        self.lock_for_ddl = "SELECT pg_advisory_xact_lock(%s)"

    def _holder_pieces(self, t: str, seq: str, holders: str) -> None:
        """The dialect's pieces of the multi-holder operations (stores/_sql_holders.py)."""
        # dialect pieces for the multi-holder operations (see stores/_sql_holders.py)
        self.ensure_parent = (
            f"INSERT INTO {t} (lock_key, kind, owner, token, acquired_at, expires_at)\n"
            f"VALUES (%(key)s, 'lock', NULL, nextval('{seq}'), {NOW}, {NOW})\n"
            "ON CONFLICT (lock_key) DO NOTHING"
        )
        self.lock_parent = (
            f"SELECT owner, owner IS NOT NULL AND expires_at > {NOW} FROM {t} "
            "WHERE lock_key = %(key)s FOR UPDATE"
        )
        self.upsert_holder = (
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
        self.prefix_match = "left(lock_key, %(n)s) = %(prefix)s"

    def _fenced_grants(self, t: str, seq: str) -> None:
        """FencedGrants: fence, grant_fenced, release_owned."""
        no_session = f"pg_try_advisory_xact_lock({self.advisory_key})"
        # -- fenced grants (FencedGrants, for a quorum: docs/stores/quorum.md). The table's sequence
        # is raised to every token granted, so a purged row's token still fences the key.
        last = f"(SELECT last_value FROM {seq})"
        # key -> the key's fence: its row's token, or the sequence if higher, floored by the
        # server's clock in microseconds
        self.fence = (
            f"SELECT greatest(coalesce((SELECT token FROM {t} WHERE lock_key = %(key)s), 0), "
            f"{last}, floor(extract(epoch FROM {NOW}) * 1000000)::bigint)"
        )
        # key kind owner ttl token -> one row if granted with `token`: free or expired (or
        # owner's own) and fenced below `token`; or already owner's with `token`. A row held
        # by someone else is skipped before the insert (no row lock, no WAL: see acquire_sql)
        self.grant_fenced = (
            f"INSERT INTO {t} AS l (lock_key, kind, owner, token, acquired_at, expires_at)\n"
            "SELECT %(key)s::text, %(kind)s::varchar, %(owner)s::varchar, %(token)s::bigint,\n"
            f"    {NOW}, {NOW} + make_interval(secs => %(ttl)s)\n"
            f"WHERE {last} < %(token)s::bigint AND NOT EXISTS (SELECT 1 FROM {t} b\n"
            "    WHERE b.lock_key = %(key)s AND (b.owner IS NULL OR b.owner <> %(owner)s)\n"
            f"    AND b.expires_at > {NOW}) AND {no_session}\n"
            "ON CONFLICT (lock_key) DO UPDATE SET kind = EXCLUDED.kind,\n"
            "    owner = EXCLUDED.owner, token = EXCLUDED.token,\n"
            "    acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,\n"
            "    state = NULL, note = NULL\n"
            f"WHERE (l.token < EXCLUDED.token AND ((l.expires_at <= {NOW} AND l.kind <> 'once')\n"
            "    OR l.owner = EXCLUDED.owner))\n"
            "    OR (l.owner = EXCLUDED.owner AND l.token = EXCLUDED.token)\n"
            f"RETURNING token, (SELECT setval('{seq}', %(token)s::bigint) FROM {seq}\n"
            "    WHERE last_value < %(token)s::bigint)"
        )
        # key owner ttl token -> one row if owner's live hold has `token` (its lease renewed):
        # a retry after a lost reply, which grant_fenced no longer grants (the sequence has
        # reached `token`, so its insert selects no row to conflict)
        self.grant_fenced_again = (
            f"UPDATE {t} SET expires_at = {NOW} + make_interval(secs => %(ttl)s)\n"
            "WHERE lock_key = %(key)s AND owner = %(owner)s AND token = %(token)s::bigint\n"
            f"    AND expires_at > {NOW} RETURNING token"
        )
        self.grant_fenced_steps = (self.grant_fenced, self.grant_fenced_again)
        # key owner -> one row changed if owner's live hold (any token) was ended
        self.release_owned = (
            f"UPDATE {t} SET owner = NULL, expires_at = {NOW} "
            f"WHERE lock_key = %(key)s AND owner = %(owner)s AND expires_at > {NOW}"
        )

    def _acquiring(self, t: str, seq: str) -> None:
        """Taking a lock: acquire, and FairQueue's and QueueJoin's acquisitions."""
        no_session = f"pg_try_advisory_xact_lock({self.advisory_key})"
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
                f"SELECT {values} WHERE {busy}{fair and ' AND ' + fair} AND {no_session}\n"
                "ON CONFLICT (lock_key) DO UPDATE SET kind = EXCLUDED.kind,\n"
                "    owner = EXCLUDED.owner, token = EXCLUDED.token,\n"
                "    acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,\n"
                "    state = NULL, note = NULL\n"
                f"WHERE (l.expires_at <= {NOW} AND l.kind <> 'once') OR l.owner = EXCLUDED.owner\n"
                f"RETURNING token{', ' + unchanged_joins if newcomer else ''}"
            )

        # The fairness clause is tested once, in the SELECT: the ON CONFLICT condition would
        # read the holders table with the same statement snapshot, so it adds nothing there.
        self.acquire = acquire_sql()
        # the same, when no live waiter is ahead of %(owner)s (a newcomer has no queue entry,
        # so for it that is: when nobody waits), or when the lock is already %(owner)s's: handed
        # over to it (its notification missed), or taken by a try whose reply was lost
        mine = (
            f"EXISTS (SELECT 1 FROM {t} m WHERE m.lock_key = %(key)s AND "
            f"m.owner = %(owner)s AND m.expires_at > {NOW})"
        )
        newcomer = acquire_sql(f"({self.nobody_queued} OR {mine})", newcomer=True)
        in_turn = acquire_sql(f"({self.nobody_ahead} OR {mine})")
        self.acquire_or_enqueue = self._join_sql(newcomer)
        # a queued waiter's success also deletes its queue entry, in the same statement
        self.acquire_as_newcomer = newcomer
        dequeue_taker = (
            f"d AS (DELETE FROM {self.holders} WHERE lock_key = %(key)s AND holder = %(owner)s "
            "AND waiting = 1 AND EXISTS (SELECT 1 FROM a))\n"
        )
        self.acquire_in_turn = f"WITH a AS ({in_turn}),\n{dequeue_taker}SELECT token FROM a"
        # the same for the waiter that has the key's doorbell (see doorbell.py): the waiters at
        # the bell are served in the bell's order, so only a waiter ahead that is not at the
        # bell (a lock_many waiter, or one of a client with all its bells in use) comes first
        not_at_bell = (
            f"NOT EXISTS (SELECT 1 FROM {self.holders} w WHERE {self.waiter_ahead} "
            f"AND w.channel IS DISTINCT FROM '{BELL_CHANNEL}')"
        )
        at_bell = acquire_sql(f"({not_at_bell} OR {mine})")
        self.acquire_at_bell = f"WITH a AS ({at_bell}),\n{dequeue_taker}SELECT token FROM a"
        # the same, run right after the wait that got the bell, in its pipeline (one
        # transaction): one row, the token or NULL; a commit that took nothing need not be
        # durable (the wait's share lock gave the transaction an id)
        # (never the lock %(owner)s holds already: a take of its own, made while this one
        # waited, would get a new token, and the waiter's hold would end with the grant)
        at_bell_afresh = acquire_sql(f"{not_at_bell} AND NOT {mine}")
        self.take_at_bell = (
            f"WITH a AS ({at_bell_afresh}),\n{dequeue_taker}"
            f"SELECT (SELECT token FROM a), (SELECT {NOT_DURABLE} WHERE NOT EXISTS "
            "(SELECT 1 FROM a))"
        )

    def _many_keys(self, t: str, seq: str, plain: str) -> None:
        """ManyKeys' common case, each in one statement over every key (``%(keys)s``, sorted):
        a newcomer's take of free keys, and the release of holds nobody queued for since."""
        # the keys come as one JSON array (psycopg adapts a JSON string for less than a list)
        keys = "json_array_elements_text(%(keys)s::json)"
        n = "json_array_length(%(keys)s::json)"
        # a key that the take's ON CONFLICT clause would refuse (held by another, a `once`
        # record), whose queue has a live waiter while it is not owner's already, or that a
        # session holds: any of them, and nothing is inserted
        any_key = f"= ANY(ARRAY(SELECT {keys}))"
        refused = (
            f"EXISTS (SELECT 1 FROM {t} b WHERE b.lock_key {any_key} AND NOT (\n"
            f"    (b.expires_at <= {NOW} AND b.kind <> 'once')\n"
            "    OR coalesce(b.owner = %(owner)s, false)))"
        )
        queued = (
            f"EXISTS (SELECT 1 FROM {self.holders} w\n"
            f"    WHERE {self._live_waiter('w.lock_key ' + any_key)}"
            f" AND NOT EXISTS (SELECT 1 FROM {t} m WHERE m.lock_key = w.lock_key"
            f" AND m.owner = %(owner)s AND m.expires_at > {NOW}))"
        )
        session = (
            f"EXISTS (SELECT 1 FROM {keys} AS v(k) WHERE NOT "
            f"pg_try_advisory_xact_lock({_advisory_key(plain, 'v.k')}))"
        )
        # A concurrent commit between the statement's snapshot and a row's lock can still
        # make the ON CONFLICT clause refuse one key after others were taken: the last
        # column's cast then fails the statement, which undoes the whole take in the same
        # round trip (SQLSTATE 22P02 with MANY_TAKEN_PARTLY in its message; the store
        # answers "busy"). Nothing taken is no error.
        check = (
            "CASE WHEN (SELECT count(*) FROM a) = " + n + " THEN true ELSE CAST("
            f"'{MANY_TAKEN_PARTLY} ' || (SELECT count(*) FROM a) AS boolean) END"
        )
        # keys owner ttl -> each key's (key, token, join count), or no row if any is refused
        self.acquire_many_as_newcomer = (
            f"WITH a AS (INSERT INTO {t} AS l (lock_key, kind, owner, token, acquired_at,\n"
            "    expires_at)\n"
            f"SELECT u.k, 'lock', %(owner)s::varchar, nextval('{seq}'), {NOW},\n"
            f"    {NOW} + make_interval(secs => %(ttl)s) FROM {keys} AS u(k)\n"
            f"WHERE NOT {refused}\n    AND NOT {queued}\n    AND NOT {session}\n"
            "ORDER BY u.k\n"
            "ON CONFLICT (lock_key) DO UPDATE SET kind = EXCLUDED.kind,\n"
            "    owner = EXCLUDED.owner, token = EXCLUDED.token,\n"
            "    acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,\n"
            "    state = NULL, note = NULL\n"
            f"WHERE (l.expires_at <= {NOW} AND l.kind <> 'once') OR l.owner = EXCLUDED.owner\n"
            "RETURNING lock_key, token, CASE WHEN joins = (SELECT s.joins FROM "
            f"{t} s WHERE s.lock_key = l.lock_key) THEN joins END AS joins)\n"
            f"SELECT lock_key, token, joins, {check} FROM a"
        )
        # holds owner -> the number of holds ended: all, if every key's live hold is
        # owner's with its token and nobody joined its queue since it was taken (the join
        # counts its take saw), none otherwise. Like release_unwaited, it hands nothing over
        # and commits without waiting for the disk; a join that commits between the snapshot
        # and a row's lock fails it as the take's check does (MANY_TAKEN_PARTLY), undone.
        held = (
            "x.lock_key = u.k AND x.owner = %(owner)s AND x.token = u.tok AND "
            f"x.expires_at > {NOW} AND x.joins = u.j"
        )
        # the holds come as one JSON array of {k: key, tok: token, j: join count}
        tokens = "json_to_recordset(%(holds)s::json) AS u(k text, tok bigint, j bigint)"
        held_n = "json_array_length(%(holds)s::json)"
        self.release_many_unwaited = (
            f"WITH r AS (UPDATE {t} x SET owner = NULL, expires_at = {NOW} FROM {tokens}\n"
            f"WHERE {held} AND (SELECT count(*) FROM {t} x, {tokens} WHERE {held}) = {held_n}\n"
            "RETURNING x.lock_key)\n"
            f"SELECT count(*), CASE WHEN count(*) IN (0, {held_n}) THEN {NOT_DURABLE} ELSE CAST("
            f"'{MANY_TAKEN_PARTLY} ' || count(*) AS boolean)::text END FROM r"
        )

    def _once_records(self, t: str, seq: str) -> None:
        """OnceRecords and ScheduledRuns: claim_once, once_state, finish_once, finish_scheduled."""
        # key owner ttl note -> one row (the token) if the once-record was claimed: absent,
        # failed, or processing with an expired lease (its holder crashed)
        self.claim_once = (
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
        self.once_state = (
            f"SELECT kind, state, expires_at > {NOW} FROM {t} WHERE lock_key = %(key)s"
        )
        mine = "lock_key = %(key)s AND owner = %(owner)s AND token = %(token)s"
        # key owner token state -> 1 row if the outcome was recorded (and the hold ended)
        self.finish_once = (
            f"UPDATE {t} SET state = %(state)s, owner = NULL, expires_at = {NOW} "
            f"WHERE {mine} AND kind = 'once'"
        )
        least = "acquired_at + make_interval(secs => %(least)s)"
        # key owner token least -> 1 row if ended, or kept until `least` s after the start
        self.finish_scheduled = (
            f"UPDATE {t} SET owner = CASE WHEN {least} > {NOW} THEN owner END, "
            f"expires_at = GREATEST({least}, {NOW}) WHERE {mine}"
        )

    def _lease(self, t: str) -> None:
        """A hold's lease: release (handing over), renew."""
        live = (
            f"lock_key = %(key)s AND owner = %(owner)s AND token = %(token)s AND expires_at > {NOW}"
        )
        # key owner token -> one row if the live hold was ended (and handed over, see below)
        self.release_and_hand_over = self._release_sql(live)
        # key owner token joins -> one row if the live hold was ended while nobody joined its
        # queue since it was taken (``joins`` as the acquisition saw it): then there is nobody
        # to hand over to, and this plain UPDATE does what the statement above would, cheaper.
        # It issues no token, so it commits without waiting for the disk (see NOT_DURABLE).
        self.release_unwaited = (
            f"UPDATE {t} SET owner = NULL, expires_at = {NOW} WHERE {live} AND joins = %(joins)s"
            f" RETURNING {NOT_DURABLE}"
        )
        # the two, for a hold that proclaimed (an election's term): they also tell the key's
        # observers (LeaderPush), which a plain lock's release, heard by nobody, need not
        self.release_and_hand_over_told = self._release_sql(live, told=True)
        # the two, on the connection that keeps the key's doorbell: they let go of it too
        self.release_at_bell = self._release_sql(live, bell=True)
        self.release_at_bell_told = self._release_sql(live, told=True, bell=True)
        # lt (ms) key bc bo -> waits for the key's doorbell up to lt ms (55P03 if not had),
        # then for the lease row's last change to commit (FOR SHARE, no lock_timeout): the
        # release that let go of the bell did so before its commit. The session's
        # lock_timeout is back for what follows in the same transaction (take_at_bell).
        # (Columns are evaluated in order, as in session_lock.)
        self.bell_wait = (
            "WITH s AS MATERIALIZED (SELECT current_setting('lock_timeout') AS lt)\n"
            "SELECT set_config('lock_timeout', %(lt)s, true), "
            "pg_advisory_lock(%(bc)s::int4, %(bo)s::int4), "
            "set_config('lock_timeout', '0', true), "
            f"(SELECT 1 FROM {t} WHERE lock_key = %(key)s FOR SHARE), "
            "set_config('lock_timeout', s.lt, true) FROM s"
        )
        self.bell_unlock = "SELECT pg_advisory_unlock(%(bc)s::int4, %(bo)s::int4)"
        self.release_unwaited_told = (
            f"WITH r AS ({self.release_unwaited})\n"
            f"SELECT r.*, pg_notify('{self.channel}', '~ ' || %(key)s) FROM r"
        )
        # key owner -> one row if owner's hold (a hand-over to a waiter that has given up) was
        # ended and handed on
        self.hand_on = self._release_sql(
            f"lock_key = %(key)s AND owner = %(owner)s AND expires_at > {NOW}"
        )
        # key owner token -> whether the row shows that (owner, token) released it: free with
        # our token, or handed over by us (the hand-over marks the row with the token it ended)
        self.released_by = (
            f"SELECT (owner IS NULL AND token = %(token)s) OR note = %(token)s::text "
            f"FROM {t} WHERE lock_key = %(key)s"
        )
        # key owner token ttl -> one row changed if the live hold was extended
        self.renew = (
            f"UPDATE {t} SET expires_at = {NOW} + make_interval(secs => %(ttl)s) WHERE {live}"
        )

    def _inspection(self, t: str) -> None:
        """info, list_holds, force_release (ringing the queue and the holder), purge."""
        cols = "lock_key, owner, token, acquired_at, expires_at, kind"
        held = f"owner IS NOT NULL AND expires_at > {NOW}"
        self.info = f"SELECT {cols} FROM {t} WHERE lock_key = %(key)s AND {held}"
        self.list_by_prefix = (
            f"SELECT {cols} FROM {t} WHERE {held} AND left(lock_key, %(n)s) = %(prefix)s "
            "ORDER BY lock_key"
        )
        self.list_all = f"SELECT {cols} FROM {t} WHERE {held} ORDER BY lock_key"
        self.owner_token = f"SELECT owner, token FROM {t} WHERE lock_key = %(key)s"
        # key -> one row if a live hold was ended; the head of the queue (or, with nobody
        # queued, everyone) is rung ("<owner> <key>") and takes its turn itself
        ring = (
            f"pg_notify('{self.channel}', coalesce({self.head('r.lock_key')}, '') || ' ' || "
            "r.lock_key)"
        )
        # ... and the holder's client hears "!<owner> <key>" (see watch): its on_lost fires
        # at once instead of at its next renewal
        lost = f"pg_notify('{self.channel}', '!' || r.old || ' ' || r.lock_key)"
        self.force_release = (
            f"WITH r AS (UPDATE {t} SET owner = NULL, expires_at = {NOW} FROM (SELECT lock_key "
            f"AS k, owner AS old FROM {t} WHERE lock_key = %(key)s FOR UPDATE) o\n"
            f"    WHERE lock_key = o.k AND {held} RETURNING lock_key, o.old)\n"
            f"SELECT {ring}, {lost} FROM r"
        )
        # older inc -> deleted rows; tokens come from the sequence, so nothing to remember
        self.purge = (
            f"DELETE FROM {t} WHERE expires_at <= {NOW} - make_interval(secs => %(older)s) "
            "AND (kind <> 'once' OR (%(inc)s AND state IN ('succeeded', 'failed'))) "
            f"AND {self.no_live_holders(t)}"
        )

    def _fair_queue(self, t: str, holders: str) -> None:
        """FairQueue's queue entries: dequeue (ringing the next head), enqueue, requeue."""
        # key owner -> one row if owner's queue entry was there to delete. A waiter that gives
        # up leaves the queue and, if the lock is free, rings the next head so a notification
        # meant for it is not lost. No row: the lock may have been handed to it meanwhile.
        self.dequeue_and_ring = (
            f"WITH d AS (DELETE FROM {self.holders} WHERE lock_key = %(key)s AND "
            "holder = %(owner)s AND waiting = 1 RETURNING lock_key)\n"
            f"SELECT CASE WHEN EXISTS (SELECT 1 FROM {t} WHERE lock_key = %(key)s "
            f"AND (owner IS NULL OR expires_at <= {NOW})) THEN pg_notify('{self.channel}', "
            f"coalesce({self.head('d.lock_key', besides=' AND holder <> %(owner)s')}, '') "
            "|| ' ' || d.lock_key) END FROM d"
        )
        # key owner kind ttl lease -> make or refresh a queue entry (a refresh keeps its place)
        # ... -> one row: how many others were queued (the store's choice of wake-ups)
        self.enqueue = (
            f"WITH {self._count_join()},\n"
            f"e AS (INSERT INTO {holders} AS x (lock_key, holder, kind, waiting, token,\n"
            "    acquired_at, expires_at, lease, channel)\n"
            f"VALUES (%(key)s, %(owner)s, %(kind)s, 1, 0, {NOW},\n"
            f"    {NOW} + make_interval(secs => %(ttl)s), %(lease)s, %(channel)s)\n"
            "ON CONFLICT (lock_key, holder) DO UPDATE SET kind = EXCLUDED.kind,\n"
            "    expires_at = EXCLUDED.expires_at, lease = EXCLUDED.lease,\n"
            "    channel = EXCLUDED.channel,\n"
            "    acquired_at = CASE WHEN x.waiting = 1 THEN x.acquired_at\n"
            "        ELSE EXCLUDED.acquired_at END, waiting = 1, token = 0)\n"
            f"SELECT {self.others_queued}"
        )
        # key owner ttl -> one row if owner's live queue entry was still there (never re-made:
        # an entry a hand-over removed must stay gone; an expired one lost its place, and the
        # waiter joins again, which counts on the lock's row)
        self.requeue = (
            f"UPDATE {holders} SET expires_at = {NOW} + make_interval(secs => %(ttl)s) "
            "WHERE lock_key = %(key)s AND holder = %(owner)s AND waiting = 1 "
            f"AND expires_at > {NOW}"
        )

    def enqueue_many(self, n: int) -> list[str]:
        # One statement: statement_timestamp() is one value for every entry. Each key's join
        # is counted on its row, as enqueue's is, so that a newcomer's quiet release sees it.
        # The entries take no hand-over (no lease); a release with one at the head frees the
        # lock and rings it on %(channel)s, where the waiter's client listens.
        return [
            f"WITH {self._count_join(many=self.key_list(n))}\n"
            f"INSERT INTO {self.holders} AS x (lock_key, holder, kind, waiting, token,\n"
            "    acquired_at, expires_at, lease, channel)\n"
            f"SELECT k, %(owner)s, 'lock', 1, 0, {NOW}, {self.later('ttl')}, NULL, %(channel)s\n"
            f"FROM ({self.key_rows(n)}) keys\n"
            "ON CONFLICT (lock_key, holder) DO UPDATE SET kind = 'lock', waiting = 1, token = 0,\n"
            "    acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,\n"
            "    lease = NULL, channel = EXCLUDED.channel"
        ]

    def dequeue_many(self, n: int) -> str:
        # as dequeue_and_ring: where a key is free (its row too may be missing: newcomers
        # queued behind the entry on a key never held), its next head is rung (a ring meant
        # for the waiter leaving must not be lost)
        return (
            f"WITH d AS ({super().dequeue_many(n)} RETURNING lock_key)\n"
            f"SELECT pg_notify('{self.channel}', coalesce("
            f"{self.head('d.lock_key', besides=' AND holder <> %(owner)s')}, '') || ' ' || "
            f"d.lock_key) FROM d LEFT JOIN {self.main} l ON l.lock_key = d.lock_key\n"
            f"WHERE l.owner IS NULL OR l.expires_at <= {NOW}"
        )

    def _shared_holds(self, seq: str) -> None:
        """Shared holds and notices: tokens, force notices, rings."""
        # -- shared holds and notices
        # -> a new token (inside the parent-locking transaction)
        self.next_token = f"SELECT nextval('{seq}')"
        # key -> tells the holders of the live shared holds of key that they are being freed
        # (delivered when the transaction that frees them commits)
        self.announce_force = (
            f"SELECT pg_notify('{self.channel}', '!' || holder || ' ' || lock_key) FROM "
            f"{self.holders} WHERE lock_key = %(key)s AND waiting = 0 AND expires_at > {NOW}"
        )
        # key -> rings every waiter of key
        self.ring_everyone = f"SELECT pg_notify('{self.channel}', ' ' || %(key)s)"

    def _join_sql(self, newcomer: str) -> str:
        """key kind owner ttl qttl lease channel -> one row (token, free, -, joins, queued):
        the token and the key's join count if taken; otherwise the caller joins the queue in
        the same statement (for a waiter already subscribed to wake-ups), and ``free`` says
        the lock was freed meanwhile by a release that could not see the join (see
        _release_sql): try again. ``queued``: how many others were queued."""
        return (
            f"WITH a AS ({newcomer}),\n"
            f"q AS (INSERT INTO {self.holders} (lock_key, holder, kind, waiting, token,\n"
            "    acquired_at, expires_at, lease, channel)\n"
            f"    SELECT %(key)s, %(owner)s, 'lock', 1, 0, {NOW},\n"
            f"        {NOW} + make_interval(secs => %(qttl)s), %(lease)s, %(channel)s\n"
            "    WHERE NOT EXISTS (SELECT 1 FROM a)\n"
            "    ON CONFLICT (lock_key, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at,\n"
            "        channel = EXCLUDED.channel),\n"
            f"{self._count_join('AND NOT EXISTS (SELECT 1 FROM a)')}\n"
            "SELECT (SELECT token FROM a), (SELECT free FROM j), (SELECT "
            f"{NOT_DURABLE} WHERE NOT EXISTS (SELECT 1 FROM a)), (SELECT joins FROM a), "
            f"{self.others_queued}"
        )

    def _count_join(self, condition: str = "", *, many: str = "") -> str:
        """A CTE ``j`` that counts a join to the queue of %(key)s (of each key of the list
        ``many``) on its row (``joins``): the release of a lock waits for it, and so notices
        a waiter its snapshot missed; ``free``: the row, as it is after that wait, is not
        held. A release that freed it leaves no owner; its ``expires_at`` is the release's
        statement time, which may be later than this statement's own (it started first and
        then waited for the row), so the time alone would not show the lock free."""
        keys = f"IN ({many})" if many else "= %(key)s"
        return (
            f"j AS (UPDATE {self.main} SET joins = joins + 1 WHERE lock_key {keys} "
            f"{condition}\n    RETURNING (owner IS NULL OR expires_at <= {NOW}) AS free)"
        )

    def _release_sql(self, match: str, *, told: bool = False, bell: bool = False) -> str:
        """SQL that ends the hold matched by ``match`` and hands the lock over: one row if ended.

        The head of the key's wait queue gets the lock with a new token and a lease of its own
        ttl, but no longer than its queue entry's (a waiter that died or froze holds it up no
        longer than its place in the queue would), and its queue entry goes; the NOTIFY
        ``=<token> <owner> <key>`` tells it, on its client's own channel (the entry's
        ``channel``; the table's for an entry without one), so other clients sleep on. The
        head is locked with SKIP LOCKED: a waiter that is leaving the queue (or refreshing its
        entry) just now is passed over, not granted.
        The row remembers the token that handed it over (``note``), for a retried release.
        ``told``: the key's observers hear ``~ <key>`` on the table's channel too.
        ``bell``: run on the connection that keeps the key's doorbell (%(bc)s, %(bo)s), it lets
        go of it once the row is updated (its next waiter's wait then waits for the commit).
        Waiters at the bell are neither handed the lock nor rung (see doorbell.py).
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
        t, seq, ch = self.main, self.seq, self.channel
        head = (
            "SELECT holder, lease, channel, "
            f"LEAST({NOW} + make_interval(secs => lease), expires_at) AS "
            f"until FROM {self.holders} WHERE lock_key = %(key)s AND waiting = 1 AND "
            f"kind = 'lock' AND expires_at > {NOW} AND channel IS DISTINCT FROM "
            f"'{BELL_CHANNEL}' ORDER BY acquired_at, holder LIMIT 1 FOR UPDATE SKIP LOCKED"
        )
        given = "g.holder IS NOT NULL"
        head_told = f"coalesce(h.channel, '{ch}')"  # where the head's client listens
        observers = f"    , pg_notify('{ch}', '~ ' || r.lock_key)\n" if told else ""
        # (a release that issues no token need not be durable: see NOT_DURABLE)
        let_go = (
            "    , pg_advisory_unlock(%(bc)s::int4, %(bo)s::int4), "
            f"CASE WHEN r.owner IS NULL THEN {NOT_DURABLE} END\n"
            if bell
            else ""
        )
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
            f"d AS (DELETE FROM {self.holders} x USING r WHERE x.lock_key = %(key)s\n"
            "    AND x.holder = r.owner AND x.waiting = 1)\n"
            "SELECT CASE WHEN r.owner IS NOT NULL\n"
            f"    THEN pg_notify({head_told}, '=' || r.token || ' ' || r.owner || ' ' "
            "|| r.lock_key)\n"
            f"    WHEN r.joins <> (SELECT s.joins FROM {t} s WHERE s.lock_key = r.lock_key)\n"
            f"    THEN pg_notify('{ch}', ' ' || r.lock_key)\n"
            "    WHEN r.kind = 'write' OR h.holder IS NOT NULL\n"
            f"    THEN pg_notify({head_told}, coalesce(h.holder, '') || ' ' || r.lock_key) END,\n"
            "    r.owner IS NOT NULL AS handed\n"  # a token issued: its commit must be durable
            f"{observers}{let_go}FROM r LEFT JOIN h ON true"
        )

    forever = f"timestamptz '{FOREVER}+00'"

    def value_key_of(self, column: str) -> str:
        return f"chr(31) || encode(sha256(convert_to({column}, 'UTF8')), 'hex')"

    def listen(self, own_channel: str) -> str:
        """A client's listener hears the table's channel and its own."""
        return f'LISTEN "{self.channel}"; LISTEN "{own_channel}"'

    #: a listener with nothing registered stops listening (every NOTIFY would signal it)
    unlisten = "UNLISTEN *"

    def later(self, name: str) -> str:
        return f"{NOW} + make_interval(secs => %({name})s)"

    def earlier(self, name: str) -> str:
        return f"{NOW} - make_interval(secs => %({name})s)"

    def _session_statements(self, t: str, plain: str) -> None:
        """Session holds (ttl=None): the server's advisory lock on ``advisory_key``, held by a
        connection set aside for it; see session.py. ``plain``: the table's name
        as ``advisory_key`` hashes it."""
        k = self.advisory_key
        this_db = "(SELECT oid FROM pg_database WHERE datname = current_database())"
        # lt (ms, 0: forever) key -> waits in the server's queue; lock_timeout is read when the
        # wait starts, after set_config in the same row
        self.session_lock = (
            f"SELECT set_config('lock_timeout', %(lt)s, false), pg_advisory_lock({k}), true"
        )
        self.session_try = f"SELECT '', NULL, pg_try_advisory_lock({k})"
        # key owner -> (token, a live lease holds the key). A statement of its own, run after
        # the lock statement in the same pipeline: its snapshot is taken after the grant, so it
        # sees a lease committed while the lock statement waited. The token comes from the
        # sequence of lease tokens (no WAL flush: a sequence logs ahead, and after a crash it
        # skips, never repeats). The application name tells info() who holds it.
        tag = (
            "left(format('d:%%s:%%s:%%s', s.tok, "
            f"to_hex(floor(extract(epoch from {NOW}) * 1000)::bigint), %(owner)s::text), 63)"
        )
        self.session_grant = (
            f"SELECT s.tok, s.busy, set_config('application_name', {tag}, false), "
            "pg_backend_pid() FROM (\n"
            f"    SELECT nextval('{self.seq}') AS tok, EXISTS (SELECT 1 FROM {t}\n"
            f"        WHERE lock_key = %(key)s AND expires_at > {NOW}) AS busy) s"
        )
        # The same in one statement, where the connection could make this temporary function
        # (pg_temp: no privilege on the schema, nothing left behind). A VOLATILE PL/pgSQL
        # function takes a new snapshot for each query it runs, so its look for a live lease,
        # after the lock, sees a lease committed while the lock waited; and the session keeps
        # its plans (a SQL function's query is planned anew at every call: 60 µs of server
        # time per grant, measured). Its clock is clock_timestamp(): the statement started
        # before the wait. No row: a try that did not get the lock.
        at = "to_hex(floor(extract(epoch from clock_timestamp()) * 1000)::bigint)"
        hashed = _advisory_key(plain, "k")
        self.session_function = (
            "CREATE OR REPLACE FUNCTION pg_temp.dblock_session_take(k text, o text, lt text, "
            "wait boolean)\nRETURNS TABLE (tok bigint, busy boolean, app text, pid integer)\n"
            "LANGUAGE plpgsql VOLATILE AS $dblock$\n"
            "#variable_conflict use_variable\n"
            "BEGIN\n"
            "    IF wait THEN\n"
            "        PERFORM set_config('lock_timeout', lt, false);\n"
            f"        PERFORM pg_advisory_lock({hashed});\n"
            f"    ELSIF NOT pg_try_advisory_lock({hashed}) THEN\n"
            "        RETURN;\n"
            "    END IF;\n"
            f"    tok := nextval('{self.seq}');\n"
            f"    busy := EXISTS (SELECT 1 FROM {t} d WHERE d.lock_key = k\n"
            "        AND d.expires_at > clock_timestamp());\n"
            "    app := set_config('application_name', "
            f"left(format('d:%s:%s:%s', tok, {at}, o), 63), false);\n"
            "    pid := pg_backend_pid();\n"
            "    RETURN NEXT;\n"
            "END\n"
            "$dblock$"
        )
        one = (
            "SELECT tok, busy, app, pid FROM pg_temp.dblock_session_take(%(key)s::text, "
            "%(owner)s::text, %(lt)s::text, {wait})"
        )
        # lt (ms) key owner -> (token, a live lease holds it, -, process), or no row
        self.session_lock_one = one.format(wait="true")
        self.session_try_one = one.format(wait="false")
        self.session_unlock_all = "SELECT pg_advisory_unlock_all()"
        # key -> ends the hold; lease waiters queued for the key are rung (delivered at the
        # statement's commit, after the unlock), as a lease's release would
        self.session_release = (
            "SELECT pg_advisory_unlock_all(), (SELECT pg_notify("
            f"'{self.channel}', ' ' || %(key)s) FROM {self.holders} "
            "WHERE lock_key = %(key)s AND waiting = 1 LIMIT 1)"
        )
        # -> the server process the connection reaches now (a pooler may change it)
        self.session_alive = "SELECT pg_backend_pid()"
        # key -> the application names of the sessions that hold its server lock
        self.session_holders = (
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid\n"
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1\n"
            f"    AND l.database = {this_db}\n"
            f"    AND l.classid = (({k} >> 32) & 4294967295)::oid\n"
            f"    AND l.objid = ({k} & 4294967295)::oid"
        )
        # key -> ends the sessions that hold its server lock (force_release)
        self.session_terminate = (
            "SELECT pg_terminate_backend(l.pid) FROM pg_locks l\n"
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1\n"
            f"    AND l.database = {this_db}\n"
            f"    AND l.classid = (({k} >> 32) & 4294967295)::oid\n"
            f"    AND l.objid = ({k} & 4294967295)::oid AND l.pid <> pg_backend_pid()"
        )
