"""Ending a database server for good: shared by chaos.py (``--server-cmd``) and the test
suite's private servers (tests/_private_servers.py). Standard library only."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time


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
