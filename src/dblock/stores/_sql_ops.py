"""The lock operations that SQL stores whose statements take named parameters and answer with
``RETURNING`` rows (SQLite, PostgreSQL) write the same way: each one statement of the store's
``sql``, run by the pool. A store that inherits :class:`StatementOperations` (in place of
``HoldersMixin``) has a statements class of :class:`OperationStatements`; it declares the
capabilities these operations serve (FencedGrants, OnceRecords) on its own class line.

:class:`ManyKeyOperations` (which StatementOperations extends, and MySQL's store inherits in
place of ``HoldersMixin``) gives every SQL store ManyKeys: one transaction per operation, whose
statements each store writes over all its keys (``_take_all``, or its own ``acquire_many``);
the store declares ``ManyKeys``. With it come FairManyKeys' queue
entries, each operation one transaction too; the store declares ``FairManyKeys``."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Generic, Protocol, cast

from ._pool import C
from ._sql_holders import HoldersMixin, HolderStatements


class Busy(Exception):
    """A key of acquire_many is taken: the transaction is rolled back, nothing is held."""


class ManyKeyOperations(HoldersMixin[C], Generic[C]):
    """ManyKeys on a SQL store: each operation one transaction whose statements do to each
    key what the store's single-key statement would (so every hold it makes, extends or ends
    is exactly what ``acquire_fair``, ``renew`` and ``release`` would make of it), in the
    given (sorted) key order: two concurrent transactions lock the keys' rows in the same
    order, and a deadlock the server reports anyway is a transient failure the pool
    retries. A busy key rolls the whole transaction back. The store declares ``ManyKeys`` on
    its class line."""

    #: each key is one or two statements (round trips) inside a transaction that keeps every
    #: key's row locked until it commits: 64 keeps that transaction short (milliseconds)
    max_keys = 64

    # -- the dialect's single-key steps, inside the transaction -----------------------------
    def _end_hold(self, conn: C, key: str, owner: str, token: int) -> bool:
        """The release of (owner, token)'s hold of ``key``, its side effects included: ended?
        (A store that overrides _end_all need not give it.)"""
        raise NotImplementedError

    @abstractmethod
    def _ended_by(self, conn: C, key: str, owner: str, token: int) -> bool:
        """After a retry: the key's row shows that (owner, token) released it."""

    @abstractmethod
    def _extend_hold(self, conn: C, key: str, owner: str, token: int, ttl: float) -> bool:
        """The renewal of (owner, token)'s live hold of ``key``: extended?"""

    def _released_many(self, tokens: Mapping[str, int], owner: str) -> None:
        """After release_many's commit (where the store has more to do: MySQL's bells)."""

    @abstractmethod
    def _take_free(self, conn: C, key: str, owner: str, ttl: float) -> int | None:
        """The plain acquire of ``key`` (free, expired or ``owner``'s own, whoever queues):
        its token, or None. acquire_many_in_turn has looked at the queues already."""

    # -- ManyKeys ---------------------------------------------------------------------------
    def acquire_many(self, keys: Sequence[str], owner: str, ttl: float) -> dict[str, int] | None:
        def op(conn: C) -> dict[str, int] | None:
            try:
                with self._transaction(conn):
                    return self._take_all(conn, keys, owner, ttl)
            except Busy:
                return None

        return self.run("acquire", op, key=_first(keys))

    def _take_all(self, conn: C, keys: Sequence[str], owner: str, ttl: float) -> dict[str, int]:
        """A newcomer's take of every key (sorted: the row locks' order depends on it), each
        as acquire_fair(queued=False) would take it: each key's token; Busy if one is taken
        (inside the transaction). (A store that overrides acquire_many need not give it.)"""
        raise NotImplementedError

    def _extend_all(
        self, conn: C, keys: list[str], tokens: Mapping[str, int], owner: str, ttl: float
    ) -> list[bool]:
        """Each key's renewal (keys sorted), inside the transaction."""
        return [self._extend_hold(conn, k, owner, tokens[k], ttl) for k in keys]

    def _end_all(
        self, conn: C, keys: list[str], tokens: Mapping[str, int], owner: str
    ) -> list[bool]:
        """Each key's release (keys sorted), inside the transaction."""
        return [self._end_hold(conn, k, owner, tokens[k]) for k in keys]

    def renew_many(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        keys = sorted(tokens)

        def op(conn: C) -> bool:
            with self._transaction(conn):
                renewed = self._extend_all(conn, keys, tokens, owner, ttl)
            return all(renewed)

        return self.run("renew", op, key=_first(keys))

    def release_many(self, tokens: Mapping[str, int], owner: str) -> bool:
        keys = sorted(tokens)
        calls = 0

        def op(conn: C) -> bool:
            nonlocal calls
            calls += 1
            with self._transaction(conn):
                ended = dict(zip(keys, self._end_all(conn, keys, tokens, owner), strict=True))
            # after a retry the first attempt may have committed: released by us is success
            return all(
                done or (calls > 1 and self._ended_by(conn, k, owner, tokens[k]))
                for k, done in ended.items()
            )

        try:
            return self.run("release", op, key=_first(keys))
        finally:
            self._released_many(tokens, owner)

    # -- FairManyKeys: the queue entries of a waiter for several keys ---------------------
    # Each operation is one transaction over all the keys (the dialect's statements, see
    # HolderStatements.enqueue_many); the store declares ``FairManyKeys``. An entry is a
    # lock-queue entry like a single-key waiter's (kind 'lock', waiting = 1) without a lease
    # or doorbell: never handed a lock, it counts for newcomers and single-key waiters as any
    # entry does.
    def _queue_params(self, keys: Sequence[str], owner: str, ttl: float) -> dict[str, Any]:
        """enqueue_many's parameters (a store whose entries say more extends them)."""
        return many_params(keys, owner, ttl=ttl)

    def enqueue_many(self, keys: Sequence[str], owner: str, ttl: float) -> None:
        statements = self.sql.enqueue_many(len(keys))
        params = self._queue_params(sorted(keys), owner, ttl)

        def op(conn: C) -> None:
            with self._transaction(conn):
                for sql in statements:
                    self._exec(conn, sql, params)

        self.run("queueing", op, key=_first(keys))

    def requeue_many(self, keys: Sequence[str], owner: str, ttl: float) -> bool:
        statements = self.sql.requeue_many(len(keys))
        params = many_params(sorted(keys), owner, ttl=ttl)

        def op(conn: C) -> bool:
            with self._transaction(conn):
                counts = [self._exec(conn, sql, params)[0] for sql in statements]
            return counts[-1] == len(keys)

        return self.run("queueing", op, key=_first(keys))

    def dequeue_many(self, keys: Sequence[str], owner: str) -> None:
        sql = self.sql.dequeue_many(len(keys))
        params = many_params(sorted(keys), owner)

        def op(conn: C) -> None:
            with self._transaction(conn):
                self._exec(conn, sql, params)

        self.run("leaving the queue", op, key=_first(keys))

    def acquire_many_in_turn(
        self, keys: Sequence[str], owner: str, ttl: float
    ) -> dict[str, int] | None:
        def op(conn: C) -> dict[str, int] | None:
            try:
                with self._transaction(conn):
                    return self._take_all_in_turn(conn, sorted(keys), owner, ttl)
            except Busy:
                return None

        return self.run("acquire", op, key=_first(keys))

    def _take_all_in_turn(self, conn: C, keys: list[str], owner: str, ttl: float) -> dict[str, int]:
        """Each key's token, and owner's entries gone; Busy if a live waiter is ahead of
        owner on a key, or a key is taken (inside the transaction)."""
        params = many_params(keys, owner)
        if self._count(conn, self.sql.blocked_many(len(keys)), params):
            raise Busy
        taken: dict[str, int] = {}
        for key in keys:
            token = self._take_free(conn, key, owner, ttl)
            if token is None:
                raise Busy
            taken[key] = token
        self._exec(conn, self.sql.dequeue_many(len(keys)), params)
        return taken

    # -- FencedManyGrants (the store declares it): the dialect's FencedGrants statements,
    # ---- several keys in one transaction ------------------------------------------------
    def fence_many(self, keys: Sequence[str]) -> dict[str, int]:
        sql = _fenced(self.sql)

        def op(conn: C) -> dict[str, int]:
            return {k: int(self._exec(conn, sql.fence, {"key": k})[1][0][0]) for k in keys}

        return self.run("reading the fence", op, key=_first(keys))

    def grant_fenced_many(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        sql = _fenced(self.sql)
        keys = sorted(tokens)  # the row locks' order, as acquire_many's

        def grant(conn: C, key: str) -> None:
            """Grant ``key`` inside the transaction; Busy if it is not grantable."""
            params = {"key": key, "kind": "lock", "owner": owner, "ttl": ttl, "token": tokens[key]}
            for statement in sql.grant_fenced_steps:
                count, rows = self._exec(conn, statement, params)
                if rows or count == 1:
                    return
            raise Busy

        def op(conn: C) -> bool:
            for statement in sql.before_fenced_grants(max(tokens.values(), default=0)):
                self._exec(conn, statement, {})
            try:
                with self._transaction(conn):
                    for key in keys:
                        grant(conn, key)
            except Busy:
                return False
            return True

        return self.run("acquire", op, key=_first(keys))

    def release_owned_many(self, keys: Sequence[str], owner: str) -> bool:
        sql = _fenced(self.sql)

        def op(conn: C) -> bool:
            with self._transaction(conn):
                ended = [
                    self._exec(conn, sql.release_owned, {"key": k, "owner": owner})[0] == 1
                    for k in sorted(keys)
                ]
            return any(ended)

        return self.run("release", op, key=_first(keys))


def many_params(keys: Sequence[str], owner: str, **more: Any) -> dict[str, Any]:
    """The parameters of a statement over several keys: k0, k1, ... (see
    HolderStatements.key_list), owner, and ``more``."""
    params: dict[str, Any] = {f"k{i}": key for i, key in enumerate(keys)}
    return {**params, "owner": owner, **more}


def _first(keys: Sequence[str]) -> str | None:
    return keys[0] if keys else None


class FencedManyStatements(Protocol):
    """The statements FencedManyGrants runs (each dialect's FencedGrants statements)."""

    #: key -> the key's fence, floored by the clock
    fence: str
    #: key owner -> 1 row changed if owner's live hold was ended
    release_owned: str
    #: key kind owner ttl token -> tried in turn: one grants (a row returned, or one changed)
    grant_fenced_steps: tuple[str, ...]

    def before_fenced_grants(self, top: int) -> list[str]:
        """What runs before a transaction of grants whose largest token is ``top``."""
        ...


def _fenced(sql: object) -> FencedManyStatements:
    return cast("FencedManyStatements", sql)


class OperationStatements(HolderStatements):
    """The statements :class:`StatementOperations` runs, each with named parameters (the
    dialect's statements class sets them)."""

    ddl: list[str]
    acquire: str
    #: a newcomer's acquire: acquire's parameters, when nobody waits in the key's queue
    acquire_as_newcomer: str
    grant_fenced: str
    release_owned: str
    claim_once: str
    once_state: str
    renew: str

    #: a fenced grant of one key: grant_fenced's parameters, tried in turn until one returns
    #: a row (granted)
    grant_fenced_steps: tuple[str, ...]

    def before_fenced_grants(self, top: int) -> list[str]:
        return []


class StatementOperations(ManyKeyOperations[C], Generic[C]):
    """acquire, renew, grant_fenced, release_owned, claim_once, once_state and ddl: one
    statement of ``self.sql`` each; ManyKeys' steps of those statements."""

    sql: OperationStatements

    # -- schema ---------------------------------------------------------------------------
    def ddl(self) -> list[str]:
        return list(self.sql.ddl)

    # -- operations -----------------------------------------------------------------------
    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        params = {"key": key, "kind": kind, "owner": owner, "ttl": ttl}

        def op(conn: Any) -> int | None:
            row = conn.execute(self.sql.acquire, params).fetchone()
            return None if row is None else int(row[0])

        return self.run("acquire", op, key=key)

    def grant_fenced(self, key: str, owner: str, ttl: float, token: int, kind: str) -> bool:
        params = {"key": key, "kind": kind, "owner": owner, "ttl": ttl, "token": token}

        def op(conn: Any) -> bool:
            steps = self.sql.grant_fenced_steps
            return any(conn.execute(s, params).fetchone() is not None for s in steps)

        return self.run("acquire", op, key=key)

    def release_owned(self, key: str, owner: str) -> bool:
        params = {"key": key, "owner": owner}

        def op(conn: Any) -> bool:
            return int(conn.execute(self.sql.release_owned, params).rowcount) == 1

        return self.run("release", op, key=key)

    def claim_once(self, key: str, owner: str, ttl: float, note: str | None) -> int | None:
        params = {"key": key, "owner": owner, "ttl": ttl, "note": note}

        def op(conn: Any) -> int | None:
            row = conn.execute(self.sql.claim_once, params).fetchone()
            return None if row is None else int(row[0])

        return self.run("once", op, key=key)

    def once_state(self, key: str) -> tuple[str, str | None, bool] | None:
        def op(conn: Any) -> tuple[str, str | None, bool] | None:
            row = conn.execute(self.sql.once_state, {"key": key}).fetchone()
            return None if row is None else (row[0], row[1], bool(row[2]))

        return self.run("state", op, key=key)

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        params = {"key": key, "owner": owner, "token": token, "ttl": ttl}

        def op(conn: Any) -> bool:
            return bool(conn.execute(self.sql.renew, params).rowcount == 1)

        return self.run("renew", op, key=key)

    # -- ManyKeys' steps (the release's are the dialect's: PostgreSQL's hands over) ---------
    def _take_free(self, conn: Any, key: str, owner: str, ttl: float) -> int | None:
        params = {"key": key, "kind": "lock", "owner": owner, "ttl": ttl}
        row = conn.execute(self.sql.acquire, params).fetchone()
        return None if row is None else int(row[0])

    def _extend_hold(self, conn: Any, key: str, owner: str, token: int, ttl: float) -> bool:
        params = {"key": key, "owner": owner, "token": token, "ttl": ttl}
        return bool(conn.execute(self.sql.renew, params).rowcount == 1)
