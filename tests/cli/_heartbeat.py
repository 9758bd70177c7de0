"""A CMD (or a process a CMD starts) that proves it is alive, for the supervision tests.

Usage: ``python _heartbeat.py FILE [ignore-term] [setsid]``. Appends ``<pid> <t>`` to FILE
every few milliseconds, ``t`` being ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every
process on a Linux host), the first line as soon as it starts; the last line is its last sign
of life. ``ignore-term``: SIGTERM (and SIGHUP) are ignored, as by a program that takes long to
shut down; ``setsid``: it leaves its session and process group first. Runs for at most 120 s.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def main() -> None:
    path, flags = sys.argv[1], set(sys.argv[2:])
    if "ignore-term" in flags:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if "setsid" in flags:
        os.setsid()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    end = time.monotonic() + 120
    while (now := time.monotonic()) < end:
        os.write(fd, f"{os.getpid()} {now:.6f}\n".encode())
        time.sleep(0.002)


if __name__ == "__main__":
    main()
