"""Multi-holder primitives on the SQL backends: semaphores, read-write locks, wait queues.

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

The SQL here is written once with ``%(name)s`` parameters and a few dialect hooks.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from .base import SqlBackend

C = TypeVar("C")
_NAMED = re.compile(r"%\((\w+)\)s")
Rows = list[Any]  # a name for backends whose method `list` shadows the builtin


class HoldersMixin(SqlBackend[C], Generic[C]):
    """Generic semaphore / rwlock / queue operations over dialect hooks."""

    #: quoted table names
    _main: str
    _holders: str
    #: the server clock expression
    _now: str

    @abstractmethod
    def _later(self, name: str) -> str:
        """SQL for ``now + <seconds parameter name>``."""

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

    #: (owner, token) of the row of %(key)s
    _owner_token: str
    #: key owner token state -> 1 row if the once-outcome was recorded and the hold ended
    _finish_once: str
    #: key owner token least -> 1 row if the hold ended, or is kept until `least` s after start
    _finish_least: str

    #: inserts a free parent row for %(key)s if there is none
    _ensure_parent: str
    #: locks the parent row: one row (owner, live) of %(key)s
    _lock_parent: str
    #: inserts or refreshes a holder row; on conflict a queue entry keeps its place
    _upsert_holder: str
    #: appended to reads of the holders table inside the transaction (MySQL: locking read)
    _locking_read = ""

    def _notify(self, conn: C, key: str) -> None:
        """Wake waiters of ``key`` (where the backend pushes releases)."""

    def _announce_force(self, conn: C, key: str) -> None:
        """Tell the holders of ``key``'s live shared holds that they are being force-released
        (where the backend can push it to them)."""

    # -- helpers --------------------------------------------------------------------------
    def _count(self, conn: C, where: str, params: dict[str, Any]) -> int:
        sql = f"SELECT count(*) FROM {self._holders} WHERE {where}{self._locking_read}"
        return int(self._exec(conn, sql, params)[1][0][0])

    @property
    def _cover(self) -> str:
        """SQL: the end of the longest live shared lease of %(key)s, else now."""
        return (
            f"coalesce((SELECT max(h.expires_at) FROM {self._holders} h WHERE h.lock_key = "
            f"%(key)s AND h.waiting = 0 AND h.expires_at > {self._now}), {self._now})"
        )

    def _recover(self, conn: C, key: str) -> None:
        """After shared holds of ``key`` changed (inside the parent-locking transaction):
        make the ownerless parent's lease cover the live ones again."""
        self._exec(
            conn,
            f"UPDATE {self._main} SET expires_at = {self._cover} "
            "WHERE lock_key = %(key)s AND owner IS NULL",
            {"key": key},
        )

    def _parent(self, conn: C, key: str) -> tuple[str | None, bool]:
        self._exec(conn, self._ensure_parent, {"key": key})
        owner, live = self._exec(conn, self._lock_parent, {"key": key})[1][0]
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
            rows = self._exec(conn, self._owner_token, {"key": params["key"]})[1]
            if rows and (rows[0][0], rows[0][1]) == (params["owner"], params["token"]):
                # MySQL counts changed rows, not matched ones: a hold kept as it was (a
                # scheduled job whose at_least equals its at_most) is still ours
                return True
            return calls > 1 and bool(rows) and rows[0][1] == params["token"]

        return self.run(what, op, key=params["key"])

    def finish_once(self, key: str, owner: str, token: int, state: str) -> bool:
        params = {"key": key, "owner": owner, "token": token, "state": state}
        return self._finish("recording the once outcome", self._finish_once, params)

    def finish_scheduled(self, key: str, owner: str, token: int, at_least: float) -> bool:
        params = {"key": key, "owner": owner, "token": token, "least": at_least}
        return self._finish("release", self._finish_least, params)

    # -- shared holds: read locks and semaphore permits -----------------------------------
    def acquire_shared(
        self, key: str, owner: str, ttl: float, kind: str, permits: int | None
    ) -> int | None:
        """Take a read hold (``permits`` None) or one of ``permits`` semaphore permits."""
        params = {"key": key, "owner": owner, "kind": kind, "ttl": ttl}
        live = f"lock_key = %(key)s AND expires_at > {self._now}"

        def op(conn: C) -> int | None:
            with self._transaction(conn):
                _, held = self._parent(conn, key)
                if held:
                    return None  # a writer, a plain lock, a once or scheduled run holds it
                other = (
                    f"{live} AND ((waiting = 0 AND kind <> %(kind)s) OR "
                    "(waiting = 1 AND kind IN ('write', 'lock')))"
                )
                if self._count(conn, other, params):
                    # another kind holds it, or a writer or plain lock waits for it: it goes
                    # first, so that shared holders do not starve it
                    return None
                if permits is not None:
                    taken = self._count(
                        conn,
                        f"{live} AND kind = %(kind)s AND waiting = 0 AND holder <> %(owner)s",
                        params,
                    )
                    if taken >= permits:
                        return None
                token = self._next_token(conn, key)
                self._exec(conn, self._upsert_holder, {**params, "token": token, "waiting": 0})
                # the parent, free or expired, becomes ownerless and covers this lease
                self._exec(
                    conn,
                    f"UPDATE {self._main} SET owner = NULL, token = %(token)s, "
                    f"expires_at = {self._cover} WHERE lock_key = %(key)s",
                    {"key": key, "token": token},
                )
                return token

        return self.run("acquire", op, key=key)

    def release_shared(self, key: str, owner: str, token: int) -> bool:
        """End a live shared hold; False if its lease was already gone."""
        params = {"key": key, "owner": owner, "token": token}
        mine = "lock_key = %(key)s AND holder = %(owner)s AND token = %(token)s AND waiting = 0"
        calls = 0

        def op(conn: C) -> bool:
            nonlocal calls
            calls += 1
            sql = f"DELETE FROM {self._holders} WHERE {mine} AND expires_at > {self._now}"
            with self._transaction(conn):
                self._exec(conn, self._lock_parent, {"key": key})
                if self._exec(conn, sql, params)[0] == 1:
                    self._recover(conn, key)
                    self._notify(conn, key)
                    return True
            # after a retry the first attempt may have committed: gone is then success
            return calls > 1 and not self._count(conn, mine, params)

        return self.run("release", op, key=key)

    def renew_shared(self, key: str, owner: str, token: int, ttl: float) -> bool:
        params = {"key": key, "owner": owner, "token": token, "ttl": ttl}
        sql = (
            f"UPDATE {self._holders} SET expires_at = {self._later('ttl')} WHERE lock_key = "
            "%(key)s AND holder = %(owner)s AND token = %(token)s AND waiting = 0 AND "
            f"expires_at > {self._now}"
        )

        def op(conn: C) -> bool:
            with self._transaction(conn):
                self._exec(conn, self._lock_parent, {"key": key})
                if self._exec(conn, sql, params)[0] != 1:
                    return False
                self._recover(conn, key)
                return True

        return self.run("renew", op, key=key)

    # -- write locks ----------------------------------------------------------------------
    def acquire_write(self, key: str, owner: str, ttl: float) -> int | None:
        """Take the parent row as a writer when no reader holds the key."""
        params = {"key": key, "owner": owner, "ttl": ttl}

        def op(conn: C) -> int | None:
            with self._transaction(conn):
                holder, held = self._parent(conn, key)
                if held and holder != owner:
                    return None
                live = f"lock_key = %(key)s AND expires_at > {self._now}"
                if self._count(conn, f"{live} AND waiting = 0", params):
                    return None  # readers or semaphore permits hold it
                token = self._next_token(conn, key)
                taken, _ = self._exec(
                    conn,
                    f"UPDATE {self._main} SET kind = 'write', owner = %(owner)s, "
                    f"token = %(token)s, acquired_at = {self._now}, "
                    f"expires_at = {self._later('ttl')}, state = NULL, note = NULL "
                    "WHERE lock_key = %(key)s AND kind <> 'once'",
                    {**params, "token": token},
                )
                if not taken:
                    return None  # a once-record is never taken by a lock: it would be erased
                self._exec(conn, self._dequeue_sql, params)
                return token

        return self.run("acquire", op, key=key)

    # -- wait queues ----------------------------------------------------------------------
    @property
    def _dequeue_sql(self) -> str:
        return (
            f"DELETE FROM {self._holders} WHERE lock_key = %(key)s AND holder = %(owner)s "
            "AND waiting = 1"
        )

    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        """Make or refresh ``owner``'s queue entry for ``key`` (a refresh keeps its place).
        ``lease`` is for backends that hand locks over; here nobody does."""
        params = {"key": key, "owner": owner, "kind": kind, "ttl": ttl, "token": 0, "waiting": 1}
        self.run("queueing", lambda conn: self._exec(conn, self._upsert_holder, params), key=key)

    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        """Refresh ``owner``'s queue entry. Without hand-overs an entry may simply be made
        again, keeping its place if it is still there."""
        self.enqueue(key, owner, kind, ttl)
        return True

    def dequeue(self, key: str, owner: str) -> None:
        params = {"key": key, "owner": owner}
        self.run(
            "leaving the queue", lambda conn: self._exec(conn, self._dequeue_sql, params), key=key
        )

    def _head(self, key_sql: str, *, besides: str = "") -> str:
        """SQL: the holder at the head of ``key_sql``'s lock queue (NULL if none)."""
        return (
            f"(SELECT holder FROM {self._holders} WHERE lock_key = {key_sql} AND waiting = 1 "
            f"AND kind = 'lock' AND expires_at > {self._now}{besides} "
            "ORDER BY acquired_at, holder LIMIT 1)"
        )

    def probe(self, key: str, owner: str) -> tuple[bool, int]:
        """(the lock of ``key`` is free, how many live waiters are ahead of ``owner``).

        A read-only statement: waiters that are not told whose turn it is ask this before
        they try, and poll more often the closer they are to the head of the queue.
        """
        sql = self._probe_sql
        row = self.run(
            "probe", lambda conn: self._exec(conn, sql, {"key": key, "owner": owner}), key=key
        )[1][0]
        return bool(row[0]), int(row[1])

    @property
    def _probe_sql(self) -> str:
        """key owner -> (the lock of key is free, live waiters ahead of owner)."""
        return (
            f"SELECT NOT EXISTS (SELECT 1 FROM {self._main} WHERE lock_key = %(key)s AND "
            f"expires_at > {self._now}), "  # held, or covering shared holds (no owner)
            f"(SELECT count(*) FROM {self._holders} w WHERE {self._ahead})"
        )

    @property
    def _ahead(self) -> str:
        """SQL on alias ``w``: a live waiter of %(key)s ahead of %(owner)s in the lock queue.

        Queue order is when an entry was made (database clock), then the holder. A waiter
        without an entry (a newcomer) has everyone ahead of it.
        """
        mine = (
            f"FROM {self._holders} q WHERE q.lock_key = %(key)s AND q.holder = %(owner)s "
            "AND q.waiting = 1"
        )
        return (
            f"{self._live_waiter} AND w.holder <> %(owner)s "
            f"AND (NOT EXISTS (SELECT 1 {mine}) OR "
            f"(w.acquired_at, w.holder) < (SELECT q.acquired_at, q.holder {mine}))"
        )

    @property
    def _queue_clause(self) -> str:
        """SQL that is true when no live waiter of the key is ahead of ``%(owner)s``."""
        return f"NOT EXISTS (SELECT 1 FROM {self._holders} w WHERE {self._ahead})"

    @property
    def _nobody_queued(self) -> str:
        """The same for a newcomer (no queue entry of its own): the key's queue is empty.
        One index probe instead of three: the uncontended acquire runs it every time."""
        return f"NOT EXISTS (SELECT 1 FROM {self._holders} w WHERE {self._live_waiter})"

    @property
    def _live_waiter(self) -> str:
        """SQL on alias ``w``: a live entry in the lock queue of %(key)s."""
        return (
            f"w.lock_key = %(key)s AND w.waiting = 1 AND w.kind = 'lock' "
            f"AND w.expires_at > {self._now}"
        )

    def _sqlite_style(self, sql: str) -> str:
        return _NAMED.sub(r":\1", sql)

    # -- inspection and maintenance of holder rows ----------------------------------------
    @abstractmethod
    def _earlier(self, name: str) -> str:
        """SQL for ``now - <seconds parameter name>``."""

    def _holder_rows(self, conn: C, key: str | None = None, prefix: str = "") -> list[Any]:
        """Live holds in the holders table: (key, owner, token, acquired_at, expires_at, kind)."""
        sql = (
            "SELECT lock_key, holder, token, acquired_at, expires_at, kind FROM "
            f"{self._holders} WHERE waiting = 0 AND expires_at > {self._now}"
        )
        params: dict[str, Any] = {}
        if key is not None:
            sql += " AND lock_key = %(key)s"
            params["key"] = key
        elif prefix:
            sql += f" AND {self._prefix_match}"
            params.update(n=len(prefix), prefix=prefix)
        return self._exec(conn, sql + " ORDER BY lock_key, acquired_at, holder", params)[1]

    #: true when lock_key starts with %(prefix)s of length %(n)s
    _prefix_match: str

    def _force_holders(self, conn: C, key: str) -> int:
        sql = (
            f"DELETE FROM {self._holders} WHERE lock_key = %(key)s AND waiting = 0 "
            f"AND expires_at > {self._now}"
        )
        with self._transaction(conn):
            self._exec(conn, self._lock_parent, {"key": key})
            self._announce_force(conn, key)
            freed = self._exec(conn, sql, {"key": key})[0]
            if freed:
                self._recover(conn, key)
                self._notify(conn, key)
        return freed

    def _purge_holders(self, conn: C, older_than: float) -> int:
        sql = f"DELETE FROM {self._holders} WHERE expires_at <= {self._earlier('older')}"
        return self._exec(conn, sql, {"older": older_than})[0]

    def _no_live_holders(self, main_alias: str) -> str:
        """SQL: the main-table row ``main_alias`` has no live holder rows (keep its parent)."""
        return (
            f"NOT EXISTS (SELECT 1 FROM {self._holders} h WHERE h.lock_key = "
            f"{main_alias}.lock_key AND h.expires_at > {self._now})"
        )
