"""``dblock demo`` on a store that is no SQL database (Redis, ZooKeeper, etcd): the inventory
table lives in an SQLite file of the run's, strategy 6 locks through the store, and the
protected strategies never oversell; strategy 7 (a session advisory lock) and 9b (a guarded
commit) are skipped."""

from __future__ import annotations

import json

import pytest

from dblock.demo import main
from tests.providers import Provider

# the demo's workers are its own processes: no client of the test's
pytestmark = pytest.mark.needs("processes", "blocking", "demo")


def test_the_inventory_in_sqlite_the_locks_in_the_store(
    provider: Provider, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if provider.has("sql"):
        pytest.skip("a store with SQL keeps the inventory itself (test_demo.py)")
    args = ["--url", db_url, "--workers", "3", "--stock", "30", "--seed", "7", "--json"]
    status = main(args)
    report = json.loads(capsys.readouterr().out)
    assert status == 0, report
    assert report["ok"] is True
    by = {s["number"]: s for s in report["strategies"]}
    for number in (3, 4, 5, 6):
        assert by[number]["status"] == "ok", by[number]
        assert by[number]["units_shipped"] == 30
        assert by[number]["oversold_units"] == 0
    assert by[7]["status"] == "skipped"
    # strategy 9: the token column fences with the store's tokens; lock.guard needs the lock
    # table in the inventory's database
    stalled = {v["variant"]: v for v in report["stalled_holder"]["variants"]}
    assert stalled["a"]["status"] == "ok" and stalled["a"]["oversold_units"] == 0
    assert stalled["a"]["units_shipped"] == 30
    assert stalled["b"]["status"] == "skipped" and "lock.guard" in stalled["b"]["note"]
