"""What an acquire of one key (``waiting.Acquisition``) and of several (``many.ManyAcquisition``)
share: the caller's limits, a grant held in hand until the caller has it, the check of a grant
whose reply came late, and the pacing of the look for a finished once-record in the way.
No I/O here."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from .._contract import Subscription
from .._errors import BackendError, DBLockError
from .hold import Hold
from .kinds import Spec
from .ops import Call, Steps, Unsubscribe
from .replies import confirms
from .traits import Traits

#: what a grant is: one key's token, or each key's
G = TypeVar("G")
T = TypeVar("T")

#: the pause before trying again after a try that waited for a row a transaction holds (the
#: next try waits for it in the server): only a floor against a server lock timeout set tiny
ROW_LOCKED_PAUSE = 0.01

#: renewals that may confirm a grant whose reply came late, before it is given up
LATE_RENEWALS = 2
#: a waiter that has not had the key this long looks, when it next wakes, whether a finished
#: once-record is what stands in its way (it never ends: waiting would last forever); then
#: twice as long each time, up to RECORD_CHECK_CAP. Its waits are never cut short for it: a
#: waiter woken early would line up again behind later ones where the server keeps the order
#: (MySQL's doorbell)
RECORD_CHECK = 1.0
RECORD_CHECK_CAP = 16.0


def cut_short(exc: BaseException) -> bool:
    """Whether the store may have done what a call that raised ``exc`` asked: the call was
    interrupted in flight (an asyncio cancellation, Ctrl-C, a signal handler's exception), or
    failed with anything but the store's own report of a failure (a DBLockError, raised once
    the store knows what became of the statement). An interruption can surface as another
    error: landing in a condition's wait between letting go of its lock and taking it back,
    it makes the ``with`` around the wait raise ``RuntimeError: release unlocked lock``."""
    return not isinstance(exc, DBLockError)


def stop_waiting(subscription: Subscription | None, leave: Steps[None] | None) -> Steps[None]:
    """The end of a waiting loop that was not closed unfinished: stop listening, then leave
    the queue (``leave``: its steps; None: nothing to leave), even when an interruption lands
    in the unsubscribe (a second cancellation, or one re-delivered after a driver swallowed
    it)."""
    try:
        if subscription is not None:
            yield Unsubscribe(subscription)
    finally:
        if leave is not None:
            yield from leave


class Attempt(ABC, Generic[G]):
    """One acquire call's state machine: ``run()`` is its steps."""

    def __init__(
        self,
        traits: Traits,
        spec: Spec,
        owner: str,
        *,
        blocking: bool,
        timeout: float | None,
    ) -> None:
        self.traits = traits
        self.spec = spec
        self.owner = owner
        self.blocking = blocking
        self.timeout = timeout
        #: a try whose ttl the store's replies do not confirm: it fails without a second try
        self.refused = False
        #: a grant to this acquire, until its caller has it or it was found gone or ended
        self._in_hand: G | None = None
        #: when the waiter last looked for a finished once-record in its way (None: not yet)
        self._record_checked: float | None = None
        self._record_every = RECORD_CHECK
        #: the last try waited for a row an open transaction holds (see _trying)
        self.row_locked = False

    def run(self) -> Steps[Hold | None]:
        """The acquire's steps: the hold had, or None if not had in time.

        A grant that its caller will not get, because a later step (an unsubscribe, a
        renewal, ending a late grant) was interrupted (an asyncio cancellation, Ctrl-C) or
        failed, is ended before the error propagates."""
        try:
            return (yield from self._run())
        except GeneratorExit:
            raise  # closed unfinished: no step may follow
        except BaseException:
            grant, self._in_hand = self._in_hand, None
            if grant is not None:
                yield from self._end_in_hand(grant)
            raise

    @abstractmethod
    def _run(self) -> Steps[Hold | None]:
        """The tries and waits."""

    @abstractmethod
    def _end_in_hand(self, grant: G) -> Steps[None]:
        """End a grant its caller will not get (best effort: the error propagates)."""

    @abstractmethod
    def _disown(self) -> Steps[None]:
        """End whatever this owner holds of the keys (a grant interrupted in flight)."""

    def _granting(self, call: Call, *, row_locked_busy: bool = False) -> Steps[Any]:
        """Run a statement that may grant the hold. If it is cut short (``cut_short``: an asyncio
        cancellation, a timeout around the acquire, Ctrl-C), or aborted past its deadline on
        a server that then ended it (BackendError ``_settled``), the store may have granted
        it anyway: that hold is ended before the error propagates, so none is left for only
        its lease to free. (Another failed statement is not: the store retried it, and it
        failed because the database cannot be reached.)

        ``row_locked_busy``: a statement that gave up waiting for the key's row is a try that
        found the key busy (None), as ``_unless_row_locked`` makes it, in this one generator:
        every try passes through it, and each generator between it and the driver is one
        frame more to resume at each of its steps."""
        if row_locked_busy:
            self.row_locked = False
        try:
            try:
                return (yield call)
            except GeneratorExit:
                raise  # closed unfinished (see run): no step may follow
            except BaseException as exc:
                if cut_short(exc) or (isinstance(exc, BackendError) and exc._settled):
                    yield from self._disown()
                raise
        except BackendError as exc:
            if not (row_locked_busy and self._gave_up_on_row(exc)):
                raise
            return None

    def _trying(self, call: Call) -> Steps[Any]:
        """``_granting`` of a try: a statement that gave up waiting for the key's row found the
        key busy (None; see ``_unless_row_locked``)."""
        return self._granting(call, row_locked_busy=True)  # its steps, not a frame around them

    def _unless_row_locked(self, steps: Steps[T], busy: T) -> Steps[T]:
        """``steps``' result, or ``busy`` if its statement gave up waiting for a row that an
        open transaction holds (a holder's ``lock.guard``); ``row_locked`` then says so, and
        the wait tries again at once: the next try waits for that row in the server, and
        gets it the moment the transaction ends."""
        self.row_locked = False
        try:
            return (yield from steps)
        except BackendError as exc:
            if not self._gave_up_on_row(exc):
                raise
            return busy

    def _gave_up_on_row(self, exc: BackendError) -> bool:
        """``exc`` is a statement's that gave up waiting for a row an open transaction holds
        (``row_locked`` then says so): the answer ``busy``, not an error."""
        if exc._row_locked:
            self.row_locked = True
        return exc._row_locked

    def _confirm(self, hold: Hold, sent: float) -> Steps[tuple[Hold | None, bool]]:
        """``hold``, granted by a request sent at ``sent``, if its reply confirms it
        (``replies.confirms``), else renewed up to ``LATE_RENEWALS`` times until a renewal
        does (the renewal checks owner and token in the store): (the hold, or None; whether
        the last renewal found it). Interrupted in flight, a renewal ends the grant, as the
        grant's own call does."""
        ttl, replies = self.spec.ttl, self.traits.replies
        took = time.monotonic() - sent
        replies.seen(took)
        if confirms(ttl, hold.expires_by - time.monotonic(), took) and hold.live():
            return hold, True
        for _ in range(LATE_RENEWALS):
            renewed_at = time.monotonic()
            if not (yield from self._granting(hold.spec.renew_call(self.owner, hold.token, ttl))):
                return None, False
            hold.renewed(renewed_at, ttl)
            now = time.monotonic()
            if confirms(ttl, hold.expires_by - now, now - renewed_at) and hold.live():
                return hold, True
        return None, True

    def _record_check_due(self) -> bool:
        """Whether to look for a finished once-record in the way now (see RECORD_CHECK)."""
        if not self.traits.records:
            return False
        now = time.monotonic()
        if self._record_checked is None:
            self._record_checked = now
        if now - self._record_checked < self._record_every:
            return False
        self._record_checked = now
        self._record_every = min(2 * self._record_every, RECORD_CHECK_CAP)
        return True
