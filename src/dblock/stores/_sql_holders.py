"""Multi-holder primitives on the SQL stores: semaphores, read-write locks, wait queues.

They live in ``<table>_holders`` (one row per hold or queue entry, each with its own lease)
beside the lock table, whose row for the same key is the *parent*: every decision that reads
several rows (how many permits are taken, is a writer waiting) runs in a short transaction that
first locks the parent row, so concurrent acquirers of one key are serialised there, and the
parent's token counter issues the fencing tokens (PostgreSQL: the token sequence).

Kinds on one key: a plain lock, a write lock, a once-record and a scheduled run hold the parent
row itself and exclude each other; read holds share with read holds, semaphore permits with
permits, and each excludes every other kind. While shared holds are live, the parent row is
ownerless with ``expires_at`` covering the longest of their leases, so every statement that
takes the parent (which takes only an expired row) waits for them without reading this table:
the parent-locking transactions of shared holds keep that cover up to date.

Queue entries (``waiting = 1``) are ordered by when they were made, on the database clock; a
waiter refreshes its entry while it waits, so a waiter that died or paused drops out of the
queue when its entry's lease ends.

A lease hold's value (LeaderValues) is a row of its own in the main table, beside the key's
(whose ``note`` remembers hand-overs and once-outcomes): lock_key :func:`value_key`, kind
``value``, no owner and a lease that never ends (so no take, info, list or force-release sees a
hold there), the token of the hold that proclaimed it and the value in ``note``. A read joins it
to the key's live hold on the token, so a value never outlives its hold's term; purge deletes
it once its key has no row that purge keeps.

The SQL here (:class:`HolderStatements`) is written once with ``%(name)s`` parameters over a
few dialect hooks; each dialect's statements class (``stores/<dialect>/statements.py``) extends it.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from .._contract import Leading
from .._types import LockInfo
from ._pool import MAINTENANCE_DEADLINE, PooledStore

C = TypeVar("C")
_NAMED = re.compile(r"%\((\w+)\)s")


#: the end of a value row's lease, UTC: past every lease a hold can have
FOREVER = "9999-12-31 23:59:59"


def value_key(key: str) -> str:
    """The lock_key of ``key``'s value row: a control character and the key's SHA-256 (which
    PostgreSQL and MySQL compute too), which no key a person picks looks like and which fits
    every dialect's key column (MySQL's holds 255 characters: a prefix added to a
    255-character key would not fit)."""
    return "\x1f" + hashlib.sha256(key.encode()).hexdigest()


def colon_style(sql: str) -> str:
    """``sql`` with its ``%(name)s`` parameters written as ``:name`` (SQLite's, and
    SQLAlchemy's ``text()``)."""
    return _NAMED.sub(r":\1", sql)


class HolderStatements(ABC):
    """The statements on the holders table and the parent rows, over dialect hooks.

    Each attribute is one statement (or, where named so, a fragment of one) with ``%(name)s``
    parameters; the dialect supplies the clock, durations and the statements that differ.
    """

    #: appended to reads of the holders table inside the transaction (MySQL: locking read)
    locking_read = ""

    # -- supplied by the dialect ------------------------------------------------------------
    #: inserts a free parent row for %(key)s if there is none
    ensure_parent: str
    #: locks the parent row: one row (owner, live) of %(key)s
    lock_parent: str
    #: inserts or refreshes a holder row; on conflict a queue entry keeps its place
    upsert_holder: str
    #: true when lock_key starts with %(prefix)s of length %(n)s
    prefix_match: str
    #: (owner, token) of the row of %(key)s
    owner_token: str
    #: key owner token state -> 1 row if the once-outcome was recorded and the hold ended
    finish_once: str
    #: key owner token least -> 1 row if the hold ended, or is kept until `least` s after start
    finish_scheduled: str

    def guard_where(self, n: int) -> str:
        """``lock.guard``'s condition (CommitGuards.guard_sql): the rows of %(owner)s's live
        holds of the ``n`` keys %(k0)s.. with their tokens %(t0)s.., live as ``renew`` tests
        it; point ranges of the primary key, so only these rows are read (and locked)."""
        pairs = " OR ".join(f"(lock_key = %(k{i})s AND token = %(t{i})s)" for i in range(n))
        return f"owner = %(owner)s AND expires_at > {self.now} AND ({pairs})"

    #: SQL: a value row's ``expires_at`` (FOREVER in the dialect's type)
    forever: str

    @abstractmethod
    def value_key_of(self, column: str) -> str:
        """SQL: :func:`value_key` of the key in ``column`` (for purge, which has no key)."""

    @abstractmethod
    def later(self, name: str) -> str:
        """SQL for ``now + <seconds parameter name>``."""

    @abstractmethod
    def earlier(self, name: str) -> str:
        """SQL for ``now - <seconds parameter name>``."""

    def __init__(self, main: str, holders: str, now: str) -> None:
        #: quoted table names
        self.main = main
        self.holders = holders
        #: the server clock expression
        self.now = now
        # the end of the longest live shared lease of %(key)s, else now
        self.cover = (
            f"coalesce((SELECT max(h.expires_at) FROM {self.holders} h WHERE h.lock_key = "
            f"%(key)s AND h.waiting = 0 AND h.expires_at > {self.now}), {self.now})"
        )
        # after shared holds of %(key)s changed: the ownerless parent's lease covers the live
        # ones again
        self.recover_cover = (
            f"UPDATE {self.main} SET expires_at = {self.cover} "
            "WHERE lock_key = %(key)s AND owner IS NULL"
        )

        # -- shared holds: read locks and semaphore permits
        live = f"lock_key = %(key)s AND expires_at > {self.now}"
        # another kind holds %(key)s, or a writer or plain lock waits for it (it goes first,
        # so that shared holders do not starve it)
        self.count_shared_blockers = self.count_holders(
            f"{live} AND ((waiting = 0 AND kind <> %(kind)s) OR "
            "(waiting = 1 AND kind IN ('write', 'lock')))"
        )
        # the permits of %(key)s that others than %(owner)s hold
        self.count_permits_taken = self.count_holders(
            f"{live} AND kind = %(kind)s AND waiting = 0 AND holder <> %(owner)s"
        )
        # the parent, free or expired, becomes ownerless and covers the new shared lease
        self.share_parent = (
            f"UPDATE {self.main} SET owner = NULL, token = %(token)s, "
            f"expires_at = {self.cover} WHERE lock_key = %(key)s"
        )
        mine = "lock_key = %(key)s AND holder = %(owner)s AND token = %(token)s AND waiting = 0"
        # key owner token -> 1 row if the live shared hold was ended
        self.end_shared_hold = (
            f"DELETE FROM {self.holders} WHERE {mine} AND expires_at > {self.now}"
        )
        self.count_shared_hold = self.count_holders(mine)
        # key owner token ttl -> 1 row if the live shared hold was extended
        self.renew_shared_hold = (
            f"UPDATE {self.holders} SET expires_at = {self.later('ttl')} WHERE lock_key = "
            "%(key)s AND holder = %(owner)s AND token = %(token)s AND waiting = 0 AND "
            f"expires_at > {self.now}"
        )

        # -- write locks
        # readers or semaphore permits hold %(key)s
        self.count_shared_holds = self.count_holders(f"{live} AND waiting = 0")
        # key owner token ttl -> 1 row if the parent was taken; a once-record is never taken
        # by a lock: it would be erased
        self.take_parent_as_writer = (
            f"UPDATE {self.main} SET kind = 'write', owner = %(owner)s, "
            f"token = %(token)s, acquired_at = {self.now}, "
            f"expires_at = {self.later('ttl')}, state = NULL, note = NULL "
            "WHERE lock_key = %(key)s AND kind <> 'once'"
        )

        # -- wait queues
        # key owner -> removes owner's queue entry
        self.dequeue = (
            f"DELETE FROM {self.holders} WHERE lock_key = %(key)s AND holder = %(owner)s "
            "AND waiting = 1"
        )
        # fragment on alias ``w``: a live entry in the lock queue of %(key)s
        self.live_waiter = self._live_waiter("w.lock_key = %(key)s")
        # fragment on alias ``w``: a live waiter of %(key)s ahead of %(owner)s in the lock
        # queue. Queue order is when an entry was made (database clock), then the holder. A
        # waiter without an entry (a newcomer) has everyone ahead of it.
        self.waiter_ahead = self._ahead(self.live_waiter, "%(key)s")
        # fragment: no live waiter of the key is ahead of %(owner)s
        self.nobody_ahead = f"NOT EXISTS (SELECT 1 FROM {self.holders} w WHERE {self.waiter_ahead})"
        # fragment: the same for a newcomer (no queue entry of its own): the key's queue is
        # empty. One index probe instead of three: the uncontended acquire runs it every time.
        self.nobody_queued = f"NOT EXISTS (SELECT 1 FROM {self.holders} w WHERE {self.live_waiter})"
        # key owner -> (the lock of key is free, live waiters ahead of owner)
        self.probe = (
            f"SELECT NOT EXISTS (SELECT 1 FROM {self.main} WHERE lock_key = %(key)s AND "
            f"expires_at > {self.now}), "  # held, or covering shared holds (no owner)
            f"(SELECT count(*) FROM {self.holders} w WHERE {self.waiter_ahead})"
        )

        # -- inspection and maintenance
        # key -> the live shared holds of key that a force-release ends
        self.force_shared_holds = (
            f"DELETE FROM {self.holders} WHERE lock_key = %(key)s AND waiting = 0 "
            f"AND expires_at > {self.now}"
        )
        # older -> holder rows and queue entries that ended more than `older` s ago
        self.purge_holders = (
            f"DELETE FROM {self.holders} WHERE expires_at <= {self.earlier('older')}"
        )
        self._leader_values()

    def _leader_values(self) -> None:
        """LeaderValues' statements (a value row: see the module)."""
        t = self.main
        # key vkey -> the live exclusive lease hold of key (live_holds' columns), whether its
        # holder proclaimed a value in it, and the value: a value row of another token (an
        # earlier term's) is not joined
        self.leader = (
            "SELECT l.lock_key, l.owner, l.token, l.acquired_at, l.expires_at, l.kind,\n"
            f"    v.token IS NOT NULL, v.note\nFROM {t} l LEFT JOIN {t} v ON v.lock_key = "
            "%(vkey)s AND v.kind = 'value' AND v.token = l.token\n"
            f"WHERE l.lock_key = %(key)s AND l.kind = 'lock' AND l.owner IS NOT NULL "
            f"AND l.expires_at > {self.now}"
        )
        self.proclaim = self._proclaim(
            "l.lock_key = %(key)s AND l.owner = %(owner)s AND l.token = %(token)s "
            f"AND l.kind = 'lock' AND l.expires_at > {self.now}"
        )
        # older -> deletes the value rows whose key has no row that purge keeps (live, or
        # ended `older` s ago or less): no read can show them again, since a hold of the key
        # that reads its value must have that value's token and be live. The kept keys are
        # hashed once each, in a derived table (MySQL's DELETE may not read its own table in
        # a plain subquery).
        self.purge_values = (
            f"DELETE FROM {t} WHERE kind = 'value' AND lock_key NOT IN (SELECT vk FROM (\n"
            f"    SELECT {self.value_key_of('k.lock_key')} AS vk FROM {t} k\n"
            f"    WHERE k.kind <> 'value' AND k.expires_at > {self.earlier('older')}) kept)"
        )

    def _proclaim(self, hold: str) -> str:
        """key vkey owner token value -> a row if the value row of owner's live hold (key,
        token), the row ``hold`` on alias ``l``, was written: made, or replaced with this
        value (an earlier term's value or this one's). A later term's is never replaced (a
        statement whose read of the hold came before the hold ended), nor a row of another
        kind. No row, nothing written, if the hold is not live. ``acquired_at`` is the
        term's start."""
        t = self.main
        return (
            f"INSERT INTO {t} AS v (lock_key, kind, owner, token, acquired_at, expires_at, "
            "note)\n"
            f"SELECT %(vkey)s, 'value', NULL, l.token, l.acquired_at, {self.forever}, "
            f"%(value)s\nFROM {t} l WHERE {hold}\n"
            "ON CONFLICT (lock_key) DO UPDATE SET token = EXCLUDED.token,\n"
            "    acquired_at = EXCLUDED.acquired_at, note = EXCLUDED.note\n"
            "WHERE v.kind = 'value' AND v.token <= EXCLUDED.token\n"
            "RETURNING token"
        )

    def _live_waiter(self, keys: str) -> str:
        """Fragment on alias ``w``: a live entry in the lock queue of the keys ``keys`` (a
        condition on ``w.lock_key``) selects."""
        return f"{keys} AND w.waiting = 1 AND w.kind = 'lock' AND w.expires_at > {self.now}"

    def _ahead(self, live: str, key_sql: str) -> str:
        """Fragment on alias ``w``: a ``live`` waiter ahead of %(owner)s in the lock queue of
        ``key_sql`` (the key of ``w``)."""
        own_entry = (
            f"FROM {self.holders} q WHERE q.lock_key = {key_sql} AND q.holder = %(owner)s "
            "AND q.waiting = 1"
        )
        return (
            f"{live} AND w.holder <> %(owner)s "
            f"AND (NOT EXISTS (SELECT 1 {own_entry}) OR "
            f"(w.acquired_at, w.holder) < (SELECT q.acquired_at, q.holder {own_entry}))"
        )

    # -- a waiter for several keys (FairManyKeys): each statement covers all its keys, given
    # as the parameters %(k0)s, %(k1)s, ... (stores/_sql_ops.py, many_params)
    @staticmethod
    def key_list(n: int) -> str:
        """SQL: the ``n`` keys' parameters, a list for ``IN (...)``."""
        return ", ".join(f"%(k{i})s" for i in range(n))

    @staticmethod
    def key_rows(n: int) -> str:
        """SQL: a query of the ``n`` keys, one row each (column ``k``), in their order."""
        return " UNION ALL ".join(f"SELECT %(k{i})s{' AS k' if i == 0 else ''}" for i in range(n))

    @abstractmethod
    def enqueue_many(self, n: int) -> list[str]:
        """owner ttl k0.. -> the statements (run in order, in one transaction) that make or
        replace %(owner)s's entries in the lock queues of the ``n`` keys, each of one
        ``acquired_at``: the clock read once, by the one statement that writes them all."""

    def requeue_many(self, n: int) -> list[str]:
        """owner ttl k0.. -> statements (in one transaction), the last of which extends
        %(owner)s's live entries in the ``n`` keys' queues, keeping their place (its row
        count: how many were live)."""
        return [
            f"UPDATE {self.holders} SET expires_at = {self.later('ttl')} WHERE lock_key IN "
            f"({self.key_list(n)}) AND holder = %(owner)s AND waiting = 1 "
            f"AND expires_at > {self.now}"
        ]

    def dequeue_many(self, n: int) -> str:
        """owner k0.. -> removes %(owner)s's entries from the ``n`` keys' queues."""
        return (
            f"DELETE FROM {self.holders} WHERE lock_key IN ({self.key_list(n)}) "
            "AND holder = %(owner)s AND waiting = 1"
        )

    def blocked_many(self, n: int) -> str:
        """owner k0.. -> how many live waiters are ahead of %(owner)s in the queue of a key of
        the ``n`` that %(owner)s does not hold (a key it holds is its own already: a retry
        after a lost reply). A plain read: the takes that follow lock the rows."""
        live = self._live_waiter(f"w.lock_key IN ({self.key_list(n)})")
        return (
            f"SELECT count(*) FROM {self.holders} w WHERE {self._ahead(live, 'w.lock_key')} "
            f"AND NOT EXISTS (SELECT 1 FROM {self.main} m WHERE m.lock_key = w.lock_key "
            f"AND m.owner = %(owner)s AND m.expires_at > {self.now})"
        )

    def count_holders(self, where: str) -> str:
        """The holder rows for which ``where`` is true, counted (inside the parent-locking
        transaction: a locking read where the dialect needs one)."""
        return f"SELECT count(*) FROM {self.holders} WHERE {where}{self.locking_read}"

    def head(self, key_sql: str, *, besides: str = "") -> str:
        """SQL: the holder at the head of ``key_sql``'s lock queue (NULL if none)."""
        return (
            f"(SELECT holder FROM {self.holders} WHERE lock_key = {key_sql} AND waiting = 1 "
            f"AND kind = 'lock' AND expires_at > {self.now}{besides} "
            "ORDER BY acquired_at, holder LIMIT 1)"
        )

    def live_holds(self, *, by_key: bool = False, by_prefix: bool = False) -> str:
        """Live holds in the holders table: (key, owner, token, acquired_at, expires_at, kind),
        of %(key)s, or of the keys %(prefix)s (of length %(n)s) starts, or all."""
        sql = (
            "SELECT lock_key, holder, token, acquired_at, expires_at, kind FROM "
            f"{self.holders} WHERE waiting = 0 AND expires_at > {self.now}"
        )
        if by_key:
            sql += " AND lock_key = %(key)s"
        elif by_prefix:
            sql += f" AND {self.prefix_match}"
        return sql + " ORDER BY lock_key, acquired_at, holder"

    def waiting(self, *, by_prefix: bool = False) -> str:
        """Live queue entries, shaped as live_holds' rows (token 0), of the keys %(prefix)s
        (of length %(n)s) starts, or all; by key and place in the queue."""
        sql = (
            "SELECT lock_key, holder, 0, acquired_at, expires_at, kind FROM "
            f"{self.holders} WHERE waiting = 1 AND expires_at > {self.now}"
        )
        if by_prefix:
            sql += f" AND {self.prefix_match}"
        return sql + " ORDER BY lock_key, acquired_at, holder"

    def no_live_holders(self, main_alias: str) -> str:
        """SQL: the main-table row ``main_alias`` has no live holder rows (keep its parent)."""
        return (
            f"NOT EXISTS (SELECT 1 FROM {self.holders} h WHERE h.lock_key = "
            f"{main_alias}.lock_key AND h.expires_at > {self.now})"
        )


class HoldersMixin(PooledStore[C], Generic[C]):
    """Generic semaphore / rwlock / queue operations, and a hold's value, over dialect
    hooks."""

    sql: HolderStatements

    @staticmethod
    @abstractmethod
    def _row_info(row: Any) -> LockInfo:
        """A (key, owner, token, acquired_at, expires_at, kind) row as the dialect returns it."""

    def waiters(self, prefix: str) -> list[LockInfo]:
        params: dict[str, Any] = {"n": len(prefix), "prefix": prefix} if prefix else {}
        sql = self.sql.waiting(by_prefix=bool(prefix))
        rows = self.run(
            "list", lambda conn: self._exec(conn, sql, params)[1], deadline=MAINTENANCE_DEADLINE
        )
        return [self._row_info(row) for row in rows]

    @abstractmethod
    def _exec(self, conn: C, sql: str, params: dict[str, Any]) -> tuple[int, list[Any]]:
        """Run one statement with ``%(name)s`` parameters; (rowcount, fetched rows)."""

    @abstractmethod
    @contextmanager
    def _transaction(self, conn: C) -> Iterator[None]:
        """A transaction that serialises on the parent row locked inside it."""

    @abstractmethod
    def _next_token(self, conn: C, key: str) -> int:
        """A new fencing token for ``key`` (inside the parent-locking transaction)."""

    def _notify(self, conn: C, key: str) -> None:
        """Wake waiters of ``key`` (where the backend pushes releases)."""

    def _announce_force(self, conn: C, key: str) -> None:
        """Tell the holders of ``key``'s live shared holds that they are being force-released
        (where the backend can push it to them)."""

    # -- helpers --------------------------------------------------------------------------
    def _count(self, conn: C, sql: str, params: dict[str, Any]) -> int:
        return int(self._exec(conn, sql, params)[1][0][0])

    def _recover(self, conn: C, key: str) -> None:
        """After shared holds of ``key`` changed (inside the parent-locking transaction):
        make the ownerless parent's lease cover the live ones again."""
        self._exec(conn, self.sql.recover_cover, {"key": key})

    def _parent(self, conn: C, key: str) -> tuple[str | None, bool]:
        self._exec(conn, self.sql.ensure_parent, {"key": key})
        owner, live = self._exec(conn, self.sql.lock_parent, {"key": key})[1][0]
        return owner, bool(live)

    # -- ending a hold with an outcome (once, scheduled) -----------------------------------
    def _finish(self, what: str, sql: str, params: dict[str, Any]) -> bool:
        """Run a statement that ends (owner, token)'s hold; after a retry, ours-and-gone is done."""
        calls = 0

        def op(conn: C) -> bool:
            nonlocal calls
            calls += 1
            if self._exec(conn, sql, params)[0] == 1:
                return True
            rows = self._exec(conn, self.sql.owner_token, {"key": params["key"]})[1]
            if rows and (rows[0][0], rows[0][1]) == (params["owner"], params["token"]):
                # MySQL counts changed rows, not matched ones: a hold kept as it was (a
                # scheduled job whose at_least equals its at_most) is still ours
                return True
            return calls > 1 and bool(rows) and rows[0][1] == params["token"]

        return self.run(what, op, key=params["key"])

    def finish_once(self, key: str, owner: str, token: int, state: str) -> bool:
        params = {"key": key, "owner": owner, "token": token, "state": state}
        return self._finish("recording the once outcome", self.sql.finish_once, params)

    def finish_scheduled(self, key: str, owner: str, token: int, at_least: float) -> bool:
        params = {"key": key, "owner": owner, "token": token, "least": at_least}
        return self._finish("release", self.sql.finish_scheduled, params)

    # -- LeaderValues (the store declares it): a hold's value row (see the module) ---------
    def proclaim(self, key: str, owner: str, token: int, value: str | None) -> bool:
        params = {
            "key": key,
            "vkey": value_key(key),
            "owner": owner,
            "token": token,
            "value": value,
        }
        return self.run("proclaim", lambda conn: self._proclaimed(conn, params), key=key)

    def _proclaimed(self, conn: C, params: dict[str, Any]) -> bool:
        """Run ``proclaim``'s statement: was the value written? (A row returned; MySQL, which
        returns none, tells it otherwise.)"""
        return bool(self._exec(conn, self.sql.proclaim, params)[1])

    def leader(self, key: str) -> Leading | None:
        params = {"key": key, "vkey": value_key(key)}
        rows = self.run(
            "reading the leader", lambda conn: self._exec(conn, self.sql.leader, params)[1], key=key
        )
        if not rows:
            return None
        row = rows[0]
        return Leading(self._row_info(row[:6]), bool(row[6]), row[7])

    def _purge_values(self, conn: C, older_than: float) -> int:
        """Delete the value rows no read can show again (inside purge, after its rows)."""
        return self._exec(conn, self.sql.purge_values, {"older": older_than})[0]

    # -- shared holds: read locks and semaphore permits -----------------------------------
    def acquire_shared(
        self, key: str, owner: str, ttl: float, kind: str, permits: int | None
    ) -> int | None:
        """Take a read hold (``permits`` None) or one of ``permits`` semaphore permits."""
        params = {"key": key, "owner": owner, "kind": kind, "ttl": ttl}
        sql = self.sql

        def op(conn: C) -> int | None:
            with self._transaction(conn):
                _, held = self._parent(conn, key)
                if held:
                    return None  # a writer, a plain lock, a once or scheduled run holds it
                if self._count(conn, sql.count_shared_blockers, params):
                    return None  # another kind holds it, or a writer waits for it
                if (
                    permits is not None
                    and self._count(conn, sql.count_permits_taken, params) >= permits
                ):
                    return None
                token = self._next_token(conn, key)
                self._exec(conn, sql.upsert_holder, {**params, "token": token, "waiting": 0})
                self._exec(conn, sql.share_parent, {"key": key, "token": token})
                return token

        return self.run("acquire", op, key=key)

    def release_shared(self, key: str, owner: str, token: int) -> bool:
        """End a live shared hold; False if its lease was already gone."""
        params = {"key": key, "owner": owner, "token": token}
        sql = self.sql
        calls = 0

        def op(conn: C) -> bool:
            nonlocal calls
            calls += 1
            with self._transaction(conn):
                self._exec(conn, sql.lock_parent, {"key": key})
                if self._exec(conn, sql.end_shared_hold, params)[0] == 1:
                    self._recover(conn, key)
                    self._notify(conn, key)
                    return True
            # after a retry the first attempt may have committed: gone is then success
            return calls > 1 and not self._count(conn, sql.count_shared_hold, params)

        return self.run("release", op, key=key)

    def renew_shared(self, key: str, owner: str, token: int, ttl: float) -> bool:
        params = {"key": key, "owner": owner, "token": token, "ttl": ttl}
        sql = self.sql

        def op(conn: C) -> bool:
            with self._transaction(conn):
                self._exec(conn, sql.lock_parent, {"key": key})
                if self._exec(conn, sql.renew_shared_hold, params)[0] != 1:
                    return False
                self._recover(conn, key)
                return True

        return self.run("renew", op, key=key)

    # -- write locks ----------------------------------------------------------------------
    def acquire_write(self, key: str, owner: str, ttl: float) -> int | None:
        """Take the parent row as a writer when no reader holds the key."""
        params = {"key": key, "owner": owner, "ttl": ttl}
        sql = self.sql

        def op(conn: C) -> int | None:
            with self._transaction(conn):
                holder, held = self._parent(conn, key)
                if held and holder != owner:
                    return None
                if self._count(conn, sql.count_shared_holds, params):
                    return None  # readers or semaphore permits hold it
                token = self._next_token(conn, key)
                taken, _ = self._exec(conn, sql.take_parent_as_writer, {**params, "token": token})
                if not taken:
                    return None  # a once-record is never taken by a lock: it would be erased
                self._exec(conn, sql.dequeue, params)
                return token

        return self.run("acquire", op, key=key)

    # -- wait queues ----------------------------------------------------------------------
    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        """Make or refresh ``owner``'s queue entry for ``key`` (a refresh keeps its place).
        ``lease`` is for backends that hand locks over; here nobody does."""
        params = {"key": key, "owner": owner, "kind": kind, "ttl": ttl, "token": 0, "waiting": 1}
        self.run("queueing", lambda conn: self._exec(conn, self.sql.upsert_holder, params), key=key)

    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        """Refresh ``owner``'s queue entry. Without hand-overs an entry may simply be made
        again, keeping its place if it is still there."""
        self.enqueue(key, owner, kind, ttl)
        return True

    def dequeue(self, key: str, owner: str) -> None:
        params = {"key": key, "owner": owner}
        self.run(
            "leaving the queue", lambda conn: self._exec(conn, self.sql.dequeue, params), key=key
        )

    def probe(self, key: str, owner: str) -> tuple[bool, int]:
        """(the lock of ``key`` is free, how many live waiters are ahead of ``owner``).

        A read-only statement: waiters that are not told whose turn it is ask this before
        they try, and poll more often the closer they are to the head of the queue.
        """
        sql = self.sql.probe
        row = self.run(
            "probe", lambda conn: self._exec(conn, sql, {"key": key, "owner": owner}), key=key
        )[1][0]
        return bool(row[0]), int(row[1])

    # -- inspection and maintenance of holder rows ----------------------------------------
    def _holder_rows(self, conn: C, key: str | None = None, prefix: str = "") -> list[Any]:
        """Live holds in the holders table: (key, owner, token, acquired_at, expires_at, kind)."""
        params: dict[str, Any] = {}
        if key is not None:
            params["key"] = key
        elif prefix:
            params.update(n=len(prefix), prefix=prefix)
        sql = self.sql.live_holds(by_key=key is not None, by_prefix=bool(prefix))
        return self._exec(conn, sql, params)[1]

    def _force_holders(self, conn: C, key: str) -> int:
        with self._transaction(conn):
            self._exec(conn, self.sql.lock_parent, {"key": key})
            self._announce_force(conn, key)
            freed = self._exec(conn, self.sql.force_shared_holds, {"key": key})[0]
            if freed:
                self._recover(conn, key)
                self._notify(conn, key)
        return freed

    def _purge_holders(self, conn: C, older_than: float) -> int:
        return self._exec(conn, self.sql.purge_holders, {"older": older_than})[0]
