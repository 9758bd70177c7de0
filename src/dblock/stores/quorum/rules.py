"""The quorum's rules: majorities, the token of a grant, lease allowances, and when a store
that failed is asked again. No I/O here; ``dblock.stores.quorum.store`` runs them against the
stores (the safety argument: docs/stores/quorum.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..._types import LockInfo

#: allowed difference between the rates of the client's clock and a store's, as a fraction of
#: a lease: each store's lease is that much longer than the one the client counts on
DRIFT_RATE = 0.01
#: plus a fixed allowance for the clocks' granularity, seconds
DRIFT_FLOOR = 0.002
#: a store that failed is asked again after this long, doubling up to FAULT_BACKOFF_CAP
FAULT_BACKOFF = 0.05
FAULT_BACKOFF_CAP = 2.0


#: rounds of one acquire while its votes split (it won some stores, none won a majority)
SPLIT_ROUNDS = 6
#: the longest random pause before the first retry after a split, seconds; doubled each round
SPLIT_PAUSE = 0.01


def split_pause(round_: int) -> float:
    """The longest random pause after the ``round_``-th split vote (0: the first)."""
    return SPLIT_PAUSE * (1 << round_)


def majority(n: int) -> int:
    """The smallest number of stores that any two such sets share one of."""
    return n // 2 + 1


def store_lease(ttl: float) -> float:
    """The lease each store is asked for, so that it outlasts the client's ``ttl`` (counted
    from before the request was sent) even when the store's clock runs fast by DRIFT_RATE."""
    return ttl * (1 + DRIFT_RATE) + DRIFT_FLOOR


def next_token(fences: Sequence[int]) -> int:
    """The token of a new grant: above every fence read (from at least a majority), each
    floored by its store's clock in microseconds (docs/stores/quorum.md: why that keeps tokens
    rising when the stores that knew the fences restarted empty, one after another)."""
    return max(fences, default=0) + 1


Verdict = Literal["held", "late", "retry", "unreachable"]


def grant_verdict(
    n: int, granted: int, refused: int, elapsed: float, ttl: float, *, too_short: bool = False
) -> Verdict:
    """What a round of fenced grants on ``n`` stores gave.

    ``held``: a majority granted the same token and the time spent (``elapsed``, from before
    the first request) leaves a positive validity (the drift allowance is in the stores'
    longer leases). ``late``: a majority granted, after the ttl, which is ``too_short`` for
    ordinary rounds to beat: no stall, and no hold either; the engine, whose own measure of
    the call is past the lease too, ends it and refuses the ttl (dblock._engine.replies),
    never reporting it held. ``retry``: the stores answered but no valid majority granted
    (release what was granted, then wait). ``unreachable``: fewer than a majority answered.
    """
    need = majority(n)
    if granted >= need and elapsed < ttl:
        return "held"
    if granted >= need and too_short:
        return "late"
    if granted + refused < need:
        return "unreachable"
    return "retry"


def held_on_majority(n: int, ok: int, failed: int) -> bool | None:
    """After renewing (or releasing) on every store: True if a majority did it, False if a
    majority answered and it cannot have been done on a majority, None if too few answered
    to tell (the caller raises BackendError and may try again)."""
    need = majority(n)
    if ok >= need:
        return True
    if ok + failed >= need:
        return None
    return False


def agreed(n: int, holds: Sequence[LockInfo | None]) -> LockInfo | None:
    """The hold that a majority of the ``n`` stores report (same owner and token), or None;
    its ``acquired_at`` is the latest and ``expires_at`` the earliest among them."""
    groups: dict[tuple[str, int], list[LockInfo]] = {}
    for info in holds:
        if info is not None:
            groups.setdefault((info.owner, info.token), []).append(info)
    for same in groups.values():
        if len(same) >= majority(n):
            ends = [i.expires_at for i in same if i.expires_at is not None]
            first = same[0]
            return LockInfo(
                key=first.key,
                owner=first.owner,
                token=first.token,
                acquired_at=max(i.acquired_at for i in same),
                expires_at=min(ends) if ends else None,
                kind=first.kind,
            )
    return None


class Fault:
    """A member's missing answer: its error, or why it was not asked or not awaited."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Fault({self.reason!r})"


#: a member that did not answer in time (it is then backed off from, like a failed one)
TIMED_OUT = Fault("no answer in time")


@dataclass
class Health:
    """What the client knows of one store's faults: when to ask it again, and whether its
    failure was already logged (a store that is down is logged once, not at every call)."""

    down: bool = False
    retry_at: float = 0.0
    backoff: float = FAULT_BACKOFF

    def available(self, now: float) -> bool:
        return not self.down or now >= self.retry_at

    def failed(self, now: float) -> bool:
        """Record a failure; True if it is news (the store was fine until now)."""
        news = not self.down
        if news:
            self.backoff = FAULT_BACKOFF
        else:
            self.backoff = min(self.backoff * 2, FAULT_BACKOFF_CAP)
        self.down, self.retry_at = True, now + self.backoff
        return news

    def answered(self) -> bool:
        """Record an answer; True if the store had been down (it is back)."""
        back = self.down
        self.down = False
        return back
