"""A table that is not dblock's is refused, and read-only commands never create or alter
anything (issue 29, point 8); on every backend, through the CLI and ``dblock.connect()``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import dblock
from dblock.backends.sql.names import aux_name
from dblock.cli import main
from tests._servers import drop_tables, raw_connect

#: every object dblock makes beside a lock table (PostgreSQL: a sequence instead of _meta)
AUX = ("_meta", "_holders", "_token_seq")


def _quote(url: str) -> str:
    return "`" if urlsplit(url).scheme == "mysql" else '"'


def columns(url: str, name: str) -> list[str] | None:
    """The columns of table ``name`` (None if there is no such relation), read without dblock."""
    conn: Any = raw_connect(url)
    try:
        cur = conn.cursor()
        scheme = urlsplit(url).scheme
        if scheme == "sqlite":
            cur.execute("SELECT name FROM sqlite_master WHERE name = ?", (name,))
            if cur.fetchone() is None:
                return None
            cur.execute(f'PRAGMA table_info("{name}")')
            return [row[1] for row in cur.fetchall()]
        if scheme == "postgresql":
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{name}"',))
            if not cur.fetchone()[0]:
                return None
            cur.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                (f'"{name}"',),
            )
            return [row[0] for row in cur.fetchall()]
        cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND table_name = %s ORDER BY ordinal_position",
            (name,),
        )
        found = [row[0] for row in cur.fetchall()]
        return found or None
    finally:
        conn.close()


def execute(url: str, *statements: str) -> None:
    conn: Any = raw_connect(url)
    try:
        cur = conn.cursor()
        for statement in statements:
            cur.execute(statement)
        if urlsplit(url).scheme == "sqlite":
            conn.commit()
    finally:
        conn.close()


@pytest.fixture
def app_table(db_url: str) -> Iterator[str]:
    """An application's own table, with a row, named as a lock table might be."""
    name = "app_" + uuid.uuid4().hex[:12]
    q = _quote(db_url)
    execute(
        db_url,
        f"CREATE TABLE {q}{name}{q} (id INTEGER PRIMARY KEY, title VARCHAR(40))",
        f"INSERT INTO {q}{name}{q} (id, title) VALUES (1, 'keep me')",
    )
    yield name
    drop_tables(db_url, name)


def untouched(url: str, name: str) -> None:
    assert columns(url, name) == ["id", "title"]
    for suffix in AUX:
        assert columns(url, aux_name(name, suffix)) is None, f"{suffix} was created"


COMMANDS = [
    ["list"],
    ["list", "--json"],
    ["info", "k"],
    ["purge"],
    ["release", "k", "--force"],
    ["run", "--no-wait", "k", "--", "true"],
    ["once", "k", "--", "true"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_command_refuses_an_application_table(
    db_url: str, app_table: str, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", db_url, "--table", app_table, *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"dblock: table {app_table} in ")
    assert "is not dblock's" in err
    untouched(db_url, app_table)


@pytest.mark.parametrize("create_schema", [True, False])
def test_connect_refuses_an_application_table(
    db_url: str, app_table: str, create_schema: bool
) -> None:
    with pytest.raises(dblock.ConfigurationError, match="not dblock's"):
        dblock.connect(db_url, table=app_table, create_schema=create_schema)
    untouched(db_url, app_table)


def test_connect_refuses_an_application_table_beside_it(db_url: str, app_table: str) -> None:
    """The application's table has the name of a lock table's holders table."""
    table = app_table + "_lk"
    q = _quote(db_url)
    execute(db_url, f"ALTER TABLE {q}{app_table}{q} RENAME TO {q}{aux_name(table, '_holders')}{q}")
    try:
        with pytest.raises(dblock.ConfigurationError, match="beside lock table"):
            dblock.connect(db_url, table=table)
        assert columns(db_url, table) is None
        assert columns(db_url, aux_name(table, "_holders")) == ["id", "title"]
    finally:
        drop_tables(db_url, table)


@pytest.mark.parametrize(
    ("args", "status"), [(["list"], 0), (["info", "k"], 1)], ids=["list", "info"]
)
def test_read_only_commands_create_nothing(
    db_url: str, table: str, args: list[str], status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lock table that does not exist yet holds nothing: list shows no holds, info says the
    key is not held, and neither creates the table (nor, on SQLite, the file)."""
    assert main(["--url", db_url, "--table", table, *args]) == status
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "does not exist" not in err, err
    if args == ["info", "k"]:
        assert out == "" and "not held" in err, (out, err)
    if db_url.startswith("sqlite"):
        assert not Path(urlsplit(db_url).path[1:]).exists(), "the database file was created"
    else:
        for suffix in ("", *AUX):
            assert columns(db_url, aux_name(table, suffix) if suffix else table) is None
    # a command that takes a lock creates the table; then the read-only ones work
    assert main(["--url", db_url, "--table", table, "run", "--no-wait", "k", "--", "true"]) == 0
    assert main(["--url", db_url, "--table", table, *args]) in (0, 1)
