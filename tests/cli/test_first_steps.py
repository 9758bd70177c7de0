"""What a new user trips over first (issue 46, point 7): the help names every store, `schema`
on a store without DDL says so, a missing extra exits 2, an unreachable store says it cannot
connect."""

from __future__ import annotations

import sys

import pytest

from dblock.cli import main
from dblock.stores._registry import BUILT_IN
from tests._private_servers import free_ports


def test_group_help_names_every_store(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split()).lower()
    about = out.partition("examples:")[0]  # the description, not just the option list
    for store in (entry.name for entry in BUILT_IN):
        assert store in about, store
        assert f"{store}://" in out, store  # --url names its scheme
    assert "quorum" in about


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:1/0", "etcd://127.0.0.1:1", "zookeeper://127.0.0.1:1/app"],
    ids=["redis", "etcd", "zookeeper"],
)
def test_schema_of_a_store_without_ddl_says_it_needs_none(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", url, "schema"]) == 0  # no connection is made
    out, err = capsys.readouterr()
    store = url.partition("://")[0]
    assert out == (
        f"-- the {store} store needs no DDL: connect() and the commands that take locks "
        "(run, once) make the lock table themselves; nothing to apply\n"
    )
    assert err == ""


def test_schema_of_a_mixed_quorum_prints_the_sql_stores_ddl(
    capsys: pytest.CaptureFixture[str],
) -> None:
    urls = "redis://127.0.0.1:1/0 etcd://127.0.0.1:1 sqlite:///locks.sqlite3"
    assert main(["--url", urls, "schema"]) == 0
    assert capsys.readouterr().out.startswith("-- dblock dblock_locks (sqlite): apply once")


def test_dashboard_without_its_extra_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "dblock.dashboard", raising=False)
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # makes the import fail
    assert main(["dashboard"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "pip install 'dblock[dashboard]'" in err


@pytest.mark.parametrize("scheme", ["redis", "etcd", "postgresql", "mysql"])
def test_run_on_an_unreachable_store_says_it_cannot_connect(
    scheme: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not what it was doing when no server answered ("creating the lock table failed" read
    as a problem with the table)."""
    port = free_ports(1)[0]
    url = {
        "redis": f"redis://127.0.0.1:{port}/0",
        "etcd": f"etcd://127.0.0.1:{port}",
        "postgresql": f"postgresql://app@127.0.0.1:{port}/db",
        "mysql": f"mysql://app@127.0.0.1:{port}/db",
    }[scheme]
    assert main(["--url", url, "run", "--no-wait", "k", "--", "true"]) == 69
    err = capsys.readouterr().err
    assert err.startswith(f"dblock: database unavailable: cannot connect to {url} "), err
    assert "lock table failed" not in err


def test_the_timeout_hint_keeps_a_sqlite_path_with_a_space_whole() -> None:
    """One URL with a space (a SQLite path) stays one ``--url``, as ``connect()`` takes it."""
    from dblock._lock import info_command

    assert info_command("k 1", "sqlite:////tmp/my dir/x.db", "locks") == (
        "dblock --url 'sqlite:////tmp/my dir/x.db' --table locks info 'k 1'"
    )
    quorum = "redis://a:6379/0 etcd://b:2379 sqlite:///c.db"
    assert info_command("k", quorum, "t") == (
        "dblock --url redis://a:6379/0 --url etcd://b:2379 --url sqlite:///c.db --table t info k"
    )
