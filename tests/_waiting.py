"""Waiting in tests for something another process or thread does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection


def until(predicate: Callable[[], bool], what: str, seconds: float = 15.0) -> None:
    """Return once ``predicate()`` holds; fail the test naming ``what`` after ``seconds``.

    It looks again after 10 ms, then less and less often, at most every 50 ms: many a
    predicate reads the store on a connection of its own, and a wait for a process to start
    lasts a second on the suite's loaded machine (100 connections at a fixed 10 ms)."""
    deadline = time.monotonic() + seconds
    pause = 0.01
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(pause)
        pause = min(pause * 1.5, 0.05)


def start_in_turn(
    threads: list[threading.Thread],
    queued: Callable[[], int],
    quitters: Collection[int] = (),
    seconds: float = 30.0,
) -> None:
    """Start the waiters' threads in order, each once ``queued()`` (the waiters the store
    shows queued) counts the one before it: they queue in this order (a fixed sleep between
    them ran out on a loaded machine). A waiter in ``quitters`` gives up and may have left
    already: it is not counted."""
    for i, thread in enumerate(threads):
        thread.start()
        counted = i + 1 - sum(1 for j in quitters if j < i)
        until(lambda: queued() >= counted, f"waiter {i} queued", seconds)  # noqa: B023 - called at once
