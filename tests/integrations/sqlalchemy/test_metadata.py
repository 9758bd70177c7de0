"""dblock.contrib.sqlalchemy.metadata: the tables a migration makes from it are the ones
``dblock schema`` makes, column for column, and a client with create_schema=False uses them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dblock
from tests._servers import drop_tables, raw_connect, require_server
from tests.integrations.sqlalchemy._engines import dblock_url, engine_url

sa = pytest.importorskip("sqlalchemy")
from dblock.contrib.sqlalchemy import metadata, seed  # noqa: E402 - after the importorskip

#: one catalog query per aspect of a schema, its only parameter the schema (database) name
PG_CATALOG = [
    "SELECT table_name, column_name, ordinal_position, column_default, is_nullable, "
    "data_type, character_maximum_length, numeric_precision, datetime_precision, "
    "collation_name FROM information_schema.columns WHERE table_schema = %s ORDER BY 1, 3",
    "SELECT tc.table_name, tc.constraint_name, tc.constraint_type, k.column_name, "
    "k.ordinal_position FROM information_schema.table_constraints tc "
    "JOIN information_schema.key_column_usage k USING (constraint_schema, constraint_name) "
    "WHERE tc.table_schema = %s ORDER BY 1, 2, 5",
    "SELECT tablename, indexname, replace(indexdef, schemaname, '') FROM pg_indexes "
    "WHERE schemaname = %s ORDER BY 1, 2",
    "SELECT sequence_name, data_type, start_value, minimum_value, maximum_value, increment, "
    "cycle_option FROM information_schema.sequences WHERE sequence_schema = %s ORDER BY 1",
]
MYSQL_CATALOG = [
    "SELECT table_name, column_name, ordinal_position, column_default, is_nullable, "
    "column_type, character_set_name, collation_name, column_key, extra "
    "FROM information_schema.columns WHERE table_schema = %s ORDER BY 1, 3",
    "SELECT table_name, engine, table_collation FROM information_schema.tables "
    "WHERE table_schema = %s ORDER BY 1",
    "SELECT table_name, index_name, seq_in_index, column_name, non_unique "
    "FROM information_schema.statistics WHERE table_schema = %s ORDER BY 1, 2, 3",
]
TABLES = ("locks", "locks_meta", "locks_holders")


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def where_sa(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(dialect, the tmp dir of a SQLite file, a fresh table name); the table dropped after."""
    dialect = str(request.param)
    url = dblock_url(dialect, str(tmp_path))
    if dialect != "sqlite":
        require_server(dialect, url)
    table = "t_" + uuid.uuid4().hex[:16]
    yield dialect, str(tmp_path), table
    drop_tables(url, table)


def _catalog(url: str, queries: list[str], schema: str) -> list[list[Any]]:
    conn = raw_connect(url)
    try:
        out = []
        for query in queries:
            cur = conn.cursor()
            cur.execute(query, (schema,))
            out.append([tuple(row) for row in cur.fetchall()])
        return out
    finally:
        conn.close()


def _sqlite_catalog(path: Path) -> list[Any]:
    conn = raw_connect(f"sqlite:///{path}")
    try:
        out: list[Any] = []
        for name in TABLES:
            out.append(conn.execute(f"PRAGMA table_xinfo({name})").fetchall())
            sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
            out.append("WITHOUT ROWID" in sql[0].upper())
            out.append(conn.execute(f"PRAGMA index_list({name})").fetchall())
        out.append(conn.execute("SELECT id, hwm FROM locks_meta").fetchall())
        return out
    finally:
        conn.close()


@pytest.fixture
def two_schemas(request: pytest.FixtureRequest) -> Iterator[Callable[[str], tuple[str, str]]]:
    """Makes two fresh schemas (PostgreSQL) or databases (MySQL); drops them afterwards."""
    made: list[tuple[str, str]] = []

    def make(dialect: str) -> tuple[str, str]:
        names = (f"sqla_a_{uuid.uuid4().hex[:12]}", f"sqla_b_{uuid.uuid4().hex[:12]}")
        word = "SCHEMA" if dialect == "postgresql" else "DATABASE"
        conn = raw_connect(dblock_url(dialect, ""))
        try:
            for name in names:
                conn.cursor().execute(f"CREATE {word} {name}")
                made.append((dialect, name))
        finally:
            conn.close()
        return names

    yield make
    for dialect, name in made:
        word = "SCHEMA" if dialect == "postgresql" else "DATABASE"
        conn = raw_connect(dblock_url(dialect, ""))
        try:
            conn.cursor().execute(
                f"DROP {word} {name}" + (" CASCADE" if dialect == "postgresql" else "")
            )
        finally:
            conn.close()


