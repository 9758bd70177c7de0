"""Which leases a client's grant replies confirm, and which ttls they refuse (no I/O)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from dblock._engine.replies import SHORT_LEASE, WINDOW, Replies, confirms, must_be_left


def test_with_no_reply_seen_any_short_lease_may_be_too_short() -> None:
    assert Replies().too_short(0.001)
    assert not Replies().too_short(SHORT_LEASE)


def test_a_lease_that_protects_work_is_never_too_short() -> None:
    """A store whose grants take 1.5 s and a 2 s ttl: a late grant is confirmed or waited
    past, never reported as it came."""
    replies = Replies()
    for _ in range(5):
        replies.seen(2.5)
    assert not replies.too_short(2.0)


def test_a_lease_is_too_short_under_a_typical_reply_and_what_must_be_left_after_it() -> None:
    replies = Replies()
    for _ in range(10):
        replies.seen(0.001)
    shortest = 0.001 + must_be_left(0.001)
    assert replies.shortest() == shortest
    assert replies.too_short(shortest * 0.9)
    assert not replies.too_short(shortest * 1.1)


def test_the_shortest_confirmed_ttl_is_never_above_a_lease_that_is_always_taken() -> None:
    replies = Replies()
    assert replies.shortest() == 0.0
    replies.seen(3.0)
    assert replies.shortest() == SHORT_LEASE
    assert not replies.too_short(SHORT_LEASE)


def test_a_short_lease_is_confirmed_only_with_enough_of_it_left() -> None:
    """As much as its reply took, and a thread switch interval: else it may be over before
    the caller runs again."""
    switch = sys.getswitchinterval()
    assert must_be_left(switch / 10) == switch
    assert must_be_left(switch * 2) == switch * 2
    assert confirms(0.04, left=0.03, took=0.01)
    assert not confirms(0.04, left=0.01, took=0.03)
    assert not confirms(0.004, left=0.0039, took=0.0001)  # under a switch interval
    assert not confirms(1e-9, left=-0.0004, took=0.0004)
    # a longer lease is taken however little is left (a store whose commits are slow)
    assert confirms(2.0, left=0.5, took=1.5)
    assert not confirms(2.0, left=-0.1, took=2.1)


def test_stalls_do_not_make_the_typical_reply_slow() -> None:
    """A lease of 1 s after a few replies that stalled for seconds is still no short one: the
    next late reply is a stall, not the ttl's fault."""
    replies = Replies()
    for _ in range(WINDOW):
        replies.seen(0.001)
    for _ in range(WINDOW // 2 - 1):
        replies.seen(3.0)
    assert not replies.too_short(1.0)
    assert replies.typical() == 0.001


def test_the_typical_reply_follows_the_recent_ones() -> None:
    """A store that became slow (a failover to a distant replica) makes short leases short."""
    replies = Replies()
    for _ in range(WINDOW):
        replies.seen(0.001)
    for _ in range(WINDOW):
        replies.seen(0.03)
    assert replies.too_short(0.02)


def test_a_refused_ttl_is_told_once_per_client_and_ttl() -> None:
    # a loop of tries with a ttl too short logs its warning once, not once per try
    replies = Replies()
    assert replies.first_refusal(0.001)
    assert not replies.first_refusal(0.001)
    assert replies.first_refusal(0.002)  # another ttl: told too
    for n in range(WINDOW * 2):  # bounded: a client trying ever new ttls keeps a few
        replies.first_refusal(1.0 + n)
    assert len(replies._told) <= WINDOW


def test_tries_with_a_ttl_too_short_warn_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import dblock

    with dblock.connect(f"sqlite:///{tmp_path}/locks.sqlite3") as client:
        with caplog.at_level(logging.DEBUG, logger="dblock"):
            for _ in range(5):
                assert not client.lock("k", ttl=1e-9).acquire(blocking=False)
    told = [r for r in caplog.records if "too short for the store" in r.getMessage()]
    assert [r.levelno for r in told] == [logging.WARNING] + [logging.DEBUG] * 4
