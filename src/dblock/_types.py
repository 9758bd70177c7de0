"""Public value types."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Kind = Literal["lock", "read", "write", "semaphore", "once", "scheduled", "session"]
State = Literal["processing", "failed", "succeeded"]


@dataclass(frozen=True)
class LockInfo:
    """One current, unexpired hold of a key, as the database sees it.

    ``acquired_at`` and ``expires_at`` are timezone-aware UTC datetimes from the database
    server's clock (``expires_at`` is None for a session hold: it has no lease). ``token`` is
    the hold's fencing token.
    """

    key: str
    owner: str
    token: int
    acquired_at: datetime
    expires_at: datetime | None
    kind: Kind


LockInfo.__module__ = "dblock"


@dataclass(frozen=True)
class LeaderInfo:
    """Who leads an election now, as the store sees it.

    ``value`` is what the leader proclaimed (None if nothing), ``token`` the fencing token of
    its term (strictly increasing per election), ``since`` when the term began (a
    timezone-aware UTC datetime from the store's clock).
    """

    name: str
    value: str | None
    token: int
    since: datetime


LeaderInfo.__module__ = "dblock"
