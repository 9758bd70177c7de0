"""Acquiring: tries, the wait queue, wake-ups, backoff and hand-overs. No I/O here.

A waiter listens before its next try, so a release between the try and the wait is not
missed. Where the store keeps a queue (``FairQueue``), waiters are served in arrival order;
where it pushes releases (``Wakeups``), they sleep until told, polling only as a safety net;
elsewhere they poll with capped, jittered backoff, paced by their place in the queue.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .._contract import FairQueue, OnceRecords, QueueJoin, Store, Subscription
from .._errors import BackendError, ConfigurationError
from .._timing import Backoff, TurnPacer, reset_deadline, set_deadline
from .attempt import ROW_LOCKED_PAUSE, Attempt, cut_short, stop_waiting
from .hold import Hold
from .kinds import Spec
from .ops import Call, Sleep, Steps, Subscribe, Unsubscribe, Wait
from .replies import MEASURED, confirms, must_be_left
from .traits import Traits

log = logging.getLogger("dblock")

#: with pushed wake-ups, waiters poll only as a fallback for a missed notification (a
#: holder that died without releasing, a woken waiter that died before it took its turn)
PUSHED_POLL_CAP = 5.0
FIRST_BACKOFF = 0.002
#: lease of a waiter's queue entry: a waiter that died or froze leaves the queue after it
QUEUE_TTL = 9.0
#: tries again of a try without waiting (blocking=False) whose grant came back too late to use
LATE_RETRIES = 1


def _fallback_backoff(cap: float) -> Backoff:
    """Polls for a waiter that is woken when something changes: only a safety net, so they
    start near the cap instead of ramping up from milliseconds."""
    return Backoff(0.75 * cap, cap)


class _QueueEntry:
    """A waiter's entry in the key's wait queue, as the waiter knows it."""

    def __init__(self) -> None:
        #: local time when the statement that last made or refreshed it was sent
        self.written_at: float | None = None
        #: we made one (so the lock may have been handed to us)
        self.made = False
        #: a hand-over we hear of is for this entry, not an earlier one heard late
        self.trusted = True

    def written(self, sent: float) -> None:
        self.written_at, self.made = sent, True

    def gone(self) -> None:
        self.written_at, self.trusted = None, False


class Acquisition(Attempt[int]):
    """One acquire call's waiting state machine: ``run()`` is its steps."""

    def __init__(
        self,
        traits: Traits,
        spec: Spec,
        owner: str,
        *,
        blocking: bool,
        timeout: float | None,
    ) -> None:
        super().__init__(traits, spec, owner, blocking=blocking, timeout=timeout)
        self.queue = spec.queue(traits)
        self.entry = _QueueEntry()
        #: the subscription, or False where the store cannot wake waiters (they sleep)
        self.subscription: Subscription | None = None
        self.polling = not traits.wakeups

    def _end_in_hand(self, token: int) -> Steps[None]:
        try:
            yield self.spec.end_call(self.owner, token)
        except Exception as exc:  # noqa: BLE001 - the interruption is what propagates
            log.warning("could not end the interrupted grant of %r: %s", self.spec.key, exc)

    def _run(self) -> Steps[Hold | None]:  # noqa: PLR0912, PLR0915 - the state machine, in one place
        spec, entry = self.spec, self.entry
        cap = self.traits.poll_cap
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        backoff: Backoff | None = None  # made when first needed: a free lock needs none
        acquired = closed = False
        should_try = True
        ahead = -1  # waiters ahead of us, as last probed (-1: not known)
        late_retries = LATE_RETRIES
        pacer: TurnPacer | None = None
        # what waits inside a statement (a busy SQLite file, a free pooled connection) waits no
        # longer than this acquire may; leaving the queue afterwards is not bounded by it
        bound = set_deadline(deadline if self.blocking else time.monotonic())
        try:
            if (
                self.blocking
                and self.queue == "lock"
                and (self.timeout is None or self.timeout > 0)
            ):
                hold = yield from self._take_or_join()
                if hold is not None:
                    acquired = True
                    return hold
                if self.subscription is not None:
                    backoff = _fallback_backoff(spec.recheck or PUSHED_POLL_CAP)
                    should_try = False
            while True:
                if should_try:
                    sent = time.monotonic()
                    token = yield from self._trying(
                        spec.try_call(self.traits, self.owner, entry.written_at is not None)
                    )
                    if token is not None:
                        hold = yield from self._confirmed(token, sent)
                        if hold is not None:
                            acquired = True
                            return hold
                        if not self.blocking and late_retries and not self.refused:
                            # a grant too late to use was no answer: one try without waiting
                            # gets one more
                            late_retries -= 1
                            continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if not self.blocking or (remaining is not None and remaining <= 0):
                    return None
                if self.row_locked:  # a guarded transaction holds the row: wait in the server
                    yield Sleep(ROW_LOCKED_PAUSE)
                    should_try = True
                    continue
                if self.subscription is None and not self.polling:
                    # listen before the next try, so a release in between is not missed
                    self.subscription = yield Subscribe(spec.key, self.owner, self.queue)
                    if self.subscription.live:
                        backoff = _fallback_backoff(spec.recheck or PUSHED_POLL_CAP)
                if (yield from self._keep_queued()):
                    should_try = True
                    continue
                yield from self._no_finished_record()
                if backoff is None:
                    backoff = Backoff(FIRST_BACKOFF, cap)
                pause = backoff.next()
                live = self.subscription is not None and self.subscription.live
                # A wake-up at every change to the store (SQLite's) is for the head and the
                # next in line; waiters further back pace themselves by the queue's speed, or
                # each release would wake all of them (and their watches' polling cost a
                # process each). Any other subscription still wakes its waiter early: a
                # Sleeper at a release in the same client, a key's channel at its release.
                paced = ahead > 1 and self.subscription is not None and self.subscription.broadcast
                if ahead >= 0 and (not live or paced):
                    if pacer is None:
                        pacer = TurnPacer(cap)
                    pause = pacer.pause(ahead)
                if spec.recheck is not None:  # a dead holder's lease end is noticed within it
                    pause = min(pause, spec.recheck)
                pause = pause if remaining is None else min(pause, remaining)
                if self.subscription is None or paced:
                    yield Sleep(pause)
                    should_try, ahead = yield from self._worth_trying()
                    continue
                yield Wait(self.subscription, pause)
                if self.subscription.granted is not None:
                    hold = yield from self._take_grant()
                    if hold is not None:
                        acquired = True
                        return hold
                    should_try = True
                    continue
                should_try, ahead = yield from self._worth_trying()
        except GeneratorExit:
            closed = True  # unfinished, by the garbage collector: no step may follow
            raise
        finally:
            reset_deadline(bound)
            if not closed:  # leaving the queue also hands on a lock handed to us
                leave = self._leave_queue() if entry.made and not acquired else None
                yield from stop_waiting(self.subscription, leave)

    def _no_finished_record(self) -> Steps[None]:
        """Raise ConfigurationError if the key names a finished once-record: a lock, read,
        write or permit waits for a hold to end, and that record never does (a failed one
        ends only by a ``once`` retry, a succeeded one never)."""
        if self.spec.kind == "once" or not self._record_check_due():
            return
        record = yield Call(OnceRecords.once_state, self.spec.key)
        if record is not None and record[0] == "once" and not record[2]:
            raise ConfigurationError(
                f"key {self.spec.key!r} is the key of a once-record ({record[1]}), which is "
                f"never released: a {self.spec.kind} on it would wait forever; use a different "
                "key for the lock (once-records and locks share one namespace)"
            )

    # -- a grant interrupted ------------------------------------------------------------------
    def _disown(self) -> Steps[None]:
        """End whatever hold of the key this acquisition's owner has in the store."""
        spec = self.spec
        try:
            holds = yield Call(Store.list_holds, spec.key)
            for hold in holds:
                if hold.key == spec.key and hold.owner == self.owner:
                    yield spec.end_call(self.owner, hold.token)
        except Exception as exc:  # noqa: BLE001 - the interruption is what propagates
            log.warning("could not end the interrupted grant of %r: %s", spec.key, exc)

    # -- queue upkeep -------------------------------------------------------------------------
    def _queueing(self, call: Call) -> Steps[Any]:
        """Run a statement that makes or refreshes our queue entry. Cut short (``cut_short``: an
        asyncio cancellation, Ctrl-C), it may have made the entry anyway: it counts as made,
        so leaving the queue removes it rather than leave it for its lease to end."""
        try:
            result = yield call
        except BaseException as exc:
            if cut_short(exc):
                self.entry.made = True
            raise
        return result

    def _keep_queued(self) -> Steps[bool]:
        """Make our queue entry, or refresh it when due; True if we should try again now (also
        when the statement waited for the key's row, held by an open transaction: the try
        then waits for that row in the server)."""
        entry, queue = self.entry, self.queue
        if queue is None or (
            entry.written_at is not None and time.monotonic() - entry.written_at <= QUEUE_TTL / 3
        ):
            self.row_locked = False
            return False  # nothing due (most waits): no statement, no generators
        return (yield from self._unless_row_locked(self._keep_queued_now(queue), True))

    def _keep_queued_now(self, queue: str) -> Steps[bool]:
        """``_keep_queued``'s statement for our entry in ``queue``, when due."""
        entry = self.entry
        sent = time.monotonic()
        sub = self.subscription
        if entry.written_at is None:
            # the lock may be handed to a plain lock's waiter that hears of releases
            lease = self.spec.ttl if sub is not None and sub.live and queue == "lock" else None
            yield from self._queueing(
                Call(FairQueue.enqueue, self.spec.key, self.owner, queue, QUEUE_TTL, lease)
            )
            entry.written(sent)
            # a release between our first try and our subscription was not announced to us:
            # look once more now (where a try is dear, a probe says whether to try), unless
            # the subscription wakes for a release that came before its first wait
            if sub is not None and sub.latched:
                return False
            if not self.traits.probe_before_try:
                return True
            should_try, _ahead = yield from self._worth_trying()
            return should_try
        kept = yield from self._queueing(
            Call(FairQueue.requeue, self.spec.key, self.owner, queue, QUEUE_TTL)
        )
        if not kept:
            # Our entry is gone: the lock was handed to us (its notification is late or lost,
            # and our own try takes it), or we were paused until the entry expired and was
            # purged (we queue again).
            entry.gone()
            return True
        entry.written(sent)
        return False

    def _leave_queue(self) -> Steps[None]:
        try:
            yield Call(FairQueue.dequeue, self.spec.key, self.owner)
        except BackendError as exc:  # the entry's own lease ends it soon enough
            log.warning("could not leave the wait queue of %r: %s", self.spec.key, exc)

    def _take_or_join(self) -> Steps[Hold | None]:
        """Where wake-ups already flow to this client: subscribe first, then one statement
        takes the lock or joins its queue (no separate enqueue and second try)."""
        joiner = self.traits.joiner
        if joiner is None or not joiner.joining():
            return None
        spec = self.spec
        subscription = yield Subscribe(spec.key, self.owner, self.queue)
        sent = time.monotonic()
        try:
            token = yield from self._trying(
                Call(QueueJoin.acquire_or_enqueue, spec.key, self.owner, spec.ttl, QUEUE_TTL)
            )
        except GeneratorExit:
            raise  # closed unfinished: no step may follow
        except BaseException as exc:
            if cut_short(exc):
                self.entry.made = True  # it may have queued us: leaving removes the entry
            yield Unsubscribe(subscription)
            raise
        if self.row_locked:  # neither taken nor joined: the wait tries again
            self.subscription = subscription
            return None
        if token is None:
            self.subscription = subscription
            self.entry.written(sent)
            return None
        self._in_hand = token
        yield Unsubscribe(subscription)
        return (yield from self._confirmed(token, sent))

    def _confirmed(self, token: int, sent: float) -> Steps[Hold | None]:
        """The hold of ``token``, granted by a request sent at ``sent``, or None if its reply
        does not confirm it (``replies.confirms``).

        Its lease began no earlier than ``sent``. A reply that took longer than the lease (a
        stalled network, a frozen server, a call resent to another node) brings a grant that
        may have run out on its way, and another client may hold the lock by now: reported as
        held, the caller's work would run unprotected. A short lease is also not confirmed by
        a reply that leaves less of it than ``replies.must_be_left``: it could be over before
        the caller runs again. Such a grant is renewed first (the renewal checks owner and
        token in the store). Gone, or still unconfirmed after ``LATE_RENEWALS`` renewals, it
        is ended (best effort: never left for its lease to end) and this try counts as
        failed: the caller waits on, queued afresh. A grant of a longer lease back in time is
        taken as it is, however little of it is left (a store whose commits are slow).

        A ttl that this client's recent grants (this one included) do not confirm
        (``Replies.too_short``) is refused: a try returns False, and a blocking acquire
        raises ValueError naming the shortest ttl they confirm, instead of waiting forever."""
        spec, replies = self.spec, self.traits.replies
        self._in_hand = token
        granted = Hold(spec, self.owner, token, spec.ttl, sent)
        hold, confirmed = yield from self._confirm(granted, sent)
        if hold is not None:
            return hold
        yield from self._end_unconfirmed(token)
        self._in_hand = None
        if replies.too_short(spec.ttl):
            self._refuse_short()
            if self.refused:
                self.entry.gone()
                return None
        log.warning(
            "lock %r: a grant (token %d) came back too late in its lease to use and was %s: "
            "this acquire goes on",
            spec.key,
            token,
            "renewed, again too late, and ended" if confirmed else "gone from the store",
            extra={"key": spec.key, "token": token, "owner": self.owner},
        )
        self.entry.gone()
        return None

    def _end_unconfirmed(self, token: int) -> Steps[None]:
        """End a grant that is not reported (it checks owner and token: never another's)."""
        try:
            yield self.spec.end_call(self.owner, token)
        except BackendError as exc:  # its lease ends it: the ttl at most
            log.debug("ending an unconfirmed grant of %r failed: %s", self.spec.key, exc)

    def _refuse_short(self) -> None:
        """A ttl this client's grants do not confirm: a try fails at once (no second try), a
        blocking acquire raises ValueError once ``MEASURED`` grants say so (it would wait
        forever for a grant it can use)."""
        spec, replies = self.spec, self.traits.replies
        shortest = replies.shortest()
        if not self.blocking:
            self.refused = True
            log.log(
                logging.WARNING if replies.first_refusal(spec.ttl) else logging.DEBUG,
                "lock %r: its ttl (%g s) is too short for the store's replies to confirm "
                "(the shortest they confirm is about %.3g s): not acquired",
                spec.key,
                spec.ttl,
                shortest,
                extra={"key": spec.key, "owner": self.owner},
            )
            return
        if len(replies) >= MEASURED:
            typical = replies.typical() or 0.0
            raise ValueError(
                f"lock {spec.key!r}: ttl={spec.ttl:g} s is too short for this store to confirm "
                f"a grant before its lease ends; the shortest ttl it confirms is about "
                f"{shortest:.3g} s (the median round trip of this client's last {len(replies)} "
                f"grants, {typical:.3g} s, plus {must_be_left(typical):.3g} s that must be left "
                "of a lease when it is reported): use a ttl of at least that, or longer to "
                "leave time for the work"
            )

    def _take_grant(self) -> Steps[Hold | None]:
        """The hold of a lock its releaser handed to us, or None if that lease already ran out
        (then we queue again).

        The hand-over's lease is the lock's ttl, capped by what was left of our queue entry's
        (or what the store vouches for, ``granted_lease``), and it started after our entry was
        last written: a conservative local bound. It is
        renewed first if that leaves less than half of it (or, for a short lease, less than
        ``replies.must_be_left``), or if the hand-over may be an earlier one heard late:
        renewing checks owner, token and lease in the store. A renewal that does not confirm
        it (``replies.confirms``) ends it.
        """
        spec, entry, sub = self.spec, self.entry, self.subscription
        token, vouched = None, None
        if sub is not None:
            token, sub.granted = sub.granted, None
            vouched, sub.granted_lease = sub.granted_lease, None
        if token is not None and entry.written_at is not None:
            self._in_hand = token
            lease = min(spec.ttl, QUEUE_TTL if vouched is None else vouched)
            hold = Hold(spec, self.owner, token, spec.ttl, entry.written_at, lease=lease)
            left = hold.expires_by - time.monotonic()
            if entry.trusted and left >= lease / 2 and confirms(spec.ttl, left, 0.0):
                return hold
            sent = time.monotonic()
            if (yield spec.renew_call(self.owner, token, spec.ttl)):
                hold = Hold(spec, self.owner, token, spec.ttl, sent)
                now = time.monotonic()
                if confirms(spec.ttl, hold.expires_by - now, now - sent) and hold.live():
                    return hold
                yield from self._end_unconfirmed(token)
            self._in_hand = None
        entry.gone()
        return None

    def _worth_trying(self) -> Steps[tuple[bool, int]]:
        """After a wait: try now? And how many waiters are ahead (-1: not asked).

        A waiter that is woken only when it is its turn just tries. One that is not (polling
        stores, or where writes are dear) asks a cheap read first, and tries only when the
        lock is free and nobody queues ahead of it.
        """
        probe = self.entry.written_at is not None and self.queue == "lock"
        targeted = self.subscription is not None and self.subscription.targeted
        if not probe or (targeted and not self.traits.probe_before_try):
            return True, -1
        free, ahead = yield Call(FairQueue.probe, self.spec.key, self.owner)
        return bool(free and ahead == 0), int(ahead)
