"""How long a client's grants take to come back, and which leases they can confirm. No I/O
here.

A grant whose reply comes back after its lease may have run out on its way, and another client
may hold the key by then: it is never reported held (the engine confirms it by a renewal, or
ends it and goes on). A short lease must also have some of itself left when its grant is
reported, or the caller is handed a hold that is over before it can use it: one under
``SHORT_LEASE`` is confirmed only with at least as much of it left as its reply took, and as
the interpreter's thread switch interval (a thread may wait that long for the GIL before its
caller runs again). A ttl under ``Replies.shortest`` (measured: the typical grant round trip
plus that much left) is one this store's replies do not confirm: an acquire with it is refused
(a try returns False; a blocking acquire raises ValueError naming ``shortest``) instead of
waiting forever for a grant it could use.
"""

from __future__ import annotations

import sys
from collections import deque

#: the replies the typical one is the median of
WINDOW = 32
#: grants measured before a blocking acquire is refused for its ttl: the first grant of a
#: client may include connecting, and one slow reply says little
MEASURED = 3
#: only a lease shorter than this may be too short to confirm: a longer one protects work, and
#: a store slow enough to answer its grants late in it (commits of seconds) has them taken as
#: they come, however little is left, and its late grants confirmed or waited past
SHORT_LEASE = 0.05


def must_be_left(took: float) -> float:
    """What a short lease must have left when a reply that took ``took`` s reports it."""
    return max(took, sys.getswitchinterval())


def confirms(ttl: float, left: float, took: float) -> bool:
    """Whether a reply that took ``took`` s confirms a lease of ``ttl`` with ``left`` s of it
    still left: some left, and for a short lease ``must_be_left(took)``."""
    return left > 0 and (ttl >= SHORT_LEASE or left >= must_be_left(took))


class Replies:
    """The recent replies of one client to grants (of a quorum: its grant rounds). Renewals
    do not count: they do less than a grant, and would make grants look quicker than they
    are. Shared by threads (a deque appends atomically)."""

    __slots__ = ("_recent", "_told")

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=WINDOW)
        #: the ttls whose refusal was logged as a warning (later refusals of one log at debug)
        self._told: set[float] = set()

    def first_refusal(self, ttl: float) -> bool:
        """True the first time a try with ``ttl`` is refused as too short on this client: its
        warning is logged once, not for every try of a loop that keeps trying."""
        if ttl in self._told or len(self._told) >= WINDOW:
            return False
        self._told.add(ttl)
        return True

    def __len__(self) -> int:
        return len(self._recent)

    def seen(self, seconds: float) -> None:
        """Count one reply that took ``seconds``."""
        self._recent.append(seconds)

    def typical(self) -> float | None:
        """The lower median of the recent replies, None before the first."""
        recent = sorted(self._recent)
        return recent[(len(recent) - 1) // 2] if recent else None

    def shortest(self) -> float:
        """The shortest ttl the recent replies confirm: a typical reply plus what must be left
        after it (capped at ``SHORT_LEASE``, which is always confirmed; 0 before the first
        reply)."""
        typical = self.typical()
        if typical is None:
            return 0.0
        return min(SHORT_LEASE, typical + must_be_left(typical))

    def too_short(self, ttl: float) -> bool:
        """True if a lease of ``ttl`` is shorter than ``SHORT_LEASE`` and than ``shortest()``
        (with no reply seen yet, any such lease is): typical grants do not confirm it."""
        if ttl >= SHORT_LEASE:
            return False
        return not self._recent or ttl < self.shortest()
