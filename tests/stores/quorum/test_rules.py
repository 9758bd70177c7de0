"""The quorum's rules (dblock.stores.quorum.rules), without any store."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dblock import LockInfo
from dblock.stores.quorum.rules import (
    DRIFT_RATE,
    FAULT_BACKOFF,
    FAULT_BACKOFF_CAP,
    Health,
    agreed,
    grant_verdict,
    held_on_majority,
    majority,
    next_token,
    store_lease,
)


@pytest.mark.parametrize(("n", "need"), [(3, 2), (4, 3), (5, 3), (7, 4)])
def test_any_two_majorities_share_a_store(n: int, need: int) -> None:
    assert majority(n) == need
    assert 2 * majority(n) > n


@given(st.lists(st.integers(min_value=0, max_value=2**62), min_size=2, max_size=7))
def test_the_next_token_is_above_every_fence_read(fences: list[int]) -> None:
    assert all(next_token(fences) > f for f in fences)


@given(st.floats(min_value=0.001, max_value=31_536_000))
def test_each_store_leases_longer_than_the_client_counts_on(ttl: float) -> None:
    # a store whose clock runs DRIFT_RATE fast still keeps the lease for ttl real seconds
    assert store_lease(ttl) / (1 + DRIFT_RATE) > ttl


def test_a_grant_is_held_only_on_a_majority_within_the_lease() -> None:
    assert grant_verdict(3, granted=2, refused=1, elapsed=0.1, ttl=1) == "held"
    assert grant_verdict(3, granted=2, refused=0, elapsed=0.1, ttl=1) == "held"  # one down
    assert grant_verdict(3, granted=2, refused=1, elapsed=1.0, ttl=1) == "retry"  # too late
    assert grant_verdict(3, granted=1, refused=2, elapsed=0.1, ttl=1) == "retry"
    assert grant_verdict(3, granted=1, refused=0, elapsed=0.1, ttl=1) == "unreachable"
    assert grant_verdict(3, granted=0, refused=1, elapsed=0.1, ttl=1) == "unreachable"
    assert grant_verdict(5, granted=2, refused=1, elapsed=0.1, ttl=1) == "retry"
    # a round slower than the ttl is a stall only if ordinary rounds beat the ttl: else the
    # grant is late, never held (the engine ends it and refuses the ttl)
    assert grant_verdict(3, granted=2, refused=1, elapsed=1.5, ttl=1, too_short=True) == "late"
    assert grant_verdict(3, granted=2, refused=1, elapsed=0.5, ttl=1, too_short=True) == "held"
    assert grant_verdict(3, granted=1, refused=2, elapsed=1.5, ttl=1, too_short=True) == "retry"


def test_renewal_counts_only_a_majority_and_says_when_it_cannot_tell() -> None:
    assert held_on_majority(3, ok=2, failed=1) is True
    assert held_on_majority(3, ok=1, failed=1) is None  # the missing answer decides
    assert held_on_majority(3, ok=1, failed=0) is False
    assert held_on_majority(3, ok=0, failed=3) is None


def _info(owner: str, token: int, start: int, end: int) -> LockInfo:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return LockInfo(
        "k", owner, token, t0 + timedelta(seconds=start), t0 + timedelta(seconds=end), "lock"
    )


def test_a_hold_is_reported_only_if_a_majority_agrees_on_owner_and_token() -> None:
    a, b = _info("a", 7, 0, 10), _info("a", 7, 1, 9)
    found = agreed(3, [a, b, None])
    assert found is not None and (found.owner, found.token) == ("a", 7)
    # the latest start and the earliest end: what every agreeing store vouches for
    assert (found.acquired_at, found.expires_at) == (b.acquired_at, b.expires_at)
    assert agreed(3, [a, _info("a", 8, 0, 10), None]) is None  # same owner, other grants
    assert agreed(3, [a, _info("b", 7, 0, 10), _info("c", 9, 0, 10)]) is None
    assert agreed(3, [a, None, None]) is None


def test_a_failing_store_is_logged_once_and_asked_again_after_a_growing_backoff() -> None:
    health = Health()
    assert health.available(0.0)
    assert health.failed(0.0) is True  # news: logged
    assert not health.available(FAULT_BACKOFF / 2)
    assert health.available(FAULT_BACKOFF)
    assert health.failed(FAULT_BACKOFF) is False  # still down: not logged again
    assert not health.available(FAULT_BACKOFF * 2.5)
    for _ in range(20):
        health.failed(0.0)
    assert health.backoff == FAULT_BACKOFF_CAP
    assert health.answered() is True  # back: logged once
    assert health.answered() is False
    assert health.available(0.0)
