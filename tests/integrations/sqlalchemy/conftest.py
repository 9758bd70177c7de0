"""A fresh lock table per test, on each dialect, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._servers import drop_tables, require_server
from tests.integrations.sqlalchemy._engines import dblock_url


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(dialect, the tmp dir of a SQLite file, a fresh table name); the table dropped after."""
    dialect = str(request.param)
    url = dblock_url(dialect, str(tmp_path))
    if dialect != "sqlite":
        require_server(dialect, url)
    table = "t_" + uuid.uuid4().hex[:16]
    yield dialect, str(tmp_path), table
    drop_tables(url, table)
