"""MySQL 8's and MariaDB's statements: ``%(name)s`` parameters (``%s`` for the positional
ones), time ``UTC_TIMESTAMP(6)``, durations in microseconds (``<name>_us``), tokens per key
returned as insert ids (see the store, ``store.py``). On MariaDB a table's tokens also
come from its sequence (``<table>_token_seq``), which session holds take theirs from (see
``session.py``)."""

from __future__ import annotations

import functools
import hashlib
import re

from .._names import aux_name, qualify
from .._sql_holders import FOREVER, HolderStatements
from .doorbell import gate_sql

NOW = "UTC_TIMESTAMP(6)"
#: Keys compare character for character: 'a' and 'a ' are two keys. Under utf8mb4_bin (PAD
#: SPACE) they compare equal and share one row; these collations do not pad. The DDL names
#: MariaDB's; connecting to MySQL 8 swaps in its own.
NOPAD_MARIADB, NOPAD_MYSQL = "utf8mb4_nopad_bin", "utf8mb4_0900_bin"
KEY_TYPE = f"VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {NOPAD_MARIADB} NOT NULL"
KEY_NOTE = f"MySQL 8: {NOPAD_MYSQL}; utf8mb4_bin pads ('a' = 'a ')"
#: the statement of ``release_and_hand_over`` whose affected rows tell the outcome
HANDED = 5
#: the `bell` of a lock_many waiter's queue entries: no connection has this id. Such a waiter
#: has no doorbell (it would need one per key) and is never handed a lock, so the bell's order
#: cannot serve it: no hand-over and no waiter at the bell passes its entries (see MANY_AHEAD)
MANY_BELL = 0
#: fragment on alias ``w``: a queue entry of a lock_many waiter
MANY_AHEAD = f"w.bell = {MANY_BELL}"
#: the GET_LOCK name of a key's session holds: this prefix and a SHA-1 of scope and key
SESSION_PREFIX = "dblock-s:"
#: the error (ER_SUBSELECT_NO_1_ROW) of take_many_at_once's check when its UPDATE took only
#: some of the keys: the rest of the packet, the commit too, is not run
MANY_TAKEN_PARTLY = 1242
#: the name of the session grant's look, prepared on each session connection
PREPARED_LOOK = "dblock_session_look"


@functools.lru_cache(maxsize=1024)
def session_lock_name(scope: str, key: str) -> str:
    """The GET_LOCK name of ``key``'s session holds in the lock table ``scope`` (database and
    table: user locks are the server's): 49 characters, under GET_LOCK's 64, whatever the key.
    The hash is of the key's exact bytes: GET_LOCK names compare case-insensitively, keys
    do not. Kept for recent keys: a hold asks twice (grant, release)."""
    digest = hashlib.sha1(f"{scope}\0{key}".encode(), usedforsecurity=False).hexdigest()
    return SESSION_PREFIX + digest


def session_free(column: str) -> str:
    """SQL: no session holds the key (%(sname)s, its GET_LOCK name), evaluated on each row
    read: the name is made to depend on ``column``, so the server cannot take it for a
    constant and evaluate it once, before the statement waits for the row's lock (it does
    for a bare ``IS_USED_LOCK('...')`` in an UPDATE's WHERE)."""
    return f"IS_USED_LOCK(CONCAT(%(sname)s, LEFT({column}, 0))) IS NULL"


def _holds_of_owner(n: int) -> str:
    """The rows of %(owner)s's holds of the ``n`` keys %(key_0)s.. with their tokens
    %(token_0)s.. (an IN list and a CASE: one primary-key probe per key)."""
    keys = ", ".join(f"%(key_{i})s" for i in range(n))
    tokens = " ".join(f"WHEN %(key_{i})s THEN %(token_{i})s" for i in range(n))
    return f"lock_key IN ({keys}) AND owner = %(owner)s AND token = CASE lock_key {tokens} END"


