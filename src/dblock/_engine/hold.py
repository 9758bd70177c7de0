"""One hold in the store, as its client knows it: token, lease, loss."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from .. import _forksafe
from .kinds import Spec

#: how often a session hold's connection is checked (a cheap statement on it), seconds: with
#: the store's deadline on that check it bounds how late a lost session is noticed
SESSION_CHECK = 1.0
#: renewals are due on a grid this fine (at most, and at most a twelfth of the lease): the
#: cancelled renewal jobs of a busy client's short holds then end on a few moments, and cost
#: its background thread a wake-up per moment instead of one per hold
RENEW_GRID = 0.25


class Cancellable(Protocol):
    """A background job the client scheduled for a hold (renewal or expiry watch)."""

    cancelled: bool

    def cancel(self) -> None: ...


class Hold:
    """One acquisition in the store, shared by the re-entrant acquisitions of its owner."""

    __slots__ = (
        "after_guard",
        "count",
        "due",
        "ending",
        "expires_by",
        "granted_at",
        "guards",
        "handle",
        "job",
        "key",
        "lease",
        "loss_reported",
        "lost",
        "mutex",
        "owner",
        "pid",
        "spec",
        "token",
        "ttl",
        "unwatch",
    )

    def __init__(
        self,
        spec: Spec,
        owner: str,
        token: int,
        ttl: float,
        sent_at: float,
        *,
        lease: float | None = None,
    ) -> None:
        self.spec = spec
        self.key = spec.key
        self.owner = owner
        self.token = token
        self.ttl = ttl
        #: the length of the current lease: ``ttl``, or less for a lock handed over by its
        #: releaser (renewed to ``ttl`` in the background if it is held that long)
        self.lease = ttl if lease is None else lease
        if spec.session:  # no lease: it lasts as long as its connection
            self.lease = math.inf
        self.count = 1
        self.lost = False
        #: its last release is under way: from the store's answer on, the key may be another
        #: owner's, so ``held`` says False already (a failed release sets it back)
        self.ending = False
        #: the local monotonic time after which the lease may have ended (conservative: the
        #: store started the lease no earlier than the request was sent)
        self.expires_by = sent_at + self.lease
        #: serialises the client's operations on this hold (caller, renewer, loss notice); the
        #: async client puts one of its runtime's in its place
        self.mutex: AbstractContextManager[Any] = _forksafe.lock()
        self.job: Cancellable | None = None
        #: a session hold: when its connection is next checked (monotonic; see next_check)
        self.due = math.inf
        #: stops the pushed loss notice (stores that push a force-release to its holder)
        self.unwatch: Callable[[], None] | None = None
        #: the client-side object that took it (re-entry by another object of the same key
        #: and owner reaches it through the client's registry)
        self.handle: object | None = None
        #: the process that took it: in a child forked while it was held, it is the parent's
        self.pid = _forksafe.pid()
        #: for observers (dblock._observe): when it was granted, and its loss was reported
        self.granted_at = time.monotonic()
        self.loss_reported = False
        #: ``lock.guard(conn)``s of this hold whose transactions may still be open: each tells
        #: whether its transaction still is (it holds the hold's row still until it ends)
        self.guards: list[Callable[[], bool]] = []
        #: a guarded transaction ended since the last renewal: the lease may have run out
        #: while it held the row, and nobody could take the key then (see lease.renewal)
        self.after_guard = False

    def live(self) -> bool:
        return (
            not self.lost and not self.ending and self.ours() and time.monotonic() < self.expires_by
        )

    def guarded(self) -> bool:
        """A guarded transaction of this hold is open: the store's row cannot change, and a
        statement of ours on it would wait for that transaction. Guards found ended are
        forgotten."""
        if not self.guards:
            return False
        for g in list(self.guards):  # in place: another thread may be adding one
            if not g():
                self.guards.remove(g)
        if not self.guards:
            self.after_guard = True
        return bool(self.guards)

    def ours(self) -> bool:
        """False in a forked child: the parent holds it, renews it and releases it."""
        return self.pid == _forksafe.pid()

    def renewed(self, sent_at: float, ttl: float) -> None:
        """The store extended the lease to ``ttl`` by a request sent at ``sent_at``."""
        if self.spec.session:
            return
        self.ttl = self.lease = ttl
        self.expires_by = sent_at + ttl

    def cancel_job(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def renews(self, auto_renew: bool) -> bool:
        """The background job renews this hold (else it only watches for the lease's end):
        with auto_renew, and for a hand-over whose lease is still shorter than the ttl; a
        session hold's connection is always checked."""
        return self.spec.session or auto_renew or self.lease < self.ttl

    def next_check(self, auto_renew: bool, watched: bool) -> float | None:
        """When the background job should next look at this hold (monotonic), or None: a
        third of the lease in (rounded down to ``RENEW_GRID``), to renew; at the lease's end,
        to report a watched loss; every ``SESSION_CHECK`` s for a session hold."""
        if self.spec.session:
            # on a grid of half checks, 0.5-1 check from now: the jobs of the many short holds
            # of a busy client end on a few moments, and their cancelled jobs cost the
            # background thread one wake-up per moment instead of one per hold
            step = SESSION_CHECK / 2
            return (math.floor(time.monotonic() / step) + 2) * step
        if self.renews(auto_renew):
            # a third of the lease in, rounded down to the grid: never later, and still a
            # quarter of the lease in at the earliest
            due = self.expires_by - self.lease * 2 / 3
            step = min(RENEW_GRID, self.lease / 12)
            return math.floor(due / step) * step if step > 0 else due
        if watched:
            return self.expires_by
        return None
