"""dblock: distributed locks kept in your relational database.

Leases measured on the database server's clock, fencing tokens, and the lock table on
PostgreSQL, MySQL/MariaDB or an embedded SQLite file.

>>> import dblock
>>> with dblock.connect() as client, client.lock("nightly-report", ttl=60, timeout=5):
...     ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
from ._types import LeaderInfo, LockInfo

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ._async_client import AsyncClient
    from ._client import Borrowed

__version__ = "0.1.0.dev0"


async def connect_async(
    url: str | Sequence[str] | AsyncEngine | Borrowed | None = None,
    *,
    table: str = "dblock_locks",
    create_schema: bool = True,
    max_connections: int | None = None,
) -> AsyncClient:
    """Open an async client (see ``connect``): ``client = await dblock.connect_async(url)``.

    Every call that touches the database is awaited, every context manager is ``async with``;
    the owner for re-entrancy is the asyncio task. Needs greenlet (``dblock[async]``), and
    for MySQL aiomysql (``dblock[mysql-async]``). A SQLAlchemy ``AsyncEngine`` in place of
    ``url`` uses that engine's pool and dialect (docs/sqlalchemy.md); so do a ``redis.Redis``,
    a started ``KazooClient`` and a ``psycopg_pool.AsyncConnectionPool`` (docs/configuration.md).
    A list of three or more URLs opens a quorum client (docs/stores/quorum.md).
    """
    try:
        from ._async_client import open_client
    except ImportError as exc:
        raise ConfigurationError(
            f"dblock's async API needs {exc.name}: pip install 'dblock[async]'"
        ) from exc
    return await open_client(url, table, create_schema, max_connections)


def __getattr__(name: str) -> Any:
    # the async classes, loaded (with asyncio) only when asked for
    if name in ("AsyncClient", "AsyncLock"):
        from . import _async_client

        return getattr(_async_client, name)
    raise AttributeError(f"module 'dblock' has no attribute {name!r}")


__all__ = [
    "AlreadyDone",
    "BackendError",
    "Client",
    "ConfigurationError",
    "DBLockError",
    "InProgress",
    "LeaderInfo",
    "Lock",
    "LockInfo",
    "LockLost",
    "LockTimeout",
    "NotHeld",
    "__version__",
    "connect",
    "connect_async",
]
