"""A quorum over several independent stores: a hold exists while a majority grants it.

The store contract, kept by asking every member store at once and counting answers with the
rules of :mod:`dblock.stores.quorum.rules`. A grant reads the key's fence from a majority (each
floored by its store's clock, so it rises even where the fences were lost), picks the token T
above them all, and asks each store to grant the key with T only if its own fence
is below T (``FencedGrants.grant_fenced``, one atomic step); the hold is had if a majority
granted within the lease, and otherwise released everywhere. Any two grants thus share a
store that accepted the later one only with a larger token, after the earlier one's lease
ended there: tokens strictly increase (docs/stores/quorum.md has the argument and its limits).

A member that fails, answers too late or cannot be reached costs its vote, is logged once and
asked again after a backoff; only when fewer than a majority answer is it a BackendError.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, TypeVar

from ... import _forksafe
from ..._contract import (
    FairManyKeys,
    FairQueue,
    FencedGrants,
    FencedManyGrants,
    LeaderValues,
    Leading,
    ManyKeys,
    ScheduledRuns,
    Store,
    Subscription,
    Wakeups,
    lacking,
    provides,
)
from ..._engine.replies import Replies
from ..._errors import BackendError, ConfigurationError, DBLockError
from ..._runtime import THREADS, Runtime
from ..._timing import bounded_wait
from ..._types import LockInfo
from .._pool import Sleeper
from .rules import (
    SPLIT_ROUNDS,
    TIMED_OUT,
    Fault,
    Health,
    agreed,
    grant_verdict,
    held_on_majority,
    majority,
    next_token,
    split_pause,
    store_lease,
)

log = logging.getLogger("dblock")
T = TypeVar("T")
F = TypeVar("F")  # what a member answers to a fence read
G = TypeVar("G")  # the token(s) a grant round mints from the fences

#: ``active`` while this thread hands jobs to a quorum's pool, holding the pool's locks: a
#: finalizer or signal handler that runs then (the collector runs finalizers wherever memory
#: is allocated) and calls into a quorum must not wait for those locks (docs/stores/quorum.md)
_handing_over = threading.local()

#: longest wait for the members' answers to one operation, seconds: a slower member costs
#: its vote (a grant waits no longer than its ttl either)
ANSWER_WITHIN = 2.0
#: what a quorum client offers (the end of its "does not provide" messages)
OFFERS = (
    "; a quorum client offers lock, lock_many, locked, scheduled, info, list and force_release "
    "(see docs/stores/quorum.md)"
)


class Member:
    """One store of the quorum: opened lazily again after it failed to open."""

    def __init__(
        self, url: str, opener: Callable[[], Store], store: Store | None, runtime: Runtime
    ) -> None:
        self.url = url
        self.opener = opener
        self.store = store
        self.health = Health()
        self._open_lock = runtime.mutex()  # one opening at a time (a forked child's anew)
        #: requests sent to it and not yet answered or failed, by this process (a forked
        #: child inherits the count, not the threads that would bring it down)
        self._in_flight = 0
        self._flight_pid = _forksafe.pid()
        self._count_lock = _forksafe.lock()

    def askable(self, now: float) -> bool:
        """Not backing off, and not down with a request still unanswered: a store that
        stopped answering (frozen, or a network that drops packets) is asked again once that
        request ends (its statement deadline aborts it), not by every call meanwhile, each
        of which would wait for it to the end of its answer window."""
        return self.health.available(now) and not (self.health.down and self.sent(0) > 0)

    def sent(self, delta: int) -> int:
        """Count ``delta`` more requests in flight; how many are."""
        with self._count_lock:
            if self._flight_pid != _forksafe.pid():
                self._in_flight, self._flight_pid = 0, _forksafe.pid()
            self._in_flight += delta
            return self._in_flight

    def get(self) -> Store:
        if self.store is None:
            with self._open_lock:
                if self.store is None:
                    self.store = checked(self.opener())
        return self.store


def checked(store: Store) -> Store:
    """``store``, if it can serve in a quorum (else closed, and a ConfigurationError)."""
    if not provides(store, FencedGrants):
        store.close()
        raise lacking(store, FencedGrants, "a quorum")
    return store


class QuorumStore(Store, ScheduledRuns, FairQueue, Wakeups, FairManyKeys, LeaderValues):
    """The store contract over ``members`` (at least three independent stores).

    Waiters line up in the wait queue of one member, the first in the URLs' order that keeps
    queues and answers (its queue orders the turns, not the grants, so a lost queue costs
    fairness, never safety); it also wakes them. Several keys are granted together by one
    atomic step on each member (FencedManyGrants), held while a majority granted them all.
    """

    name = "quorum"
    offers = OFFERS
    #: a try costs two round trips to every store; a look at the queue, one to one store
    probe_before_try = True

    def __init__(self, members: list[Member], table: str, runtime: Runtime = THREADS) -> None:
        self.members = members
        self.n = len(members)
        self.table = table
        self.rt = runtime
        self.safe_url = " ".join(_safe(m) for m in members)
        self.poll_cap = max((m.store.poll_cap for m in members if m.store), default=0.25)
        opened = [m.store for m in members if m.store is not None]
        self.max_keys = min((s.max_keys for s in opened if provides(s, ManyKeys)), default=64)
        self.withheld = _withheld(opened)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._pool_lock = _forksafe.lock()
        self._late: set[Any] = set()  # the async client's tasks for late answers
        #: how long the grant rounds a majority answered took
        self._rounds = Replies()

    # -- running one operation on every member ---------------------------------------------
    def _ask(self, member: Member, what: str, call: Callable[[Any], T]) -> T:
        """``call(store)`` on one member, keeping its health (a fault logged once)."""
        member.sent(1)
        try:
            value = call(member.get())
        except (DBLockError, OSError) as exc:
            if member.health.failed(time.monotonic()):
                log.warning("quorum store %s failed (%s): %s", _safe(member), what, exc)
            raise
        finally:
            member.sent(-1)
        if member.health.answered():
            log.warning("quorum store %s answers again", _safe(member))
        return value

    def _fan_out(
        self,
        what: str,
        call: Callable[[Any], T],
        *,
        within: float | None = None,
        members: Sequence[Member] | None = None,
        late: Callable[[Member, T], None] | None = None,
    ) -> list[T | Fault]:
        """``call(store)`` on every member at once; the answers in members' order, a Fault for
        each that failed, was not asked (backing off) or did not answer ``within`` s (default
        :data:`ANSWER_WITHIN`, read at each call) (it is then backed off from like a failed
        one). ``late`` gets the answers that came after that.

        It waits for every store that answers in time, though a majority would do for
        safety: a hold that stands on every store survives one of them restarting empty, one
        on a bare majority does not, and ``info`` right after a renewal agrees with it."""
        members = self.members if members is None else members
        within = ANSWER_WITHIN if within is None else within
        now = time.monotonic()
        out: list[T | Fault] = [Fault("backing off") for _ in members]
        asked = [i for i, m in enumerate(members) if m.askable(now)]
        jobs = [self._job(members[i], what, call) for i in asked]
        later = late and _late_for(late, members, asked)
        if self.rt is THREADS:
            outcomes = self._run_threads(jobs, within, later)
        else:
            from .fanout import fan_out_on_loop

            outcomes = fan_out_on_loop(self.rt, jobs, within, later, self._late)
        for i, outcome in zip(asked, outcomes, strict=True):
            out[i] = outcome
            if outcome is TIMED_OUT and members[i].health.failed(time.monotonic()):
                log.warning(
                    "quorum store %s is slow (%s): no answer in %g s",
                    _safe(members[i]),
                    what,
                    within,
                )
        return out

    def _job(self, member: Member, what: str, call: Callable[[Any], T]) -> Callable[[], T]:
        return lambda: self._ask(member, what, call)

    def _run_threads(
        self,
        jobs: list[Callable[[], T]],
        within: float,
        late: Callable[[int, T], None] | None,
    ) -> list[T | Fault]:
        if getattr(_handing_over, "active", False):
            # re-entered by a finalizer or signal handler while this thread held the pool's
            # locks: ask the stores one after another on this thread (each call is bounded by
            # its store's own timeouts), never wait for a lock this thread holds
            return [_inline(job) for job in jobs]
        _handing_over.active = True
        try:
            pool = self._executor()
            # each job sees the caller's context (its deadline for statements: dblock._timing)
            futures = [pool.submit(contextvars.copy_context().run, job) for job in jobs]
        finally:
            _handing_over.active = False
        deadline = time.monotonic() + within
        try:
            _wait_until(futures, deadline, FIRST_EXCEPTION)  # all answered, or the time is up
        except BaseException:
            # Interrupted (Ctrl-C, a signal handler's exception): the calls go on and reach
            # the stores anyway. The caller's cleanup (leaving a queue the call may have
            # joined, ending a grant it may have made) must come after them, not race them.
            # An error in this wait (the interruption landing again) ends it; a second
            # interruption propagates.
            with contextlib.suppress(Exception):
                _wait_until(futures, deadline, ALL_COMPLETED)
            raise
        out: list[T | Fault] = []
        for i, future in enumerate(futures):
            if not future.done():
                out.append(TIMED_OUT)
                if late is not None:
                    future.add_done_callback(_after(i, late))
            elif future.exception() is not None:
                out.append(Fault(str(future.exception())))
            else:
                out.append(future.result())
        return out

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            # a forked child has none of the parent's threads: it makes a pool of its own
            if self._pool is None or self._pool_pid != _forksafe.pid():
                self._pool = ThreadPoolExecutor(
                    max_workers=max(16, 4 * self.n), thread_name_prefix="dblock-quorum"
                )
                self._pool_pid = _forksafe.pid()
            return self._pool

    def _answered(self, what: str, key: str | None, outcomes: Sequence[object]) -> None:
        """Raise BackendError unless a majority answered."""
        faults = [o for o in outcomes if isinstance(o, Fault)]
        if self.n - len(faults) >= majority(self.n):
            return
        about = f" of {key!r}" if key is not None else ""
        reasons = self._fault_reasons(outcomes)
        raise BackendError(
            f"{what}{about} failed: only {self.n - len(faults)} of the quorum's {self.n} stores "
            f"answered, {majority(self.n)} needed ({reasons})"
        )

    def _fault_reasons(self, outcomes: Sequence[object]) -> str:
        """Each member that gave no answer, and why, for an error message."""
        return "; ".join(
            f"{_safe(m)}: {o.reason}"
            for m, o in zip(self.members, outcomes, strict=True)
            if isinstance(o, Fault)
        )

    # -- Store ------------------------------------------------------------------------------
    def ensure_schema(self, create: bool) -> None:
        """Each member's tables are made or checked when it is opened."""

    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        lease = store_lease(ttl)
        return self._in_rounds(
            lambda: self._grant_round(
                key,
                ttl,
                read=lambda s: s.fence(key),
                mint=next_token,
                grant=lambda s, token: s.grant_fenced(key, owner, lease, token, kind),
                undo=lambda s: s.release_owned(key, owner),
            )
        )

    def _in_rounds(self, round_: Callable[[], tuple[G | None, bool]]) -> G | None:
        """Grant rounds (``_grant_round``) until one did not fail by a split vote, at most
        SPLIT_ROUNDS; what the last one granted."""
        for i in range(SPLIT_ROUNDS - 1):
            granted, split = round_()
            if granted is not None or not split:
                return granted
            # A split vote: contenders that came at once each won some stores and none a
            # majority, so each gave its grants back. Nobody holds the key, and "busy" would
            # be false (a `scheduled` job fired on every host at once would run nowhere).
            # Each such contender tries again after its own random pause; the first to come
            # back finds the stores free (and fenced above the last round's token).
            self.rt.sleep(random.uniform(0, split_pause(i)))
        return round_()[0]

    def _grant_round(
        self,
        about: str,
        ttl: float,
        *,
        read: Callable[[Any], F],
        mint: Callable[[list[F]], G],
        grant: Callable[[Any, G], bool],
        undo: Callable[[Any], object],
    ) -> tuple[G | None, bool]:
        """One round of fenced grants: (the token(s) if held, whether it failed by a split
        vote, that is this contender won some stores but not a majority). ``read`` a
        member's fence(s), ``mint`` the token(s) from a majority's, ``grant`` them on a member
        (one atomic step, True if granted), ``undo`` a member's grant."""
        # T above every fence read is granted on every store that answers (see _fan_out)
        start = time.monotonic()
        fences = self._fan_out("reading the fence", read)
        self._answered("acquire", about, fences)
        token = mint([f for f in fences if not isinstance(f, Fault)])
        settled = False  # True once this attempt has failed: late grants are then undone

        def undo_late(member: Member, granted: bool) -> None:
            if granted and settled:
                self._undo(member, undo)

        try:
            votes = self._fan_out(
                "acquire",
                lambda s: grant(s, token),
                # a ttl that ordinary rounds do not beat waits for the answers: cut at the
                # ttl, every store would count as slow, and none would grant it
                within=ANSWER_WITHIN if self._rounds.too_short(ttl) else min(ttl, ANSWER_WITHIN),
                late=undo_late,
            )
        except BaseException:  # interrupted (a cancellation): no grant may outlive the call
            settled = True
            with contextlib.suppress(Exception):
                self._fan_out("release", undo)
            raise
        granted = sum(v is True for v in votes)
        refused = sum(v is False for v in votes)
        elapsed = time.monotonic() - start
        if granted + refused >= majority(self.n):
            self._rounds.seen(elapsed)
        short = self._rounds.too_short(ttl)
        verdict = grant_verdict(self.n, granted, refused, elapsed, ttl, too_short=short)
        if verdict in ("held", "late"):
            # a late one is handed to the engine, which ends it and refuses the ttl: released
            # here, it would look like a busy key, waited on forever
            return token, False
        settled = True
        # every store that may have granted: those that did, and those whose answer is missing
        maybe = [m for m, v in zip(self.members, votes, strict=True) if v is not False]
        if maybe:
            self._fan_out("release", undo, members=maybe)
        if verdict == "unreachable":
            self._answered("acquire", about, votes)
        return None, granted > 0

    def _undo(self, member: Member, undo: Callable[[Any], object]) -> None:
        # a failure was logged by _ask; the grant's lease ends it then
        with contextlib.suppress(DBLockError, OSError):
            self._ask(member, "release", undo)

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        lease = store_lease(ttl)

        def renew_or_repair(store: Any) -> bool:
            # A store that lost the hold (restarted empty, or it missed the grant) is given it
            # again with the same token where it is free and fenced below it: a long hold
            # does not stay on a bare majority, which one more restart would break.
            return bool(store.renew(key, owner, token, lease)) or bool(
                store.grant_fenced(key, owner, lease, token, "lock")
            )

        outcomes = self._fan_out("renew", renew_or_repair)
        return self._on_majority("renew", key, outcomes)

    def release(self, key: str, owner: str, token: int) -> bool:
        outcomes = self._fan_out("release", lambda s: s.release(key, owner, token))
        return self._on_majority("release", key, outcomes)

    def finish_scheduled(self, key: str, owner: str, token: int, at_least: float) -> bool:
        def finish(store: Any) -> bool:
            if provides(store, ScheduledRuns):
                return store.finish_scheduled(key, owner, token, at_least)
            return bool(store.release(key, owner, token))

        return self._on_majority("release", key, self._fan_out("release", finish))

    def _on_majority(self, what: str, key: str, outcomes: Sequence[object]) -> bool:
        failed = sum(isinstance(o, Fault) for o in outcomes)
        ok = sum(o is True for o in outcomes)
        done = held_on_majority(self.n, ok, failed)
        if done is None:
            self._answered(what, key, outcomes)  # raises if too few answered
            # a majority answered, but too few of them did it to tell, and enough did not
            # answer that it may have been done on a majority
            reasons = self._fault_reasons(outcomes)
            raise BackendError(
                f"{what} of {key!r} failed: {self.n - failed} of the quorum's {self.n} stores "
                f"answered but only {ok} did it, {majority(self.n)} needed, and the others "
                f"may have ({reasons})"
            )
        return bool(done)

    def info(self, key: str) -> LockInfo | None:
        outcomes = self._fan_out("info", lambda s: s.info(key))
        self._answered("info", key, outcomes)
        return agreed(self.n, [o for o in outcomes if not isinstance(o, Fault)])

    def list_holds(self, prefix: str) -> list[LockInfo]:
        outcomes = self._fan_out("list", lambda s: s.list_holds(prefix))
        self._answered("list", None, outcomes)
        per_key: dict[str, list[LockInfo | None]] = {}
        for holds in outcomes:
            if isinstance(holds, Fault):
                continue
            seen: set[str] = set()
            for info in holds:
                if info.key not in seen:  # one hold of a key per store (no shared holds here)
                    seen.add(info.key)
                    per_key.setdefault(info.key, []).append(info)
        found = [agreed(self.n, holds) for _key, holds in sorted(per_key.items())]
        return [i for i in found if i is not None]

    def force_release(self, key: str) -> bool:
        outcomes = self._fan_out("force_release", lambda s: s.force_release(key))
        self._answered("force_release", key, outcomes)
        return any(o is True for o in outcomes)

    # -- LeaderValues: on every member, the latest proclaim wins ------------------------------
    def proclaim(self, key: str, owner: str, token: int, value: str | None) -> bool:
        # Each member keeps the value with its own hold; a member that missed a proclaim (it
        # was down, or its hold was repaired later) keeps an older one, so every value
        # carries the moment it was proclaimed (one leader's clock: its terms' proclaims all
        # come from its process) and a read takes the latest among the members that agree
        # on the hold.
        stamped = _stamp(value)
        outcomes = self._fan_out("proclaim", lambda s: s.proclaim(key, owner, token, stamped))
        return self._on_majority("proclaim", key, outcomes)

    def leader(self, key: str) -> Leading | None:
        outcomes = self._fan_out("leader", lambda s: s.leader(key))
        self._answered("leader", key, outcomes)
        found = [o for o in outcomes if not isinstance(o, Fault) and o is not None]
        hold = agreed(self.n, [o.info for o in found])
        if hold is None:
            return None
        values = [
            _unstamp(o.value)
            for o in found
            if o.proclaimed and (o.info.owner, o.info.token) == (hold.owner, hold.token)
        ]
        if not values:
            return Leading(hold, False, None)
        return Leading(hold, True, max(values, key=lambda v: v[0])[1])

    # -- ManyKeys: one FencedManyGrants step on each member -----------------------------------
    def acquire_many(self, keys: Sequence[str], owner: str, ttl: float) -> dict[str, int] | None:
        """The keys' tokens, each minted as ``acquire`` mints one, if a majority of the stores
        each granted every key in one atomic step; otherwise nothing stays granted."""
        keys = list(keys)
        if not keys:
            return {}
        if len(keys) > self.max_keys:
            raise ValueError(f"{len(keys)} keys in one step: the quorum takes {self.max_keys}")
        if self._in_queue("probe", lambda q: _waited_for(q, keys, owner), False):
            return None
        lease = store_lease(ttl)
        return self._in_rounds(
            lambda: self._grant_round(
                _about(keys),
                ttl,
                read=lambda s: _fenced_many(s).fence_many(keys),
                mint=lambda fences: {k: next_token([f[k] for f in fences]) for k in keys},
                grant=lambda s, tokens: _fenced_many(s).grant_fenced_many(tokens, owner, lease),
                undo=lambda s: _fenced_many(s).release_owned_many(keys, owner),
            )
        )

    def renew_many(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        if not tokens:
            return True
        lease = store_lease(ttl)

        def renew_or_repair(store: Any) -> bool:
            # as renew: a store that lost the holds (restarted empty) is granted them again,
            # all or none, where each key is free there and fenced below its token
            return bool(store.renew_many(tokens, owner, lease)) or bool(
                _fenced_many(store).grant_fenced_many(tokens, owner, lease)
            )

        outcomes = self._fan_out("renew", renew_or_repair)
        return self._on_majority("renew", _about(list(tokens)), outcomes)

    def release_many(self, tokens: Mapping[str, int], owner: str) -> bool:
        if not tokens:
            return True
        outcomes = self._fan_out("release", lambda s: _fenced_many(s).release_many(tokens, owner))
        return self._on_majority("release", _about(list(tokens)), outcomes)

    # -- FairQueue: the turns, kept by one member (the grants stay the quorum's) -------------
    def _queue_keeper(self) -> tuple[Member, FairQueue] | None:
        now = time.monotonic()
        for member in self.members:
            if member.askable(now) and provides(member.store, FairQueue):
                return member, member.store
        return None

    def _in_queue(self, what: str, call: Callable[[FairQueue], T], failed: T) -> T:
        """``call`` on the queue's keeper; ``failed`` if there is none, or it fails or does not
        answer within the answer window (cut to the caller's deadline: the queue orders turns
        only, and a waiter's timeout bounds its wait whatever the keeper does)."""
        keeper = self._queue_keeper()
        if keeper is None:
            return failed
        member, queue = keeper
        within, _cut = bounded_wait(ANSWER_WITHIN)
        (outcome,) = self._fan_out(
            what, lambda _store: call(queue), within=within, members=[member]
        )
        return failed if isinstance(outcome, Fault) else outcome

    def acquire_fair(self, key: str, owner: str, ttl: float, queued: bool) -> int | None:
        _free, ahead = self.probe(key, owner)
        if ahead > 0:
            return None
        token = self.acquire(key, owner, ttl, "lock")
        if token is not None and queued:
            self.dequeue(key, owner)
        return token

    def probe(self, key: str, owner: str) -> tuple[bool, int]:
        return self._in_queue("probe", lambda q: q.probe(key, owner), (True, 0))

    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        # no lease: a member must never hand the lock over by itself (that grant would be
        # on one store only)
        self._in_queue("enqueue", lambda q: q.enqueue(key, owner, kind, ttl, None), None)

    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        return self._in_queue("requeue", lambda q: q.requeue(key, owner, kind, ttl), True)

    def dequeue(self, key: str, owner: str) -> None:
        self._in_queue("dequeue", lambda q: q.dequeue(key, owner), None)

    # -- FairManyKeys: the entries are the queue keeper's, so their order is its one order ---
    def _in_many_queue(self, what: str, call: Callable[[FairManyKeys], T], failed: T) -> T:
        """``call`` on the queue's keeper, if it keeps queues for several keys; else
        ``failed``, as when there is no keeper (the waiter then tries as a newcomer)."""
        return self._in_queue(
            what, lambda q: call(q) if provides(q, FairManyKeys) else failed, failed
        )

    def enqueue_many(self, keys: Sequence[str], owner: str, ttl: float) -> None:
        self._in_many_queue("enqueue", lambda q: q.enqueue_many(keys, owner, ttl), None)

    def requeue_many(self, keys: Sequence[str], owner: str, ttl: float) -> bool:
        # a keeper that is gone, or one that keeps no such queue, is not a reason to enqueue
        # again and again; a new keeper without the entries answers False
        return self._in_many_queue("requeue", lambda q: q.requeue_many(keys, owner, ttl), True)

    def dequeue_many(self, keys: Sequence[str], owner: str) -> None:
        self._in_many_queue("dequeue", lambda q: q.dequeue_many(keys, owner), None)

    def acquire_many_in_turn(
        self, keys: Sequence[str], owner: str, ttl: float
    ) -> dict[str, int] | None:
        # acquire_many's look at the queues counts only the live entries ahead of owner's
        tokens = self.acquire_many(keys, owner, ttl)
        if tokens is not None:
            self.dequeue_many(keys, owner)
        return tokens

    # -- Wakeups ----------------------------------------------------------------------------
    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        """Wake-ups from the queue's keeper for a queued waiter; else from the first member
        that pushes them to any waiter and answers (a release ends the hold on every store,
        so any one of them tells of it); else a plain sleep."""
        keeper = self._queue_keeper() if queue is not None else None
        queued = self._first_live(
            [] if keeper is None else [keeper[0]],
            lambda s: s.subscribe(key, owner, queue) if provides(s, Wakeups) else None,
        )
        return (
            queued
            or self._first_live(
                self.members,
                lambda s: (
                    s.subscribe(key, owner, None)
                    if provides(s, Wakeups) and s.wakes_unqueued
                    else None
                ),
            )
            or Sleeper(self.rt.event())  # no member pushes wake-ups now: sleep between tries
        )

    def subscribe_many(self, keys: Sequence[str], owner: str) -> Subscription | None:
        """Wake-ups from the queue's keeper (it knows the queues' heads), else from the first
        member that pushes them; None if no member does now (the waiter polls)."""
        keeper = self._queue_keeper()
        members = dict.fromkeys([*([] if keeper is None else [keeper[0]]), *self.members])
        return self._first_live(
            list(members),
            lambda s: s.subscribe_many(keys, owner) if provides(s, ManyKeys) else None,
        )

    def _first_live(
        self, members: Sequence[Member], open_one: Callable[[Store], Subscription | None]
    ) -> Subscription | None:
        """The first live subscription that ``open_one`` makes on one of ``members`` that
        answer (one that fails, or is not live, is passed over)."""
        now = time.monotonic()
        for member in members:
            if not member.askable(now):
                continue
            with contextlib.suppress(DBLockError, OSError):
                subscription = open_one(member.get())
                if subscription is not None:
                    if subscription.live:
                        return subscription
                    subscription.close()
        return None

    def purge(self, older_than: float, include_once: bool) -> int:
        """Purge each store (fences survive a purge: FencedGrants); the most rows one of them
        deleted."""
        outcomes = self._fan_out("purge", lambda s: s.purge(older_than, include_once))
        self._answered("purge", None, outcomes)
        return max((o for o in outcomes if isinstance(o, int)), default=0)

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pool_pid == _forksafe.pid():
            pool.shutdown(wait=False, cancel_futures=True)
        for member in self.members:
            if member.store is not None:
                member.store.close()


def _withheld(stores: Sequence[Store]) -> frozenset[type]:
    """What a quorum of ``stores`` (those opened) cannot offer: several keys at once unless
    each store grants them in one step; queues for several keys unless each store that may
    keep the quorum's queues keeps them (any of them may become its keeper)."""
    withheld: set[type] = set()
    if not all(provides(s, LeaderValues) for s in stores):
        withheld.add(LeaderValues)
    if not all(provides(s, FencedManyGrants) and provides(s, ManyKeys) for s in stores):
        withheld |= {ManyKeys, FairManyKeys}
    elif not all(provides(s, FairManyKeys) for s in stores if provides(s, FairQueue)):
        withheld.add(FairManyKeys)
    return frozenset(withheld)


def _stamp(value: str | None) -> str:
    """``value`` with the moment it was proclaimed (``<ns>`` for None, ``<ns>:<value>``)."""
    now = time.time_ns()
    return f"{now}" if value is None else f"{now}:{value}"


def _unstamp(stamped: str | None) -> tuple[int, str | None]:
    """(when, value) of a stamped value (a value written otherwise counts as oldest)."""
    when, sep, value = (stamped or "").partition(":")
    if not when.isdigit():
        return 0, stamped
    return int(when), value if sep else None


def _fenced_many(store: Any) -> Any:
    """``store``, if it grants several keys in one step; else a TypeError, which costs its
    vote only (a member opened late, of a kind the quorum's first members did not show)."""
    if provides(store, FencedManyGrants) and provides(store, ManyKeys):
        return store
    raise TypeError(f"the {store.name} store cannot grant several keys in one step")


def _waited_for(queue: FairQueue, keys: Sequence[str], owner: str) -> bool:
    """A live waiter is ahead of ``owner`` in the queue of one of ``keys`` (any live waiter,
    where ``owner`` has no entry there)."""
    return any(queue.probe(key, owner)[1] > 0 for key in keys)


def _about(keys: Sequence[str]) -> str:
    """Several keys, for a message."""
    return keys[0] if len(keys) == 1 else f"{keys[0]} and {len(keys) - 1} more"


def _inline(job: Callable[[], T]) -> T | Fault:
    """``job``'s value, or a Fault if it failed (as a pool's future would tell)."""
    try:
        return job()
    except Exception as exc:  # noqa: BLE001 - any failure costs the vote, as in a future
        return Fault(str(exc))


def _safe(member: Member) -> str:
    return member.store.safe_url if member.store is not None else member.url


def _wait_until(futures: Sequence[Future[Any]], deadline: float, when: str) -> None:
    """Wait for ``futures`` until every one is done or ``deadline`` passes (``when``: how
    often ``concurrent.futures.wait`` returns on the way)."""
    pending = set(futures)
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        _done, pending = wait_futures(pending, timeout=left, return_when=when)


def _late_for(
    late: Callable[[Member, T], None], members: Sequence[Member], asked: list[int]
) -> Callable[[int, T], None]:
    """``late`` by the index of a job among those asked."""
    return lambda j, value: late(members[asked[j]], value)


def _after(i: int, late: Callable[[int, T], None]) -> Callable[[Future[T]], None]:
    def done(future: Future[T]) -> None:
        if not future.cancelled() and future.exception() is None:
            late(i, future.result())

    return done


def open_quorum(
    urls: Sequence[str], open_one: Callable[[str], Store], table: str, runtime: Runtime | None
) -> QuorumStore:
    """Open a member store for each of ``urls``; one that cannot be reached now is opened
    later, but a majority must open now. A mistake in a URL raises ConfigurationError.

    With ``create_schema=False`` a member without the lock table (a Redis restarted empty)
    costs its vote like one that is down; MissingTable only if a majority lack it (nothing
    can be held then)."""
    from .._schema import MissingTable

    members: list[Member] = []
    opened: list[bool | Fault] = []
    missing: list[MissingTable] = []
    seen: dict[str, str] = {}  # a member's identity -> its URL
    rt = THREADS if runtime is None else runtime
    try:
        for url in urls:
            outcome: bool | Fault = True
            try:
                store: Store | None = checked(open_one(url))
            except BackendError as exc:
                log.warning("quorum store %s cannot be reached now: %s", _redacted(url), exc)
                store, outcome = None, Fault("cannot connect")
            except MissingTable as exc:
                missing.append(exc)
                store, outcome = None, Fault("no lock table")
            member = Member(_redacted(url), _opener(open_one, url), store, rt)
            if store is None:
                member.health.failed(time.monotonic())
            members.append(member)
            if store is not None:
                _distinct(store, url, seen)
            opened.append(outcome)
        _enough_tables(missing, len(urls))
        quorum = QuorumStore(members, table, rt)
        quorum._answered("connect", None, opened)
    except BaseException:
        for member in members:
            if member.store is not None:
                member.store.close()
        raise
    return quorum


def _distinct(store: Store, url: str, seen: dict[str, str]) -> None:
    """Raise ConfigurationError if ``store`` is one already in ``seen`` under another URL:
    its votes would count twice, and a majority of names would be fewer real stores."""
    identity = store.identity() if provides(store, FencedGrants) else None
    if identity is None:
        return
    other = seen.setdefault(identity, url)
    if other != url:
        raise ConfigurationError(
            f"a quorum's stores must be independent: {_redacted(other)} and {_redacted(url)} "
            "reach the same store (the same server and database, or the same file)"
        )


def _enough_tables(missing: Sequence[ConfigurationError], n: int) -> None:
    """Raise the first MissingTable if a majority of the ``n`` stores lack the table."""
    if len(missing) >= majority(n):
        raise missing[0]


def _opener(open_one: Callable[[str], Store], url: str) -> Callable[[], Store]:
    return lambda: open_one(url)


def _redacted(url: str) -> str:
    from ..._url import redact

    return redact(url)
