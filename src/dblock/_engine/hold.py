"""One hold in the store, as its client knows it: token, lease, loss."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from .. import _forksafe
from .kinds import Spec


class Cancellable(Protocol):
    """A background job the client scheduled for a hold (renewal or expiry watch)."""

    cancelled: bool

    def cancel(self) -> None: ...


class Hold:
    """One acquisition in the store, shared by the re-entrant acquisitions of its owner."""

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
        self.count = 1
        self.lost = False
        #: the local monotonic time after which the lease may have ended (conservative: the
        #: store started the lease no earlier than the request was sent)
        self.expires_by = sent_at + self.lease
        #: serialises the client's operations on this hold (caller, renewer, loss notice); the
        #: async client puts one of its runtime's in its place
        self.mutex: AbstractContextManager[Any] = _forksafe.lock()
        self.job: Cancellable | None = None
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

    def live(self) -> bool:
        return not self.lost and self.ours() and time.monotonic() < self.expires_by

    def ours(self) -> bool:
        """False in a forked child: the parent holds it, renews it and releases it."""
        return self.pid == _forksafe.pid()

    def renewed(self, sent_at: float, ttl: float) -> None:
        """The store extended the lease to ``ttl`` by a request sent at ``sent_at``."""
        self.ttl = self.lease = ttl
        self.expires_by = sent_at + ttl

    def cancel_job(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def renews(self, auto_renew: bool) -> bool:
        """The background job renews this hold (else it only watches for the lease's end):
        with auto_renew, and for a hand-over whose lease is still shorter than the ttl."""
        return auto_renew or self.lease < self.ttl

    def next_check(self, auto_renew: bool, watched: bool) -> float | None:
        """When the background job should next look at this hold (monotonic), or None: a
        third of the lease in, to renew; at the lease's end, to report a watched loss."""
        if self.renews(auto_renew):
            return self.expires_by - self.lease * 2 / 3
        if watched:
            return self.expires_by
        return None