class MysqlStatements(HolderStatements):
    """Every statement of the MySQL/MariaDB store, for one lock table."""

    # inside the parent-locking transaction, count with a locking read: it sees the latest
    # committed rows whatever snapshot REPEATABLE READ would otherwise give
    locking_read = " LOCK IN SHARE MODE"

    def __init__(self, schema: str | None, table: str, *, sequence: bool = False) -> None:
        """``sequence``: the table has its token sequence (MariaDB), which every token then
        also comes from; without it (MySQL 8) tokens are the rows' counters alone."""
        t = qualify(schema, table, "`")
        meta = qualify(schema, aux_name(table, "_meta"), "`")
        holders = qualify(schema, aux_name(table, "_holders"), "`")
        seq = qualify(schema, aux_name(table, "_token_seq"), "`")
        sessions = qualify(schema, aux_name(table, "_sessions"), "`")
        super().__init__(t, holders, NOW)
        self.seq = seq
        self.meta = meta
        self.sequence = sequence
        self._schema(table, t, meta, holders, seq=seq, sessions=sessions)
        self._holder_pieces(t, meta, holders)
        self._acquiring(t, meta)
        self._fenced_grants(t, meta)
        self._once_records(t, meta)
        self._lease(t)
        self._guards(t)
        self._inspection(t, meta)
        self._build_hand_over(t, holders, self._token_after("token"))
        self._build_sessions(t, meta, sessions)
        self._fair_queue()
        self._shared_holds()

    def _token_after(self, counter: str) -> str:
        """SQL: the token after ``counter`` (a row's last one, or the purged tokens'
        mark): above it and, with the sequence, above every session token issued."""
        return (
            f"GREATEST({counter} + 1, NEXTVAL({self.seq}))" if self.sequence else f"{counter} + 1"
        )

    def _schema(
        self, table: str, t: str, meta: str, holders: str, *, seq: str, sessions: str
    ) -> None:
        """The schema's DDL, the tables it has, the lock that serialises its creation."""
        # -- schema
        self.create_main_table = (
            f"CREATE TABLE IF NOT EXISTS {t} (\n"
            f"    lock_key    {KEY_TYPE},  -- {KEY_NOTE}\n"
            "    kind        VARCHAR(16) NOT NULL DEFAULT 'lock',\n"
            "    owner       VARCHAR(255),\n"
            "    token       BIGINT NOT NULL,\n"
            "    acquired_at DATETIME(6) NOT NULL,  -- UTC\n"
            "    expires_at  DATETIME(6) NOT NULL,  -- UTC\n"
            "    state       VARCHAR(16),\n"
            "    note        TEXT,\n"
            "    queued_until DATETIME(6),  -- UTC; no live queue entry of the key outlives it\n"
            "    PRIMARY KEY (lock_key)\n"
            ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )
        self.create_meta_table = (
            f"CREATE TABLE IF NOT EXISTS {meta} (\n"
            "    id  TINYINT NOT NULL PRIMARY KEY,\n"
            "    hwm BIGINT NOT NULL  -- highest fencing token ever purged\n"
            ") ENGINE=InnoDB"
        )
        self.seed_meta = f"INSERT IGNORE INTO {meta} (id, hwm) VALUES (1, 0)"
        self.create_holders_table = (
            f"CREATE TABLE IF NOT EXISTS {holders} (\n"
            f"    lock_key    {KEY_TYPE},  -- {KEY_NOTE}\n"
            "    holder      VARCHAR(255) NOT NULL,  -- the owner of a hold or queue entry\n"
            "    kind        VARCHAR(16) NOT NULL,\n"
            "    waiting     SMALLINT NOT NULL DEFAULT 0,  -- 1: a queue entry, not a hold\n"
            "    token       BIGINT NOT NULL,\n"
            "    acquired_at DATETIME(6) NOT NULL,  -- UTC\n"
            "    expires_at  DATETIME(6) NOT NULL,  -- UTC\n"
            "    lease       DOUBLE,  -- a waiter's lease for a hand-over (NULL: none)\n"
            "    bell        BIGINT,  -- the connection id of the waiter's doorbell\n"
            "    PRIMARY KEY (lock_key, holder)\n"
            ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )
        # MariaDB only (an executable comment: MySQL skips it): the tokens of session holds,
        # which every lease token also exceeds. Non-transactional and cached: a crash skips the
        # values it had not logged, never repeats one. ensure_schema creates it starting above
        # the tokens a table already has (sequence_start).
        self.create_sequence_ddl = f"/*M!100300 CREATE SEQUENCE IF NOT EXISTS {seq} */"
        # who holds each key's session lock (info, list): MEMORY, so a grant writes no log; a
        # server restart empties it, as it frees the locks. A row is current only while its
        # connection holds the key's GET_LOCK (a holder that died leaves its row behind).
        self.create_sessions_table = (
            f"CREATE TABLE IF NOT EXISTS {sessions} (\n"
            f"    lock_key    {KEY_TYPE},  -- {KEY_NOTE}\n"
            "    lock_name   VARCHAR(64) CHARACTER SET ascii NOT NULL,  -- its GET_LOCK name\n"
            "    conn        BIGINT NOT NULL,  -- CONNECTION_ID() of the holder\n"
            "    owner       VARCHAR(255) NOT NULL,\n"
            "    token       BIGINT NOT NULL,\n"
            "    acquired_at DATETIME(6) NOT NULL,  -- UTC\n"
            "    PRIMARY KEY (lock_key)\n"
            ") ENGINE=MEMORY DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )
        self.ddl = [
            self.create_main_table,
            self.create_meta_table,
            self.seed_meta,
            self.create_holders_table,
            self.create_sessions_table,
            self.create_sequence_ddl,
        ]
        # -> the first token of a sequence made for a table that may already have tokens
        self.sequence_start = (
            f"SELECT GREATEST(COALESCE(MAX(token), 0), COALESCE((SELECT MAX(hwm) FROM {meta}), "
            f"0)) + 1 FROM {t}"
        )
        # every table the schema has: a process that finds only some of them is looking at
        # another process's creation halfway through, and must wait for it (GET_LOCK below)
        self.table_names = (table, aux_name(table, "_meta"), aux_name(table, "_holders"))
        #: what session holds need beside them (the sequence: MariaDB): a table made before
        #: them gets them from ensure_schema, and has no session holds until then
        self.session_names = (aux_name(table, "_sessions"), aux_name(table, "_token_seq"))
        digest = hashlib.sha1(t.encode(), usedforsecurity=False).hexdigest()[:16]
        self.ddl_lock_name = f"dblock_ddl_{digest}"
        # schema table meta holders sessions sequence -> (table, column, the server is MySQL
        # 8) of each of the tables (or the sequence) that exists; every one has columns. The
        # columns view alone, not joined to the tables view: MariaDB then opens only this
        # schema's tables, where the join read every table of every database (14 ms at 300
        # tables, on each connect)
        self.find_tables = (
            "SELECT c.table_name, c.column_name, VERSION() NOT LIKE '%%MariaDB%%' "
            "FROM information_schema.columns c "
            "WHERE c.table_schema = COALESCE(%s, DATABASE()) "
            "AND c.table_name IN (%s, %s, %s, %s, %s)"
        )
        self.is_mysql8 = "SELECT VERSION() NOT LIKE '%MariaDB%'"
        # name -> one process creates the schema at a time
        self.take_ddl_lock = "SELECT GET_LOCK(%s, 60)"
        self.let_go_ddl_lock = "SELECT RELEASE_LOCK(%s)"

    def _holder_pieces(self, t: str, meta: str, holders: str) -> None:
        """The dialect's pieces of the multi-holder operations (stores/_sql_holders.py)."""
        # dialect pieces for the multi-holder operations (see stores/_sql_holders.py)
        self.ensure_parent = (
            f"INSERT INTO {t} (lock_key, kind, owner, token, acquired_at, expires_at)\n"
            f"SELECT %(key)s, 'lock', NULL, m.hwm + 1, {NOW}, {NOW} FROM {meta} m WHERE m.id = 1\n"
            "ON DUPLICATE KEY UPDATE lock_key = lock_key"
        )
        self.lock_parent = (
            f"SELECT owner, owner IS NOT NULL AND expires_at > {NOW} FROM {t} "
            "WHERE lock_key = %(key)s FOR UPDATE"
        )
        # `acquired_at` is assigned before `waiting`, which its condition reads
        self.upsert_holder = (
            f"INSERT INTO {holders} (lock_key, holder, kind, waiting, token, acquired_at,\n"
            "    expires_at)\n"
            "VALUES (%(key)s, %(owner)s, %(kind)s, %(waiting)s, %(token)s,\n"
            f"    {NOW}, {NOW} + INTERVAL %(ttl_us)s MICROSECOND)\n"
            "ON DUPLICATE KEY UPDATE kind = VALUES(kind), token = VALUES(token),\n"
            "    expires_at = VALUES(expires_at),\n"
            "    acquired_at = IF(waiting = 1 AND VALUES(waiting) = 1, acquired_at,\n"
            "        VALUES(acquired_at)),\n"
            "    waiting = VALUES(waiting)"
        )
        self.prefix_match = "LEFT(lock_key, %(n)s) = %(prefix)s"

    def _acquiring(self, t: str, meta: str) -> None:
        """Taking a lock: acquire, a newcomer's acquire (FairQueue), the queue's busy mark."""
        next_token = self._token_after
        row = f"{t}."  # MySQL has no alias for an INSERT target: qualify with the table itself
        ours = f"{row}owner = VALUES(owner)"
        # MySQL parses and plans every statement anew (PyMySQL has no server-side prepared
        # statements), so what a statement costs grows with its text, even the parts it never
        # runs, such as a subquery on the queue. So acquiring tries a plain UPDATE first, which
        # serves the common case (the key has a row, and no waiters in the last seconds), and
        # only where it changed nothing a second statement that covers the rest. Waiters keep
        # `queued_until` of the key's row later than their queue entries' leases (see
        # enqueue): before it, a newcomer must look into the queue, which only the second
        # statement does.
        # key ttl_us -> marks the key's queue busy at least ttl_us (plus a second) from now.
        # It writes (a row lock and a durable commit on the lock's own row, in the way of a
        # hand-over) only when the mark would end sooner, and then sets it twice as far.
        soon = f"{NOW} + INTERVAL %(ttl_us)s MICROSECOND + INTERVAL 1 SECOND"
        self._mark = (f"{soon} + INTERVAL %(ttl_us)s MICROSECOND", soon)
        self.mark_queued = self._marking("= %(key)s")
        # key -> (the lock is held, microseconds left of the queue mark); no row: free. A
        # plain read, which waits for no row lock: a newcomer to a busy key asks it before it
        # tries (see _take_as_newcomer)
        self.busy_look = (
            f"SELECT owner IS NOT NULL AND expires_at > {NOW}, "
            f"TIMESTAMPDIFF(MICROSECOND, {NOW}, queued_until) FROM {t} WHERE lock_key = %(key)s"
        )

        def update_sql(fair: str = "", n: int = 0) -> str:
            """key kind owner ttl_us -> 1 row changed, with the new token as insert id
            (``LAST_INSERT_ID(expr)``), if the key's row was taken; 0 if it is held, absent or
            (with ``fair``) the key had waiters lately. A live row is taken only by its own
            owner (an idempotent retry); a `once` record never by a lock; a free row not
            while a session holds the key (%(sname)s). ``n``: the same over the keys
            %(key_0)s ... (their GET_LOCK names %(sname_0)s ...), each row as it would be;
            the rows changed, and no insert id: their tokens are read afterwards."""
            also = f" AND {fair}" if fair else ""
            token = next_token("token")
            where, free = "lock_key = %(key)s", session_free("lock_key")
            if n:
                where = f"lock_key IN ({', '.join(f'%(key_{i})s' for i in range(n))})"
                names = " ".join(f"WHEN %(key_{i})s THEN %(sname_{i})s" for i in range(n))
                free = f"IS_USED_LOCK(CASE lock_key {names} END) IS NULL"
            else:
                token = f"LAST_INSERT_ID({token})"
            return (
                f"UPDATE {t} SET owner = %(owner)s,\n"
                f"    token = {token},\n"
                f"    kind = %(kind)s, acquired_at = {NOW}, note = NULL,\n"
                f"    expires_at = {NOW} + INTERVAL %(ttl_us)s MICROSECOND\n"
                f"WHERE {where} AND ((expires_at <= {NOW} AND kind <> 'once'{also}\n"
                f"    AND {free}) OR owner = %(owner)s)"
            )

        def insert_sql(fair: str = "", *, new_row: str = "") -> str:
            """key kind owner ttl_us -> 1 row inserted / 2 taken, with the token as insert id,
            or 0. Without ``fair`` it inserts only: it follows an UPDATE that tested all else.
            With it, it also takes the row if no live waiter is queued. In ON DUPLICATE KEY
            UPDATE assignments run left to right on the updated row, so `owner` is assigned
            first from the condition and every later one tests whether `owner` became ours.
            VALUES() is deprecated in MySQL 8.0.20 for a row alias that MariaDB lacks; both
            accept it. A new row's token reads `hwm` with a shared lock (a subquery of an
            INSERT under REPEATABLE READ is a locking read), so it cannot read a stale `hwm`
            while a purge is deleting the key. A key without a row has no queue (purge keeps
            the row of a key with live queue entries). A new row is not made while a session
            holds the key: checked before the row exists, which a session grant that finds no
            row makes up for (it makes the row, and waits for one being inserted: see
            session.py). ``new_row``: a further condition (`` AND ...``) on trying at all."""
            values = (
                f"INSERT INTO {t} (lock_key, kind, owner, token, acquired_at, expires_at)\n"
                "SELECT %(key)s, %(kind)s, %(owner)s,\n"
                f"    LAST_INSERT_ID({next_token('m.hwm')}), {NOW},\n"
                f"    {NOW} + INTERVAL %(ttl_us)s MICROSECOND FROM {meta} m\n"
                f"WHERE m.id = 1 AND IS_USED_LOCK(%(sname)s) IS NULL{new_row}\n"
            )
            if not fair:
                return values + "ON DUPLICATE KEY UPDATE lock_key = lock_key"
            return values + (
                "ON DUPLICATE KEY UPDATE\n"
                f"    owner = IF(({row}expires_at <= {NOW} AND {row}kind <> 'once' AND {fair}\n"
                f"        AND {session_free(row + 'lock_key')}) OR {ours}, VALUES(owner),\n"
                f"        {row}owner),\n"
                f"    token = IF({ours}, LAST_INSERT_ID({next_token(row + 'token')}), "
                f"{row}token),\n"
                f"    kind = IF({ours}, VALUES(kind), {row}kind),\n"
                f"    acquired_at = IF({ours}, VALUES(acquired_at), {row}acquired_at),\n"
                f"    note = IF({ours}, NULL, {row}note),\n"
                f"    expires_at = IF({ours}, VALUES(expires_at), {row}expires_at)"
            )

        # the statements of an acquire, tried in turn until one takes the key
        self.acquire = (update_sql(), insert_sql())
        # a newcomer's acquire: the same, only when nobody waits in the key's queue
        quiet = f"(queued_until IS NULL OR queued_until <= {NOW})"
        self.acquire_as_newcomer = (update_sql(quiet), insert_sql(self.nobody_queued))
        # ManyKeys' acquire_many, for a key take_many_at_once did not take: a newcomer's
        # second statement, which also makes no new row for a key with live waiters (entries
        # made without a row: the queue is the rule, whatever made them)
        self.acquire_many_newcomer = insert_sql(
            self.nobody_queued, new_row=f" AND {self.nobody_queued}"
        )
        #: n -> the tokens of the keys %(key_0)s ... that owner holds
        self.many_tokens = functools.cache(
            lambda n: (
                f"SELECT lock_key, token FROM {t} "
                f"WHERE lock_key IN ({', '.join(f'%(key_{i})s' for i in range(n))}) "
                f"AND owner = %(owner)s AND expires_at > {NOW}"
            )
        )
        #: n -> one packet: a transaction whose UPDATE takes every key a newcomer may take,
        #: then reads their tokens and commits, if it took all n. Else the check between
        #: them fails (its subquery has two rows: MANY_TAKEN_PARTLY), the rest of the packet
        #: is not run, and the transaction stays open for the keys left (MysqlStore). The
        #: keys are distinct rows and every row taken changes (a new token), so n rows
        #: changed is every key taken.
        self.take_many_at_once = functools.cache(
            lambda n: (
                f"START TRANSACTION;\n{update_sql(quiet, n)};\n"
                f"SELECT (SELECT 1 UNION ALL SELECT 2 FROM DUAL WHERE ROW_COUNT() <> {n});\n"
                f"{self.many_tokens(n)};\nCOMMIT"
            )
        )

    def _marking(self, keys: str) -> str:
        """mark_queued for the keys ``lock_key <keys>`` selects."""
        mark, soon = self._mark
        return (
            f"UPDATE {self.main} SET queued_until = {mark}\n"
            f"WHERE lock_key {keys} AND (queued_until IS NULL OR queued_until < {soon})"
        )

    def enqueue_many(self, n: int) -> list[str]:
        # Each key's row is marked queued (made free if missing: a newcomer's insert of a new
        # row looks at no queue), as enqueue marks it; then the entries, in one statement:
        # UTC_TIMESTAMP(6) is one value for all of it. Entries take no hand-over (no lease)
        # and are marked as a lock_many waiter's (MANY_BELL), which nobody at the bell passes:
        # a release frees the lock, and the waiter looks (MysqlStore.subscribe_many).
        mark, soon = self._mark
        return [
            f"INSERT INTO {self.main} (lock_key, kind, owner, token, acquired_at, expires_at,\n"
            f"    queued_until)\nSELECT k.k, 'lock', NULL, m.hwm + 1, {NOW}, {NOW}, {mark}\n"
            f"FROM ({self.key_rows(n)}) k, {self.meta} m WHERE m.id = 1\n"
            "ON DUPLICATE KEY UPDATE queued_until = IF(queued_until IS NULL OR queued_until <\n"
            f"    {soon}, VALUES(queued_until), queued_until)",
            f"INSERT INTO {self.holders} (lock_key, holder, kind, waiting, token, acquired_at,\n"
            "    expires_at, lease, bell)\n"
            f"SELECT k.k, %(owner)s, 'lock', 1, 0, {NOW}, {self.later('ttl')}, NULL, {MANY_BELL}\n"
            f"FROM ({self.key_rows(n)}) k\n"
            "ON DUPLICATE KEY UPDATE kind = 'lock', token = 0, waiting = 1,\n"
            "    acquired_at = VALUES(acquired_at), expires_at = VALUES(expires_at),\n"
            f"    lease = NULL, bell = {MANY_BELL}",
        ]

    def look_many(self, n: int) -> str:
        """owner k0.. -> (live entries ahead of %(owner)s's on the ``n`` keys it does not hold,
        how many of the keys another holds or a once-record keeps): a plain read, which tells
        a lock_many waiter when to try (both 0). Session holds it does not see: the try does."""
        held = (
            f"SELECT count(*) FROM {self.main} m WHERE m.lock_key IN ({self.key_list(n)}) "
            f"AND (m.expires_at > {NOW} OR m.kind = 'once') AND NOT (m.owner <=> %(owner)s)"
        )
        return f"SELECT ({self.blocked_many(n)}), ({held})"

    def requeue_many(self, n: int) -> list[str]:
        # the marks first, as requeue does: they must outlive the entries
        return [self._marking(f"IN ({self.key_list(n)})"), *super().requeue_many(n)]

    def _fenced_grants(self, t: str, meta: str) -> None:
        """FencedGrants: fence, grant_fenced_update/_insert, release_owned."""
        # -- fenced grants (FencedGrants, for a quorum: docs/stores/quorum.md)
        # key -> the key's fence: its row's token, or the highest purged token if higher,
        # floored by the server's clock in microseconds (UTC: no time zone can step it back)
        self.fence = (
            f"SELECT GREATEST(COALESCE((SELECT token FROM {t} WHERE lock_key = %(key)s), 0), "
            f"hwm, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {NOW})) "
            f"FROM {meta} WHERE id = 1"
        )
        # key kind owner ttl_us token -> 1 row changed if the key's row was granted with
        # `token`: free or expired (or owner's own) and fenced below it; or already owner's
        # with `token` (a retry). 0: held, fenced at or above `token`, or no row (the insert
        # below then tries). WHERE is read before SET, so the assignments' order is free.
        self.grant_fenced_update = (
            f"UPDATE {t} SET owner = %(owner)s, token = %(token)s, kind = %(kind)s,\n"
            f"    acquired_at = {NOW}, state = NULL, note = NULL,\n"
            f"    expires_at = {NOW} + INTERVAL %(ttl_us)s MICROSECOND\n"
            "WHERE lock_key = %(key)s AND ((token < %(token)s AND ((expires_at <= "
            f"{NOW}\n    AND kind <> 'once') OR owner = %(owner)s))\n"
            "    OR (owner = %(owner)s AND token = %(token)s))"
        )
        # key kind owner ttl_us token -> 1 row inserted if the key had none and the purged
        # tokens' mark is below `token`; 0 if a row appeared meanwhile (a lost vote)
        self.grant_fenced_insert = (
            f"INSERT INTO {t} (lock_key, kind, owner, token, acquired_at, expires_at)\n"
            f"SELECT %(key)s, %(kind)s, %(owner)s, %(token)s, {NOW},\n"
            f"    {NOW} + INTERVAL %(ttl_us)s MICROSECOND FROM {meta} m\n"
            "WHERE m.id = 1 AND m.hwm < %(token)s\n"
            "ON DUPLICATE KEY UPDATE lock_key = lock_key"
        )
        # FencedManyGrants' grant of one key: the update, else the insert
        self.grant_fenced_steps = (self.grant_fenced_update, self.grant_fenced_insert)
        # key owner -> 1 row changed if owner's live hold (any token) was ended
        self.release_owned = (
            f"UPDATE {t} SET owner = NULL, expires_at = {NOW} "
            f"WHERE lock_key = %(key)s AND owner = %(owner)s AND expires_at > {NOW}"
        )

    def _once_records(self, t: str, meta: str) -> None:
        """OnceRecords and ScheduledRuns: claim_once, once_state, finish_once, finish_scheduled."""
        next_token = self._token_after
        row = f"{t}."  # MySQL has no alias for an INSERT target: qualify with the table itself
        ours = f"{row}owner = VALUES(owner)"
        # key owner ttl_us note -> affected rows 1 / 2 with the token as insert id if the
        # once-record was claimed (absent, failed, or processing with an expired lease), else 0.
        # The claim condition tests four columns, so `owner` is assigned first and every later
        # assignment tests whether `owner` became ours.
        claim = (
            f"({row}kind <> 'once' AND {row}expires_at <= {NOW}) OR ({row}kind = 'once' AND "
            f"({row}state = 'failed' OR ({row}state = 'processing' AND {row}expires_at <= {NOW})))"
            f" OR {row}owner = VALUES(owner)"
        )
        self.claim_once = (
            f"INSERT INTO {t} (lock_key, kind, owner, token, acquired_at, expires_at, state,\n"
            "    note)\n"
            f"SELECT %s, 'once', %s, LAST_INSERT_ID({next_token('m.hwm')}), {NOW},\n"
            f"       {NOW} + INTERVAL %s MICROSECOND, 'processing', %s\n"
            f"FROM {meta} m WHERE m.id = 1\n"
            "ON DUPLICATE KEY UPDATE\n"
            f"    owner = IF({claim}, VALUES(owner), {row}owner),\n"
            f"    token = IF({ours}, LAST_INSERT_ID({next_token(row + 'token')}), {row}token),\n"
            f"    kind = IF({ours}, 'once', {row}kind),\n"
            f"    acquired_at = IF({ours}, VALUES(acquired_at), {row}acquired_at),\n"
            f"    state = IF({ours}, 'processing', {row}state),\n"
            f"    note = IF({ours}, VALUES(note), {row}note),\n"
            f"    expires_at = IF({ours}, VALUES(expires_at), {row}expires_at)"
        )
        self.once_state = f"SELECT kind, state, expires_at > {NOW} FROM {t} WHERE lock_key = %s"
        mine = "lock_key = %(key)s AND owner = %(owner)s AND token = %(token)s"
        # key owner token state -> 1 row if the outcome was recorded (and the hold ended)
        self.finish_once = (
            f"UPDATE {t} SET state = %(state)s, owner = NULL, expires_at = {NOW} "
            f"WHERE {mine} AND kind = 'once'"
        )
        least = "acquired_at + INTERVAL %(least_us)s MICROSECOND"
        # key owner token least -> 1 row if ended, or kept until `least` s after the
        # start. `owner` is assigned before `expires_at`; neither condition reads either column.
        self.finish_scheduled = (
            f"UPDATE {t} SET owner = IF({least} > {NOW}, owner, NULL), "
            f"expires_at = GREATEST({least}, {NOW}) WHERE {mine}"
        )

    def _lease(self, t: str) -> None:
        """A hold's lease: renew."""
        live = f"lock_key = %s AND owner = %s AND token = %s AND expires_at > {NOW}"
        # ttl_us key owner token -> 1 row changed if the live hold was extended
        self.renew = f"UPDATE {t} SET expires_at = {NOW} + INTERVAL %s MICROSECOND WHERE {live}"

    def _guards(self, t: str) -> None:
        """lock.guard(conn) (CommitGuards): the guard runs on the caller's connection, so it
        is plain ``%(name)s`` SQL, parameters as the contract names them."""

        def guard(n: int) -> str:
            # a locking read: it waits for a writer of the row and reads the latest committed
            # row whatever the caller's isolation level, and its shared lock keeps a takeover,
            # force_release or purge from changing the row until the caller's transaction
            # ends
            return f"SELECT token FROM {t}\nWHERE {self.guard_where(n)}\nLOCK IN SHARE MODE"

        def renew_after_guard(n: int) -> str:
            # as release_many, but live or not: a lease that ran out while a guarded
            # transaction held the row was taken by nobody (a key taken since has another
            # owner or token). A retry changes the rows again (a later expiry): idempotent
            return (
                f"UPDATE {t} SET expires_at = {NOW} + INTERVAL %(ttl_us)s MICROSECOND "
                f"WHERE {_holds_of_owner(n)}"
            )

        #: n -> owner k0.. t0.. -> the token of each of owner's live holds, share-locked
        self.guard = functools.cache(guard)
        #: n -> owner key_i token_i ttl_us -> the rows changed where owner's hold of key_i
        #: with token_i, its lease run out or not, was extended ttl_us from now
        self.renew_after_guard = functools.cache(renew_after_guard)
        # -> (host name, port, data directory, database) of the connection's server: with
        # the lock table's database, the store's identity (MysqlStore.guard_identity)
        self.identity = "SELECT @@hostname, @@port, @@datadir, DATABASE()"

    def _inspection(self, t: str, meta: str) -> None:
        """info, list_holds, force_release, purge."""
        cols = "lock_key, owner, token, acquired_at, expires_at, kind"
        held = f"owner IS NOT NULL AND expires_at > {NOW}"
        self.info = f"SELECT {cols} FROM {t} WHERE lock_key = %s AND {held}"
        self.list_by_prefix = (
            f"SELECT {cols} FROM {t} WHERE {held} AND LEFT(lock_key, %s) = %s ORDER BY lock_key"
        )
        self.list_all = f"SELECT {cols} FROM {t} WHERE {held} ORDER BY lock_key"
        self.owner_token = f"SELECT owner, token, note FROM {t} WHERE lock_key = %(key)s"
        self.force_release = (
            f"UPDATE {t} SET owner = NULL, expires_at = {NOW} WHERE lock_key = %s AND {held}"
        )
        gone = (
            f"expires_at <= {NOW} - INTERVAL %s MICROSECOND AND (kind <> 'once' OR "
            f"(%s AND state IN ('succeeded', 'failed'))) AND {self.no_live_holders(t)}"
        )
        self.highest_purged_token = f"SELECT COALESCE(MAX(token), 0) FROM {t} WHERE {gone}"
        self.remember_purged_tokens = f"UPDATE {meta} SET hwm = GREATEST(hwm, %s) WHERE id = 1"
        self.purge = f"DELETE FROM {t} WHERE {gone} AND token <= %s"
        # the purge's scan does not leave gap locks on rows it does not delete
        self.purge_isolation = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"

    def _fair_queue(self) -> None:
        """FairQueue's look at the queue and the lock (probe)."""
        # key owner -> probe's (free, waiters ahead), microseconds left of the lease, whether
        # owner holds it, and whether a lock_many waiter is ahead of owner
        self.look = (
            f"{self.probe},\n    (SELECT TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at) "
            f"FROM {self.main} WHERE lock_key = %(key)s AND owner IS NOT NULL "
            f"AND expires_at > {NOW}),\n"
            f"    EXISTS (SELECT 1 FROM {self.main} WHERE lock_key = %(key)s "
            f"AND owner = %(owner)s AND expires_at > {NOW}),\n"
            f"    EXISTS (SELECT 1 FROM {self.holders} w WHERE {self.waiter_ahead} "
            f"AND {MANY_AHEAD})"
        )

    def _shared_holds(self) -> None:
        """Shared holds: the next token inside the parent-locking transaction."""
        next_token = self._token_after
        # key -> the key's next token, as insert id (inside the parent-locking transaction)
        self.next_token = (
            f"UPDATE {self.main} SET token = LAST_INSERT_ID({next_token('token')}) "
            "WHERE lock_key = %s"
        )

    def _build_hand_over(self, t: str, holders: str, next_token: str) -> None:
        """The statements of the hand-over: a release that gives the lock to the waiter its
        doorbell wakes, the queue entries that let it find that waiter, and what waiters read."""
        # key owner kind ttl lease bell -> make or refresh a queue entry (a refresh keeps its
        # place); a waiter with a ``lease`` (seconds) takes hand-overs, told by the doorbell it
        # waits at on connection ``bell`` (its id)
        self.enqueue = (
            f"INSERT INTO {holders} (lock_key, holder, kind, waiting, token, acquired_at,\n"
            "    expires_at, lease, bell)\n"
            f"VALUES (%(key)s, %(owner)s, %(kind)s, 1, 0, {NOW},\n"
            f"    {NOW} + INTERVAL %(ttl_us)s MICROSECOND, %(lease)s, %(bell)s)\n"
            "ON DUPLICATE KEY UPDATE kind = VALUES(kind), token = 0,\n"
            "    expires_at = VALUES(expires_at), lease = VALUES(lease), bell = VALUES(bell),\n"
            "    acquired_at = IF(waiting = 1, acquired_at, VALUES(acquired_at)), waiting = 1"
        )
        # key owner ttl bell -> one row if owner's live queue entry was still there (never made
        # again: an entry a hand-over removed must stay gone)
        self.requeue = (
            f"UPDATE {holders} SET expires_at = {NOW} + INTERVAL %(ttl_us)s MICROSECOND, "
            "bell = COALESCE(%(bell)s, bell) "
            f"WHERE lock_key = %(key)s AND holder = %(owner)s AND waiting = 1 "
            f"AND expires_at > {NOW}"
        )
        live = (
            f"lock_key = %(key)s AND owner = %(owner)s AND token = %(token)s AND expires_at > {NOW}"
        )
        # key owner token -> 1 row changed if the live hold was ended (freed, not handed over)
        self.release = f"UPDATE {t} SET owner = NULL, expires_at = {NOW} WHERE {live}"

        def release_many(n: int) -> str:
            return (
                f"UPDATE {t} SET owner = NULL, expires_at = {NOW} "
                f"WHERE {_holds_of_owner(n)} AND expires_at > {NOW}"
            )

        #: n -> the rows changed where owner's live holds of %(key_i)s with %(token_i)s ended
        self.release_many = functools.cache(release_many)
        # key owner token bell slack_us -> one transaction, sent as one packet, whose UPDATE
        # (statement _HANDED) changes one row if the live hold was ended (handed over or freed). It
        # locks the lock's row, takes the key's gate (see doorbell.py), then lets go of the bell:
        # the server gives the bell to the waiter that asked for it first, at once, and that
        # waiter's pass through the gate waits for this commit to be on disk (InnoDB lets other
        # sessions read a commit, and releases its row locks, before it writes the log: a hand-over
        # read sooner could be undone by a server crash, and its token issued again); its wake-up
        # overlaps the rest of the transaction. The lock goes to that waiter, found by its bell's
        # connection id (IS_USED_LOCK; ids are compared in 32 bits, as the connection handshake
        # gives them), if it has a live queue entry that takes hand-overs and no live entry ahead of
        # it waited slack_us or longer (a waiter whose GET_LOCK ran out asks again behind those that
        # asked after it: the bell's order is not always the queue's; among waiters that all waited
        # less than the slack the bell's order decides, see doorbell.py) or is a lock_many waiter's
        # (MANY_AHEAD: it is at no bell, whatever its age), and the gate was had: the
        # next token, and a lease of its own, but no longer than its queue entry's (a waiter that
        # died or froze holds it up no longer than its place in the queue would); its entry goes.
        # `note` keeps the token that handed it over, for a retried release, and tells a waiter at
        # the bell that the holder was handed the lock (so it waits for the bell). Otherwise the
        # lock is freed. The SELECTs aggregate so that they always set their variables, even where
        # no row matches. The gate is let go of after the COMMIT, which returns once on disk.
        given = "@dblock_h IS NOT NULL"
        slack = "INTERVAL %(slack_us)s MICROSECOND"  # Bells.slack_us: ARRIVAL_SLACK, or less
        gate = gate_sql("bell")
        self.let_go_gate = f"DO RELEASE_LOCK({gate})"
        # bell -> lets go of the key's bell (a hold that kept it, freed without a hand-over:
        # ManyKeys' release_many), which wakes the next waiter at it
        self.let_go_bell = "DO RELEASE_LOCK(%(bell)s)"
        self.release_and_hand_over = (
            "START TRANSACTION;\n"
            "SELECT COALESCE(MAX(IF(kind = 'lock', 2, 1)), 0) INTO @dblock_r\n"
            f"FROM {t} WHERE {live} FOR UPDATE;\n"
            f"SELECT GET_LOCK({gate}, 0) INTO @dblock_g;\n"
            "DO RELEASE_LOCK(%(bell)s);\n"
            "SELECT MAX(holder), MAX(LEAST("
            f"{NOW} + INTERVAL ROUND(lease * 1000000) MICROSECOND, expires_at))\n"
            f"INTO @dblock_h, @dblock_until FROM {holders} h WHERE @dblock_r = 2 AND\n"
            "    @dblock_g = 1 AND lock_key = %(key)s AND waiting = 1 AND kind = 'lock' AND\n"
            f"    lease IS NOT NULL AND holder <> %(owner)s AND expires_at > {NOW} AND\n"
            "    bell = IS_USED_LOCK(%(bell)s) & 4294967295 AND NOT EXISTS (\n"
            f"        SELECT 1 FROM {holders} w WHERE {self.live_waiter}\n"
            "        AND (w.acquired_at, w.holder) < (h.acquired_at, h.holder)\n"
            f"        AND (w.acquired_at < {NOW} - {slack} OR {MANY_AHEAD})) FOR UPDATE;\n"
            f"UPDATE {t} SET owner = @dblock_h,\n"
            f"    token = IF({given}, {next_token}, token),\n"
            f"    acquired_at = IF({given}, {NOW}, acquired_at),\n"
            f"    expires_at = COALESCE(@dblock_until, {NOW}),\n"
            f"    note = IF({given}, %(token)s, NULL)\n"
            "WHERE @dblock_r > 0 AND lock_key = %(key)s;\n"
            f"DELETE FROM {holders} WHERE lock_key = %(key)s AND holder = @dblock_h\n"
            "    AND waiting = 1;\n"
            "COMMIT;\n" + self.let_go_gate
        )
        # key owner -> the token of owner's live plain-lock hold (a waiter leaving the queue
        # finds whether a release handed the lock to it)
        self.handed_to = (
            f"SELECT token FROM {t} WHERE lock_key = %(key)s AND owner = %(owner)s "
            f"AND kind = 'lock' AND expires_at > {NOW}"
        )
        # key owner -> (1, token) if owner holds the lock, (0, handed) if another does: handed
        # is 1 if a release handed it to that one; no row if it is free. A locking read: it
        # waits for a release that is committing, and reads what it committed (a waiter asks
        # it after the gate, which also waits for that commit to be on disk).
        # key owner slack_us -> at the bell: (1, token) if the lock was handed to owner; (0, 1)
        # if it was handed to another, or it is free but a waiter ahead of owner in the queue
        # has waited slack_us or longer (both: the bell is passed on); (0, 0) if it is held, or
        # free but a lock_many waiter is ahead of owner (which takes it without the bell: owner
        # keeps the bell and looks again); no row if it is free.
        # A third column: the live waiters ahead of owner (in the second part, those that
        # waited slack_us or longer), for a waiter that passes the bell on to pace its return.
        held_row = f"lock_key = %(key)s AND owner IS NOT NULL AND expires_at > {NOW}"
        ahead = f"(SELECT count(*) FROM {holders} w WHERE {self.waiter_ahead})"
        self.granted = (
            f"(SELECT owner = %(owner)s, IF(owner = %(owner)s, token, note IS NOT NULL), "
            f"{ahead} FROM {t} WHERE {held_row} LOCK IN SHARE MODE) UNION ALL (SELECT 0, "
            f"MIN(COALESCE(w.bell, -1) <> {MANY_BELL}), COUNT(*) FROM {holders} w WHERE "
            f"NOT EXISTS (SELECT 1 FROM {t} WHERE {held_row}) AND {self.waiter_ahead} AND "
            f"(w.acquired_at < {NOW} - {slack} OR {MANY_AHEAD}) HAVING COUNT(*) > 0)"
        )

    def create_sequence(self, start: int) -> str:
        """The token sequence, starting at ``start`` (MariaDB)."""
        return f"CREATE SEQUENCE IF NOT EXISTS {self.seq} START WITH {int(start)}"

    def push_sequence(self, token: int) -> str:
        """Make the sequence's next value exceed ``token`` (SETVAL takes literals only; it
        leaves a sequence that is already past it alone)."""
        return f"SELECT SETVAL({self.seq}, {int(token)})"

    def before_fenced_grants(self, top: int) -> list[str]:
        """Before FencedManyGrants' transaction of grants up to ``top``: the sequence pushed
        past it, as before one fenced grant (a session token drawn from it then exceeds
        every granted token)."""
        return [self.push_sequence(top)] if self.sequence else []

    def _build_sessions(self, t: str, meta: str, sessions: str) -> None:
        """Session holds (ttl=None): GET_LOCK on a connection set aside for the hold; see
        session.py. Each statement is a transaction of its own (autocommit);
        user variables carry results from one to the next within the packet."""
        # A sequence's values are not durable: after a crash it restarts from what the log
        # had on disk, and a value handed out from a cache refilled since comes again. So a
        # session token is handed out only below a mark, in meta row 2, of how far the
        # sequence had reserved (next_not_cached_value) when a commit that waits for the disk,
        # and so writes every refill before it, was made (make_durable). Marks only grow, and
        # a value below one comes from a refill made before it: on disk. A client keeps the
        # highest mark it knows to be on disk and reads the table's only for a value past it;
        # a value past the table's mark too makes a new one (once per cache, 1000 values).
        # InnoDB shows a commit before it is on disk: a mark read is trusted once the gate (a
        # GET_LOCK its writer holds until its commit has returned) is seen free or passed.
        reserved = f"SELECT next_not_cached_value FROM {self.seq}"
        # key owner sname -> if the key's row is free, a row of the sessions table saying who
        # holds it (info, list) with the token: the sequence's next value, or the row's next
        # if that is higher. Its read of the key's row is a locking one (an INSERT ... SELECT
        # under REPEATABLE READ), so it waits for a lease being taken or released, and reads
        # what that committed. Granted: 1 or 2 rows affected, and the insert id is twice the
        # token, plus 1 if the token came from the row, not the sequence (which must then be
        # pushed past it). (A row's token is at most 2^62, a quorum's token too.)
        look = (
            f"INSERT INTO {sessions} (lock_key, lock_name, conn, owner, token, acquired_at)\n"
            "SELECT r.lock_key, %(sname)s, CONNECTION_ID(), %(owner)s, LAST_INSERT_ID(\n"
            f"    2 * GREATEST(@dblock_v := NEXTVAL({self.seq}), @dblock_t := r.token + 1)\n"
            f"    + (@dblock_t > @dblock_v)) DIV 2, {NOW}\n"
            f"FROM {t} r WHERE @dblock_s = 1 AND r.lock_key = %(key)s AND r.expires_at <= {NOW}\n"
            "LOCK IN SHARE MODE\n"
            "ON DUPLICATE KEY UPDATE lock_name = VALUES(lock_name), conn = VALUES(conn),\n"
            "    owner = VALUES(owner), token = VALUES(token), acquired_at = VALUES(acquired_at)"
        )
        # key -> why a grant was not made: 0 the lock was not had, 1 the key has no row, 2 a
        # lease holds it
        self.session_status = (
            "SELECT IF(@dblock_s = 1,\n"
            f"    IF(EXISTS (SELECT 1 FROM {t} WHERE lock_key = %(key)s), 2, 1), 0)"
        )
        # gate -> (the table's mark, 1 if it is on disk)
        self.session_mark = (
            f"SELECT COALESCE(MAX(hwm), 0), IS_FREE_LOCK(%(gate)s) = 1\n"
            f"    OR IF(GET_LOCK(%(gate)s, 5) = 1, RELEASE_LOCK(%(gate)s), 0) FROM {meta} "
            "WHERE id = 2"
        )
        # -> how far the sequence has reserved
        self.sequence_reserved = reserved
        # gate n -> marks the sequence durable up to n, with a commit that waits for the disk
        # (and so writes the sequence's refills before it), holding the gate until it has
        self.make_durable = (
            "SELECT GET_LOCK(%(gate)s, 10);\n"
            f"INSERT INTO {meta} (id, hwm) VALUES (2, %(n)s)\n"
            "ON DUPLICATE KEY UPDATE hwm = GREATEST(hwm, VALUES(hwm));\n"
            "DO RELEASE_LOCK(%(gate)s)"
        )
        # key owner sname -> the look again, the lock in hand
        self.session_look = look
        # the look, prepared once per session connection (PREPARED_LOOK): the server then
        # skips parsing it at every grant, about a tenth of the grant's cost there
        order = re.findall(r"%\((\w+)\)s", look)
        self.session_look_text = re.sub(r"%\((\w+)\)s", "?", look)
        using = ", ".join(f"%({name})s" for name in order)
        # sname s key owner -> waits up to `s` s in the server's queue for the key's GET_LOCK
        # (the queue is first come, first served); then the look above, prepared (on a
        # session connection)
        self.session_grant = (
            "SELECT GET_LOCK(%(sname)s, %(s)s) INTO @dblock_s;\n"
            f"EXECUTE {PREPARED_LOOK} USING {using}"
        )
        # key owner sname -> the key had no row: a free one is made (which waits for a row
        # being inserted by a lease, and a lease that comes later finds it, and the session,
        # when it locks it), then the look again, with the lock still held. Its token is the
        # purged tokens' mark: none was issued above it for the key.
        self.session_grant_new_row = (
            f"INSERT INTO {t} (lock_key, kind, owner, token, acquired_at, expires_at)\n"
            f"SELECT %(key)s, 'lock', NULL, m.hwm, {NOW}, {NOW} FROM {meta} m\n"
            "WHERE m.id = 1 AND @dblock_s = 1 ON DUPLICATE KEY UPDATE lock_key = lock_key;\n"
            f"{look}"
        )
        # sname -> gives the lock back (a lease held the key)
        self.session_unlock = "SELECT RELEASE_LOCK(%(sname)s)"
        # sname -> ends the hold: matches one row if it was still held. Its row in the sessions
        # table stays (a row whose lock is free is no hold) until the key's next grant
        # replaces it, or session_purge deletes it. A hold's statements answer by the rows
        # they match (an OK packet), not by a result set, which costs the client more to read
        self.session_release = "SELECT 1 FROM DUAL WHERE RELEASE_LOCK(%(sname)s) = 1 INTO @dblock_r"
        # sname -> matches one row while this connection holds the lock
        self.session_alive = (
            "SELECT 1 FROM DUAL WHERE IS_USED_LOCK(%(sname)s) = CONNECTION_ID() INTO @dblock_r"
        )
        cols = f"lock_key, owner, token, acquired_at, NULL, 'session' FROM {sessions}"
        current = "IS_USED_LOCK(lock_name) = conn"
        # key -> the key's session hold, as (key, owner, token, acquired_at, None, 'session')
        self.session_info = f"SELECT {cols} WHERE lock_key = %(key)s AND {current}"
        # [prefix] -> every session hold (of the keys `prefix` starts)
        self.session_list = f"SELECT {cols} WHERE {current}"
        self.session_list_by_prefix = f"{self.session_list} AND {self.prefix_match}"
        # sname -> the connection that holds the key's session lock (NULL: none)
        self.session_holder = "SELECT IS_USED_LOCK(%(sname)s)"
        # -> forget the rows of holders that died (their locks are free or another's)
        self.session_purge = f"DELETE FROM {sessions} WHERE NOT ({current} <=> 1)"

    forever = f"'{FOREVER}'"

    def value_key_of(self, column: str) -> str:
        # SHA2() hashes the column's utf8mb4 bytes: the UTF-8 that value_key hashes
        return f"CONCAT(CHAR(31 USING utf8mb4), SHA2({column}, 256))"

    def _proclaim(self, hold: str) -> str:
        """The same as the other dialects' (see HolderStatements._proclaim), without
        RETURNING: the affected rows say 1 if the row was made, and the insert id is the
        token wherever it was replaced, changed or not (an update that changes nothing
        counts no row). ON DUPLICATE KEY UPDATE has no WHERE: each assignment keeps the row
        as it was unless it is a value row of this token or an earlier one; ``token`` comes
        last, as the others test it. A locking read of the hold (an INSERT ... SELECT under
        REPEATABLE READ) keeps it live until the statement commits."""
        t = self.main
        ours = f"{t}.kind = 'value' AND {t}.token <= VALUES(token)"
        return (
            f"INSERT INTO {t} (lock_key, kind, owner, token, acquired_at, expires_at, note)\n"
            f"SELECT %(vkey)s, 'value', NULL, l.token, l.acquired_at, {self.forever}, "
            f"%(value)s\nFROM {t} l WHERE {hold}\n"
            "ON DUPLICATE KEY UPDATE\n"
            f"    note = IF({ours}, VALUES(note), {t}.note),\n"
            f"    acquired_at = IF({ours}, VALUES(acquired_at), {t}.acquired_at),\n"
            f"    token = IF({ours}, LAST_INSERT_ID(VALUES(token)), {t}.token)"
        )

    def later(self, name: str) -> str:
        return f"{NOW} + INTERVAL %({name}_us)s MICROSECOND"

    def earlier(self, name: str) -> str:
        return f"{NOW} - INTERVAL %({name}_us)s MICROSECOND"
