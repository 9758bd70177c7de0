"""MySQL/MariaDB wake-ups: waiters sleep in ``GET_LOCK`` on the key's doorbell; a release rings it.

MySQL cannot push a release to a client, but a session blocked in ``GET_LOCK`` wakes the moment
the holder of that user lock lets go, and the server grants a user lock to its waiters in the
order they asked. dblock uses one user lock per key as a doorbell, never as the lock:

- A waiter sleeps in ``GET_LOCK(bell)`` on a connection of its own, at most ``RING_WAIT`` s at
  a time (then it polls the table once and sleeps again).
- Whoever gets the bell is next in line: it tries at once and, if it takes the lock, keeps the
  bell for as long as it holds the lock. Its release ends the lease, then lets go of the bell,
  which wakes the next waiter, and only that one.
- A holder that took a free lock without waiting has no bell: the first waiter gets the bell
  at once and polls the table, paced like the head of a queue; the waiters behind it sleep.

The lease row stays the only truth. A bell that is lost (its connection dropped), stuck (its
process frozen) or rung early costs time, never safety: waiters fall back to polling. The
server closes an idle bell connection after ``BELL_IDLE`` s (``wait_timeout``), which frees a
bell kept by a frozen or forgotten holder. Each waiter uses one connection while it waits, so
a client keeps at most ``MAX_BELLS`` bells; waiters beyond that poll.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _forksafe
from .._timing import Backoff, head_backoff
from ._sql import POOL_SIZE
from ._watchdog import Watchdog

#: the longest one GET_LOCK sleeps before its waiter polls the table once, seconds
RING_WAIT = 2.0
#: the server closes a bell connection idle this long (``wait_timeout``), freeing its bell
BELL_IDLE = 30
#: bells (waiting or held) one client may have at once
MAX_BELLS = 64
_STATEMENT_SLACK = 5.0  # the watchdog's margin over a GET_LOCK's own timeout
LEASE_MARGIN = 0.02  # a waiter wakes this long after the lease it saw should have ended
FAST_FAILURE = 0.5  # a GET_LOCK that fails sooner found its connection dead, not the server


class Bells:
    """The doorbells of one MySQL backend: their connections, and who waits or holds one.

    ``table`` names the lock table with its database (user locks are the whole server's);
    ``connect`` opens a connection (autocommit); ``watchdog`` is the backend's, which aborts
    a statement on a connection with ``abort(conn)``.
    """

    def __init__(
        self,
        table: str,
        connect: Callable[[], Any],
        *,
        close: Callable[[Any], None],
        watchdog: Watchdog,
        abort: Callable[[Any], None],
        max_poll: float,
        read_timeout: float,
    ) -> None:
        self.table = table
        self._connect = connect
        self._close = close
        self.watchdog = watchdog
        self.abort = abort
        self.max_poll = max_poll
        #: one GET_LOCK's sleep: within the driver's read timeout, which would end it early
        self.ring_wait = min(RING_WAIT, read_timeout / 2)
        self._mutex = _forksafe.lock()
        self._idle: list[tuple[Any, float]] = []  # (connection, when it was put back)
        self._waiting: dict[tuple[str, str], Doorbell] = {}
        self._held: dict[tuple[str, str], Any] = {}  # (key, owner) of a hold -> its bell's conn
        self._count = 0
        self._pid = os.getpid()
        self._closed = False

    def name(self, key: str) -> str:
        """The user lock of ``key``'s doorbell: 64 characters at most, whatever the key."""
        digest = hashlib.sha1(f"{self.table}\0{key}".encode(), usedforsecurity=False)
        return f"dblock:{digest.hexdigest()}"

    def _forked(self) -> None:
        """In a forked child: forget the parent's connections without touching them."""
        if self._pid != os.getpid():
            self._idle.clear()
            self._waiting.clear()
            self._held.clear()
            self._count = 0
            self._pid = os.getpid()

    # -- waiters ----------------------------------------------------------------------------
    def doorbell(self, key: str, owner: str) -> Doorbell | None:
        """A doorbell for ``owner`` waiting on ``key``, or None if this client has too many."""
        with self._mutex:
            self._forked()
            if self._closed or self._count >= MAX_BELLS:
                return None
            self._count += 1
            bell = Doorbell(self, key, owner)
            self._waiting[(key, owner)] = bell
            return bell

    def lease_left(self, key: str, owner: str, seconds: float) -> None:
        """``owner``'s look found the lock held for ``seconds`` more: sleep no longer."""
        with self._mutex:
            bell = self._waiting.get((key, owner))
        if bell is not None:
            bell.lease_ends = time.monotonic() + seconds

    def ringing(self, key: str, owner: str) -> Doorbell | None:
        """``owner``'s doorbell for ``key`` if it has the bell (it is next in line)."""
        with self._mutex:
            bell = self._waiting.get((key, owner))
        return bell if bell is not None and bell.has_bell else None

    def checkout(self) -> Any:
        with self._mutex:
            self._forked()
            while self._idle:
                conn, since = self._idle.pop()
                if time.monotonic() - since < BELL_IDLE / 2:
                    return conn
                self._close(conn)  # the server may have closed it by now
        return self._connect()

    def checkin(self, conn: Any) -> None:
        with self._mutex:
            if not self._closed and self._pid == os.getpid() and len(self._idle) < POOL_SIZE:
                self._idle.append((conn, time.monotonic()))
                return
        self._close(conn)

    def closed(self, bell: Doorbell, conn: Any | None, won: bool) -> None:
        """A waiter is done: keep its bell with its hold (``won``), else let go of it."""
        with self._mutex:
            if self._pid != os.getpid():
                return
            if self._waiting.get((bell.key, bell.owner)) is bell:
                del self._waiting[(bell.key, bell.owner)]
            if won and conn is not None and not self._closed:
                self._held[(bell.key, bell.owner)] = conn
                return
            self._count -= 1
        if conn is not None:
            self.let_go(conn, bell.name if bell.has_bell else None)

    # -- holders ----------------------------------------------------------------------------
    def holding(self, key: str, owner: str) -> bool:
        """True if the hold (key, owner) keeps a bell, which its release will ring."""
        with self._mutex:
            return self._pid == os.getpid() and (key, owner) in self._held

    def ring(self, key: str, owner: str) -> None:
        """The hold (key, owner) has ended: let go of its bell, waking the next waiter."""
        with self._mutex:
            if self._pid != os.getpid():
                return
            conn = self._held.pop((key, owner), None)
            if conn is None:
                return
            self._count -= 1
        self.let_go(conn, self.name(key))

    def let_go(self, conn: Any, name: str | None) -> None:
        """Release ``name`` (if held) on ``conn`` and pool the connection, or close it."""
        if name is None:
            self.checkin(conn)
            return
        ident, _ = self.watchdog.watch(_STATEMENT_SLACK, lambda: self.abort(conn))
        try:
            with conn.cursor() as cur:
                cur.execute("DO RELEASE_LOCK(%s)", (name,))
        except Exception:  # noqa: BLE001 - a dead bell connection frees its bell anyway
            self._close(conn)
        else:
            self.checkin(conn)
        finally:
            self.watchdog.done(ident)

    def discard(self, conn: Any) -> None:
        """Close a connection that failed or was interrupted (its bell, if any, goes too)."""
        self.abort(conn)
        self._close(conn)

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            if self._pid != os.getpid():
                return
            conns = [conn for conn, _ in self._idle] + list(self._held.values())
            self._idle.clear()
            self._held.clear()
        for conn in conns:
            self._close(conn)  # closing the session frees its bells


class Doorbell:
    """A Subscription for MySQL: ``wait()`` sleeps in GET_LOCK on the key's bell."""

    live = True
    targeted = True
    latched = True  # the bell is a lock, not an event: one freed before GET_LOCK is had at once
    granted: int | None = None

    def __init__(self, bells: Bells, key: str, owner: str) -> None:
        self._bells = bells
        self.key = key
        self.owner = owner
        self.name = bells.name(key)
        self._conn: Any | None = None
        #: this waiter holds the bell: it is next in line
        self.has_bell = False
        #: the last wait ended with the bell rung (the lock was just released): try at once
        self.rung = False
        #: the waiter took the lock: the bell stays with its hold
        self.won = False
        #: when the holder's lease ends, as last seen (monotonic; None: not seen)
        self.lease_ends: float | None = None
        self._broken = False
        self._busy = False  # a GET_LOCK is in flight on the connection
        self._head: Backoff | None = None
        self._sleep = threading.Event()

    def wait(self, timeout: float) -> bool:
        if timeout <= 0:
            return False
        if self.has_bell or self._broken:
            # next in line behind a holder without a bell (or no bell to be had): poll
            if self._head is None:
                self._head = head_backoff(self._bells.max_poll)
            self._sleep.wait(min(timeout, self._head.next()))
            return False
        sleep = min(timeout, self._bells.ring_wait)
        if self.lease_ends is not None:
            # wake as the lease ends: a bell kept by a frozen holder is never rung
            sleep = min(sleep, max(LEASE_MARGIN, self.lease_ends - time.monotonic() + LEASE_MARGIN))
            self.lease_ends = None
        return self._ring_wait(sleep)

    def _ring_wait(self, seconds: float) -> bool:
        started = time.monotonic()
        try:
            row = self._get_lock(seconds)
        except Exception:  # noqa: BLE001 - the doorbell is a hint: poll instead
            self._drop()
            # a pooled connection that fails at once died idle (a server restart): one more
            # try on a new one; a failure after that, or a slow one, makes this waiter poll
            try:
                if time.monotonic() - started > FAST_FAILURE:
                    raise
                row = self._get_lock(seconds)
            except Exception:  # noqa: BLE001
                self._drop()
                self._broken = True
                return False
        if row is None or row[0] != 1:
            return False  # timed out (0), or an error (NULL): poll once, then sleep again
        self.has_bell = self.rung = True
        return True

    def _get_lock(self, seconds: float) -> Any:
        """GET_LOCK(bell, seconds) on this waiter's connection (made if it has none)."""
        bells = self._bells
        if self._conn is None:
            self._conn = bells.checkout()
        conn = self._conn
        ident, _ = bells.watchdog.watch(seconds + _STATEMENT_SLACK, lambda: bells.abort(conn))
        try:
            self._busy = True
            with conn.cursor() as cur:
                cur.execute("SELECT GET_LOCK(%s, %s)", (self.name, seconds))
                row = cur.fetchone()
            self._busy = False
            return row
        finally:
            bells.watchdog.done(ident)

    def _drop(self) -> None:
        self._busy = False
        conn, self._conn = self._conn, None
        if conn is not None:
            self._bells.discard(conn)

    def close(self) -> None:
        self._sleep.set()
        if self._busy:  # interrupted inside GET_LOCK: the connection is mid-statement
            self._drop()
        self._bells.closed(self, self._conn, self.won)
        self._conn = None
