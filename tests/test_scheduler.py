"""The background thread that runs renewals and expiry watches at their times."""

from __future__ import annotations

import math
import threading
import time

import pytest

from dblock._engine import Hold, Spec
from dblock._renewer import Scheduler
from dblock._session_checks import SessionChecks


def test_a_job_due_before_the_one_the_thread_sleeps_for_still_runs_on_time() -> None:
    scheduler = Scheduler("test-scheduler")
    ran = threading.Event()
    try:
        scheduler.at(time.monotonic() + 60, lambda: None)  # the thread sleeps until then
        time.sleep(0.05)
        scheduler.at(time.monotonic() + 0.05, ran.set)
        assert ran.wait(10), "the thread slept on until the later job"
    finally:
        scheduler.stop()


def test_jobs_run_in_the_order_of_their_times_and_cancelled_ones_not_at_all() -> None:
    scheduler = Scheduler("test-scheduler")
    order: list[str] = []
    done = threading.Event()
    try:
        now = time.monotonic()
        scheduler.at(now + 0.3, lambda: (order.append("c"), done.set()))
        scheduler.at(now + 0.1, lambda: order.append("a"))
        scheduler.at(now + 0.2, lambda: order.append("x")).cancel()
        scheduler.at(now + 0.2, lambda: order.append("b"))
        assert done.wait(10)
        assert order == ["a", "b", "c"]
    finally:
        scheduler.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_jobs_still_run_after_something_ended_the_thread() -> None:
    """``at`` starts a thread only when it knows of none: one that ended (here a job raised
    SystemExit, which ends a thread quietly) must be known to have ended, or every later
    renewal would wait for a thread that is gone."""
    scheduler = Scheduler("test-scheduler")

    def end_the_thread() -> None:
        raise SystemExit

    try:
        scheduler.at(time.monotonic(), end_the_thread)
        first = scheduler._thread
        assert first is not None
        first.join(10)
        assert not first.is_alive()
        ran = threading.Event()
        scheduler.at(time.monotonic(), ran.set)
        assert ran.wait(10), "a job waited for the thread that had ended"
    finally:
        scheduler.stop()


# -- the checks of session holds: one job for all of a client's holds ----------------------------
def _session_hold(key: str) -> Hold:
    return Hold(Spec(key, math.inf, "session"), f"owner-{key}", 1, math.inf, time.monotonic())


def test_session_holds_are_checked_when_due_until_discarded_and_a_failing_check_stops_none() -> (
    None
):
    scheduler = Scheduler("test-scheduler")
    checks = SessionChecks(scheduler)
    seen: list[str] = []
    twice = threading.Event()

    def check(hold: Hold) -> None:
        seen.append(hold.key)
        if hold.key == "bad":
            raise RuntimeError("a check that fails")
        hold.due = time.monotonic() + 0.1
        if seen.count("a") >= 2:
            twice.set()

    try:
        a, bad, gone = _session_hold("a"), _session_hold("bad"), _session_hold("gone")
        for hold in (a, bad, gone):
            hold.due = time.monotonic()
            checks.add(hold, check)
        checks.discard(gone)
        assert twice.wait(10), "a hold due again was not checked again"
        assert "gone" not in seen
        assert seen.count("bad") == 1  # it failed: no more checks of it, "a" still checked
        checks.discard(a)
        checks.discard(bad)
        time.sleep(1.2)  # the job sees no hold left and stops
        assert not checks._armed
        count = len(seen)
        later = _session_hold("later")
        later.due = time.monotonic()
        checks.add(later, check)
        deadline = time.monotonic() + 10
        while "later" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "later" in seen[count:], "a hold added after the job stopped was not checked"
    finally:
        scheduler.stop()


# -- renewal jobs: on a grid, so that a busy client's cancelled ones wake the thread rarely ----
def test_renewals_of_many_short_holds_fall_on_few_moments_never_after_a_third_of_the_lease() -> (
    None
):
    # 300 holds handed over with a 9 s lease (shorter than their 30 s ttl: each is renewed in
    # the background), one every 3 ms, as a contended key hands them out; each is released
    # before its renewal, leaving a cancelled job. One job time per hold would wake the thread
    # 300 times; on the grid it wakes at most once per 0.25 s.
    start = 1000.0
    dues = []
    for i in range(300):
        sent = start + i * 0.003
        hold = Hold(Spec("k", 30.0), "owner", i + 1, 30.0, sent, lease=9.0)
        due = hold.next_check(auto_renew=False, watched=False)
        assert due is not None
        assert sent + 9.0 / 4 <= due <= sent + 9.0 / 3
        dues.append(due)
    assert len(set(dues)) <= math.ceil(300 * 0.003 / 0.25) + 1
    # a short lease keeps its margin: a grid step is at most a twelfth of it
    short = Hold(Spec("k", 30.0), "owner", 1, 30.0, start + 0.1234, lease=0.3)
    due = short.next_check(auto_renew=True, watched=False)
    assert due is not None and start + 0.1234 + 0.3 / 4 <= due <= start + 0.1234 + 0.1
