"""Run ``dblock`` and deliver a signal to it at the worst moment of a wait.

``python _signal_at.py ARM SIGNUM DBLOCK-ARGS...``: once the file ARM exists, the main
thread's next wait on a condition sends SIGNUM to this process just after the condition's
lock was let go and before the wait is set up to take it back, the one moment when an
exception raised by a signal handler leaves the caller's ``with`` block releasing a lock
it no longer holds. Once only.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

ARM, SIGNUM = sys.argv[1], int(sys.argv[2])
_release_save = threading.Condition._release_save  # type: ignore[attr-defined]
_sent: list[bool] = []


def _release_then_signal(self: Any) -> None:
    _release_save(self)
    if not _sent and threading.current_thread() is threading.main_thread() and os.path.exists(ARM):
        _sent.append(True)
        with open(ARM + ".sent", "w"):
            pass
        signal.raise_signal(SIGNUM)


threading.Condition._release_save = _release_then_signal  # type: ignore[attr-defined]
sys.argv = ["dblock", *sys.argv[3:]]

from dblock.cli import command  # noqa: E402 - after the condition is patched

command()
