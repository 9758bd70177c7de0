"""Waiting in tests for something another process or thread does."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(predicate: Callable[[], bool], what: str, seconds: float = 15.0) -> None:
    """Return once ``predicate()`` holds; fail the test naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)
