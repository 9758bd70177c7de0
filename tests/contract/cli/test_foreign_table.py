"""A table that is not dblock's is refused, and read-only commands never create or alter
anything (issue 29, point 8); on every SQL store, through the CLI and ``dblock.connect()``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import dblock
from dblock.cli import main
from dblock.stores._names import aux_name
from tests.providers import Provider

pytestmark = pytest.mark.needs("sql", "cli")

#: every object dblock makes beside a lock table (PostgreSQL: a sequence instead of _meta)
AUX = ("_meta", "_holders", "_token_seq")


@pytest.fixture
def app_table(provider: Provider) -> Iterator[str]:
    """An application's own table, with a row, named as a lock table might be."""
    name = "app_" + uuid.uuid4().hex[:12]
    q = provider.q
    provider.execute(
        f"CREATE TABLE {q}{name}{q} (id INTEGER PRIMARY KEY, title VARCHAR(40))",
        f"INSERT INTO {q}{name}{q} (id, title) VALUES (1, 'keep me')",
    )
    yield name
    provider.drop(name)


def untouched(provider: Provider, name: str) -> None:
    assert provider.columns(name) == ["id", "title"]
    for suffix in AUX:
        assert provider.columns(aux_name(name, suffix)) is None, f"{suffix} was created"


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
    provider: Provider,
    db_url: str,
    app_table: str,
    args: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--url", db_url, "--table", app_table, *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"dblock: table {app_table} in ")
    assert "is not dblock's" in err
    untouched(provider, app_table)


@pytest.mark.parametrize("create_schema", [True, False])
def test_connect_refuses_an_application_table(
    provider: Provider, db_url: str, app_table: str, create_schema: bool
) -> None:
    with pytest.raises(dblock.ConfigurationError, match="not dblock's"):
        dblock.connect(db_url, table=app_table, create_schema=create_schema)
    untouched(provider, app_table)


def test_connect_refuses_an_application_table_beside_it(
    provider: Provider, db_url: str, app_table: str
) -> None:
    """The application's table has the name of a lock table's holders table."""
    table = app_table + "_lk"
    q = provider.q
    provider.execute(f"ALTER TABLE {q}{app_table}{q} RENAME TO {q}{aux_name(table, '_holders')}{q}")
    try:
        with pytest.raises(dblock.ConfigurationError, match="beside lock table"):
            dblock.connect(db_url, table=table)
        assert provider.columns(table) is None
        assert provider.columns(aux_name(table, "_holders")) == ["id", "title"]
    finally:
        provider.drop(table)


@pytest.mark.parametrize(
    ("args", "status"), [(["list"], 0), (["info", "k"], 1)], ids=["list", "info"]
)
def test_read_only_commands_create_nothing(
    provider: Provider,
    db_url: str,
    table: str,
    args: list[str],
    status: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A lock table that does not exist yet holds nothing: list shows no holds, info says the
    key is not held, and neither creates the table (nor, on SQLite, the file)."""
    assert main(["--url", db_url, "--table", table, *args]) == status
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "does not exist" not in err, err
    if args == ["info", "k"]:
        assert out == "" and "not held" in err, (out, err)
    if provider.has("file"):
        assert not provider.file().exists(), "the database file was created"
    else:
        for suffix in ("", *AUX):
            assert provider.columns(aux_name(table, suffix) if suffix else table) is None
    # a command that takes a lock creates the table; then the read-only ones work
    assert main(["--url", db_url, "--table", table, "run", "--no-wait", "k", "--", "true"]) == 0
    assert main(["--url", db_url, "--table", table, *args]) in (0, 1)
