"""The ``dblock`` command line: ``dblock run KEY -- CMD`` is flock(1) for a fleet.

The CLI is a thin client of the public API. Its toolkits (click, rich) are imported here and
never by ``import dblock``.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dblock`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    from .app import run_main

    return run_main(argv)


__all__ = ["main"]
