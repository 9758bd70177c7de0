"""``dblock demo`` on every provider the demo reaches by URL, with a small workload (3 workers,
stock 30).

Only what must hold is asserted: the protected strategies (3-9) never oversell and ship exactly
the stock. Whether the unprotected ones (1, 2) oversell depends on timing, so it is not.
Strategy 7, a session advisory lock, is skipped by the demo where the store has none.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dblock.demo import main
from tests._servers import demo_tables, raw_connect
from tests.providers import Provider

# the demo's workers are its own processes: no client of the test's
pytestmark = pytest.mark.needs("processes", "sql", "blocking")

SMALL = ["--workers", "3", "--stock", "30", "--seed", "7"]


def _run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    status = main([*args, "--json"])
    out = capsys.readouterr().out
    return status, json.loads(out)


@pytest.fixture
def sentinel(db_url: str) -> Iterator[str]:
    """A user's table that the demo must leave alone."""
    name = "t_" + uuid.uuid4().hex[:16]
    conn = raw_connect(db_url)
    try:
        conn.cursor().execute(f"CREATE TABLE {name} (sku VARCHAR(64), available INTEGER)")
        conn.cursor().execute(f"INSERT INTO {name} VALUES ('sku-42', 5)")
        yield name
        conn.cursor().execute(f"DROP TABLE IF EXISTS {name}")
    finally:
        conn.close()


def test_protected_strategies_ship_exactly_the_stock(
    provider: Provider, db_url: str, sentinel: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, report = _run_json(capsys, "--url", db_url, *SMALL)
    assert status == 0, report
    assert report["ok"] is True
    assert report["dialect"] == provider.dialect
    assert report["stock"] == 30
    by = {s["number"]: s for s in report["strategies"]}
    assert sorted(by) == [1, 2, 3, 4, 5, 6, 7]
    for number in (3, 4, 5, 6, 7):
        s = by[number]
        assert s["correct"] is True
        if number == 7 and not provider.has("advisory"):
            assert s["status"] == "skipped"
            assert "advisory" in s["note"]
            continue
        assert s["status"] == "ok", s
        assert s["oversold_units"] == 0, s
        assert s["units_shipped"] == 30, s
        assert s["stock_left"] == 0, s
        assert s["units_shipped"] + s["stock_left"] == 30, s
        assert s["unaccounted_units"] == 0, s
        assert s["orders_confirmed"] >= 30 // 5
        assert s["throughput_orders_per_s"] > 0
        assert s["p99_latency_ms"] > 0
    for number in (1, 2):  # reported, whatever the race did this time
        s = by[number]
        assert s["status"] == "ok", s
        assert s["correct"] is False
        assert s["oversold_units"] == max(0, s["units_shipped"] - 30)
        assert s["verdict"] in ("OVERSOLD", "lucky")
    assert by[5]["retries"] >= 0
    # strategy 8, orders of several SKUs: lock_many (a) and sorted per-SKU locks (b) ship
    # exactly each SKU's stock; arrival order (c) is reported with its lock timeouts
    several = report["several_skus"]
    variants = {v["variant"]: v for v in several["variants"]}
    assert sorted(variants) == ["a", "b", "c"]
    total = several["stock_per_sku"] * len(several["skus"])
    for name in ("a", "b"):
        v = variants[name]
        assert v["status"] == "ok" and v["correct"] is True, v
        assert v["oversold_units"] == 0 and v["unaccounted_units"] == 0, v
        assert v["units_shipped"] + v["stock_left"] == total, v
    assert variants["c"]["oversold_units"] == 0 and variants["c"]["lock_timeouts"] >= 0
    # strategy 9, holders stalled past their lease: the token column (a) and the guarded
    # commit (b) ship exactly the stock; which stalled writes were refused is timing
    stalled = {v["variant"]: v for v in report["stalled_holder"]["variants"]}
    assert sorted(stalled) == ["a", "b"]
    for v in stalled.values():
        assert v["status"] == "ok" and v["correct"] is True, v
        assert v["oversold_units"] == 0 and v["unaccounted_units"] == 0, v
        assert v["units_shipped"] == 30 and v["stock_left"] == 0, v
        assert v["stalled_wrote"] + v["stalled_refused"] == 2, v
    # the demo's own tables are gone, the user's table is untouched
    tables = set(report["tables"])
    assert len(tables) >= 2
    assert all(t.startswith("dblock_demo_") for t in tables)
    assert not tables & demo_tables(db_url)
    conn = raw_connect(db_url)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT sku, available FROM {sentinel}")
        assert [tuple(row) for row in cur.fetchall()] == [("sku-42", 5)]
    finally:
        conn.close()


def test_plain_output_off_a_terminal(db_url: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dblock.demo", "--url", db_url, *SMALL, "--strategies", "2,3,6"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "oversold" in proc.stdout
    assert "dblock lock" in proc.stdout
    assert "\x1b[" not in proc.stdout + proc.stderr  # no colours, no live display
    lines = proc.stderr.splitlines()
    assert len(lines) == 3, proc.stderr  # one progress line per strategy
    assert lines[1].startswith("3. ")
    assert "Traceback" not in proc.stderr
