"""Every configuration mistake exits 2 with one line; 69 only for a database that cannot be
reached (issue 29, point 14)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dblock.cli import main
from tests._servers import POSTGRESQL_URL, drop_tables, require_server


def one_line(err: str) -> str:
    assert err.count("\n") == 1, err
    assert err.startswith("dblock: "), err
    assert "Traceback" not in err and "Error:" not in err, err
    return err


@pytest.mark.parametrize(
    "query",
    ["foo=1", "connect_timeout=x"],
)
def test_bad_url_parameter_is_one_line(
    tmp_path: Path, query: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"mysql://root@127.0.0.1:1/db?{query}"  # refused before connecting
    assert main(["--url", url, "list"]) == 2
    assert "mysql://root@127.0.0.1:1/db" in one_line(capsys.readouterr().err)


def test_bad_dblock_url_is_one_line() -> None:
    for args in (["list"], ["schema"]):
        done = subprocess.run(
            [sys.executable, "-m", "dblock", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DBLOCK_URL": "mongodb://127.0.0.1:27017/0"},
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert "unsupported database URL" in one_line(done.stderr)


def test_note_that_is_not_text_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/locks.sqlite3"
    # "\udcff": a byte of the command line that is not UTF-8, as Python decodes argv
    for note in ("a\udcffb", "a\x00b"):
        assert main(["--url", url, "once", "k", "--note", note, "--", "true"]) == 2
        assert "--note" in capsys.readouterr().err


def test_purge_older_than_beyond_the_calendar_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    require_server("postgresql", POSTGRESQL_URL)
    table = "t_" + uuid.uuid4().hex[:16]
    try:
        assert (
            main(["--url", POSTGRESQL_URL, "--table", table, "purge", "--older-than", "1e300"]) == 2
        )
        assert "--older-than" in capsys.readouterr().err
        assert (
            main(["--url", POSTGRESQL_URL, "--table", table, "purge", "--older-than", "3e9"]) == 0
        )
    finally:
        drop_tables(POSTGRESQL_URL, table)


def test_configuration_error_after_connecting_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table that is not dblock's is found only once connected: still 2, not 1 or 69."""
    url = f"sqlite:///{tmp_path}/app.sqlite3"
    with sqlite3.connect(tmp_path / "app.sqlite3") as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    assert main(["--url", url, "--table", "orders", "run", "k", "--", "true"]) == 2
    assert "not dblock's" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("prefix", ["\udcff", "k" * 256, "a\x00b"])
def test_list_prefix_no_key_can_have_exits_2(
    tmp_path: Path, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/locks.sqlite3"
    assert main(["--url", url, "list", "--prefix", prefix]) == 2
    assert "--prefix" in capsys.readouterr().err
