"""Fixtures of the MySQL/MariaDB tests: a fresh lock table, and a raw cursor on the server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import dblock
from tests._servers import MYSQL_URL, drop_tables, raw_connect, require_server


@pytest.fixture
def table() -> Iterator[str]:
    require_server("mysql", MYSQL_URL)
    name = "t_" + uuid.uuid4().hex[:16]
    dblock.connect(MYSQL_URL, table=name, create_schema=True).close()
    yield name
    drop_tables(MYSQL_URL, name)


@pytest.fixture
def raw() -> Iterator[Any]:
    conn = raw_connect(MYSQL_URL)
    yield conn.cursor()
    conn.close()
