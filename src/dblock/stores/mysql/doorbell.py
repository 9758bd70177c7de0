"""MySQL/MariaDB wake-ups: waiters sleep in ``GET_LOCK`` on the key's doorbell; a release rings it.

MySQL cannot push a release to a client, but a session blocked in ``GET_LOCK`` wakes the moment
the holder of that user lock lets go, and the server grants a user lock to its waiters in the
order they asked. dblock uses one user lock per key as a doorbell, never as the lock:

- A waiter sleeps in ``GET_LOCK(bell)`` on a connection of its own, at most ``RING_WAIT`` s at
  a time (then it polls the table once and sleeps again).
- A release by a holder that keeps the bell lets go of it inside the transaction that ends
  the lease, which wakes the next waiter at the bell, and only that one, and hands the lock
  to that waiter in the same commit (the lease row gets the new owner and token) if its queue
  entry names its bell's connection and no live entry ahead of it has waited
  ``ARRIVAL_SLACK`` or longer (see MysqlStatements.release_and_hand_over). The bell's order
  is not always the queue's: a waiter whose ``GET_LOCK`` ran out asks again behind those that
  asked after it, and waiters arriving together may reach the bell in another order than
  they queued (among waiters that all waited less than the slack, the bell's order decides).
- Whoever gets the bell first passes the key's gate, then reads the lease row: statements sent
  with its GET_LOCK in one packet. A release holds the gate from before it lets go of the bell
  until its commit is on disk: InnoDB lets others read a commit before that (it releases row
  locks before it writes the log), and a hand-over read then could be undone by a server crash,
  and its token issued again. Handed the lock, it holds it, and keeps the bell for as long as
  it does. Free, it tries at once, unless a waiter ahead of it has waited the slack or longer.
  Handed to another waiter (whose bell's connection changed, say), or free with such a
  waiter ahead of it, it passes the bell on and waits for it again, a little later each time.
- A holder that took a free lock without waiting has no bell: the first waiter gets the bell
  at once and polls the table, paced like the head of a queue; the waiters behind it sleep.
- A waiter for several keys (``lock_many``) has no bell: a session sleeps in one GET_LOCK at a
  time, and a bell for each key would take a connection each. Its queue entries are marked
  (statements.MANY_BELL) and no waiter at a bell passes them, whatever their age: a release
  does not hand the lock over behind one, and a waiter the bell wakes with one ahead keeps the
  bell and looks again. The lock_many waiter looks at its keys itself (KeysLook), paced like
  the head of a queue, and takes them all (a hold without a bell) once they are free for it.

The lease row stays the only truth. A bell that is lost (its connection dropped), stuck (its
process frozen) or rung early costs time, never safety: waiters fall back to polling. The
server closes an idle bell connection after ``BELL_IDLE`` s (``wait_timeout``), which frees a
bell kept by a frozen or forgotten holder. Each waiter uses one connection while it waits, so
a client keeps at most ``MAX_BELLS`` bells; waiters beyond that poll. The cap is not the pool's
``max_connections``: the bells are connections of their own, and a bell-less waiter that comes
to head the queue holds up every hand-over until its next poll (20 threads of a client with the
default pool of 10: 75 critical sections a second, 680 when every waiter has a bell).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..._contract import Subscription
from ..._errors import DBLockError
from ..._runtime import Event
from ..._timing import HEAD_POLL, Backoff, TurnPacer, head_backoff
from .._bells import BellBook
from .._watchdog import Watchdog

#: the longest one GET_LOCK sleeps before its waiter polls the table once, seconds
RING_WAIT = 2.0
#: the server closes a bell connection idle this long (``wait_timeout``), freeing its bell
BELL_IDLE = 30
#: bells (waiting or held) one client may have at once
MAX_BELLS = 64
_STATEMENT_SLACK = 5.0  # the watchdog's margin over a GET_LOCK's own timeout
LEASE_MARGIN = 0.02  # a waiter wakes this long after the lease it saw should have ended
FAST_FAILURE = 0.5  # a GET_LOCK that fails sooner found its connection dead, not the server
PASS_PAUSE = 0.001  # the first pause before asking again for a bell passed on
#: waiters that have all waited less than this many seconds (at most half a GET_LOCK's sleep,
#: Bells.slack_us) are served in the order they reached the bell (the server's GET_LOCK
#: queue), not strictly by their queue entries' times: an entry and its GET_LOCK are two round
#: trips, which waiters arriving together interleave, and served strictly, each such swap cost
#: a pass of the bell (8 processes on one key fell from about 600 to about 25 sections/s). A
#: waiter ahead that waited longer is served first (its GET_LOCK may have run out, RING_WAIT,
#: and asked again behind later ones).
ARRIVAL_SLACK = 0.5
#: the key's gate is the user lock named by its bell's name and this (see gate_sql)
GATE = ":durable"
#: the longest a waiter that has the bell waits at the gate (a commit's disk write); beyond it,
#: it takes a lock handed to it with a write of its own, whose commit follows that one's
GATE_WAIT = 2.0
T = TypeVar("T")


def gate_sql(bell_param: str) -> str:
    """SQL for the name of the gate of the bell named by the parameter ``bell_param``."""
    return f"CONCAT(%({bell_param})s, '{GATE}')"


class Bells(BellBook["Doorbell"]):
    """The doorbells of one MySQL backend: their connections, and who waits or holds one.

    ``table`` names the lock table with its database (user locks are the whole server's);
    ``connect`` opens a connection (autocommit), ``close`` closes one; ``watchdog`` is the
    backend's, which aborts a statement on a connection with ``abort(conn)``; ``granted`` is
    the SQL of the read a waiter makes once it has the bell; ``idle_kept``: idle bell
    connections kept.
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
        granted: str,
        idle_kept: int = MAX_BELLS,
    ) -> None:
        super().__init__(limit=MAX_BELLS, idle_kept=idle_kept, idle_for=BELL_IDLE)
        self.table = table
        #: key owner -> (1, token): owner was handed the lock; (0, handed): another holds it,
        #: handed over by a release (1) or taken (0); no row: free (a locking read)
        self.granted_sql = granted
        self._connect = connect
        self._close_conn = close
        self.watchdog = watchdog
        self.abort = abort
        self.max_poll = max_poll
        #: one GET_LOCK's sleep, and the wait at the gate after it: together within the
        #: driver's read timeout, which would end them early
        self.ring_wait = min(RING_WAIT, read_timeout / 3)
        self.gate_wait = min(GATE_WAIT, read_timeout / 3)
        #: ARRIVAL_SLACK in microseconds, below a GET_LOCK's sleep: a waiter whose GET_LOCK ran
        #: out and asked again behind later ones has waited longer than the slack
        self.slack_us = round(min(ARRIVAL_SLACK, self.ring_wait / 2) * 1_000_000)

    def name(self, key: str) -> str:
        """The user lock of ``key``'s doorbell: 64 characters at most, whatever the key."""
        digest = hashlib.sha1(f"{self.table}\0{key}".encode(), usedforsecurity=False)
        return f"dblock:{digest.hexdigest()}"

    def _make(self, key: str, owner: str, sleep: Event) -> Doorbell:
        return Doorbell(self, key, owner, sleep)

    def _open(self) -> Any:
        return self._connect()

    def _close(self, conn: Any) -> None:
        self._close_conn(conn)

    # -- waiters ----------------------------------------------------------------------------
    def lease_left(self, key: str, owner: str, seconds: float) -> None:
        """``owner``'s look found the lock held for ``seconds`` more: sleep no longer."""
        bell = self.waiting(key, owner)
        if bell is not None:
            bell.lease_ends = time.monotonic() + seconds

    def connection_id(self, key: str, owner: str) -> int | None:
        """The connection id of ``owner``'s doorbell for ``key`` (made if it has none yet)."""
        bell = self.waiting(key, owner)
        return None if bell is None else bell.connection_id()

    # -- holders ----------------------------------------------------------------------------
    def release_holding(self, key: str, owner: str, release: Callable[[Any], T]) -> T | None:
        """The hold (key, owner) is ending: ``release(conn)`` on its bell's connection, which
        must end the lease and let go of the bell (and so wake the next waiter) in one
        transaction. Its result; None if the hold keeps no bell. What it raises propagates
        after the connection is closed, which frees the bell and rolls back what it had not
        committed."""
        conn = self._ending(key, owner)
        if conn is None:
            return None
        ident, _ = self.watchdog.watch(_STATEMENT_SLACK, lambda: self.abort(conn))
        try:
            result = release(conn)
        except BaseException:
            self._close(conn)
            raise
        finally:
            self.watchdog.done(ident)
        self.checkin(conn)
        return result

    def let_go(self, conn: Any, bell: Doorbell | None) -> None:
        if bell is None:
            self.checkin(conn)
            return
        ident, _ = self.watchdog.watch(_STATEMENT_SLACK, lambda: self.abort(conn))
        try:
            with conn.cursor() as cur:
                cur.execute("DO RELEASE_LOCK(%s)", (bell.name,))
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


