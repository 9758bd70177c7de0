"""dblock's lock tables as SQLAlchemy metadata, for Alembic migrations (docs/sqlalchemy.md).

``dblock.connect(engine)`` and ``dblock.connect_async(async_engine)`` take a SQLAlchemy engine
themselves; this module adds what a migration needs: the tables ``dblock schema`` creates, per
dialect, column for column, as ``Table`` objects.

>>> from dblock.contrib.sqlalchemy import metadata
>>> target_metadata = [Base.metadata, metadata("postgresql")]  # Alembic's env.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import DDL, Column, MetaData, PrimaryKeyConstraint, Sequence, Table, event, text
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.types import TypeEngine

from .._errors import ConfigurationError
from .._validate import check_table
from ..stores._names import aux_name
from ..stores.mysql.statements import NOPAD_MARIADB, NOPAD_MYSQL

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
    inserts that row; a migration runs :func:`seed` for it (and for PostgreSQL's and MariaDB's
    token sequence). MySQL and MariaDB also get ``<table>_sessions`` (MEMORY: who holds each
    session lock).
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
    Alembic's autogenerate cannot express: PostgreSQL's and MariaDB's token sequence (it leaves
    sequences out), SQLite's and MySQL's one ``_meta`` row. Idempotent."""
    if dialect not in DIALECTS:
        raise ConfigurationError(f"unknown dialect {dialect!r}: use {', '.join(DIALECTS)}")
    schema, name = check_table(table)
    if dialect == "postgresql":
        from ..stores.postgresql.statements import PostgresStatements

        return [PostgresStatements(schema, name).create_token_sequence]
    if dialect == "sqlite":
        from ..stores.sqlite.statements import SqliteStatements

        return [SqliteStatements(schema, name).seed_meta]
    from ..stores.mysql.statements import MysqlStatements

    # the token sequence (MariaDB only: MySQL skips the versioned comment), as for PostgreSQL
    mysql_statements = MysqlStatements(schema, name)
    return [mysql_statements.seed_meta, mysql_statements.create_sequence_ddl]


def _seeded(table: Table, statements: list[str]) -> None:
    for statement in statements:
        ddl = DDL(statement.replace("%", "%%"))  # type: ignore[no-untyped-call]
        event.listen(table, "after_create", ddl)


@dataclass(frozen=True)
class _Types:
    """A dialect's column types for dblock's tables (as stores/*/statements.py spell them)."""

    key: TypeEngine[Any]
    short: TypeEngine[Any]  # kind, state
    owner: TypeEngine[Any]  # owner, holder
    text: TypeEngine[Any]
    big: TypeEngine[Any]
    small: TypeEngine[Any]
    time: TypeEngine[Any]


def _tables(
    md: MetaData,
    schema: str | None,
    name: str,
    t: _Types,
    *,
    main_extra: list[Column[Any]],
    holders_extra: list[Column[Any]],
    options: dict[str, Any],
) -> None:
    """The lock table and its holders table, with the columns every dialect has, in order."""
    Table(
        name,
        md,
        Column("lock_key", t.key, nullable=False),
        Column("kind", t.short, nullable=False, server_default=text("'lock'")),
        Column("owner", t.owner),
        Column("token", t.big, nullable=False),
        Column("acquired_at", t.time, nullable=False),
        Column("expires_at", t.time, nullable=False),
        Column("state", t.short),
        Column("note", t.text),
        *main_extra,
        PrimaryKeyConstraint("lock_key"),
        schema=schema,
        **options,
    )
    Table(
        aux_name(name, "_holders"),
        md,
        Column("lock_key", t.key, nullable=False),
        Column("holder", t.owner, nullable=False),
        Column("kind", t.short, nullable=False),
        Column("waiting", t.small, nullable=False, server_default=text("0")),
        Column("token", t.big, nullable=False),
        Column("acquired_at", t.time, nullable=False),
        Column("expires_at", t.time, nullable=False),
        *holders_extra,
        PrimaryKeyConstraint("lock_key", "holder"),
        schema=schema,
        **options,
    )


def _meta(md: MetaData, schema: str | None, name: str, dialect: str, **options: Any) -> None:
    """SQLite's and MySQL's one-row table of the highest purged token, and its row."""
    tiny = mysql.TINYINT() if dialect == "mysql" else sqlite.INTEGER()
    big = mysql.BIGINT() if dialect == "mysql" else sqlite.INTEGER()
    meta = Table(
        aux_name(name, "_meta"),
        md,
        Column("id", tiny, nullable=False, autoincrement=False),
        Column("hwm", big, nullable=False),
        PrimaryKeyConstraint("id"),
        schema=schema,
        **options,
    )
    _seeded(meta, seed(dialect, f"{schema}.{name}" if schema else name))


def _postgresql(md: MetaData, schema: str | None, name: str) -> None:
    pg = postgresql
    types = _Types(
        key=pg.TEXT(collation="C"),
        short=pg.VARCHAR(16),
        owner=pg.VARCHAR(255),
        text=pg.TEXT(),
        big=pg.BIGINT(),
        small=pg.SMALLINT(),
        time=pg.TIMESTAMP(timezone=True),
    )
    _tables(
        md,
        schema,
        name,
        types,
        main_extra=[Column("joins", pg.BIGINT(), nullable=False, server_default=text("0"))],
        holders_extra=[
            Column("lease", pg.DOUBLE_PRECISION()),
            Column("channel", pg.VARCHAR(63)),
        ],
        options={},
    )
    Sequence(aux_name(name, "_token_seq"), schema=schema, metadata=md)


def _sqlite(md: MetaData, schema: str | None, name: str) -> None:
    lite = sqlite
    types = _Types(
        key=lite.TEXT(),
        short=lite.TEXT(),
        owner=lite.TEXT(),
        text=lite.TEXT(),
        big=lite.INTEGER(),
        small=lite.INTEGER(),
        time=lite.REAL(),
    )
    options = {"sqlite_with_rowid": False}
    _tables(md, schema, name, types, main_extra=[], holders_extra=[], options=options)
    _meta(md, schema, name, "sqlite")


def _mysql(md: MetaData, schema: str | None, name: str, nopad: str) -> None:
    my = mysql
    types = _Types(
        key=my.VARCHAR(255, charset="utf8mb4", collation=nopad),
        short=my.VARCHAR(16),
        owner=my.VARCHAR(255),
        text=my.TEXT(),
        big=my.BIGINT(),
        small=my.SMALLINT(),
        time=my.DATETIME(fsp=6),
    )
    options = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
    _tables(
        md,
        schema,
        name,
        types,
        main_extra=[Column("queued_until", my.DATETIME(fsp=6))],
        holders_extra=[Column("lease", my.DOUBLE()), Column("bell", my.BIGINT())],
        options=options,
    )
    _meta(md, schema, name, "mysql", mysql_engine="InnoDB")
    # who holds each key's session lock (GET_LOCK): MEMORY, so a grant writes no log
    Table(
        aux_name(name, "_sessions"),
        md,
        Column("lock_key", types.key, nullable=False),
        Column("lock_name", my.VARCHAR(64, charset="ascii"), nullable=False),
        Column("conn", my.BIGINT(), nullable=False),
        Column("owner", my.VARCHAR(255), nullable=False),
        Column("token", my.BIGINT(), nullable=False),
        Column("acquired_at", my.DATETIME(fsp=6), nullable=False),
        PrimaryKeyConstraint("lock_key"),
        schema=schema,
        mysql_engine="MEMORY",
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
    )
