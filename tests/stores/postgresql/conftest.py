"""Fixtures of the PostgreSQL store's own tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import dblock
from dblock.stores.postgresql.store import PostgresStore
from tests._internals import store_of
from tests._servers import POSTGRESQL_URL, drop_tables, require_server


@pytest.fixture
def pg_store() -> Iterator[tuple[dblock.Client, PostgresStore, str]]:
    """A blocking client on a fresh table of the shared server, its store and the table's
    name; the table is dropped afterwards."""
    require_server("postgresql", POSTGRESQL_URL)
    table = "t_" + uuid.uuid4().hex[:16]
    client = dblock.connect(POSTGRESQL_URL, table=table)
    backend = store_of(client)
    assert isinstance(backend, PostgresStore)
    try:
        yield client, backend, table
    finally:
        client.close()
        drop_tables(POSTGRESQL_URL, table)


@pytest.fixture
def pg(
    pg_store: tuple[dblock.Client, PostgresStore, str],
) -> tuple[dblock.Client, PostgresStore]:
    """``pg_store`` without the table's name."""
    client, backend, _table = pg_store
    return client, backend
