"""The chaos soak's pause of a leader freezes the CMD it is starting too (bench/_chaos_procs.py).

A CI soak reported two leaders' CMDs running at once: the paused ``dblock lead`` had been
starting its CMD, whose fork was in flight when the SIGSTOP came, and the look for its
children ran before the fork had ended, so the CMD ran on through the pause.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
from bench._chaos_procs import freeze, state, wait_stopped

from dblock.cli.supervisor import descendants

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: forks a child (which sleeps) again and again, keeping four; its 200 MB make each fork
#: take milliseconds, so that a fork is often in flight when the SIGSTOP comes
FORKER = textwrap.dedent(
    """
    import os, subprocess
    ballast = bytearray(200_000_000)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    kids = []
    while True:
        kids.append(subprocess.Popen(["sleep", "60"], preexec_fn=os.setsid))
        if len(kids) > 4:
            kids.pop(0).kill()
    """
)


@pytest.fixture
def forker() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", FORKER])
    try:
        give_up = time.monotonic() + 30
        while not descendants(proc.pid) and time.monotonic() < give_up:
            time.sleep(0.01)
        yield proc.pid
    finally:
        for pid in freeze([proc.pid], descendants):  # no fork after this: none is missed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_a_frozen_process_and_everything_it_started_stay_stopped(forker: int) -> None:
    assert state(forker) is not None
    for i in range(150):
        time.sleep(0.002 * (i % 7))  # a different moment of its loop each time
        stopped = freeze([forker], descendants)
        # a child stopped in time shows so once the kernel next runs it, which a loaded
        # machine may not do for a while (0.2 s was too short in a CI run); one that was
        # missed never does
        running = [pid for pid in descendants(forker) if not wait_stopped(pid, timeout=5.0)]
        assert running == [], f"children of the frozen process run on: {running}"
        for pid in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
