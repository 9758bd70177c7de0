"""A throwaway in-memory store, for the tests only: the store contract over a dict.

It implements ``dblock._contract.Store`` and the FairQueue, SharedHolds, OnceRecords,
FairManyKeys and LeaderValues capabilities, modelled on the SQL stores' tables: one record
per key (the lock, or the parent of shared holds; a proclaimed value beside its token) and
per key a set of holder entries (shared holds and queue entries). Every operation runs
under one ``threading.Lock`` of the shared :class:`Tables`, so two clients built on one
``Tables`` contend like two processes on one database. Its clock is ``time.monotonic()``;
tokens of a key only go up, across purges too (a high-water mark).

Importing this module needs the store contract in the core (the ``memory`` provider is
skipped before that; see tests/providers.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import dblock
from dblock._contract import (
    FairManyKeys,
    FairQueue,
    LeaderValues,
    Leading,
    OnceRecords,
    SharedHolds,
    Store,
)

#: wall-clock time of monotonic 0, to show the store's clock as datetimes
_WALL_AT_ZERO = datetime.now(timezone.utc) - timedelta(seconds=time.monotonic())


def _when(mono: float) -> datetime:
    return _WALL_AT_ZERO + timedelta(seconds=mono)


@dataclass
class Record:
    """A key's record: a hold (``owner`` set), or free, or the parent of shared holds
    (no owner, ``expires_at`` covering their leases), or a once-record's outcome."""

    kind: str
    owner: str | None
    token: int
    acquired_at: float
    expires_at: float
    state: str | None = None
    note: str | None = None
    #: the token of the hold that proclaimed ``value`` (0: none): a later hold of the key
    #: has a larger token, so it never shows an earlier one's value
    value_token: int = 0
    value: str | None = None


@dataclass
class Holder:
    """A shared hold (``waiting`` False) or a queue entry (``waiting`` True) of a key."""

    kind: str
    waiting: bool
    token: int
    acquired_at: float
    expires_at: float


@dataclass
class Table:
    records: dict[str, Record] = field(default_factory=dict)
    holders: dict[str, dict[str, Holder]] = field(default_factory=dict)
    #: the largest token of a purged record: a key made again starts above it
    hwm: int = 0


