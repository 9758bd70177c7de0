"""Waiting schedules (pure): capped exponential backoff with jitter; the caller's deadline."""

from __future__ import annotations

import random
import time
from contextvars import ContextVar, Token

from ._errors import LockTimeout

_SHARED = random.Random()


class Backoff:
    """Sleep lengths for a waiter: growing 1.5-2.5x per step up to ``cap``, then jittered in
    ``[0.75 * cap, cap]``.

    Jitter spreads waiters apart so a release is not followed by a herd of queries; steady
    growth keeps a long wait cheap (a waiter settles near the cap instead of falling back to
    short sleeps), and the cap bounds how stale a waiter's view can get.
    """

    def __init__(
        self, base: float, cap: float, rng: random.Random | None = None, *, plateau: int = 0
    ) -> None:
        if not 0 < base <= cap:
            raise ValueError("need 0 < base <= cap")
        self.base = base
        self.cap = cap
        self._previous = base
        self._rng = rng or _SHARED
        self._plateau = plateau  # this many sleeps of about ``base`` before growing

    def next(self) -> float:
        """The next sleep, in seconds."""
        if self._plateau > 0:
            self._plateau -= 1
            return min(self.cap, self.base * self._rng.uniform(1.0, 1.25))
        self._previous = min(self.cap, self._previous * self._rng.uniform(1.5, 2.5))
        if self._previous >= self.cap:
            return max(self.base, self.cap * self._rng.uniform(0.75, 1.0))
        return self._previous


#: how soon the head of a queue that is not told of releases first asks whether it is free
HEAD_POLL = 0.002
HEAD_PLATEAU = 25  # polls at that pace before slowing down


def head_backoff(cap: float) -> Backoff:
    """Polls for the head of a queue: every ``HEAD_POLL`` s for ``HEAD_PLATEAU`` polls, then
    less and less often up to ``cap``."""
    return Backoff(HEAD_POLL, cap, plateau=HEAD_PLATEAU)


class TurnPacer:
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


# -- the caller's deadline, for the waits inside one statement --------------------------------
#: a try-once, or a wait whose time is up, may still wait this long for a busy database file
#: or a free pooled connection: a commit or a statement in progress takes milliseconds, and
#: failing a try-once for that alone would report a free lock as busy
DEADLINE_SLACK = 0.25

_deadline: ContextVar[float | None] = ContextVar("dblock_deadline", default=None)


class DeadlinePassed(LockTimeout):
    """A wait inside a statement (a busy SQLite file, no free pooled connection) outlasted the
    caller's deadline; nothing was done in the database. Lock.acquire turns it into False."""


def set_deadline(deadline: float | None) -> Token[float | None]:
    """Bound the waits of this thread's (task's) statements by ``deadline`` (monotonic)."""
    return _deadline.set(deadline)


def reset_deadline(token: Token[float | None]) -> None:
    _deadline.reset(token)


def time_left() -> float | None:
    """Seconds to the caller's deadline (negative once it passed), or None if there is none."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def bounded_wait(wait: float, since: float | None = None) -> tuple[float, bool]:
    """(how long a wait of at most ``wait`` s may last, whether the caller's deadline cut it);
    never less than ``DEADLINE_SLACK`` because of the deadline. ``since``: for a wait that
    started then (a ``time.monotonic()``), not now."""
    left = time_left()
    if left is not None and since is not None:
        left += time.monotonic() - since
    if left is None or max(left, 0.0) + DEADLINE_SLACK >= wait:
        return wait, False
    return max(left, 0.0) + DEADLINE_SLACK, True
