"""Acquiring a session hold (``ttl=None`` on a store with ``SessionHolds``). No I/O here.

The waiting is the server's: one store call waits in the server's own queue for what is
left of the timeout, and a release there hands the lock to the next waiter. The engine only
loops when a live lease of the key stepped the grant back (lease and session holds exclude
each other): it backs off and asks again.
"""

from __future__ import annotations

import math
import time

from .._contract import SessionHolds
from .._timing import Backoff
from .hold import Hold
from .kinds import Spec
from .ops import Call, Sleep, Steps

FIRST_BACKOFF = 0.005


def acquire_session(
    spec: Spec, owner: str, cap: float, *, blocking: bool, timeout: float | None
) -> Steps[Hold | None]:
    """Take ``spec.key``'s server lock, waiting up to ``timeout`` s (None: forever)."""
    sent = time.monotonic()
    deadline = math.inf if timeout is None else sent + timeout
    backoff = None  # made when first needed: most grants are had at the first ask
    while True:
        wait = 0.0 if not blocking else max(0.0, deadline - sent)
        token = yield Call(SessionHolds.acquire_session, spec.key, owner, wait)
        if token is not None:
            return Hold(spec, owner, token, spec.ttl, sent)
        remaining = deadline - time.monotonic()
        if wait == 0 or remaining <= 0:
            return None
        backoff = backoff or Backoff(FIRST_BACKOFF, cap)
        yield Sleep(min(backoff.next(), remaining))
        sent = time.monotonic()
