"""Checks run in a forked child, reported to the parent (which holds pytest's machinery)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable


def wait_for(pid: int, seconds: float) -> int | None:
    """The exit status of child ``pid``, or None (after killing it) if it ran too long."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def wrong_in_child(check: Callable[[], str], seconds: float = 30) -> str:
    """Fork, run ``check`` in the child (what it found wrong, "" if nothing) and return its
    answer in the parent: the exception it raised, or a hang, count as wrong too."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        wrong = "the child failed"
        try:
            wrong = check()
        except BaseException as exc:  # reported to the parent, which fails the test
            wrong = f"the child raised {type(exc).__name__}: {exc}"
        finally:
            os.write(write, wrong.encode()[:4000] or b"-")
            os._exit(0)
    os.close(write)
    try:
        if wait_for(pid, seconds) != 0:
            return f"the child did not end within {seconds:g} s"
        said = os.read(read, 4096)
    finally:
        os.close(read)
    return "" if said == b"-" else said.decode(errors="replace")