class Doorbell(Subscription):
    """A Subscription for MySQL: ``wait()`` sleeps in GET_LOCK on the key's bell."""

    live = True
    targeted = True
    latched = True  # the bell is a lock, not an event: one freed before GET_LOCK is had at once
    granted: int | None = None

    def __init__(self, bells: Bells, key: str, owner: str, sleep: Event) -> None:
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
        #: pauses before asking for the bell again after passing it on (None: not passing)
        self._passing: Backoff | None = None
        #: how long to stay away from the bell after passing it on far back in the queue
        self._paced: float | None = None
        self._pacer = TurnPacer(RING_WAIT)
        self._sleep = sleep

    def wait(self, timeout: float) -> bool:
        if timeout <= 0:
            return False
        if self.has_bell or self._broken:
            # next in line behind a holder without a bell (or no bell to be had): poll
            if self._head is None:
                self._head = head_backoff(self._bells.max_poll)
            self._sleep.wait(min(timeout, self._head.next()))
            return False
        if self._passing is not None:
            # the lock was handed to a waiter behind us at the bell: let it get there first
            pause = min(timeout, self._paced or self._passing.next())
            self._paced = None
            self._sleep.wait(pause)
            timeout -= pause
            if timeout <= 0:
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
            rang, row = self._get_lock(seconds)
        except Exception:  # noqa: BLE001 - the doorbell is a hint: poll instead
            self._drop()
            # a pooled connection that fails at once died idle (a server restart): one more
            # try on a new one; a failure after that, or a slow one, makes this waiter poll.
            # (A failure after GET_LOCK, in the read, lets go of the bell with the connection.)
            try:
                if time.monotonic() - started > FAST_FAILURE:
                    raise
                rang, row = self._get_lock(seconds)
            except Exception:  # noqa: BLE001
                self._drop()
                self._broken = True
                return False
        if rang is None or rang[0] not in (1, 2):
            return False  # timed out (0), or an error: poll once, then sleep again
        self.has_bell = True
        return self._answer(row, durable=rang[0] == 2)

    def _answer(self, row: Any, *, durable: bool) -> bool:
        """Having the bell, and ``row`` from the granted read: was the lock handed to us, is
        it free, or whose turn is it? ``durable``: the read came after the gate, so a
        hand-over it saw is on disk."""
        if row is not None and row[0] == 0 and row[1] == 1:
            # handed to a waiter behind us at the bell (its bell's connection changed since it
            # queued, say), or free while a waiter ahead of us in the queue is behind us at
            # the bell: pass the bell on, to it
            try:
                self._run("DO RELEASE_LOCK(%(name)s)", {"name": self.name}, results=0)
            except Exception:  # noqa: BLE001 - a dead connection frees its bell anyway
                self._drop()
            self.has_bell = False
            if self._passing is None:
                self._passing = Backoff(PASS_PAUSE, self._bells.max_poll)
            ahead = int(row[2] or 0)
            if ahead > 1:
                # Far back: stay away from the bell until our turn is near. Asking again at
                # once would queue us at the bell behind waiters that come after us in the
                # queue, and each hand-off would pass the bell along a line of them.
                self._paced = self._pacer.pause(ahead)
            return False
        self._passing = None
        if row is not None and row[0] == 1 and durable:
            self.granted = int(row[1])
            self.won = True  # the bell stays with the hold (the acquire takes the grant)
        elif row is not None and row[0] == 1:
            # handed to us, but maybe not on disk yet: the acquire looks, and takes it again
            # with a commit of its own (which the server writes after the hand-over's)
            self.rung = False
        else:
            self.rung = row is None  # free: try at once; taken: look before trying
        return True

    def connection_id(self) -> int | None:
        """The id of this waiter's connection (made if it has none), or None if it fails."""
        try:
            return int(self._connection().thread_id())
        except Exception:  # noqa: BLE001 - no bell then: the waiter polls, as without one
            return None

    def _get_lock(self, seconds: float) -> tuple[Any, Any]:
        """GET_LOCK(bell, seconds) on this waiter's connection (made if it has none), then,
        if it got the bell, a pass through the gate (GET_LOCK and RELEASE_LOCK of the gate,
        waiting at most ``gate_wait``), and the granted read: sent in one packet, so the server
        runs each the moment the one before returns, without a round trip to the client
        between them. The first result is 2 if the bell was had and the gate passed, 1 if
        only the bell, 0 if neither (the read's result is ignored then). Each statement is a
        transaction of its own, reading the clock when it starts."""
        gate = gate_sql("name")
        sql = (
            "SELECT IF(GET_LOCK(%(name)s, %(s)s) = 1,\n"
            f"    1 + IF(GET_LOCK({gate}, %(g)s) = 1, RELEASE_LOCK({gate}), 0), 0);\n"
            + self._bells.granted_sql
        )
        params = {
            "name": self.name,
            "s": seconds,
            "g": self._bells.gate_wait,
            "key": self.key,
            "owner": self.owner,
            "slack_us": self._bells.slack_us,
        }
        rang, row = self._run(sql, params, seconds=seconds + self._bells.gate_wait, results=2)
        return rang, row

    def _connection(self) -> Any:
        """This waiter's connection, made if it has none."""
        if self._conn is None:
            self._conn = self._bells.checkout()
        return self._conn

    def _run(
        self, sql: str, params: dict[str, Any], *, seconds: float = 0.0, results: int = 1
    ) -> list[Any]:
        """Statements on this waiter's connection, which may take ``seconds`` (plus the
        watchdog's slack); the first row of each of the first ``results`` results."""
        bells = self._bells
        conn = self._connection()
        ident, _ = bells.watchdog.watch(seconds + _STATEMENT_SLACK, lambda: bells.abort(conn))
        try:
            self._busy = True
            rows: list[Any] = []
            with conn.cursor() as cur:
                cur.execute(sql, params)
                while len(rows) < results:
                    rows.append(cur.fetchone())
                    if not cur.nextset():
                        break
            self._busy = False
            return rows + [None] * (results - len(rows))
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


