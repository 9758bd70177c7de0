"""PostgreSQL wake-ups for a plain lock's waiters: they sleep in ``pg_advisory_lock`` on the
key's doorbell, and the release of a holder that waited lets go of it.

PostgreSQL signals every LISTENing backend of the database at each NOTIFY, and each of them
runs a transaction to read it: with one listening connection per waiting client, every
hand-off cost the server a transaction per waiting client (64 clients waiting: about 65 per
hand-off). A session asleep in ``pg_advisory_lock`` costs nothing until the lock's holder lets
go of it, and the server grants the lock to its waiters in the order they asked. So one
advisory lock per key is the key's doorbell, never the lock (two int4 keys from a hash of
table and key: a lock space apart from the bigint keys of session holds), where the queue is
long: a waiter whose client last saw ``CROWD`` or more others queued for the key (with fewer,
it hears releases as before: a hand-over by the release, one statement sooner):

- A waiter joins the key's queue with an entry marked as a bell's (``statements.BELL_CHANNEL``,
  no lease: no release hands it the lock or rings it), its bell's connection ready before
  that (so that it reaches the bell in the order it queued), then waits for the bell: one
  statement, sent by a worker of its client (a thread, or a task of the event loop), which
  stays in the server's queue while the waiter wakes now and then to refresh its entry or
  try once (asked again, it would join the bell's queue at its end). The waiter at the head
  of the key's queue takes a free lock by itself on such a try: a holder that froze keeping
  the bell holds the others up no longer than its lease.
- Whoever gets the bell is next in line: the waiters at a bell are served in the bell's order.
  The statement that got it the bell then waits for the lease row (``FOR SHARE``), so that
  the release that rang it has committed, and the waiter tries at once
  (``acquire_at_bell``: the lock is free, and no waiter ahead of it is one without a bell, a
  ``lock_many`` waiter or one beyond ``MAX_BELLS``: those are served first).
- Having taken the lock it keeps the bell for the hold. The release ends the lease and lets
  go of the bell in one statement, on the bell's connection: the next waiter wakes, and only
  that one.
- A holder that took a free lock without waiting has no bell: the first waiter gets the bell
  at once and polls the lock, paced like the head of a queue; the waiters behind it sleep.

The lease row stays the only truth. A bell that is lost (its connection dropped), stuck (its
holder frozen) or rung early costs time, never safety: waiters still try now and then, and
the oldest takes a free lock. The server ends a bell connection idle for ``BELL_IDLE`` s
(``idle_session_timeout``, PostgreSQL 14 and later), which frees a bell kept by a frozen or
forgotten holder. A waiter that stops waiting cancels its statement in the server (closed
instead, it could still get the bell and take the lock for nobody). Each waiter uses one
connection while it waits, so a client keeps at most ``MAX_BELLS`` bells; its other waiters
hear releases on the client's listener, as before.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from ..._bounded import remember
from ..._contract import Subscription
from ..._runtime import Event
from ..._timing import head_backoff
from .._bells import BellBook

log = logging.getLogger("dblock")

#: the longest one wait for the bell lasts in the server (then it asks again), seconds
LONG_WAIT = 30.0
#: how long closing a waiter waits for its cancelled bell wait to end, seconds
CANCEL_WAIT = 5.0
#: the server ends a bell connection idle this long (``idle_session_timeout``), seconds
BELL_IDLE = 30
#: bells (waiting or held) one client may have at once
MAX_BELLS = 64
#: idle bell connections a client keeps for its next waiters
IDLE_KEPT = 8
#: a waiter waits at the key's doorbell where its client last saw this many others queued
#: for the key (fewer: it hears releases on the listener, which signals as many backends as
#: there are waiting clients, and hands the lock over one statement sooner)
CROWD = 8
#: keys whose queue's length a client remembers
_REMEMBERED = 10_000
_STATEMENT_SLACK = 5.0  # the watchdog's margin over a bell wait's own lock_timeout
FAST_FAILURE = 0.5  # a bell wait that fails sooner found its connection dead, not the server
T = TypeVar("T")


class Bells(BellBook["Doorbell"]):
    """The doorbells of one PostgreSQL store: their connections, and who waits at or keeps
    one. ``store`` opens and closes the connections and aborts a statement that overruns
    (its watchdog)."""

    def __init__(self, store: Any) -> None:
        super().__init__(limit=MAX_BELLS, idle_kept=IDLE_KEPT, idle_for=BELL_IDLE)
        self.store = store
        #: key -> how many others were queued for it when a waiter of this client joined
        self._queued: dict[str, int] = {}

    def give_up(self) -> None:
        """No more doorbells for this client (a connection pooler sits between)."""
        with self._mutex:
            if self._limit:
                log.info("dblock: a connection pooler sits between: waiters hear releases")
            self._limit = 0

    def lock_of(self, key: str) -> tuple[int, int]:
        """The two int4 keys of ``key``'s bell, the same for every client of the table."""
        name = f"{self.store.table}\0{key}".encode()
        digest = hashlib.sha1(name, usedforsecurity=False).digest()
        return (
            int.from_bytes(digest[:4], "big", signed=True),
            int.from_bytes(digest[4:8], "big", signed=True),
        )

    def _make(self, key: str, owner: str, sleep: Event) -> Doorbell:
        return Doorbell(self, key, owner, sleep)

    def _open(self) -> Any:
        return self.store._bell_connection()

    def _close(self, conn: Any) -> None:
        self.store._close_connection(conn)

    def _dead(self, conn: Any) -> bool:
        return bool(conn.closed)

    def _forget(self) -> None:
        self._queued.clear()

    # -- waiters ----------------------------------------------------------------------------
    def crowded(self, key: str) -> bool:
        """A waiter for ``key`` waits at its doorbell: this client last saw ``CROWD`` or more
        others queued for it."""
        with self._mutex:
            return self._queued.get(key, 0) >= CROWD

    @staticmethod
    def crowd() -> int:
        """How many others queued a join needs to count: ``CROWD`` make a crowd."""
        return CROWD

    def queued(self, key: str, others: int) -> None:
        """A waiter of this client joined ``key``'s queue behind ``others``."""
        with self._mutex:
            remember(self._queued, key, others, _REMEMBERED)

    # -- holders ----------------------------------------------------------------------------
    def release_holding(
        self, key: str, owner: str, release: Callable[[Any, tuple[int, int]], T]
    ) -> T | None:
        """The hold (key, owner) is ending: ``release(conn, bell)`` on its bell's connection,
        which must end the lease and let go of the bell. Its result; None if the hold keeps
        no bell. What it raises propagates after the connection is closed, which frees the
        bell and rolls back what it had not committed. (A waiter's grant ended before its
        wait is over, as an acquire that cannot use it does, takes the bell with it.)"""
        conn = self._ending(key, owner, lambda bell: bell.give_up_hold())
        if conn is None:
            return None
        lock = self.lock_of(key)
        result = self.run(conn, lambda: release(conn, lock))
        self.checkin(conn)
        return result

    def run(self, conn: Any, statement: Callable[[], T], seconds: float = 0.0) -> T:
        """``statement()`` on ``conn`` within ``seconds`` and the watchdog's slack; the
        connection is closed if it raises (or was aborted)."""
        store = self.store
        ident, watch = store._watchdog.watch(seconds + _STATEMENT_SLACK, lambda: store._abort(conn))
        try:
            result = statement()
        except BaseException:
            self.store._close_connection(conn)
            raise
        finally:
            store._watchdog.done(ident)
        if watch.aborted:
            self.store._close_connection(conn)
            raise psycopg.OperationalError("a doorbell statement overran its deadline")
        return result

    def let_go(self, conn: Any, bell: Doorbell | None) -> None:
        if bell is not None:
            params = {"bc": bell.lock[0], "bo": bell.lock[1]}
            try:
                self.run(conn, lambda: conn.execute(self.store.sql.bell_unlock, params))
            except Exception:  # noqa: BLE001 - a closed connection frees its bell anyway
                return
        self.checkin(conn)

    def discard(self, conn: Any) -> None:
        """Close a connection that failed or was interrupted (its bell, if any, goes too)."""
        self.store._abort(conn)
        self.store._close_connection(conn)


