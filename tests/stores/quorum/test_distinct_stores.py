"""A quorum refuses one store under several names (issue 44, point 6): its votes would count
as many, and every release would then report a false loss."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import dblock
from dblock.cli import main
from tests._servers import drop_tables
from tests.providers import fresh_table

REDIS = "redis://127.0.0.1:6379"
PG = "postgresql://postgres@127.0.0.1/"


@pytest.fixture
def table() -> Iterator[str]:
    """A fresh table, dropped afterwards from the shared servers the quorum opened."""
    name = fresh_table()
    yield name
    for url in (REDIS, PG + "q_a", PG + "q_b"):
        drop_tables(url, name)


def _refused(urls: list[str], table: str, first: str, second: str) -> str:
    with pytest.raises(dblock.ConfigurationError, match="independent") as caught:
        dblock.connect(urls, table=table)
    message = str(caught.value)
    assert f"{first} and {second}" in message
    return message


def test_one_redis_under_three_urls_is_refused(table: str) -> None:
    urls = [REDIS, "redis://localhost:6379", REDIS + "?client_name=x"]
    _refused(urls, table, REDIS, "redis://localhost:6379")


def test_one_postgresql_database_by_two_addresses_is_refused(table: str) -> None:
    urls = [
        "postgresql://postgres:s3cret@127.0.0.1/q_a",
        "postgresql://postgres:s3cret@localhost/q_a",
        PG + "q_b",
    ]
    message = _refused(
        urls,
        table,
        "postgresql://postgres:***@127.0.0.1/q_a",
        "postgresql://postgres:***@localhost/q_a",
    )
    assert "s3cret" not in message


def test_one_sqlite_file_by_a_symlink_or_dot_is_refused(tmp_path: Path, table: str) -> None:
    files = [tmp_path / f"member{i}.sqlite3" for i in range(3)]
    urls = [f"sqlite:///{f}" for f in files]
    with dblock.connect(urls, table=table):  # three files: three stores
        pass
    link = tmp_path / "link.sqlite3"
    os.symlink(files[0], link)
    _refused([urls[0], urls[1], f"sqlite:///{link}"], table, urls[0], f"sqlite:///{link}")
    dotted = f"sqlite:///{tmp_path}/./member1.sqlite3"
    _refused([urls[0], urls[1], dotted], table, urls[1], dotted)


def test_the_cli_exits_2_for_one_store_under_two_urls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [tmp_path / f"member{i}.sqlite3" for i in range(2)]
    link = tmp_path / "link.sqlite3"
    dblock.connect(f"sqlite:///{files[0]}").close()  # the file exists
    os.symlink(files[0], link)
    urls = [f"sqlite:///{f}" for f in (*files, link)]
    assert main([a for url in urls for a in ("--url", url)] + ["list"]) == 2
    assert "independent" in capsys.readouterr().err
