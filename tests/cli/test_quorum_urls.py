"""``--url`` given several times, or ``DBLOCK_URL`` holding several URLs: a quorum client."""

from __future__ import annotations

from pathlib import Path

import pytest

import dblock
from dblock.cli import main
from tests.providers import fresh_table


def _urls(tmp_path: Path) -> list[str]:
    return [f"sqlite:///{tmp_path}/member{i}.sqlite3" for i in range(3)]


def test_url_given_three_times_runs_cmd_under_a_quorum_lock(tmp_path: Path) -> None:
    urls, table = _urls(tmp_path), fresh_table()
    marker = tmp_path / "ran"
    argv = [a for url in urls[:2] for a in ("--url", url)]
    # the third store after the command name: the URLs of both places make the quorum
    argv += ["--table", table, "run", "--url", urls[2], "k", "--", "touch", str(marker)]
    assert main(argv) == 0
    assert marker.exists()
    for url in urls:  # each store granted it, and each recorded its release
        with dblock.connect(url, table=table) as member:
            assert member.info("k") is None
            lock = member.lock("k")
            assert lock.acquire(blocking=False)
            assert lock.token is not None and lock.token > 1
            lock.release()


def test_two_urls_are_no_quorum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    urls = _urls(tmp_path)
    assert main(["--url", urls[0], "--url", urls[1], "list"]) == 2
    assert "at least three" in capsys.readouterr().err


def test_the_same_url_before_and_after_the_command_is_one_store(tmp_path: Path) -> None:
    url = _urls(tmp_path)[0]
    assert main(["--url", url, "list", "--url", url]) == 0


def test_dblock_url_may_name_the_quorum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    urls, table = _urls(tmp_path), fresh_table()
    monkeypatch.setenv("DBLOCK_URL", " ".join(urls))
    with dblock.connect(urls, table=table) as client, client.lock("held"):
        assert main(["--table", table, "info", "held"]) == 0
        assert "token:" in capsys.readouterr().out
