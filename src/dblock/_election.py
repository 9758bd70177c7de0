"""Leader election: ``client.election(name)``, one leader at a time, with a fencing token per
term (docs/election.md).

An election is a lock on the key ``name`` and nothing more: a term is a lease hold of it,
renewed in the background; candidates wait in the key's wait queue, so they lead in the
order they started campaigning; the term's token is the hold's fencing token, so terms'
tokens strictly increase. What a lock lacks is the leader's value, which the store keeps
with the hold (:class:`~dblock._contract.LeaderValues`): it belongs to one term, so nobody
reads an earlier leader's address beside a later leader's token.

The leader's value is proclaimed in a second step after the grant: a reader that comes in
between sees a hold with nothing proclaimed yet, and waits for it (a few milliseconds)
rather than report a leader with no value.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._contract import LeaderPush, LeaderValues, Leading, lacking, provides
from ._errors import BackendError, LockLost, LockTimeout, NotHeld
from ._lock import Lock
from ._runtime import Event
from ._types import LeaderInfo
from ._validate import check_key, check_leader_value, check_timeout, check_ttl

if TYPE_CHECKING:
    from ._core import Core

log = logging.getLogger("dblock")

#: the longest a candidate goes without looking at the term it waits for: a leader that died
#: without resigning is replaced within its ttl and this (releases wake candidates at once)
RECHECK = 0.5
#: how often ``observe()`` reads the leader where the store does not push changes
OBSERVE_POLL = 0.05
#: where it does (LeaderPush): the longest between two reads (a leader whose lease ran out
#: with nobody to take over is no event on every store)
OBSERVE_SAFETY_POLL = 1.0
#: the longest pause between an observer's reads while the store fails
OBSERVE_BACKOFF_CAP = 2.0
#: how long a reader waits for a new leader to proclaim its value before reporting it
#: without one (the proclaim follows the grant at once; a leader that died in between never
#: proclaims)
PROCLAIM_WAIT = 0.5
#: the pause between reads while waiting for that value
PROCLAIM_POLL = 0.01


def leader_info(name: str, leading: Leading | None) -> LeaderInfo | None:
    """The public view of a store's answer."""
    if leading is None:
        return None
    info = leading.info
    return LeaderInfo(name=name, value=leading.value, token=info.token, since=info.acquired_at)


class Term:
    """One term of leadership, from :meth:`Election.campaign`: ``with`` it, or
    :meth:`resign`. Any thread of the client may proclaim or resign it.

    ``lost`` is set, and the election's ``on_lost`` called once, when the term's lease is
    lost (another candidate may lead now): stop acting as the leader. ``token`` is the
    term's fencing token; pass it with every write the leader makes so that a resource can
    refuse a deposed leader's late writes.
    """

    def __init__(
        self,
        election: Election,
        lock: Lock,
        *,
        tid: int,
        token: int,
        value: str | None,
        lost: Any,
    ) -> None:
        self._election = election
        self._lock = lock
        self._tid = tid
        self._value = value
        self._token = token
        #: set when the term is lost (``threading.Event``; ``asyncio.Event`` in the async API)
        self.lost = lost
        self._reported = False
        self._report_mutex = threading.Lock()
        self._resigned = False
        #: resign() was called (it may have failed: the term renews no more)
        self._stepping_down = False
        #: the async API's term that wraps this one (dblock._async_election)
        self.outer: object = None

    @property
    def name(self) -> str:
        return self._election.name

    @property
    def key(self) -> str:
        """The lock key the election is kept under: its name."""
        return self._election.name

    @property
    def ttl(self) -> float:
        """The term's lease in seconds."""
        return self._election.ttl

    @property
    def token(self) -> int:
        """The term's fencing token: strictly increases from term to term of the election."""
        return self._token

    @property
    def value(self) -> str | None:
        """What this leader proclaimed last."""
        return self._value

    @property
    def leading(self) -> bool:
        """True while the term is neither resigned nor known to be lost."""
        return not self._stepping_down and not self._reported and self._lock.held

    @property
    def lease_end(self) -> float | None:
        """The ``time.monotonic()`` moment from which the term's lease may have ended (see
        :attr:`dblock.Lock.lease_end`); None once resigned or lost."""
        return None if self._resigned else self._lock.lease_end

    def proclaim(self, value: str | None) -> None:
        """Change the leader's value without giving up the term. Raises LockLost if the term
        is lost (it was not the leader's to change any more)."""
        value = check_leader_value(value)
        if self._stepping_down or self._reported:
            raise self._lost_error("proclaim")
        if not self._election._store.proclaim(self.name, self._lock.owner, self.token, value):
            self.report_lost()
            raise self._lost_error("proclaim")
        self._value = value

    def resign(self) -> None:
        """Give up leadership now: the next candidate leads at once. Idempotent; a term
        already known to be lost resigns quietly (its loss was reported through ``lost``
        and ``on_lost``); a loss found only now is reported, then raises LockLost. If the
        store cannot be reached (BackendError) the term stops renewing, so its lease ends
        within its ttl, and ``resign()`` may be called again."""
        if self._resigned:
            return
        self._stepping_down = True
        if self._reported:
            self._resigned = True
            self._lock._release_quietly(self._tid)
            return
        try:
            self._lock._release(self._tid)
        except LockLost:
            self._resigned = True
            self.report_lost()
            raise
        except NotHeld:  # released already (its hold was ended meanwhile)
            pass
        self._resigned = True

    def abandon(self) -> None:
        """End a term that was never handed out (its campaign failed after the grant)."""
        self._resigned = self._stepping_down = True
        self._lock._release_quietly(self._tid)

    def report_lost(self) -> None:
        """Set ``lost`` and call the election's ``on_lost`` (once per term)."""
        with self._report_mutex:
            if self._reported:
                return
            self._reported = True
        self._election._term_lost(self)

    def _lost_error(self, what: str) -> LockLost:
        return LockLost(
            f"the term (token {self._token}) of election {self.name!r} is over: it was "
            f"{'resigned' if self._stepping_down else 'lost'} before {what}()",
            key=self.name,
        )

    def __enter__(self) -> Term:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.resign()

    def __repr__(self) -> str:
        state = "leading" if self.leading else "over"
        return f"<dblock.Term election={self.name!r} token={self._token} {state}>"