class Tables:
    """The shared state of every client of one provider: lock tables by name."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.tables: dict[str, Table] = {}


class MemoryStore(Store, FairQueue, SharedHolds, OnceRecords, FairManyKeys, LeaderValues):
    name = "memory"
    safe_url = "memory://"
    poll_cap = 0.05

    def __init__(self, tables: Tables, table: str, create_schema: bool = True) -> None:
        self._tables = tables
        self.table = table
        self._closed = False
        self.ensure_schema(create_schema)

    # -- plumbing ------------------------------------------------------------------------------

    def _t(self) -> Table:
        """The lock table (call with the mutex held)."""
        if self._closed:
            raise dblock.BackendError(f"the memory store of {self.table} is closed")
        found = self._tables.tables.get(self.table)
        if found is None:
            raise dblock.BackendError(f"lock table {self.table} was dropped")
        return found

    @staticmethod
    def _now() -> float:
        return time.monotonic()

    def _parent(self, t: Table, key: str, now: float) -> Record:
        """The key's record, made free if there is none."""
        rec = t.records.get(key)
        if rec is None:
            rec = t.records[key] = Record("lock", None, t.hwm, now, now)
        return rec

    @staticmethod
    def _live_holders(t: Table, key: str, now: float) -> dict[str, Holder]:
        return {o: h for o, h in t.holders.get(key, {}).items() if h.expires_at > now}

    def _cover(self, t: Table, key: str, now: float) -> None:
        """An ownerless parent's lease covers its live shared holds again."""
        rec = t.records.get(key)
        if rec is None or rec.owner is not None:
            return
        shared = [h.expires_at for h in self._live_holders(t, key, now).values() if not h.waiting]
        rec.expires_at = max(shared, default=now)

    def _ahead(self, t: Table, key: str, owner: str | None, now: float) -> int:
        """Live lock-queue entries of ``key`` ahead of ``owner`` (all of them for a newcomer)."""
        entries = {
            o: h
            for o, h in self._live_holders(t, key, now).items()
            if h.waiting and h.kind == "lock"
        }
        mine = t.holders.get(key, {}).get(owner) if owner is not None else None
        if mine is None or not mine.waiting:
            return sum(1 for o in entries if o != owner)
        return sum(
            1
            for o, h in entries.items()
            if o != owner and (h.acquired_at, o) < (mine.acquired_at, owner)
        )

    def _take(
        self, t: Table, key: str, owner: str, ttl: float, kind: str, now: float
    ) -> int | None:
        rec = t.records.get(key)
        if rec is None:
            t.records[key] = Record(kind, owner, t.hwm + 1, now, now + ttl)
            return t.hwm + 1
        if (rec.expires_at <= now and rec.kind != "once") or rec.owner == owner:
            rec.kind, rec.owner, rec.token = kind, owner, rec.token + 1
            rec.acquired_at, rec.expires_at, rec.state, rec.note = now, now + ttl, None, None
            return rec.token
        return None

    @staticmethod
    def _mine(rec: Record | None, owner: str, token: int) -> bool:
        return rec is not None and rec.owner == owner and rec.token == token

    def _info(self, key: str, owner: str, token: int, start: float, end: float, kind: str) -> Any:
        return dblock.LockInfo(key, owner, token, _when(start), _when(end), kind)  # type: ignore[arg-type]

    # -- Store ---------------------------------------------------------------------------------

    def ensure_schema(self, create: bool) -> None:
        with self._tables.mutex:
            if self.table in self._tables.tables:
                return
            if not create:
                raise dblock.ConfigurationError(
                    f"lock table {self.table} does not exist in the memory store: create it "
                    "with connect(create_schema=True) (or the DDL of `dblock schema`)"
                )
            self._tables.tables[self.table] = Table()

    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        with self._tables.mutex:
            return self._take(self._t(), key, owner, ttl, kind, self._now())

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        with self._tables.mutex:
            now = self._now()
            rec = self._t().records.get(key)
            if not self._mine(rec, owner, token) or rec is None or rec.expires_at <= now:
                return False
            rec.expires_at = now + ttl
            return True

    def release(self, key: str, owner: str, token: int) -> bool:
        with self._tables.mutex:
            now = self._now()
            rec = self._t().records.get(key)
            if not self._mine(rec, owner, token) or rec is None or rec.expires_at <= now:
                return False
            rec.owner, rec.expires_at = None, now
            return True

    def _holds(self, t: Table, now: float, match: Any) -> list[Any]:
        found = []
        for key, rec in t.records.items():
            if match(key) and rec.owner is not None and rec.expires_at > now:
                found.append(
                    self._info(key, rec.owner, rec.token, rec.acquired_at, rec.expires_at, rec.kind)
                )
        for key, entries in t.holders.items():
            if not match(key):
                continue
            for owner, h in entries.items():
                if not h.waiting and h.expires_at > now:
                    found.append(
                        self._info(key, owner, h.token, h.acquired_at, h.expires_at, h.kind)
                    )
        return sorted(found, key=lambda i: (i.key, i.acquired_at))

    def info(self, key: str) -> Any:
        with self._tables.mutex:
            found = self._holds(self._t(), self._now(), lambda k: k == key)
            return found[0] if found else None

    def list_holds(self, prefix: str) -> list[Any]:
        with self._tables.mutex:
            return self._holds(self._t(), self._now(), lambda k: k.startswith(prefix))

    def force_release(self, key: str) -> bool:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            freed = False
            rec = t.records.get(key)
            if rec is not None and rec.owner is not None and rec.expires_at > now:
                rec.owner, rec.expires_at = None, now
                freed = True
            entries = t.holders.get(key, {})
            for owner, h in list(entries.items()):
                if not h.waiting and h.expires_at > now:
                    del entries[owner]
                    freed = True
            self._cover(t, key, now)
            return freed

    def purge(self, older_than: float, include_once: bool) -> int:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            count = 0
            for key, entries in list(t.holders.items()):
                for owner, h in list(entries.items()):
                    if h.expires_at <= now - older_than:
                        del entries[owner]
                        count += 1
                if not entries:
                    del t.holders[key]
            for key, rec in list(t.records.items()):
                gone = rec.expires_at <= now - older_than and (
                    rec.kind != "once" or (include_once and rec.state in ("succeeded", "failed"))
                )
                if gone and not self._live_holders(t, key, now):
                    t.hwm = max(t.hwm, rec.token)
                    del t.records[key]
                    count += 1
            return count

    def close(self) -> None:
        self._closed = True

    # -- ManyKeys ------------------------------------------------------------------------------

    def acquire_many(self, keys: Any, owner: str, ttl: float) -> dict[str, int] | None:
        return self._acquire_many(keys, owner, ttl, queued=False)

    def _acquire_many(
        self, keys: Any, owner: str, ttl: float, queued: bool
    ) -> dict[str, int] | None:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            for key in keys:
                rec = t.records.get(key)
                free = (
                    rec is None
                    or rec.owner == owner
                    or (rec.expires_at <= now and rec.kind != "once")
                )
                if not free or self._ahead(t, key, owner if queued else None, now):
                    return None
            tokens = {}
            for key in keys:
                token = self._take(t, key, owner, ttl, "lock", now)
                assert token is not None  # (checked above, under the same mutex)
                tokens[key] = token
                self._drop_entry(t, key, owner)
            return tokens

    def acquire_many_in_turn(self, keys: Any, owner: str, ttl: float) -> dict[str, int] | None:
        return self._acquire_many(keys, owner, ttl, queued=True)

    def enqueue_many(self, keys: Any, owner: str, ttl: float) -> None:
        with self._tables.mutex:  # one step, one arrival time for every key
            t, now = self._t(), self._now()
            for key in keys:
                t.holders.setdefault(key, {})[owner] = Holder("lock", True, 0, now, now + ttl)

    def requeue_many(self, keys: Any, owner: str, ttl: float) -> bool:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            entries = [t.holders.get(key, {}).get(owner) for key in keys]
            if any(e is None or not e.waiting or e.expires_at <= now for e in entries):
                return False
            for entry in entries:
                assert entry is not None
                entry.expires_at = now + ttl
            return True

    def dequeue_many(self, keys: Any, owner: str) -> None:
        with self._tables.mutex:
            t = self._t()
            for key in keys:
                self._drop_entry(t, key, owner)

    def renew_many(self, tokens: Any, owner: str, ttl: float) -> bool:
        return all([self.renew(key, owner, token, ttl) for key, token in tokens.items()])

    def release_many(self, tokens: Any, owner: str) -> bool:
        with self._tables.mutex:  # one step: no observer sees some of them ended
            now = self._now()
            ended = True
            for key, token in tokens.items():
                rec = self._t().records.get(key)
                if not self._mine(rec, owner, token) or rec is None or rec.expires_at <= now:
                    ended = False
                    continue
                rec.owner, rec.expires_at = None, now
            return ended

    # -- FairQueue -----------------------------------------------------------------------------

    def acquire_fair(self, key: str, owner: str, ttl: float, queued: bool) -> int | None:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            if self._ahead(t, key, owner if queued else None, now):
                return None
            token = self._take(t, key, owner, ttl, "lock", now)
            if token is not None:
                self._drop_entry(t, key, owner)
            return token

    def probe(self, key: str, owner: str) -> tuple[bool, int]:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            rec = t.records.get(key)
            return (rec is None or rec.expires_at <= now), self._ahead(t, key, owner, now)

    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            entries = t.holders.setdefault(key, {})
            entry = entries.get(owner)
            if entry is not None and entry.waiting and entry.expires_at > now:
                entry.kind, entry.expires_at = kind, now + ttl  # keeps its place
            else:
                entries[owner] = Holder(kind, True, 0, now, now + ttl)

    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        self.enqueue(key, owner, kind, ttl)  # nothing is handed over: an entry may be remade
        return True

    def dequeue(self, key: str, owner: str) -> None:
        with self._tables.mutex:
            self._drop_entry(self._t(), key, owner)

    @staticmethod
    def _drop_entry(t: Table, key: str, owner: str) -> None:
        entries = t.holders.get(key, {})
        entry = entries.get(owner)
        if entry is not None and entry.waiting:
            del entries[owner]

    # -- SharedHolds ---------------------------------------------------------------------------

    def acquire_shared(
        self, key: str, owner: str, ttl: float, kind: str, permits: int | None
    ) -> int | None:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            rec = self._parent(t, key, now)
            if rec.owner is not None and rec.expires_at > now:
                return None  # a writer, a plain lock, a once or scheduled run holds it
            live = self._live_holders(t, key, now)
            for h in live.values():
                if (not h.waiting and h.kind != kind) or (
                    h.waiting and h.kind in ("write", "lock")
                ):
                    return None  # another kind holds it, or a writer or plain lock waits
            if permits is not None:
                taken = sum(
                    1 for o, h in live.items() if not h.waiting and h.kind == kind and o != owner
                )
                if taken >= permits:
                    return None
            rec.token += 1
            t.holders.setdefault(key, {})[owner] = Holder(kind, False, rec.token, now, now + ttl)
            rec.owner = None
            self._cover(t, key, now)
            return rec.token

    def release_shared(self, key: str, owner: str, token: int) -> bool:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            entries = t.holders.get(key, {})
            h = entries.get(owner)
            if h is None or h.waiting or h.token != token or h.expires_at <= now:
                return False
            del entries[owner]
            self._cover(t, key, now)
            return True

    def renew_shared(self, key: str, owner: str, token: int, ttl: float) -> bool:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            h = t.holders.get(key, {}).get(owner)
            if h is None or h.waiting or h.token != token or h.expires_at <= now:
                return False
            h.expires_at = now + ttl
            self._cover(t, key, now)
            return True

    def acquire_write(self, key: str, owner: str, ttl: float) -> int | None:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            rec = self._parent(t, key, now)
            if rec.expires_at > now and rec.owner != owner:
                return None
            if any(not h.waiting for h in self._live_holders(t, key, now).values()):
                return None  # readers or semaphore permits hold it
            if rec.kind == "once":
                return None  # a once-record is never taken by a lock: it would be erased
            rec.kind, rec.owner, rec.token = "write", owner, rec.token + 1
            rec.acquired_at, rec.expires_at, rec.state, rec.note = now, now + ttl, None, None
            self._drop_entry(t, key, owner)
            return rec.token

    # -- OnceRecords ---------------------------------------------------------------------------

    def claim_once(self, key: str, owner: str, ttl: float, note: str | None) -> int | None:
        with self._tables.mutex:
            t, now = self._t(), self._now()
            rec = t.records.get(key)
            if rec is None:
                rec = t.records[key] = Record("once", owner, t.hwm + 1, now, now + ttl)
                rec.state, rec.note = "processing", note
                return rec.token
            claimable = (
                (rec.kind != "once" and rec.expires_at <= now)
                or (
                    rec.kind == "once"
                    and (
                        rec.state == "failed"
                        or (rec.state == "processing" and rec.expires_at <= now)
                    )
                )
                or rec.owner == owner
            )
            if not claimable:
                return None
            rec.kind, rec.owner, rec.token = "once", owner, rec.token + 1
            rec.acquired_at, rec.expires_at = now, now + ttl
            rec.state, rec.note = "processing", note
            return rec.token

    def once_state(self, key: str) -> tuple[str, str | None, bool] | None:
        with self._tables.mutex:
            rec = self._t().records.get(key)
            if rec is None:
                return None
            return rec.kind, rec.state, rec.expires_at > self._now()

    def finish_once(self, key: str, owner: str, token: int, state: str) -> bool:
        with self._tables.mutex:
            rec = self._t().records.get(key)
            if not self._mine(rec, owner, token) or rec is None or rec.kind != "once":
                return False
            rec.state, rec.owner, rec.expires_at = state, None, self._now()
            return True

    def finish_scheduled(self, key: str, owner: str, token: int, at_least: float) -> bool:
        with self._tables.mutex:
            rec = self._t().records.get(key)
            if not self._mine(rec, owner, token) or rec is None:
                return False
            now = self._now()
            if rec.acquired_at + at_least <= now:
                rec.owner = None
            rec.expires_at = max(rec.acquired_at + at_least, now)
            return True

    # -- LeaderValues --------------------------------------------------------------------------

    def proclaim(self, key: str, owner: str, token: int, value: str | None) -> bool:
        with self._tables.mutex:
            rec = self._t().records.get(key)
            if not self._mine(rec, owner, token) or rec is None or rec.expires_at <= self._now():
                return False
            rec.value_token, rec.value = token, value
            return True

    def leader(self, key: str) -> Leading | None:
        with self._tables.mutex:
            rec = self._t().records.get(key)
            if rec is None or rec.owner is None or rec.kind != "lock":
                return None
            if rec.expires_at <= self._now():
                return None
            info = self._info(key, rec.owner, rec.token, rec.acquired_at, rec.expires_at, rec.kind)
            proclaimed = rec.value_token == rec.token
            return Leading(info, proclaimed, rec.value if proclaimed else None)
