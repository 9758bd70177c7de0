"""The background thread that runs renewals and expiry watches at their times."""

from __future__ import annotations

import threading
import time

from dblock._renewer import Scheduler


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
