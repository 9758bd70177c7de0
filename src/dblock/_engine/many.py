"""Acquiring several keys at once (``lock_many``): all or none, waiting without holding any.

One try is one atomic step of the store (``ManyKeys.acquire_many``): every key is taken, each
with its own token, or none is. A waiter therefore never holds some of its keys while it
waits for the others, and two waiters for overlapping sets can never wait for each other.

Where the store keeps wait queues for several keys (``FairManyKeys``), a waiter that did not
get its keys at the first try makes an entry in every key's queue in one step, at one place
of an order common to all keys: newcomers and single-key waiters that come later queue
behind it, so a stream of them cannot starve it; of two waiters for overlapping sets, the
one ahead on one key is ahead on all of them, so the queues never deadlock either. Its wait
is bounded by the holds and the entries already ahead of it when it queued, each ending
within its lease. It wakes when any of its keys is released (``subscribe_many``), polling
only as a safety net; where the store pushes nothing, it polls with capped, jittered backoff.
No I/O here: the client drives these steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._contract import FairManyKeys, ManyKeys, OnceRecords, Store, Subscription, provides
from .._errors import BackendError, ConfigurationError
from .._timing import Backoff, reset_deadline, set_deadline
from .attempt import ROW_LOCKED_PAUSE, Attempt, cut_short, stop_waiting
from .hold import Hold
from .kinds import Spec
from .ops import Call, Sleep, Steps, Wait
from .replies import MEASURED
from .traits import Traits
from .waiting import FIRST_BACKOFF, LATE_RETRIES, PUSHED_POLL_CAP, QUEUE_TTL

log = logging.getLogger("dblock")


@dataclass
class ManySpec(Spec):
    """A ``lock_many`` hold: its keys (sorted) and, once granted, each key's token. ``key``
    names them all, for logs and observers."""

    keys: tuple[str, ...] = ()
    tokens: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, keys: tuple[str, ...], ttl: float) -> ManySpec:
        return cls(", ".join(keys), ttl, "many", keys=keys)

    def granted(self, tokens: Mapping[str, int]) -> ManySpec:
        """The spec of the hold granted with ``tokens``."""
        return ManySpec(self.key, self.ttl, self.kind, keys=self.keys, tokens=dict(tokens))

    def tokens_of(self, token: int) -> dict[str, int]:
        return dict(self.tokens)

    def renew_call(self, owner: str, token: int, ttl: float) -> Call:
        return Call(ManyKeys.renew_many, self.tokens, owner, ttl)

    def end_call(self, owner: str, token: int) -> Call:
        return Call(ManyKeys.release_many, self.tokens, owner)


def many_hold(spec: ManySpec, owner: str, tokens: Mapping[str, int], sent: float) -> Hold:
    """The hold of a grant of ``tokens`` by a request sent at ``sent``. Its ``token`` is the
    first key's (for logs); each key's is in ``hold.spec.tokens``."""
    granted = spec.granted(tokens)
    return Hold(granted, owner, granted.tokens[spec.keys[0]], spec.ttl, sent)


class ManyAcquisition(Attempt[dict[str, int]]):
    """One ``lock_many`` acquire's waiting state machine: ``run()`` is its steps."""

    spec: ManySpec

    def __init__(
        self,
        store: Store,
        traits: Traits,
        spec: ManySpec,
        owner: str,
        *,
        blocking: bool,
        timeout: float | None,
    ) -> None:
        super().__init__(traits, spec, owner, blocking=blocking, timeout=timeout)
        #: the store queues waiters for several keys (else they retry as newcomers)
        self.fair = provides(store, FairManyKeys)
        self.subscription: Subscription | None = None
        self._subscribed = False
        #: when our queue entries were last written (local clock), None: we have none
        self._queued_at: float | None = None
        #: we made entries (or may have: an interrupted statement), to remove at the end
        self._entries_made = False

    def _run(self) -> Steps[Hold | None]:  # noqa: PLR0912 - the waiting loop, in one place
        spec = self.spec
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        backoff = Backoff(FIRST_BACKOFF, self.traits.poll_cap)
        late_retries = LATE_RETRIES
        acquired = closed = False
        bound = set_deadline(deadline if self.blocking else time.monotonic())
        try:
            while True:
                sent = time.monotonic()
                queued = self._queued_at is not None
                call = (
                    Call(FairManyKeys.acquire_many_in_turn, spec.keys, self.owner, spec.ttl)
                    if queued
                    else Call(ManyKeys.acquire_many, spec.keys, self.owner, spec.ttl)
                )
                tokens = yield from self._trying(call)
                if tokens is not None:
                    if queued:
                        self._entries_made = False  # the grant removed them
                    hold = yield from self._confirmed(tokens, sent)
                    if hold is not None:
                        acquired = True
                        return hold
                    if not self.blocking and late_retries and not self.refused:
                        late_retries -= 1
                        continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if not self.blocking or self.refused or (remaining is not None and remaining <= 0):
                    return None
                if self.row_locked:  # a guarded transaction holds a key's row (see _trying)
                    yield Sleep(ROW_LOCKED_PAUSE)
                    continue
                if not self._subscribed:
                    # listen before the next try, so a release in between is not missed
                    self._subscribed = True
                    self.subscription = yield Call(ManyKeys.subscribe_many, spec.keys, self.owner)
                    if self.subscription is not None and self.subscription.live:
                        backoff = Backoff(0.75 * PUSHED_POLL_CAP, PUSHED_POLL_CAP)
                if (yield from self._keep_queued()):
                    continue  # just queued: a release before it told nobody, so look now
                yield from self._no_finished_record()
                pause = backoff.next()
                if remaining is not None:
                    pause = min(pause, remaining)
                if self.subscription is not None:
                    yield Wait(self.subscription, pause)
                else:
                    yield Sleep(pause)
        except GeneratorExit:
            closed = True  # unfinished, by the garbage collector: no step may follow
            raise
        finally:
            reset_deadline(bound)
            if not closed:
                leave = self._leave_queues() if self._entries_made and not acquired else None
                yield from stop_waiting(self.subscription, leave)

    # -- queue entries ------------------------------------------------------------------------
    def _keep_queued(self) -> Steps[bool]:
        """Make our entries on every key, or refresh them when due; True if just made (or
        the statement waited for a key's row that an open transaction holds: try again)."""
        return (yield from self._unless_row_locked(self._keep_queued_now(), True))

    def _keep_queued_now(self) -> Steps[bool]:
        if not self.fair:
            return False
        spec, owner = self.spec, self.owner
        now = time.monotonic()
        if self._queued_at is not None and now - self._queued_at <= QUEUE_TTL / 3:
            return False
        if self._queued_at is not None:
            kept = yield from self._queueing(
                Call(FairManyKeys.requeue_many, spec.keys, owner, QUEUE_TTL)
            )
            if kept:
                self._queued_at = now
                return False
        # none yet, or one lapsed (a pause past its lease): queue afresh, all at one place
        yield from self._queueing(Call(FairManyKeys.enqueue_many, spec.keys, owner, QUEUE_TTL))
        self._queued_at = now
        return True

    def _queueing(self, call: Call) -> Steps[Any]:
        """A statement that makes or keeps our entries: interrupted in flight, it may have made
        them, so leaving removes them rather than leave them for their lease to end."""
        try:
            result = yield call
        except BaseException as exc:
            if cut_short(exc):
                self._entries_made = True
            raise
        self._entries_made = True
        return result

    def _leave_queues(self) -> Steps[None]:
        try:
            yield Call(FairManyKeys.dequeue_many, self.spec.keys, self.owner)
        except BackendError as exc:  # the entries' own lease ends them soon enough
            log.warning("could not leave the wait queues of %s: %s", self.spec.key, exc)

    def _no_finished_record(self) -> Steps[None]:
        """Raise ConfigurationError if a key names a finished once-record, which never ends:
        the wait would last forever."""
        if not self._record_check_due():
            return
        for key in self.spec.keys:
            record = yield Call(OnceRecords.once_state, key)
            if record is not None and record[0] == "once" and not record[2]:
                raise ConfigurationError(
                    f"key {key!r} of lock_many({list(self.spec.keys)!r}) is the key of a "
                    f"once-record ({record[1]}), which is never released: the lock_many would "
                    "wait forever; use different keys for locks (once-records and locks share "
                    "one namespace)"
                )

    # -- grants -------------------------------------------------------------------------------
    def _disown(self) -> Steps[None]:
        try:
            mine: dict[str, int] = {}
            for key in self.spec.keys:
                info = yield Call(Store.info, key)
                if info is not None and info.key == key and info.owner == self.owner:
                    mine[key] = info.token
            if mine:
                yield Call(ManyKeys.release_many, mine, self.owner)
        except Exception as exc:  # noqa: BLE001 - the interruption is what propagates
            log.warning("could not end the interrupted grant of %s: %s", self.spec.key, exc)

    def _end_in_hand(self, grant: dict[str, int]) -> Steps[None]:
        yield from self._end(grant)

    def _end(self, tokens: Mapping[str, int]) -> Steps[None]:
        try:
            yield Call(ManyKeys.release_many, dict(tokens), self.owner)
        except Exception as exc:  # noqa: BLE001 - what propagates is the caller's error
            log.warning("could not end the grant of %s: %s", self.spec.key, exc)

    def _confirmed(self, tokens: dict[str, int], sent: float) -> Steps[Hold | None]:
        """The hold of a grant sent at ``sent``, or None if its reply came back too late in its
        lease to use (as for one key, ``Acquisition._confirmed``): it is renewed to confirm
        it, or ended, and this try counts as failed."""
        spec, replies = self.spec, self.traits.replies
        self._in_hand = tokens
        hold, _ = yield from self._confirm(many_hold(spec, self.owner, tokens, sent), sent)
        if hold is not None:
            return hold
        yield from self._end(tokens)
        self._in_hand = None
        if replies.too_short(spec.ttl):
            if self.blocking and len(replies) >= MEASURED:
                raise ValueError(
                    f"lock_many({list(spec.keys)!r}): ttl={spec.ttl:g} s is too short for this "
                    "store to confirm a grant before its lease ends; the shortest ttl it "
                    f"confirms is about {replies.shortest():.3g} s"
                )
            self.refused = not self.blocking
        log.warning(
            "lock_many %s: a grant came back too late in its lease to use and was ended: "
            "this acquire goes on",
            spec.key,
        )
        self._queued_at = None  # the grant removed our entries: queue again if we wait
        return None
