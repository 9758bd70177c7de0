"""SQLAlchemy URLs of the test servers, per dialect and driver, and a pool's checkout count."""

from __future__ import annotations

from typing import Any

from tests._servers import MYSQL_URL, POSTGRESQL_URL

#: (dialect, asynchronous) -> the SQLAlchemy driver the tests use
DRIVERS = {
    ("sqlite", False): "sqlite",
    ("sqlite", True): "sqlite+aiosqlite",
    ("postgresql", False): "postgresql+psycopg",
    ("postgresql", True): "postgresql+psycopg",
    ("mysql", False): "mysql+pymysql",
    ("mysql", True): "mysql+aiomysql",
}


def dblock_url(dialect: str, tmp_dir: str) -> str:
    if dialect == "sqlite":
        return f"sqlite:///{tmp_dir}/locks.sqlite3"
    return POSTGRESQL_URL if dialect == "postgresql" else MYSQL_URL


def engine_url(dialect: str, tmp_dir: str, *, asynchronous: bool = False) -> str:
    """The SQLAlchemy URL of the database that ``dblock_url`` names."""
    plain = dblock_url(dialect, tmp_dir)
    return DRIVERS[dialect, asynchronous] + plain[plain.index("://") :]


class Checkouts:
    """Counts the connections checked out of an engine's pool (its ``checkout`` event)."""

    def __init__(self, engine: Any) -> None:
        from sqlalchemy import event

        self.count = 0
        event.listen(getattr(engine, "sync_engine", engine), "checkout", self._seen)

    def _seen(self, *_: Any) -> None:
        self.count += 1
