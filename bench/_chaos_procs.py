"""Ending a database server for good, shared by chaos.py (``--server-cmd``) and the test
suite's private servers (tests/_private_servers.py); freezing a process with all it started
(chaos.py's pauses). Standard library only."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable


def kill_group(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGKILL to every process of ``proc``'s process group (``proc`` leads it: it was
    started with ``start_new_session``); returns once they are all gone, since a new server
    refuses to start beside the old one's processes. What the server had not written to its
    files is lost."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise RuntimeError(f"the server's processes (group {proc.pid}) outlived SIGKILL")


def state(pid: int) -> str | None:
    """The process's state letter in /proc (``T`` stopped, ``Z`` a zombie...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()[0].decode()


def wait_stopped(pid: int, timeout: float = 5.0) -> bool:
    """Wait until ``pid`` has stopped (or is gone); False if it still runs after ``timeout``."""
    give_up = time.monotonic() + timeout
    while state(pid) not in ("T", "t", "Z", None):
        if time.monotonic() > give_up:
            return False
        time.sleep(0.001)
    return True


def freeze(pids: Iterable[int], descendants: Callable[[int], Iterable[int]]) -> list[int]:
    """SIGSTOP each of ``pids``, then, once it has stopped, every process it started; the
    processes stopped, parents first. A process receives a signal only when its system call
    returns: a fork in flight when SIGSTOP was sent ends first, and its child shows in /proc
    only then, so the children are looked for after the stop has taken effect (looked for at
    once, a child forked at that moment ran on through the pause)."""
    stopped = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
    for pid in list(stopped):
        wait_stopped(pid)
        for child in descendants(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGSTOP)
                stopped.append(child)
    return stopped
