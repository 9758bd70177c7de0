"""Lock: waiting, backoff, reentrancy, renewal and loss detection. No SQL here.

What "lost" means: the lease of a hold is gone (expired, taken over by another owner,
force-released, or could not be renewed before it ran out because the database was
unreachable). From that moment another owner may act on what the lock protects. dblock tells
you in three ways: ``held`` turns False, ``on_lost`` is called once (from the client's
background thread), and ``release()`` / ``renew()`` raise :class:`LockLost`. Stop the work, and
let the protected resource reject stale writes by their fencing token (``lock.token``).

When a lock object learns of it: a force-release is pushed where the store can (PostgreSQL
NOTIFY, for locks with ``on_lost`` or ``auto_renew``); otherwise at the next renewal (every
ttl/3 with ``auto_renew``, at the lease's end without), or at release, renew or re-entry.

Timeline of the race fencing protects against::

    A acquires (token 7) ... A pauses (GC, SIGSTOP) ...... A resumes, writes with token 7
                     lease expires | B acquires (token 8), writes with token 8
                                     the resource has seen 8, so it rejects A's 7
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from . import _forksafe
from ._errors import BackendError, EventLoopError, LockLost, LockTimeout, NotHeld
from ._renewer import Job
from ._timing import HEAD_POLL, Backoff, DeadlinePassed, head_backoff, reset_deadline, set_deadline
from ._validate import check_key, check_timeout, check_ttl

if TYPE_CHECKING:
    from ._client import Client
    from .backends import Subscription

log = logging.getLogger("dblock")

#: with pushed wake-ups, waiters poll only as a fallback for a missed notification (a
#: holder that died without releasing, a woken waiter that died before it took its turn)
PUSHED_POLL_CAP = 5.0
FIRST_BACKOFF = 0.002
#: lease of a waiter's queue entry: a waiter that died or froze leaves the queue after it
QUEUE_TTL = 9.0


def _running_loop() -> bool:
    """True if this thread is running an asyncio event loop (without importing asyncio)."""
    if "asyncio" not in sys.modules:
        return False  # nothing can be running a loop that was never imported
    import asyncio  # already loaded: no import cost

    return asyncio._get_running_loop() is not None


_THREAD = threading.local()
_THREAD_SERIAL = itertools.count(1)
_SERIAL_LOCK = _forksafe.lock()


def thread_id() -> int:
    """This thread's identity for ownership: unlike ``threading.get_ident()``, which Python
    gives to a new thread once the old one has ended, it is never reused in this process, so
    a new thread can never re-enter or release a hold of a thread that died holding it."""
    serial: int | None = getattr(_THREAD, "serial", None)
    if serial is None:
        with _SERIAL_LOCK:
            serial = next(_THREAD_SERIAL)
        _THREAD.serial = serial
    return serial


def _fallback_backoff(cap: float) -> Backoff:
    """Polls for a waiter that is woken when something changes: only a safety net (a holder
    that died without releasing), so they start near the cap instead of ramping up from ms."""
    return Backoff(0.75 * cap, cap)


class _TurnPacer:
    """When to look again, for a queued waiter that is not told of releases.

    It learns how fast the queue moves (seconds per position, from its own probes) and sleeps
    about half the expected time to its turn; at the head it polls fast for a while, then
    less and less often while the holder keeps the lock.
    """

    def __init__(self, cap: float) -> None:
        self._cap = cap
        self._per_position = 0.01  # a first guess, replaced by what is observed
        self._last: tuple[float, int] | None = None
        self._head: Backoff | None = None

    def pause(self, ahead: int) -> float:
        now = time.monotonic()
        if self._last is not None and ahead < self._last[1]:
            observed = (now - self._last[0]) / (self._last[1] - ahead)
            self._per_position = 0.5 * self._per_position + 0.5 * observed
        if self._last is None or ahead != self._last[1]:
            self._last = (now, ahead)
            self._head = None
        if ahead > 0:
            return min(self._cap, max(HEAD_POLL, 0.5 * ahead * self._per_position))
        if self._head is None:
            self._head = head_backoff(self._cap)
        return self._head.next()


def _joiner(backend: object) -> Callable[[str, str, float, float], int | None] | None:
    """The backend's one-statement "take it or join its queue", if wake-ups already flow to
    this client (an optional capability: PostgreSQL's)."""
    listening = getattr(backend, "listening", None)
    join: Callable[[str, str, float, float], int | None] | None = getattr(
        backend, "acquire_or_enqueue", None
    )
    return join if listening is not None and listening() else None


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


class Hold:
    """One acquisition in the database, shared by re-entrant acquisitions of its thread."""

    def __init__(
        self,
        lock: Lock,
        owner: str,
        token: int,
        ttl: float,
        sent_at: float,
        *,
        lease: float | None = None,
    ) -> None:
        self.lock = lock
        self.key = lock.key
        self.owner = owner
        self.token = token
        self.ttl = ttl
        #: the length of the current lease: ``ttl``, or less for a lock handed over by its
        #: releaser (renewed to ``ttl`` in the background if it is held that long)
        self.lease = ttl if lease is None else lease
        self.count = 1
        self.lost = False
        #: the local monotonic time after which the lease may have ended (conservative: the
        #: database started the lease no earlier than the request was sent)
        self.expires_by = sent_at + self.lease
        self.mutex = _forksafe.lock()
        self.job: Job | None = None
        #: stops the pushed loss notice (backends that push a force-release to its holder)
        self.unwatch: Callable[[], None] | None = None
        #: the process that took it: in a child forked while it was held, it is the parent's
        self.pid = _forksafe.pid()

    def live(self) -> bool:
        return not self.lost and self.ours() and time.monotonic() < self.expires_by

    def ours(self) -> bool:
        """False in a forked child: the parent holds it, renews it and releases it."""
        return self.pid == _forksafe.pid()

    def renewed(self, sent_at: float, ttl: float) -> None:
        """The database extended the lease to ``ttl`` by a request sent at ``sent_at``."""
        self.ttl = self.lease = ttl
        self.expires_by = sent_at + ttl


class Lock:
    """A lease lock on one key. Create it with :meth:`Client.lock`.

    >>> with client.lock("invoice:42", ttl=30, timeout=5):
    ...     pay()
    """

    def __init__(
        self,
        client: Client,
        key: str,
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        reentrant: bool = True,
        auto_renew: bool = False,
        on_lost: Callable[[Lock], object] | None = None,
        kind: str = "lock",
    ) -> None:
        self._client = client
        self._key = check_key(key)
        self._ttl = check_ttl(ttl)
        self._timeout = check_timeout(timeout)
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be a callable taking the lock")
        self._reentrant = bool(reentrant)
        self._auto_renew = bool(auto_renew)
        self._on_lost = on_lost
        self._kind = kind
        self._holds: dict[int, list[Hold]] = {}
        self._mutex = _forksafe.lock()

    # -- properties -----------------------------------------------------------------------
    @property
    def key(self) -> str:
        return self._key

    @property
    def ttl(self) -> float:
        return self._ttl

    def _current(self) -> Hold | None:
        with self._mutex:
            refs = self._holds.get(thread_id())
            if refs:
                return refs[-1]
            for refs in self._holds.values():
                if refs:
                    return refs[-1]
        return None

    @property
    def held(self) -> bool:
        """True while this lock object holds the key and its lease is not known to be lost."""
        hold = self._current()
        return hold is not None and hold.live()

    @property
    def token(self) -> int | None:
        """The fencing token of the current hold, None when not held."""
        hold = self._current()
        return hold.token if hold is not None and not hold.lost and hold.ours() else None

    @property
    def owner(self) -> str:
        """``<host>:<pid>:<thread>:<random>``: the holder's identity (a fresh one per hold)."""
        hold = self._current()
        if hold is not None:
            return hold.owner
        return self._client._identity() + ":-"

    def _lease_end(self) -> float | None:
        """The ``time.monotonic()`` moment from which the current hold's lease may have ended
        (the statement that started it was sent no earlier than its ttl before); None when
        nothing is held or the hold is known lost. ``dblock run`` stops CMD ahead of it."""
        hold = self._current()
        if hold is None or hold.lost or not hold.ours():
            return None
        return hold.expires_by

    def locked(self) -> bool:
        """Ask the database: is the key held by anyone now?"""
        return self._client._backend.info(self._key) is not None

    # -- acquire --------------------------------------------------------------------------
    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; return False if it was not had in time.

        ``blocking=False`` tries once. ``timeout`` (seconds) bounds the wait; None uses the
        lock's own timeout, whose default None waits forever. A re-entrant acquisition asks
        the database whether the hold is still ours (and renews it); if it is not, the hold is
        lost and this acquire is a fresh one. On a thread that runs an asyncio event loop it
        raises a DBLockError that is also a RuntimeError: use ``connect_async``.
        """
        if _running_loop():
            raise EventLoopError(
                f"lock {self._key!r}: the blocking dblock API was called on a thread that is "
                "running an asyncio event loop. All coroutines share this thread, so the lock "
                "would let them all in at once, and waiting would freeze the loop. Use the "
                "async API (client = await dblock.connect_async(...); async with "
                "client.lock(key): ...), or run the whole critical section, acquire to release, "
                "in a worker thread, e.g. await asyncio.to_thread(work)",
                key=self._key,
            )
        wait = check_timeout(timeout) if timeout is not None else self._timeout
        tid = thread_id()
        if self._reentrant:
            shared = self._client._reentrant_hold(self._key, tid)
            if shared is not None and shared.lock._reenter(shared):
                self._push(tid, shared)
                return True
        try:
            hold = self._acquire_new(blocking, wait)
        except DeadlinePassed:  # the database file or the pool stayed busy: not had in time
            hold = None
        if hold is None:
            return False
        self._push(tid, hold)
        if self._reentrant:
            self._client._set_reentrant_hold(self._key, tid, hold)
        self._schedule(hold)
        self._watch(hold)
        return True

    def _watch(self, hold: Hold) -> None:
        """Where the store pushes a force-release to the holder (PostgreSQL NOTIFY), learn of
        it at once instead of at the next renewal, for holds whose loss someone hears of."""
        watch: Callable[[str, str, Callable[[], None]], Callable[[], None]] | None = getattr(
            self._client._backend, "watch", None
        )
        if watch is None or (self._on_lost is None and not self._auto_renew):
            return
        scheduler = self._client._scheduler

        def heard() -> None:  # on the listener's thread: hand the check to the renewer's
            scheduler.at(time.monotonic(), lambda: self._pushed_loss(hold))

        unwatch = watch(self._key, hold.owner, heard)
        with hold.mutex:
            if hold.count == 0 or hold.lost:
                unwatch()
            else:
                hold.unwatch = unwatch

    def _pushed_loss(self, hold: Hold) -> None:
        """Runs on the background thread after a force-release notice: confirm it in the
        database, then the hold is lost."""
        with hold.mutex:
            if hold.count == 0 or hold.lost:
                return
            backend = self._client._backend
            # shared holds are among several of the key; any other kind is the key's one hold
            shared = self._kind in ("read", "semaphore")
            holds = backend.list(self._key) if shared else [backend.info(self._key)]
            if any(
                i is not None
                and i.key == self._key
                and (i.owner, i.token) == (hold.owner, hold.token)
                for i in holds
            ):
                return  # still ours (a notice about an earlier hold of the same owner)
            hold.lost = True
            if hold.job is not None:
                hold.job.cancel()
        self._report_lost(hold)

    def _reenter(self, hold: Hold) -> bool:
        """Count one more acquisition of ``hold`` if the database confirms it is still ours.

        Local memory is not enough: an operator may have force-released it, or its lease may
        have run out while the process was paused. One round trip renews it with its token
        (as a renewal would); if it is gone, the hold is lost (``on_lost`` fires) and the
        caller acquires afresh, with a new token, while the lost hold's own release still
        raises LockLost.
        """
        with hold.mutex:
            if not hold.live() or hold.count == 0:
                return False
            sent = time.monotonic()
            if not self._renew_hold(hold, hold.ttl):
                if hold.job is not None:
                    hold.job.cancel()
                hold.lost = True
            else:
                hold.renewed(sent, hold.ttl)
                if hold.job is not None:
                    hold.job.cancel()
                self._schedule_locked(hold)
                hold.count += 1
                return True
        # on_lost runs on the background thread, as documented, not in the caller's acquire
        self._client._scheduler.at(time.monotonic(), lambda: self._report_lost(hold))
        return False

    def _acquire_new(  # noqa: PLR0912, PLR0915 - the waiting state machine, in one place
        self, blocking: bool, timeout: float | None
    ) -> Hold | None:
        client = self._client
        backend = client._backend
        owner = client._new_owner()
        deadline = None if timeout is None else time.monotonic() + timeout
        subscription = None
        backoff = Backoff(FIRST_BACKOFF, client._poll_cap)
        entry = _QueueEntry()
        acquired = False
        should_try = True
        ahead = -1  # waiters ahead of us, as last probed (-1: not known)
        pacer = _TurnPacer(client._poll_cap)  # polls by queue position where nothing is pushed
        # what waits inside a statement (a busy SQLite file, a free pooled connection) waits no
        # longer than this acquire may; leaving the queue afterwards is not bounded by it
        bound = set_deadline(deadline if blocking else time.monotonic())
        try:
            if blocking and self._queue_kind == "lock" and (timeout is None or timeout > 0):
                hold, subscription, sent = self._take_or_join(owner)
                if hold is not None:
                    acquired = True
                    return hold
                if subscription is not None:
                    backoff = _fallback_backoff(PUSHED_POLL_CAP)
                    entry.written(sent)
                    should_try = False
            while True:
                if should_try:
                    sent = time.monotonic()
                    token = self._try_acquire(owner, entry.written_at is not None)
                    if token is not None:
                        acquired = True
                        return Hold(self, owner, token, self._ttl, sent)
                remaining = None if deadline is None else deadline - time.monotonic()
                if not blocking or (remaining is not None and remaining <= 0):
                    return None
                if subscription is None:
                    # Listen before the next try, so a release between the try and the wait
                    # is not missed (PITFALLS 8).
                    subscription = backend.subscribe(self._key, owner, self._queue_kind)
                    if subscription.live:
                        backoff = _fallback_backoff(PUSHED_POLL_CAP)
                if self._keep_queued(owner, entry, subscription):
                    should_try = True
                    continue
                pause = backoff.next()
                if ahead >= 0 and not subscription.live:
                    pause = pacer.pause(ahead)
                subscription.wait(pause if remaining is None else min(pause, remaining))
                if subscription.granted is not None:
                    hold = self._take_grant(owner, subscription, entry)
                    if hold is not None:
                        acquired = True
                        return hold
                    should_try = True
                    continue
                should_try, ahead = self._worth_trying(
                    owner, subscription, entry.written_at is not None
                )
        finally:
            reset_deadline(bound)
            if subscription is not None:
                subscription.close()
            if entry.made and not (acquired and self._dequeues_itself):
                self._leave_queue(owner)  # which also hands on a lock handed to us meanwhile

    def _keep_queued(self, owner: str, entry: _QueueEntry, subscription: Subscription) -> bool:
        """Make our queue entry, or refresh it when due; True if we should try again now."""
        if self._queue_kind is None or (
            entry.written_at is not None and time.monotonic() - entry.written_at <= QUEUE_TTL / 3
        ):
            return False
        backend = self._client._backend
        sent = time.monotonic()
        if entry.written_at is None:
            # the lock may be handed to a plain lock's waiter that hears of releases
            lease = self._ttl if subscription.live and self._queue_kind == "lock" else None
            backend.enqueue(self._key, owner, self._queue_kind, QUEUE_TTL, lease)
            entry.written(sent)
            # a release between our first try and our subscription was not announced to us:
            # look once more (where a look is a write, the probe before the next try does),
            # unless the subscription wakes for a release that came before its first wait
            return not backend.probe_first and not subscription.latched
        if not backend.requeue(self._key, owner, self._queue_kind, QUEUE_TTL):
            # Our entry is gone: the lock was handed to us (its notification is late or lost,
            # and our own try takes it), or we were paused until the entry expired and was
            # purged (we queue again).
            entry.gone()
            return True
        entry.written(sent)
        return False

    #: waiters of this kind keep an entry in the key's wait queue (None: they do not queue).
    #: Plain locks queue: waiters are served first come, first served, and a newcomer does
    #: not take a free lock while others wait for it, so a busy key is handed over in order
    #: instead of going to whoever polls first.
    _queue_kind: str | None = "lock"
    #: a successful acquisition removes the waiter's queue entry itself
    _dequeues_itself = True

    def _try_acquire(self, owner: str, queued: bool) -> int | None:
        """One attempt in the database; the new fencing token, or None if busy."""
        return self._client._backend.acquire_fair(self._key, owner, self._ttl, queued)

    def _renew_hold(self, hold: Hold, ttl: float) -> bool:
        """Extend the hold's lease in the database; False if it was already gone."""
        return self._client._backend.renew(self._key, hold.owner, hold.token, ttl)

    def _leave_queue(self, owner: str) -> None:
        try:
            self._client._backend.dequeue(self._key, owner)
        except BackendError as exc:  # the entry's own lease ends it soon enough
            log.warning("could not leave the wait queue of %r: %s", self._key, exc)

    def _end_hold(self, hold: Hold) -> bool:
        """End the hold in the database; False if its lease was already gone."""
        return self._client._backend.release(self._key, hold.owner, hold.token)

    def _take_or_join(self, owner: str) -> tuple[Hold | None, Subscription | None, float]:
        """Where wake-ups already flow to this client: subscribe first, then one statement
        takes the lock or joins its queue (no separate enqueue and second try). Returns
        (hold, None, sent), (None, subscription, sent) once queued, or (None, None, 0) if not
        available; ``sent`` is when the statement was sent."""
        backend = self._client._backend
        join = _joiner(backend)
        if join is None:
            return None, None, 0.0
        subscription = backend.subscribe(self._key, owner, self._queue_kind)
        sent = time.monotonic()
        try:
            token = join(self._key, owner, self._ttl, QUEUE_TTL)
        except BaseException:
            subscription.close()
            raise
        if token is None:
            return None, subscription, sent
        subscription.close()
        return Hold(self, owner, token, self._ttl, sent), None, sent

    def _take_grant(
        self, owner: str, subscription: Subscription, entry: _QueueEntry
    ) -> Hold | None:
        """The hold of a lock its releaser handed to us, or None if that lease already ran out
        (then we queue again).

        The hand-over's lease is the lock's ttl, capped by what was left of our queue entry's,
        and it started after our entry was last written: a conservative local bound. It is
        renewed first if that leaves less than half of it, or if the hand-over may be an
        earlier one heard late: renewing checks owner, token and lease in the database.
        """
        token, subscription.granted = subscription.granted, None
        if token is not None and entry.written_at is not None:
            lease = min(self._ttl, QUEUE_TTL)
            hold = Hold(self, owner, token, self._ttl, entry.written_at, lease=lease)
            if entry.trusted and hold.expires_by - time.monotonic() >= lease / 2:
                return hold
            sent = time.monotonic()
            if self._client._backend.renew(self._key, owner, token, self._ttl):
                return Hold(self, owner, token, self._ttl, sent)
        entry.gone()
        return None

    def _worth_trying(
        self, owner: str, subscription: Subscription, queued: bool
    ) -> tuple[bool, int]:
        """After a wait: try now? And how many waiters are ahead (-1: not asked).

        A waiter that is woken only when it is its turn just tries. One that is not (polling
        backends, or where writes are dear) asks a cheap read first, and tries only when the
        lock is free and nobody queues ahead of it.
        """
        backend = self._client._backend
        probe = queued and self._queue_kind == "lock"
        if not probe or (subscription.targeted and not backend.probe_first):
            return True, -1
        free, ahead = backend.probe(self._key, owner)
        return free and ahead == 0, ahead

    def _push(self, tid: int, hold: Hold) -> None:
        with self._mutex:
            self._holds.setdefault(tid, []).append(hold)

    # -- release and renew ----------------------------------------------------------------
    def release(self) -> None:
        """Release one acquisition; the key is freed after as many releases as acquisitions.

        Raises NotHeld if this owner does not hold the lock, and LockLost if its lease was
        gone (the work ran partly unprotected). Never frees another owner's hold.
        """
        tid = thread_id()
        with self._mutex:
            refs = self._holds.get(tid)
            hold = refs[-1] if refs else None
        if hold is None or refs is None:
            raise NotHeld(
                f"lock {self._key!r} is not held by this owner (table "
                f"{self._client._backend.table}); release() only what acquire() returned True for",
                key=self._key,
            )
        if not hold.ours():
            # a child forked while the lock was held (leaving a `with` block, say): the hold
            # is its parent's, which still works under it; forget it here, touch nothing
            self._pop(tid)
            return
        with hold.mutex:
            if hold.count > 1:
                hold.count -= 1
                self._pop(tid)
                if hold.lost:
                    raise self._lost_error(hold)
                return
            if hold.job is not None:
                hold.job.cancel()  # stop renewing before releasing (PITFALLS 11)
            try:
                released = self._end_hold(hold)
            except BackendError:
                # The caller wanted it released: renewal stays stopped, so if the database
                # stays out of reach the lease lapses by itself within its ttl instead of
                # living as long as this process. release() may be called again meanwhile.
                hold.job = None
                raise
            hold.count = 0
            self._unwatch(hold)
            self._pop(tid)
            self._client._drop_reentrant_hold(self._key, tid, hold)
            if not released:
                hold.lost = True
            if hold.lost:
                raise self._lost_error(hold)

    def _pop(self, tid: int) -> None:
        with self._mutex:
            refs = self._holds[tid]
            refs.pop()
            if not refs:
                del self._holds[tid]

    def _lost_error(self, hold: Hold) -> LockLost:
        return LockLost(
            f"the lease of lock {self._key!r} (token {hold.token}, table "
            f"{self._client._backend.table}) was lost before release: it expired or was taken "
            "over, so the work ran partly unprotected; use a longer ttl or auto_renew=True",
            key=self._key,
        )

    def renew(self, ttl: float | None = None) -> None:
        """Extend the lease to ``ttl`` seconds from now (default: the lock's ttl).

        Raises NotHeld if not held, LockLost if the lease is no longer this owner's.
        """
        new_ttl = self._ttl if ttl is None else check_ttl(ttl)
        hold = self._current_of_thread()
        with hold.mutex:
            if hold.lost:
                raise self._lost_error(hold)
            sent = time.monotonic()
            if not self._renew_hold(hold, new_ttl):
                hold.lost = True
                self._unwatch(hold)
                if hold.job is not None:
                    hold.job.cancel()
                raise self._lost_error(hold)
            hold.renewed(sent, new_ttl)
            if hold.job is not None:
                hold.job.cancel()
            self._schedule_locked(hold)

    def _current_of_thread(self) -> Hold:
        with self._mutex:
            refs = self._holds.get(thread_id())
        if not refs or not refs[-1].ours():
            raise NotHeld(f"lock {self._key!r} is not held by this owner", key=self._key)
        return refs[-1]

    # -- background renewal and loss watch ------------------------------------------------
    def _schedule(self, hold: Hold) -> None:
        with hold.mutex:
            self._schedule_locked(hold)

    def _schedule_locked(self, hold: Hold) -> None:
        if self._renews(hold):
            when = hold.expires_by - hold.lease * 2 / 3
        elif self._on_lost is not None:
            when = hold.expires_by
        else:
            return
        hold.job = self._client._scheduler.at(when, lambda: self._tick(hold))

    def _renews(self, hold: Hold) -> bool:
        """The background job renews this hold (else it only watches for the lease's end):
        with auto_renew, and for a hand-over whose lease is still shorter than the ttl."""
        return self._auto_renew or hold.lease < hold.ttl

    def _tick(self, hold: Hold) -> None:
        """Runs on the client's background thread: renew, or notice the lease is gone."""
        with hold.mutex:
            if hold.count == 0 or hold.lost or hold.job is None or hold.job.cancelled:
                return
            if not self._renews(hold):
                lost = True  # a watched lease that was not renewed has run out
            else:
                sent = time.monotonic()
                try:
                    lost = not self._renew_hold(hold, hold.ttl)
                except BackendError as exc:
                    if time.monotonic() < hold.expires_by:
                        log.warning("renewing %r failed, retrying: %s", self._key, exc)
                        retry = min(time.monotonic() + max(hold.ttl / 10, 0.05), hold.expires_by)
                        hold.job = self._client._scheduler.at(retry, lambda: self._tick(hold))
                        return
                    lost = True
                else:
                    if not lost:
                        hold.renewed(sent, hold.ttl)
                        self._schedule_locked(hold)
                        return
            hold.lost = True
        self._report_lost(hold)

    def _report_lost(self, hold: Hold) -> None:
        """Log the loss and call ``on_lost`` (once per hold: callers set ``hold.lost`` first,
        under its mutex, only if it was not set)."""
        self._unwatch(hold)
        log.warning("lost the lease of lock %r (token %d)", self._key, hold.token)
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("on_lost callback of lock %r raised", self._key)

    @staticmethod
    def _unwatch(hold: Hold) -> None:
        unwatch, hold.unwatch = hold.unwatch, None
        if unwatch is not None:
            unwatch()

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> Lock:
        if not self.acquire():
            raise LockTimeout(
                f"lock {self._key!r} was not acquired within {self._timeout:g} s (table "
                f"{self._client._backend.table}); it is held by another owner — see "
                f"`dblock info {self._key}`",
                key=self._key,
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"<dblock.{name} key={self._key!r} ttl={self._ttl:g} held={self.held}>"


Lock.__module__ = "dblock"
