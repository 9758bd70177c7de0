"""What tells a stalled reply from a ttl that ordinary replies do not beat (no I/O)."""

from __future__ import annotations

from dblock._engine.replies import SHORT_LEASE, STALL_FACTOR, WINDOW, Replies


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


def test_a_lease_is_too_short_under_a_few_typical_replies() -> None:
    replies = Replies()
    for _ in range(10):
        replies.seen(0.001)
    assert replies.too_short(0.001 * STALL_FACTOR * 0.9)
    assert not replies.too_short(0.001 * STALL_FACTOR * 1.1)


def test_stalls_do_not_make_the_typical_reply_slow() -> None:
    """A lease of 1 s after a few replies that stalled for seconds is still no short one: the
    next late reply is a stall, not the ttl's fault."""
    replies = Replies()
    for _ in range(WINDOW):
        replies.seen(0.001)
    for _ in range(WINDOW // 2 - 1):
        replies.seen(3.0)
    assert not replies.too_short(1.0)


def test_the_typical_reply_follows_the_recent_ones() -> None:
    """A store that became slow (a failover to a distant replica) makes short leases short."""
    replies = Replies()
    for _ in range(WINDOW):
        replies.seen(0.001)
    for _ in range(WINDOW):
        replies.seen(0.03)
    assert replies.too_short(0.02)
