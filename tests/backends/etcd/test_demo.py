"""``dblock demo`` with its locks in etcd: the inventory table lives in an SQLite file of the
run's (etcd is no SQL database), and strategy 6 locks through etcd; it never oversells."""

from __future__ import annotations

import json

import pytest

from dblock.demo import main


def test_demo_with_locks_in_etcd(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["--url", url, "--workers", "3", "--stock", "30", "--seed", "7", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0, report
    assert report["ok"] is True
    by = {s["number"]: s for s in report["strategies"]}
    for number in (3, 4, 5, 6):
        assert by[number]["status"] == "ok", by[number]
        assert by[number]["units_shipped"] == 30
        assert by[number]["oversold_units"] == 0
    assert by[7]["status"] == "skipped"
