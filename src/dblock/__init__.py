"""dblock: distributed locks kept in your relational database.

Leases measured on the database server's clock, fencing tokens, and the lock table on
PostgreSQL, MySQL/MariaDB or an embedded SQLite file.

>>> import dblock
>>> with dblock.connect() as client, client.lock("nightly-report", ttl=60, timeout=5):
...     ...
"""

from __future__ import annotations

from ._client import Client, connect
from ._errors import (
    AlreadyDone,
    BackendError,
    ConfigurationError,
    DBLockError,
    InProgress,
    LockLost,
    LockTimeout,
    NotHeld,
)
from ._lock import Lock
from ._types import LockInfo

__version__ = "0.1.0.dev0"

__all__ = [
    "AlreadyDone",
    "BackendError",
    "Client",
    "ConfigurationError",
    "DBLockError",
    "InProgress",
    "Lock",
    "LockInfo",
    "LockLost",
    "LockTimeout",
    "NotHeld",
    "__version__",
    "connect",
]