class Doorbell(Subscription):
    """A Subscription for a plain lock's waiter. Its first ``wait()`` starts the wait for the
    key's bell on a worker of the client's runtime (a thread, or a task of the event loop),
    whose statement stays in the server's queue across the waiter's later ``wait()`` calls:
    the engine wakes its waiters now and then (to refresh their queue entries, to try once),
    and a wait asked again would join the bell's queue at its end. Once it has the bell, the
    waiter polls the lock."""

    live = True
    targeted = True
    latched = True  # the bell is a lock, not an event: one let go of before the wait is had

    def __init__(self, bells: Bells, key: str, owner: str, sleep: Event) -> None:
        self._bells = bells
        self.key = key
        self.owner = owner
        self.lock = bells.lock_of(key)
        self._conn: Any | None = None
        #: this waiter has the bell: it is next in line
        self.has_bell = False
        #: the waiter's last try took the lock: the bell stays with its hold
        self.won = False
        #: the lease a take at the bell asks for (the lock's ttl: the store sets it when the
        #: waiter queues); None: the waiter tries by itself once it has the bell
        self.ttl: float | None = None
        self._broken = False
        self._head: Any = None
        self._sleep = sleep
        #: the wait in flight: set when its worker is done; what it found
        self._done: Event | None = None
        self._outcome: _Outcome | None = None
        self._failures = 0

    def ready(self) -> None:
        """Check out the bell's connection now, before the waiter's queue entry is written:
        its wait is then sent right after the entry, and waiters reach the bell in the order
        they queued (one that opened a connection after queueing reached it behind waiters
        that queued after it, and was served after them). Failing, the worker tries again."""
        try:
            self._conn = self._bells.checkout()
        except Exception:  # the worker's own checkout decides what it means
            log.debug("dblock: a doorbell's connection could not be made yet", exc_info=True)

    def wait(self, timeout: float) -> bool:
        if timeout <= 0:
            return False
        if self.has_bell or self._broken:
            # next in line behind a holder without a bell (or no bell to be had): poll
            if self._head is None:
                self._head = head_backoff(self._bells.store.poll_cap)
            self._sleep.wait(min(timeout, self._head.next()))
            return False
        if self._done is None:
            self._start()
        done = self._done
        if done is None or not done.wait(timeout):
            return False  # still in the bell's queue, in its place
        return self._settle()

    def _start(self) -> None:
        """Send the wait for the bell (with the take that follows it) on a worker."""
        self._done, self._outcome = self._bells.store.rt.event(), None
        self._bells.store.rt.start(f"dblock-bell[{self._bells.store.table}]", self._ask)

    def _settle(self) -> bool:
        """The worker is done: True if it got the bell (and perhaps the lock: ``granted``)."""
        outcome, self._done, self._outcome = self._outcome, None, None
        if outcome is None:
            return False
        if outcome.failed:
            self._conn = None  # closed by the worker
            # a pooled connection that fails at once died idle (a server restart): one more
            # try on a new one; a second failure, or a slow one, makes this waiter poll
            self._failures += 1
            if self._failures > 1 or outcome.seconds > FAST_FAILURE:
                self._broken = True
            return False
        if not outcome.rang:
            return False  # its long wait ran out: the next wait asks again
        self.has_bell = True
        if outcome.token is not None:
            self.granted, self.granted_lease = outcome.token, self.ttl
            self.won = True  # the bell stays with the hold
        return True

    def _ask(self) -> None:
        """The worker: wait for the bell up to ``LONG_WAIT`` s, then take the lock in the same
        round trip (the statement that got the bell waited for the release's commit)."""
        started = time.monotonic()
        outcome = _Outcome()
        try:
            if self._conn is None:
                self._conn = self._bells.checkout()
            conn = self._conn
            sql = self._bells.store.sql
            params = {"bc": self.lock[0], "bo": self.lock[1], "key": self.key}
            params["lt"] = str(round(LONG_WAIT * 1000))
            ttl = self.ttl
            take = None

            def statement() -> bool:
                nonlocal take
                try:
                    with conn.pipeline():
                        conn.execute(sql.bell_wait, params)
                        if ttl is not None:  # next in line: take the lock at once
                            take = conn.execute(
                                sql.take_at_bell,
                                {"key": self.key, "kind": "lock", "owner": self.owner, "ttl": ttl},
                            )
                except psycopg.errors.LockNotAvailable:
                    return False  # it ended without the bell: the connection is fine
                return True

            outcome.rang = self._bells.run(conn, statement, LONG_WAIT)
            row = take.fetchone() if take is not None and outcome.rang else None
            if row is not None and row[0] is not None:
                outcome.token = int(row[0])
        except BaseException as exc:
            # closed by Bells.run (a cancellation by close() lands here too)
            self._conn = None
            outcome.failed = True
            if not isinstance(exc, Exception):
                raise
        finally:
            outcome.seconds = time.monotonic() - started
            self._outcome = outcome
            if self._done is not None:
                self._done.set()

    def give_up_hold(self) -> Any | None:
        """The grant this waiter's try took is being ended (its acquire could not use it):
        the bell's connection goes with it, to let go of the bell in the same release."""
        if not (self.won and self.has_bell and self._conn is not None):
            return None
        conn, self._conn = self._conn, None
        self.won = self.has_bell = False
        return conn

    def close(self) -> None:
        self._sleep.set()
        done = self._done
        if done is not None and not done.is_set():
            # asleep in the bell's queue: cancel that statement in the server (closed
            # instead, it could still get the bell, and take the lock for nobody)
            conn = self._conn
            if conn is not None:
                try:
                    conn.cancel_safe(timeout=CANCEL_WAIT)
                except Exception:  # the worker's end is awaited either way
                    log.debug("dblock: cancelling a bell wait failed", exc_info=True)
            if not done.wait(CANCEL_WAIT) and conn is not None:
                self._bells.discard(conn)  # the worker ends with the connection
                done.wait(CANCEL_WAIT)
        if done is not None and self._outcome is not None:
            self._settle()  # what it got (the bell, a grant) is let go of below
        if self._conn is not None and self.won and not self._claimed():
            # a grant the acquire never took: end it with the bell, on this connection
            self._end_grant()
        self._bells.closed(self, self._conn, self.won)
        self._conn = None

    def _claimed(self) -> bool:
        """The engine took the grant (``granted`` is set back to None when it does)."""
        return self.granted is None

    def _end_grant(self) -> None:
        """End the lease this waiter's take got, which its acquire did not take up."""
        token, self.granted = self.granted, None
        conn, self._conn = self._conn, None
        self.won = self.has_bell = False
        store = self._bells.store
        params = {"key": self.key, "owner": self.owner, "token": token, "joins": None}
        try:
            self._bells.run(conn, lambda: store._release_at_bell(conn, params, self.lock, False))
        except Exception:  # closed: the bell is free, the lease ends by itself
            log.debug("dblock: ending an unused grant at the bell failed", exc_info=True)
            return
        self._bells.checkin(conn)


class _Outcome:
    """What a wait for the bell found."""

    __slots__ = ("failed", "rang", "seconds", "token")

    def __init__(self) -> None:
        self.rang = False
        self.token: int | None = None
        self.failed = False
        self.seconds = 0.0
