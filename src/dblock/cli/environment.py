"""The dblock executable's environment: settings for its own process, and CMD's environment.

gRPC (the etcd store's driver) carries its threads over a fork by default: in the child that
``run``, ``once`` and ``lead`` fork for CMD it restarts its poller thread, and the close of
every descriptor before exec can close the poller's own under it. The child then aborts
(SIGABRT) before CMD starts: a few forks in a thousand on busy CPUs. That child only execs, so
dblock's own process turns the carrying over off. CMD gets the environment dblock was given,
without this setting or any other a driver makes for itself (``GRPC_VERBOSITY``).
"""

from __future__ import annotations

import os

#: set in dblock's own process, whatever the environment says: CMD may want otherwise
_FOR_DBLOCK_ALONE = {"GRPC_ENABLE_FORK_SUPPORT": "0"}

_given: dict[str, str] | None = None


def set_up_own_process() -> None:
    """Note the environment dblock was given, then make dblock's own settings; before any
    driver loads."""
    global _given  # noqa: PLW0603 - once per process, by the executable alone
    _given = dict(os.environ)
    os.environ.update(_FOR_DBLOCK_ALONE)


def for_cmd() -> dict[str, str]:
    """A copy of the environment dblock was given (of the process's, when dblock runs inside
    another program, which owns its environment)."""
    return dict(os.environ if _given is None else _given)
