"""The ``dblock`` command line: ``dblock run KEY -- CMD`` is flock(1) for a fleet.

The CLI is a thin client of the public API. Its toolkits (click, rich) are imported here and
never by ``import dblock``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dblock`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    from .app import run_main

    return run_main(argv)


def command() -> NoReturn:
    """The ``dblock`` executable (and ``python -m dblock``): :func:`main`, then the process
    ends at once.

    Python's own finalisation collects every object of every module loaded (a driver's
    included): tens of milliseconds on each run of a command that cron may start every
    minute, with nothing left to do by then. What of it matters is done first: the exit
    handlers run (logging's flush among them) and the standard streams are flushed. While a
    thread that is not a daemon still runs, or if a stream cannot be flushed (a closed pipe),
    Python exits as usual, as it would have.

    Before anything, the process's own settings are made (``environment``): they are this
    executable's alone, never those of a program that runs :func:`main` inside itself.
    """
    from .environment import set_up_own_process

    set_up_own_process()
    status = main()
    _exit_now(status)


def _exit_now(status: int) -> NoReturn:
    import atexit
    import os
    import threading

    here = threading.current_thread()
    alone = here is threading.main_thread() and all(
        thread is here or thread.daemon for thread in threading.enumerate()
    )
    if alone:
        atexit._run_exitfuncs()  # Python's exit runs them first too, then flushes the streams
        try:
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
        except (OSError, ValueError):
            pass  # Python's exit reports it as it does
        else:
            os._exit(status)
    sys.exit(status)


__all__ = ["command", "main"]