def _works_without_creating(url: str, table: str) -> None:
    with dblock.connect(url, table=table, create_schema=False) as client:
        with client.lock("k", ttl=30) as first:
            older = first.token
        client.purge(older_than=0)
        with client.lock("k", ttl=30) as second:
            assert second.token > older  # the purged token is remembered (meta row / sequence)
        with client.rwlock("rw").read_lock():  # the holders table
            assert [i.key for i in client.list()] == ["rw"]


def test_sqlite_tables_from_metadata_are_dblocks(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "dblock.sqlite3", tmp_path / "metadata.sqlite3"
    dblock.connect(f"sqlite:///{ours}", table="locks").close()
    engine = sa.create_engine(f"sqlite:///{theirs}")
    metadata("sqlite", "locks").create_all(engine)
    engine.dispose()
    assert _sqlite_catalog(theirs) == _sqlite_catalog(ours)
    _works_without_creating(f"sqlite:///{theirs}", "locks")


def test_postgresql_tables_from_metadata_are_dblocks(
    two_schemas: Callable[[str], tuple[str, str]],
) -> None:
    url = dblock_url("postgresql", "")
    require_server("postgresql", url)
    ours, theirs = two_schemas("postgresql")
    dblock.connect(url, table=f"{ours}.locks").close()
    engine = sa.create_engine(engine_url("postgresql", ""))
    metadata("postgresql", f"{theirs}.locks").create_all(engine)
    engine.dispose()
    assert _catalog(url, PG_CATALOG, theirs) == _catalog(url, PG_CATALOG, ours)
    _works_without_creating(url, f"{theirs}.locks")


def test_mysql_tables_from_metadata_are_dblocks(
    two_schemas: Callable[[str], tuple[str, str]],
) -> None:
    url = dblock_url("mysql", "")
    require_server("mysql", url)
    ours, theirs = two_schemas("mysql")
    dblock.connect(url, table=f"{ours}.locks").close()
    engine = sa.create_engine(engine_url("mysql", ""))
    with engine.connect() as conn:
        version = conn.exec_driver_sql("SELECT VERSION()").scalar()
    flavour = "mariadb" if "MariaDB" in version else "mysql"
    metadata(flavour, f"{theirs}.locks").create_all(engine)
    engine.dispose()
    assert _catalog(url, MYSQL_CATALOG, theirs) == _catalog(url, MYSQL_CATALOG, ours)
    meta = f"SELECT id, hwm FROM {theirs}.locks_meta"
    assert _catalog(url, [meta + " WHERE %s IS NOT NULL"], theirs) == [[(1, 0)]]
    _works_without_creating(url, f"{theirs}.locks")


def test_metadata_refuses_what_dblock_refuses() -> None:
    with pytest.raises(dblock.ConfigurationError, match="unknown dialect"):
        metadata("oracle")
    with pytest.raises(dblock.ConfigurationError):
        metadata("postgresql", "bad name; DROP TABLE x")
    assert seed("postgresql") == ['CREATE SEQUENCE IF NOT EXISTS "dblock_locks_token_seq"']
    assert seed("sqlite", "locks") == ['INSERT OR IGNORE INTO "locks_meta" (id, hwm) VALUES (1, 0)']
    shared = sa.MetaData()
    assert metadata("sqlite", "locks", into=shared) is shared
    assert sorted(shared.tables) == sorted(TABLES)


def test_alembic_autogenerate_sees_no_difference(where_sa: tuple[str, str, str]) -> None:
    """Tables made by dblock, compared by Alembic with the metadata (types and server defaults
    too): nothing to migrate."""
    pytest.importorskip("alembic")
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    dialect, tmp, table = where_sa
    dblock.connect(dblock_url(dialect, tmp), table=table).close()
    engine = sa.create_engine(engine_url(dialect, tmp))
    try:
        with engine.connect() as conn:
            flavour = dialect
            if dialect == "mysql":
                version = conn.exec_driver_sql("SELECT VERSION()").scalar()
                flavour = "mariadb" if "MariaDB" in version else "mysql"
            # other tests' tables come and go meanwhile: only this test's are reflected
            ours = {table, f"{table}_meta", f"{table}_holders"}
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "compare_server_default": True,
                    "include_name": lambda name, kind, _: kind != "table" or name in ours,
                },
            )
            diff = compare_metadata(context, metadata(flavour, table))
    finally:
        engine.dispose()
    assert diff == []
