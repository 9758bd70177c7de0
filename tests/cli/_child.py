"""The CMD that the CLI tests run under ``dblock run`` / ``dblock once``.

Usage: ``python _child.py DIR MODE``. Every mode first appends ``<pid> <DBLOCK_TOKEN>`` to
``DIR/runs`` and writes ``DIR/ready.<pid>``.

- ``wait``: wait until ``DIR/stop`` exists (at most 60 s), exit 0.
- ``trap``: on SIGINT/SIGTERM/SIGHUP write the signal's name to ``DIR/signal`` and exit 42.
- ``deaf``: on SIGINT/SIGTERM/SIGHUP write the signal's name to ``DIR/signal`` and go on
  sleeping (only SIGKILL ends it).
- ``sleep``: sleep 60 s (the test expects it to be killed).
- ``exit:N``: exit with status N.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    where, mode = Path(sys.argv[1]), sys.argv[2]

    def trapped(signum: int, frame: object) -> None:
        (where / "signal").write_text(signal.Signals(signum).name)
        if mode == "trap":
            sys.exit(42)

    if mode in ("trap", "deaf"):
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, trapped)
    with (where / "runs").open("a") as runs:
        runs.write(f"{os.getpid()} {os.environ.get('DBLOCK_TOKEN')}\n")
    (where / f"ready.{os.getpid()}").write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    if mode.startswith("exit:"):
        return int(mode.split(":", 1)[1])
    while time.monotonic() < deadline:
        if mode == "wait" and (where / "stop").exists():
            return 0
        time.sleep(0.02)
    return 99


if __name__ == "__main__":
    sys.exit(main())