class KeysLook(Subscription):
    """A Subscription for a waiter for several keys (``subscribe_many``), which has no bell.

    No release rings it: ``wait()`` looks at its keys, one plain read (``look``: how many live
    entries are ahead of its own on the keys, and how many of them are held), every HEAD_POLL s
    for a while after that changed, then less and less often up to ``cap``: quick while its
    keys change hands, cheap while they do not. True once nothing stands in its way. It
    sleeps before each look: its waiter has just tried, and a try that fails where the look
    saw nothing in the way (a session hold, which the look does not see) slows it down.
    """

    live = True  # a key freed for it ends the wait: the engine's own polls are a safety net

    def __init__(self, look: Callable[[], tuple[int, int]], sleep: Event, cap: float) -> None:
        self._look = look
        self._sleep = sleep
        self._cap = cap
        self._seen: tuple[int, int] | None = None
        self._pace = head_backoff(cap)
        self._closed = False

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not self._closed:
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._sleep.wait(min(left, self._pace.next()))
            if self._closed:
                return False
            try:
                seen = self._look()
            except DBLockError:
                return True  # the try that follows meets the failure, and says what it is
            if seen == (0, 0):
                return True
            if seen != self._seen:
                # at the head of every queue (only holds in the way): poll as a queue's head
                # does; behind other waiters, faster only right after the queue moved
                self._seen = seen
                self._pace = (
                    head_backoff(self._cap) if seen[0] == 0 else Backoff(HEAD_POLL, self._cap)
                )
        return False

    def close(self) -> None:
        self._closed = True
        self._sleep.set()
