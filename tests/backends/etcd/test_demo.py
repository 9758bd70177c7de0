"""``dblock demo --lock-url etcd://…``: the inventory in SQLite, the dblock strategy's locks in
etcd; it never oversells."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dblock.demo import main


def test_demo_with_locks_in_etcd(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path}/inventory.sqlite3"
    args = ["--url", db, "--lock-url", url, "--workers", "3", "--stock", "30", "--seed", "7"]
    status = main([*args, "--strategies", "6", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0, report
    (s,) = report["strategies"]
    assert s["number"] == 6 and s["status"] == "ok", s
    assert s["oversold_units"] == 0 and s["units_shipped"] == 30 and s["stock_left"] == 0, s
