"""SQLite's statements: named parameters ``:name`` (the shared holder statements keep
``%(name)s``, turned into ``:name`` when run); time in Unix seconds on SQLite's clock."""

from __future__ import annotations

from collections.abc import Callable

from .._names import aux_name, qualify
from .._sql_holders import FOREVER, colon_style
from .._sql_ops import OperationStatements

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
#: the SQL function purge registers on its connection for value_key_of (SQLite has no SHA-256)
VALUE_KEY_FUNCTION = "dblock_value_key"


class SqliteStatements(OperationStatements):
    """Every statement of the SQLite store, for one lock table."""

    def __init__(self, schema: str | None, table: str) -> None:
        t = qualify(schema, table, '"')
        meta = qualify(schema, aux_name(table, "_meta"), '"')
        holders = qualify(schema, aux_name(table, "_holders"), '"')
        super().__init__(t, holders, NOW)

        # -- schema
        self.create_main_table = (
            f"CREATE TABLE IF NOT EXISTS {t} (\n"
            "    lock_key    TEXT    NOT NULL PRIMARY KEY,\n"
            "    kind        TEXT    NOT NULL DEFAULT 'lock',\n"
            "    owner       TEXT,\n"
            "    token       INTEGER NOT NULL,\n"
            "    acquired_at REAL    NOT NULL,  -- Unix seconds, SQLite's clock\n"
            "    expires_at  REAL    NOT NULL,\n"
            "    state       TEXT,\n"
            "    note        TEXT\n"
            ") WITHOUT ROWID"
        )
        self.create_meta_table = (
            f"CREATE TABLE IF NOT EXISTS {meta} (\n"
            "    id  INTEGER NOT NULL PRIMARY KEY,\n"
            "    hwm INTEGER NOT NULL  -- highest fencing token ever purged\n"
            ")"
        )
        self.seed_meta = f"INSERT OR IGNORE INTO {meta} (id, hwm) VALUES (1, 0)"
        self.create_holders_table = (
            f"CREATE TABLE IF NOT EXISTS {holders} (\n"
            "    lock_key    TEXT    NOT NULL,\n"
            "    holder      TEXT    NOT NULL,  -- the owner of a hold or queue entry\n"
            "    kind        TEXT    NOT NULL,\n"
            "    waiting     INTEGER NOT NULL DEFAULT 0,  -- 1: a queue entry, not a hold\n"
            "    token       INTEGER NOT NULL,\n"
            "    acquired_at REAL    NOT NULL,\n"
            "    expires_at  REAL    NOT NULL,\n"
            "    PRIMARY KEY (lock_key, holder)\n"
            ") WITHOUT ROWID"
        )
        self.ddl = [
            self.create_main_table,
            self.create_meta_table,
            self.seed_meta,
            self.create_holders_table,
        ]
        # t m h -> (table, column) of every table of the schema that exists (see
        # MysqlStatements.find_tables for why all of them)
        where = f'"{schema}".' if schema else ""
        self.find_tables = (
            f"SELECT m.name, c.name FROM {where}sqlite_master m, pragma_table_info(m.name"
            f"{f', {schema!r}' if schema else ''}) c WHERE m.type IN ('table', 'view') "
            "AND m.name IN (:t, :m, :h)"
        )
        #: find_tables' parameters
        self.table_names = {
            "t": table,
            "m": aux_name(table, "_meta"),
            "h": aux_name(table, "_holders"),
        }

        # -- hooks of the shared holder statements
        self.ensure_parent = (
            f"INSERT INTO {t} (lock_key, kind, owner, token, acquired_at, expires_at)\n"
            f"SELECT %(key)s, 'lock', NULL, hwm + 1, {NOW}, {NOW} FROM {meta} WHERE id = 1\n"
            "ON CONFLICT (lock_key) DO NOTHING"
        )
        # no row lock in SQLite: the transaction's write lock serialises everything
        self.lock_parent = (
            f"SELECT owner, owner IS NOT NULL AND expires_at > {NOW} FROM {t} "
            "WHERE lock_key = %(key)s"
        )
        self.upsert_holder = (
            f"INSERT INTO {holders} AS x (lock_key, holder, kind, waiting, token, acquired_at,\n"
            "    expires_at)\n"
            "VALUES (%(key)s, %(owner)s, %(kind)s, %(waiting)s, %(token)s,\n"
            f"    {NOW}, {NOW} + %(ttl)s)\n"
            "ON CONFLICT (lock_key, holder) DO UPDATE SET kind = excluded.kind,\n"
            "    token = excluded.token, expires_at = excluded.expires_at,\n"
            "    acquired_at = CASE WHEN x.waiting = 1 AND excluded.waiting = 1\n"
            "        THEN x.acquired_at ELSE excluded.acquired_at END,\n"
            "    waiting = excluded.waiting"
        )
        self.prefix_match = "substr(lock_key, 1, %(n)s) = %(prefix)s"
        # key -> the key's next token (inside the parent-locking transaction)
        self.next_token = f"UPDATE {t} SET token = token + 1 WHERE lock_key = :key RETURNING token"

        # -- locks
        self.meta = meta
        #: several keys' statements, built once per count of keys (see acquire_many)
        self._many: dict[tuple[str, int], str] = {}
        self.acquire = self._acquire_sql()
        # The fairness clause is tested once, in the SELECT: the statement reads and writes
        # one snapshot (SQLite refuses to write on a stale one), so ON CONFLICT would not
        # learn anything new from it.
        # the same, when nobody waits (a newcomer has no queue entry of its own)
        self.acquire_as_newcomer = self._acquire_sql(colon_style(self.nobody_queued))
        # the same, when no live waiter is ahead of :owner
        self.acquire_in_turn = self._acquire_sql(colon_style(self.nobody_ahead))
        live = f"lock_key = :key AND owner = :owner AND token = :token AND expires_at > {NOW}"
        # :key :owner :token -> 1 row changed if the hold was live and is now ended
        self.release = f"UPDATE {t} SET owner = NULL, expires_at = {NOW} WHERE {live}"
        # :key :owner :token :ttl -> 1 row changed if the hold was live and is extended
        self.renew = f"UPDATE {t} SET expires_at = {NOW} + :ttl WHERE {live}"
        self.owner_token = f"SELECT owner, token FROM {t} WHERE lock_key = :key"

        # -- fenced grants (FencedGrants, for a quorum: docs/stores/quorum.md)
        # :key -> the key's fence: its row's token, or the highest purged token if higher,
        # floored by SQLite's clock (the host's that holds the file) in microseconds, whole
        # milliseconds (julianday's precision): well above a grant's +1 per round trip
        self.fence = (
            f"SELECT max(coalesce((SELECT token FROM {t} WHERE lock_key = :key), 0), hwm, "
            f"CAST({NOW} * 1000000 AS INTEGER)) FROM {meta} WHERE id = 1"
        )
        # :key :kind :owner :ttl :token -> one row if granted with the token :token: free or
        # expired (or :owner's own) and fenced below :token; or already :owner's with :token
        self.grant_fenced = (
            f"INSERT INTO {t} AS l (lock_key, kind, owner, token, acquired_at, expires_at)\n"
            f"SELECT :key, :kind, :owner, :token, {NOW}, {NOW} + :ttl FROM {meta}\n"
            "WHERE id = 1 AND hwm < :token\n"
            "ON CONFLICT (lock_key) DO UPDATE SET kind = excluded.kind,\n"
            "    owner = excluded.owner, token = excluded.token,\n"
            "    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at,\n"
            "    state = NULL, note = NULL\n"
            f"WHERE (l.token < excluded.token AND ((l.expires_at <= {NOW} AND l.kind <> 'once')\n"
            "    OR l.owner = excluded.owner))\n"
            "    OR (l.owner = excluded.owner AND l.token = excluded.token)\n"
            "RETURNING token"
        )
        self.grant_fenced_steps = (self.grant_fenced,)
        # :key :owner -> 1 row changed if :owner's live hold (any token) was ended
        self.release_owned = (
            f"UPDATE {t} SET owner = NULL, expires_at = {NOW} "
            f"WHERE lock_key = :key AND owner = :owner AND expires_at > {NOW}"
        )

        # -- once-records
        # :key :owner :ttl :note -> one row (the token) if the once-record was claimed: absent,
        # failed, or processing with an expired lease (its holder crashed)
        self.claim_once = (
            f"INSERT INTO {t} AS l (lock_key, kind, owner, token, acquired_at, expires_at, state, "
            "note)\n"
            f"SELECT :key, 'once', :owner, hwm + 1, {NOW}, {NOW} + :ttl, 'processing', :note "
            f"FROM {meta} WHERE id = 1\n"
            "ON CONFLICT (lock_key) DO UPDATE SET kind = 'once', owner = excluded.owner,\n"
            "    token = l.token + 1, acquired_at = excluded.acquired_at,\n"
            "    expires_at = excluded.expires_at, state = 'processing', note = excluded.note\n"
            f"WHERE (l.kind <> 'once' AND l.expires_at <= {NOW}) OR (l.kind = 'once' AND\n"
            f"    (l.state = 'failed' OR (l.state = 'processing' AND l.expires_at <= {NOW})))\n"
            "    OR l.owner = excluded.owner\n"
            "RETURNING token"
        )
        self.once_state = f"SELECT kind, state, expires_at > {NOW} FROM {t} WHERE lock_key = :key"
        mine = "lock_key = :key AND owner = :owner AND token = :token"
        # :key :owner :token :state -> 1 row if the outcome was recorded (and the hold ended)
        self.finish_once = (
            f"UPDATE {t} SET state = :state, owner = NULL, expires_at = {NOW} "
            f"WHERE {mine} AND kind = 'once'"
        )
        # :key :owner :token :least -> 1 row if ended, or kept until `least` s after the start
        self.finish_scheduled = (
            f"UPDATE {t} SET owner = CASE WHEN acquired_at + :least > {NOW} THEN owner END, "
            f"expires_at = max(acquired_at + :least, {NOW}) WHERE {mine}"
        )

        # -- inspection and maintenance
        cols = "lock_key, owner, token, acquired_at, expires_at, kind"
        held = f"owner IS NOT NULL AND expires_at > {NOW}"
        self.info = f"SELECT {cols} FROM {t} WHERE lock_key = :key AND {held}"
        self.list_by_prefix = (
            f"SELECT {cols} FROM {t} WHERE {held} AND substr(lock_key, 1, :n) = :prefix "
            "ORDER BY lock_key"
        )
        self.list_all = f"SELECT {cols} FROM {t} WHERE {held} ORDER BY lock_key"
        # :key -> 1 row changed if a live hold was ended
        self.force_release = (
            f"UPDATE {t} SET owner = NULL, expires_at = {NOW} WHERE lock_key = :key AND {held}"
        )
        gone = (
            f"expires_at <= {NOW} - :older AND (kind <> 'once' OR "
            f"(:inc AND state IN ('succeeded', 'failed'))) AND {self.no_live_holders(t)}"
        )
        # :older :inc -> remembers the highest token purge deletes, so none is issued again
        self.remember_purged_tokens = (
            f"UPDATE {meta} SET hwm = max(hwm, coalesce((SELECT max(token) FROM {t} "
            f"WHERE {gone}), 0)) WHERE id = 1"
        )
        self.purge = f"DELETE FROM {t} WHERE {gone}"

    def _acquire_sql(self, fair: str = "", n: int = 0) -> str:
        """:key :kind :owner :ttl -> one row (the new token) if taken, no row if held, when
        ``fair`` holds. A live row is taken only by its own owner (an idempotent retry); a
        `once` record is never taken by a plain lock.

        With ``n`` keys (:k0.. in place of :key, ``v.column1`` in ``fair``): a row (key, new
        token) for each key taken, each exactly as the one-key statement would take it."""
        t = self.main
        key, keys = (":key", "") if not n else ("v.column1", f"{_values(n, ':k{i}')} v, ")
        return (
            f"INSERT INTO {t} AS l (lock_key, kind, owner, token, acquired_at, expires_at)\n"
            f"SELECT {key}, :kind, :owner, hwm + 1, {NOW}, {NOW} + :ttl FROM {keys}{self.meta}\n"
            f"WHERE id = 1 {fair and 'AND ' + fair}\n"
            "ON CONFLICT (lock_key) DO UPDATE SET kind = excluded.kind,\n"
            "    owner = excluded.owner, token = l.token + 1,\n"
            "    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at,\n"
            "    state = NULL, note = NULL\n"
            f"WHERE (l.expires_at <= {NOW} AND l.kind <> 'once') OR l.owner = excluded.owner\n"
            f"RETURNING {'lock_key, ' if n else ''}token"
        )

    # -- several keys in one statement (ManyKeys): the keys are :k0, :k1, ... and, where each
    # has a token, :t0, :t1, ... One statement instead of one per key: SQLite's own work per
    # key is a few microseconds, a statement's round through the driver several more.
    def _built(self, name: str, n: int, build: Callable[[int], str]) -> str:
        sql = self._many.get((name, n))
        if sql is None:
            sql = self._many[name, n] = build(n)
        return sql

    def acquire_many(self, n: int) -> str:
        """k0.. :kind :owner :ttl -> (key, token) of each of the ``n`` keys taken as
        acquire_as_newcomer takes one (the caller's transaction rolls back unless all are)."""
        return self._built("acquire_many", n, self._acquire_many)

    def take_many(self, n: int) -> str:
        """k0.. :kind :owner :ttl -> (key, token) of each of the ``n`` keys taken as acquire
        takes one (the queues were looked at already: blocked_many)."""
        return self._built("take_many", n, self._take_many)

    def release_many(self, n: int) -> str:
        """k0.. t0.. :owner -> a row changed for each of the ``n`` holds that was live and is
        ended (as release ends one). No RETURNING: the count says enough, and costs less."""
        return self._built("release_many", n, self._release_many)

    def renew_many(self, n: int) -> str:
        """k0.. t0.. :owner :ttl -> a row changed for each of the ``n`` holds that was live and
        is extended (as renew extends one)."""
        return self._built("renew_many", n, self._renew_many)

    def _acquire_many(self, n: int) -> str:
        return self._acquire_sql(
            f"NOT EXISTS (SELECT 1 FROM {self.holders} w WHERE "
            f"{colon_style(self._live_waiter('w.lock_key = v.column1'))})",
            n,
        )

    def _take_many(self, n: int) -> str:
        return self._acquire_sql(n=n)

    def renew_after_guard(self, n: int) -> str:
        """k0.. t0.. :owner :ttl -> a row changed for each of the ``n`` rows that still names
        :owner and its token, live or not, now extended (CommitGuards.renew_after_guard)."""
        return self._built("renew_after_guard", n, self._renew_after_guard)

    def guard(self, n: int) -> str:
        """k0.. t0.. :owner -> a row changed for each of the ``n`` holds that is live (as renew
        tests it), changing nothing (CommitGuards.guard_sql, run in the caller's transaction).

        SQLite has no row locks: the no-op write makes the caller's transaction the file's
        one writer until it ends, so every other writer (a takeover, a force_release, a
        renewal) waits for it. In WAL mode a transaction that read first (a deferred BEGIN)
        may fail to upgrade to a writer (SQLITE_BUSY_SNAPSHOT, if another connection wrote
        since its read): the caller should guard first, or BEGIN IMMEDIATE."""
        return self._built("guard", n, self._guard)

    def _release_many(self, n: int) -> str:
        return self._holds_update(f"owner = NULL, expires_at = {NOW}", n)

    def _renew_many(self, n: int) -> str:
        return self._holds_update(f"expires_at = {NOW} + :ttl", n)

    def _renew_after_guard(self, n: int) -> str:
        return self._holds_update(f"expires_at = {NOW} + :ttl", n, live=False)

    def _guard(self, n: int) -> str:
        return colon_style(f"UPDATE {self.main} SET token = token\nWHERE {self.guard_where(n)}")

    def _holds_update(self, change: str, n: int, *, live: bool = True) -> str:
        """``change`` made to each of the ``n`` keys' holds of (:owner, its token), live ones
        only unless not ``live``. An IN list and a CASE, not UPDATE ... FROM (VALUES ...):
        SQLite runs them with less work (one primary-key probe per key either way)."""
        token = " ".join(f"WHEN :k{i} THEN :t{i}" for i in range(n))
        alive = f" AND expires_at > {NOW}" if live else ""
        return (
            f"UPDATE {self.main} SET {change}\n"
            f"WHERE lock_key IN ({colon_style(self.key_list(n))}) AND owner = :owner\n"
            f"    AND token = CASE lock_key {token} END{alive}"
        )

    def enqueue_many(self, n: int) -> list[str]:
        # one statement: SQLite's clock is fixed for the whole of it, so every entry gets
        # the same time (and the write lock serialises it with every other writer anyway)
        return [
            f"INSERT INTO {self.holders} AS x (lock_key, holder, kind, waiting, token,\n"
            "    acquired_at, expires_at)\n"
            f"SELECT k, %(owner)s, 'lock', 1, 0, {NOW}, {NOW} + %(ttl)s\n"
            f"FROM ({self.key_rows(n)}) WHERE true\n"  # WHERE: the upsert's parse needs it
            "ON CONFLICT (lock_key, holder) DO UPDATE SET kind = 'lock', waiting = 1,\n"
            "    token = 0, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at"
        ]

    forever = f"((julianday('{FOREVER}') - 2440587.5) * 86400.0)"

    def value_key_of(self, column: str) -> str:
        return f"{VALUE_KEY_FUNCTION}({column})"

    def later(self, name: str) -> str:
        return f"{NOW} + %({name})s"

    def earlier(self, name: str) -> str:
        return f"{NOW} - %({name})s"


def _values(n: int, row: str) -> str:
    """SQL: ``(VALUES (row), ...)`` of ``n`` rows, ``row`` formatted with i = 0 .. n - 1 (its
    columns are column1, column2, ...)."""
    return "(VALUES " + ", ".join(f"({row.format(i=i)})" for i in range(n)) + ")"
