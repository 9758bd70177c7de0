"""The CMD the chaos soak's leaders run under ``dblock lead``: it logs that it runs, so the
referee can check that no two of them ever ran at once.

    python bench/_chaos_lead_cmd.py LOGFILE

Appends ``start <pid> <token> <mono>`` when it starts, ``beat <pid> <token> <mono>`` about
every 20 ms, and ``stop <pid> <token> <mono>`` on SIGTERM (then exits 0); ``<token>`` is
the term's ``DBLOCK_TOKEN``, ``<mono>`` is ``time.monotonic()`` (one clock for every process
of a Linux host). Each line is one write(2): a SIGKILL loses nothing written.

Past ``DBLOCK_CHAOS_UNTIL`` (a ``time.monotonic()`` moment, set by chaos.py well after its
hang check) it exits on its own: should the orchestrator vanish without ending its leaders,
each leader in turn then resigns and exits, and none is left behind.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType

BEAT = 0.02


def main(path: str) -> int:
    token = os.environ.get("DBLOCK_TOKEN", "?")
    until = float(os.environ.get("DBLOCK_CHAOS_UNTIL", "inf"))
    pid = os.getpid()
    # one write(2) per line, unbuffered: the SIGTERM handler may run between any two lines,
    # never inside a buffered write
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(kind: str) -> None:
        os.write(fd, f"{kind} {pid} {token} {time.monotonic():.6f}\n".encode())

    def on_term(signum: int, frame: FrameType | None) -> None:
        line("stop")
        os._exit(0)  # at once: no beat after the stop line

    signal.signal(signal.SIGTERM, on_term)
    line("start")
    while time.monotonic() < until:
        time.sleep(BEAT)
        line("beat")
    os.close(fd)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: _chaos_lead_cmd.py LOGFILE", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