class Election:
    """Leader election among the clients that campaign for ``name``. Create it with
    :meth:`Client.election`.

    >>> with client.election("scheduler").campaign(value="10.0.0.7:8080") as term:
    ...     run_scheduler(until=term.lost, fence=term.token)
    """

    def __init__(
        self,
        core: Core,
        name: str,
        *,
        ttl: float = 15.0,
        on_lost: Callable[[Term], object] | None = None,
        new_event: Callable[[], Any] = threading.Event,
    ) -> None:
        self._name = check_key(name)
        self._ttl = check_ttl(ttl)
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be a callable taking the term")
        store = core.store
        if not provides(store, LeaderValues):
            raise lacking(store, LeaderValues, "election()")
        self._core = core
        self._store: LeaderValues = store
        self._on_lost = on_lost
        self._new_event = new_event

    @property
    def name(self) -> str:
        return self._name

    @property
    def ttl(self) -> float:
        return self._ttl

    def campaign(self, value: str | None = None, timeout: float | None = None) -> Term:
        """Wait until this client leads (candidates lead in the order they started), then
        proclaim ``value`` and return the term. Raises LockTimeout if not leading within
        ``timeout`` seconds (None: wait as long as it takes)."""
        value = check_leader_value(value)
        wait = check_timeout(timeout)
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            term = self._campaign_once(value, left)
            if term is not None:
                return term
            if deadline is not None and time.monotonic() >= deadline:
                raise self._timed_out(wait)

    def _campaign_once(self, value: str | None, wait: float | None) -> Term | None:
        """One campaign: the term, or None if it was lost before its value was proclaimed
        (a pause past the ttl right after the grant)."""
        box: list[Term] = []
        lock = Lock(
            self._core,
            self._name,
            ttl=self._ttl,
            timeout=wait,
            reentrant=False,
            auto_renew=True,
            on_lost=lambda _lock: box[0].report_lost() if box else None,
            recheck=RECHECK,
        )
        if not lock.acquire(timeout=wait):
            raise self._timed_out(wait)
        tid, token = self._core.owner_serial(), lock.token
        term = Term(self, lock, tid=tid, token=token or 0, value=value, lost=self._new_event())
        box.append(term)
        try:
            proclaimed = token is not None and self._store.proclaim(
                self._name, lock.owner, token, value
            )
        except BaseException:  # cancelled, interrupted, unreachable: lead nowhere unseen
            term.abandon()
            raise
        if not proclaimed:
            # lost between the grant and the proclaim (a pause past the ttl): not a term
            term.abandon()
            return None
        return term

    def _timed_out(self, wait: float | None) -> LockTimeout:
        leader = self.leader()
        who = "nobody" if leader is None else f"token {leader.token}, value {leader.value!r}"
        return LockTimeout(
            f"election {self._name!r}: not leading within {wait:g} s (leader: {who})",
            key=self._name,
        )

    def _term_lost(self, term: Term) -> None:
        term.lost.set()
        log.warning("lost the term (token %s) of election %r", term._token, self._name)
        if self._on_lost is not None:
            try:
                self._on_lost(term)
            except Exception:
                log.exception("on_lost callback of election %r raised", self._name)

    def leader(self) -> LeaderInfo | None:
        """Who leads now (read from the store), or None."""
        return leader_info(self._name, self._settled())

    def _settled(self) -> Leading | None:
        """The store's leader, once it has proclaimed its value (see the module)."""
        leading = self._store.leader(self._name)
        give_up = time.monotonic() + PROCLAIM_WAIT
        while leading is not None and not leading.proclaimed and time.monotonic() < give_up:
            self._core.rt.sleep(PROCLAIM_POLL)
            leading = self._store.leader(self._name)
        return leading

    def observe(self) -> Iterator[LeaderInfo | None]:
        """Yield the leader now, then each time it changes (a new term, a new value, nobody),
        in order, forever. A change between two reads that is undone by the next (a term too
        short to be seen) is not shown; the latest state always is. While the store cannot
        be reached it keeps trying (logging once), then goes on from the latest state."""
        watch = self.watch()
        try:
            last: LeaderInfo | object | None = _NOTHING
            while True:
                last = self.next_change(last, watch)
                yield last
        finally:
            watch.close()

    def watch(self) -> LeaderWatch:
        """What ``observe()`` waits on between its reads: the store's pushes, if it has
        them (LeaderPush), else a poll."""
        event = self._core.rt.event()
        if provides(self._core.store, LeaderPush):
            unwatch = self._core.store.watch_leader(self._name, event.set)
            return LeaderWatch(event, OBSERVE_SAFETY_POLL, unwatch)
        return LeaderWatch(event, OBSERVE_POLL, None)

    def next_change(
        self, last: object, watch: LeaderWatch, until: Callable[[], bool] | None = None
    ) -> LeaderInfo | None:
        """Wait until the leader differs from ``last``; the new one. ``until``: checked at
        each wake-up (whoever makes it true sets ``watch.event``); once true, return None
        without waiting for a change."""
        pause = OBSERVE_POLL
        while True:
            if until is not None and until():
                return None
            watch.event.clear()  # before the read: a change after it wakes the wait
            try:
                now = self.leader()
            except BackendError as exc:  # unreachable for now: the latest state once back
                pause = self._unreachable(exc, pause)
                self._core.rt.sleep(pause)
                continue
            pause = OBSERVE_POLL
            if _change(now) != _change(last):
                return now
            watch.event.wait(watch.poll)

    def _unreachable(self, exc: BackendError, pause: float) -> float:
        """Log a failed read of an observer; the pause before the next (backing off)."""
        if pause == OBSERVE_POLL:
            log.warning("observing election %r: the store failed (%s)", self._name, exc)
        return min(2 * pause, OBSERVE_BACKOFF_CAP)

    def __repr__(self) -> str:
        return f"<dblock.Election name={self._name!r} ttl={self._ttl:g}>"


_NOTHING = object()


def _change(leader: object) -> object:
    """What tells two readings of the leader apart: its term and value. ``since`` is left
    out: a quorum's is the latest of the stores that answered, which may differ from read
    to read within one term."""
    if isinstance(leader, LeaderInfo):
        return (leader.token, leader.value)
    return leader


class LeaderWatch:
    """An observer's wake-ups: ``event`` is set when the store tells of a change; ``poll``
    is the longest wait between reads (the safety net, or the whole of it unpushed)."""

    def __init__(self, event: Event, poll: float, unwatch: Callable[[], None] | None) -> None:
        self.event = event
        self.poll = poll
        self._unwatch = unwatch

    def close(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()


Election.__module__ = "dblock"
Term.__module__ = "dblock"
