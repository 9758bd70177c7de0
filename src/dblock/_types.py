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
