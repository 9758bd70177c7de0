"""How long a client's grants take to come back: what tells a stalled reply from a ttl that
ordinary replies do not beat. No I/O here.

A grant whose reply comes back after its lease may have run out on its way, and another client
may hold the key by then (the engine confirms it, or waits on). That reasoning needs the ttl to
outlast an ordinary reply: a lease shorter than a typical grant comes back late as a matter of
course, and treating every such reply as a stall would refuse a free key forever. Such a lease
is taken as asked, its end perhaps already past when the grant is reported (``held`` is
False, ``release()`` raises LockLost): it cannot protect anything, and the caller learns so,
as of any lease that ran out.
"""

from __future__ import annotations

from collections import deque

#: a ttl under this many typical grants is too short to tell a stall by: most replies come back
#: after it. Not more: on a store whose commits take most of the ttl (1.5 s of 2 s), a grant
#: that came back late must still be confirmed or waited past, never reported as it came
STALL_FACTOR = 1.0
#: the replies the typical one is the median of
WINDOW = 32
#: only a lease shorter than this may be too short to confirm: a longer one protects work, and
#: a store slow enough to answer its grants after it (commits of seconds) has its late grants
#: confirmed or waited past, never reported as they came
SHORT_LEASE = 0.05


class Replies:
    """The recent replies of one client to grants (of a quorum: its grant rounds). Renewals
    do not count: they do less than a grant, and would make grants look quicker than they
    are. Shared by threads (a deque appends atomically)."""

    __slots__ = ("_recent",)

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=WINDOW)

    def seen(self, seconds: float) -> None:
        """Count one reply that took ``seconds``."""
        self._recent.append(seconds)

    def too_short(self, ttl: float) -> bool:
        """True if a lease of ``ttl`` is shorter than ``SHORT_LEASE`` and than
        ``STALL_FACTOR`` typical replies (the lower median of the recent ones; with none yet,
        any such lease is), so a reply later than the lease is no sign of a stall."""
        if ttl >= SHORT_LEASE:
            return False
        recent = sorted(self._recent)
        if not recent:
            return True
        return ttl < STALL_FACTOR * recent[(len(recent) - 1) // 2]
