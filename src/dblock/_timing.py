"""Waiting schedules (pure): capped exponential backoff with decorrelated jitter."""

from __future__ import annotations

import random


class Backoff:
    """Sleep lengths for a waiter: each drawn from ``[base, 3 * previous]``, capped at ``cap``.

    Jitter spreads waiters apart so a release is not followed by a herd of queries, and the
    cap bounds how stale a waiter's view can get (the worst-case extra hand-off latency).
    """

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        if not 0 < base <= cap:
            raise ValueError("need 0 < base <= cap")
        self.base = base
        self.cap = cap
        self._previous = base
        self._rng = rng or random.Random()

    def next(self) -> float:
        """The next sleep, in seconds."""
        self._previous = min(self.cap, self._rng.uniform(self.base, self._previous * 3))
        return self._previous
