"""The kinds of hold, and which store operations take, renew and end each.

A kind is data: the engine asks it which :class:`~dblock._engine.ops.Call` to run, so one
waiting loop serves locks, read and write holds, permits, once-records and scheduled runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._contract import (
    FairQueue,
    OnceRecords,
    ScheduledRuns,
    SessionHolds,
    SharedHolds,
    Store,
    require,
)
from .ops import Call
from .traits import Traits


@dataclass
class Spec:
    """What a lock object asks for; ``outcome`` is set by ``once`` before it ends the hold."""

    key: str
    ttl: float
    kind: str = "lock"
    permits: int | None = None
    note: str | None = None
    at_least: float = 0.0
    outcome: str = field(default="failed")
    #: the longest a waiter that is told of releases goes without looking again (None: the
    #: engine's default): a holder that died without releasing is noticed within it
    recheck: float | None = None
    #: held as long as a connection of the store's, on the server's own lock (no lease)
    session: bool = field(init=False, repr=False, compare=False, default=False)
    #: held alongside others of the key (read holds, permits)
    shared: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        # read on every acquire, renewal and release: attributes, not properties
        self.session = self.kind == "session"
        self.shared = self.kind in ("read", "semaphore")

    def check(self, store: Store) -> None:
        """Raise ConfigurationError if ``store`` lacks a capability this kind needs."""
        if self.kind in ("read", "semaphore"):
            require(store, SharedHolds, f"{self.kind} holds")
        elif self.kind == "write":
            require(store, SharedHolds, "read-write locks")
            require(store, FairQueue, "read-write locks")
        elif self.kind == "once":
            require(store, OnceRecords, "once()")
        elif self.kind == "scheduled":
            require(store, ScheduledRuns, "scheduled()")
        elif self.kind == "session":
            require(store, SessionHolds, "session holds")

    def queue(self, traits: Traits) -> str | None:
        """The kind of queue entry a waiter keeps (None: it does not queue). Plain locks queue
        where the store can: waiters are served in arrival order, and a newcomer does not
        take a free lock while others wait for it."""
        if not traits.fair:
            return None
        return {"lock": "lock", "write": "write"}.get(self.kind)

    def try_call(self, traits: Traits, owner: str, queued: bool) -> Call:
        """One attempt to take the hold; its value is the new token, or None if busy."""
        k = self.key
        if self.kind == "lock":
            if traits.fair:
                return Call(FairQueue.acquire_fair, k, owner, self.ttl, queued)
            return Call(Store.acquire, k, owner, self.ttl, "lock")
        if self.kind in ("read", "semaphore"):
            return Call(SharedHolds.acquire_shared, k, owner, self.ttl, self.kind, self.permits)
        if self.kind == "write":
            return Call(SharedHolds.acquire_write, k, owner, self.ttl)
        if self.kind == "once":
            return Call(OnceRecords.claim_once, k, owner, self.ttl, self.note)
        return Call(Store.acquire, k, owner, self.ttl, self.kind)

    def tokens_of(self, token: int) -> dict[str, int]:
        """Each key of the hold with its token: one key here (``lock_many``'s has several)."""
        return {self.key: token}

    def renew_call(self, owner: str, token: int, ttl: float) -> Call:
        if self.session:  # nothing to extend: is its connection (so its server lock) alive?
            return Call(SessionHolds.check_session, self.key, owner, token)
        if self.shared:
            return Call(SharedHolds.renew_shared, self.key, owner, token, ttl)
        return Call(Store.renew, self.key, owner, token, ttl)

    def end_call(self, owner: str, token: int) -> Call:
        k = self.key
        if self.shared:
            return Call(SharedHolds.release_shared, k, owner, token)
        if self.kind == "once":
            return Call(OnceRecords.finish_once, k, owner, token, self.outcome)
        if self.kind == "scheduled":
            return Call(ScheduledRuns.finish_scheduled, k, owner, token, self.at_least)
        if self.session:
            return Call(SessionHolds.release_session, k, owner, token)
        return Call(Store.release, k, owner, token)
