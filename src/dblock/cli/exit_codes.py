"""Exit statuses of the ``dblock`` command, in one place.

``run`` and ``once`` otherwise exit with CMD's own status (``128 + N`` when CMD died of
signal ``N``), like a shell.
"""

from __future__ import annotations

from typing import Final

OK: Final = 0
#: generic failure; also ``info`` (not held) and ``release`` (nothing was held)
FAILURE: Final = 1
#: bad argument (click's usage error), or any other configuration mistake (ConfigurationError:
#: URL, URL parameter, table, a table that is not dblock's): retrying will not help
USAGE: Final = 2
#: the database could not be reached (sysexits EX_UNAVAILABLE)
UNAVAILABLE: Final = 69
#: ``run``: the lease was lost while CMD ran, so CMD was terminated
LEASE_LOST: Final = 70
#: ``run``: the lock was not had (default of ``--conflict-exit-code``); ``once``: in progress
#: (sysexits EX_TEMPFAIL: try again later)
CONFLICT: Final = 75
#: CMD exists but could not be executed (as in sh)
CANNOT_EXECUTE: Final = 126
#: CMD was not found (as in sh)
NOT_FOUND: Final = 127
#: CMD (or dblock itself, while waiting) was killed by signal N: exit ``SIGNAL_BASE + N``
SIGNAL_BASE: Final = 128
