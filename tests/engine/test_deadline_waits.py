"""How long a wait inside one statement may last under the caller's deadline (no I/O): the
pool asks at its first failure, for the whole call since it started."""

from __future__ import annotations

import time

import pytest

from dblock._timing import DEADLINE_SLACK, bounded_wait, reset_deadline, set_deadline


def test_without_a_deadline_the_wait_is_whole() -> None:
    assert bounded_wait(30.0) == (30.0, False)
    assert bounded_wait(30.0, since=time.monotonic() - 5) == (30.0, False)


def test_a_wait_asked_later_is_bounded_as_if_asked_when_it_started() -> None:
    started = time.monotonic()
    token = set_deadline(started + 2.0)
    try:
        at_start, cut = bounded_wait(30.0)
        assert cut and at_start == pytest.approx(2.0 + DEADLINE_SLACK, abs=0.05)
        # asked 1.5 s into the call (the deadline's end nearer by as much), for the call
        later = started - 1.5
        token2 = set_deadline(later + 2.0)
        try:
            since, cut = bounded_wait(30.0, since=later)
            assert cut and since == pytest.approx(2.0 + DEADLINE_SLACK, abs=0.05)
            assert bounded_wait(30.0)[0] == pytest.approx(0.5 + DEADLINE_SLACK, abs=0.05)
        finally:
            reset_deadline(token2)
    finally:
        reset_deadline(token)


def test_a_passed_deadline_still_leaves_the_slack() -> None:
    token = set_deadline(time.monotonic() - 10.0)
    try:
        assert bounded_wait(30.0, since=time.monotonic() - 1.0) == pytest.approx(
            (DEADLINE_SLACK, True)
        )
    finally:
        reset_deadline(token)
