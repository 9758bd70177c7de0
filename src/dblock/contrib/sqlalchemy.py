"""dblock's lock tables as SQLAlchemy metadata, for Alembic migrations (docs/sqlalchemy.md).

``dblock.connect(engine)`` and ``dblock.connect_async(async_engine)`` take a SQLAlchemy engine
themselves; this module adds what a migration needs: the tables ``dblock schema`` creates, per
dialect, column for column, as ``Table`` objects.

>>> from dblock.contrib.sqlalchemy import metadata
>>> target_metadata = [Base.metadata, metadata("postgresql")]  # Alembic's env.py
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import DDL, Column, MetaData, PrimaryKeyConstraint, Sequence, Table, event, text
from sqlalchemy.dialects import mysql, postgresql, sqlite

from .._errors import ConfigurationError
from .._validate import check_table
from ..backends.sql.mysql import NOPAD_MARIADB, NOPAD_MYSQL
from ..backends.sql.names import aux_name

__all__ = ["DIALECTS", "metadata", "seed"]

#: the dialects :func:`metadata` knows: MySQL 8 and MariaDB differ in the keys' collation
DIALECTS = ("postgresql", "sqlite", "mysql", "mariadb")


def metadata(
    dialect: str, table: str = "dblock_locks", *, into: MetaData | None = None
) -> MetaData:
    """The tables (and PostgreSQL's token sequence) that ``dblock schema`` creates for
    ``dialect`` and ``table`` (``schema.table`` allowed), added to ``into`` (default: a new
    ``MetaData``), which is returned.

    ``dialect``: "postgresql", "sqlite", "mysql" (MySQL 8) or "mariadb". SQLite and MySQL keep
    the highest purged token in a one-row ``<table>_meta`` table: ``metadata.create_all()``
    inserts that row; a migration runs :func:`seed` for it (and for PostgreSQL's sequence).
    """
    if dialect not in DIALECTS:
        raise ConfigurationError(f"unknown dialect {dialect!r}: use {', '.join(DIALECTS)}")
    schema, name = check_table(table)
    md = MetaData() if into is None else into
    if dialect == "postgresql":
        _postgresql(md, schema, name)
    elif dialect == "sqlite":
        _sqlite(md, schema, name)
    else:
        _mysql(md, schema, name, NOPAD_MARIADB if dialect == "mariadb" else NOPAD_MYSQL)
    return md


def seed(dialect: str, table: str = "dblock_locks") -> list[str]:
    """What a migration runs (``op.execute``) after creating :func:`metadata`'s tables, which
    Alembic's autogenerate cannot express: PostgreSQL's token sequence (it leaves sequences
    out), SQLite's and MySQL's one ``_meta`` row. Idempotent."""
    if dialect not in DIALECTS:
        raise ConfigurationError(f"unknown dialect {dialect!r}: use {', '.join(DIALECTS)}")
    schema, name = check_table(table)
    if dialect == "postgresql":
        from ..backends.sql.postgresql import PostgresStatements

        return [PostgresStatements(schema, name).create_token_sequence]
    if dialect == "sqlite":
        from ..backends.sql.sqlite import SqliteStatements

        return [SqliteStatements(schema, name).seed_meta]
    from ..backends.sql.mysql import MysqlStatements

    return [MysqlStatements(schema, name).seed_meta]


def _seeded(table: Table, statements: list[str]) -> None:
    for statement in statements:
        ddl = DDL(statement.replace("%", "%%"))  # type: ignore[no-untyped-call]
        event.listen(table, "after_create", ddl)


def _postgresql(md: MetaData, schema: str | None, name: str) -> None:
    pg = postgresql

    def key() -> Column[str]:
        return Column("lock_key", pg.TEXT(collation="C"), nullable=False)

    Table(
        name,
        md,
        key(),
        Column("kind", pg.VARCHAR(16), nullable=False, server_default=text("'lock'")),
        Column("owner", pg.VARCHAR(255)),
        Column("token", pg.BIGINT, nullable=False),
        Column("acquired_at", pg.TIMESTAMP(timezone=True), nullable=False),
        Column("expires_at", pg.TIMESTAMP(timezone=True), nullable=False),
        Column("state", pg.VARCHAR(16)),
        Column("note", pg.TEXT),
        Column("joins", pg.BIGINT, nullable=False, server_default=text("0")),
        PrimaryKeyConstraint("lock_key"),
        schema=schema,
    )
    Sequence(aux_name(name, "_token_seq"), schema=schema, metadata=md)
    Table(
        aux_name(name, "_holders"),
        md,
        key(),
        Column("holder", pg.VARCHAR(255), nullable=False),
        Column("kind", pg.VARCHAR(16), nullable=False),
        Column("waiting", pg.SMALLINT, nullable=False, server_default=text("0")),
        Column("token", pg.BIGINT, nullable=False),
        Column("acquired_at", pg.TIMESTAMP(timezone=True), nullable=False),
        Column("expires_at", pg.TIMESTAMP(timezone=True), nullable=False),
        Column("lease", pg.DOUBLE_PRECISION),
        Column("channel", pg.VARCHAR(63)),
        PrimaryKeyConstraint("lock_key", "holder"),
        schema=schema,
    )


def _sqlite(md: MetaData, schema: str | None, name: str) -> None:
    lite = sqlite
    Table(
        name,
        md,
        Column("lock_key", lite.TEXT, nullable=False),
        Column("kind", lite.TEXT, nullable=False, server_default=text("'lock'")),
        Column("owner", lite.TEXT),
        Column("token", lite.INTEGER, nullable=False),
        Column("acquired_at", lite.REAL, nullable=False),
        Column("expires_at", lite.REAL, nullable=False),
        Column("state", lite.TEXT),
        Column("note", lite.TEXT),
        PrimaryKeyConstraint("lock_key"),
        schema=schema,
        sqlite_with_rowid=False,
    )
    meta = Table(
        aux_name(name, "_meta"),
        md,
        Column("id", lite.INTEGER, nullable=False, autoincrement=False),
        Column("hwm", lite.INTEGER, nullable=False),
        PrimaryKeyConstraint("id"),
        schema=schema,
    )
    _seeded(meta, seed("sqlite", f"{schema}.{name}" if schema else name))
    Table(
        aux_name(name, "_holders"),
        md,
        Column("lock_key", lite.TEXT, nullable=False),
        Column("holder", lite.TEXT, nullable=False),
        Column("kind", lite.TEXT, nullable=False),
        Column("waiting", lite.INTEGER, nullable=False, server_default=text("0")),
        Column("token", lite.INTEGER, nullable=False),
        Column("acquired_at", lite.REAL, nullable=False),
        Column("expires_at", lite.REAL, nullable=False),
        PrimaryKeyConstraint("lock_key", "holder"),
        schema=schema,
        sqlite_with_rowid=False,
    )


def _mysql(md: MetaData, schema: str | None, name: str, nopad: str) -> None:
    my = mysql
    options: dict[str, Any] = {
        "mysql_engine": "InnoDB",
        "mysql_charset": "utf8mb4",
        "mysql_collate": "utf8mb4_bin",
    }

    def key() -> Column[str]:
        return Column(
            "lock_key", my.VARCHAR(255, charset="utf8mb4", collation=nopad), nullable=False
        )

    Table(
        name,
        md,
        key(),
        Column("kind", my.VARCHAR(16), nullable=False, server_default=text("'lock'")),
        Column("owner", my.VARCHAR(255)),
        Column("token", my.BIGINT, nullable=False),
        Column("acquired_at", my.DATETIME(fsp=6), nullable=False),
        Column("expires_at", my.DATETIME(fsp=6), nullable=False),
        Column("state", my.VARCHAR(16)),
        Column("note", my.TEXT),
        Column("queued_until", my.DATETIME(fsp=6)),
        PrimaryKeyConstraint("lock_key"),
        schema=schema,
        **options,
    )
    meta = Table(
        aux_name(name, "_meta"),
        md,
        Column("id", my.TINYINT, nullable=False, autoincrement=False),
        Column("hwm", my.BIGINT, nullable=False),
        PrimaryKeyConstraint("id"),
        schema=schema,
        mysql_engine="InnoDB",
    )
    _seeded(meta, seed("mysql", f"{schema}.{name}" if schema else name))
    Table(
        aux_name(name, "_holders"),
        md,
        key(),
        Column("holder", my.VARCHAR(255), nullable=False),
        Column("kind", my.VARCHAR(16), nullable=False),
        Column("waiting", my.SMALLINT, nullable=False, server_default=text("0")),
        Column("token", my.BIGINT, nullable=False),
        Column("acquired_at", my.DATETIME(fsp=6), nullable=False),
        Column("expires_at", my.DATETIME(fsp=6), nullable=False),
        Column("lease", my.DOUBLE),
        Column("bell", my.BIGINT),
        PrimaryKeyConstraint("lock_key", "holder"),
        schema=schema,
        **options,
    )
