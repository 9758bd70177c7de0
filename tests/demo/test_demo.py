"""``dblock demo``: its arguments, output and report, without a store (the runs against each
store are tests/contract/test_demo.py)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from rich.console import Console

from dblock.demo import main
from dblock.demo._db import SKUS, stocks_left
from dblock.demo._report import RichProgress, conclusion, table, to_json, verdict
from dblock.demo._runner import (
    Demo,
    Result,
    make_orders,
    make_several_orders,
    p99,
    several_stock,
)
from dblock.demo._strategies import (
    ARRIVAL_TRIES,
    SEVERAL_SKUS,
    STALLED_HOLDER,
    STALLED_SHOWS,
    STALLS,
    STRATEGIES,
    parse_strategies,
)

SMALL = ["--workers", "3", "--stock", "30", "--seed", "7"]


def _run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    status = main([*args, "--json"])
    out = capsys.readouterr().out
    return status, json.loads(out)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://demo:s3cr3t-pw@127.0.0.1:1/nope",
        "mysql://demo:s3cr3t-pw@127.0.0.1:1/nope",
        "sqlite:////proc/no-such-dir/demo.sqlite3",
    ],
)
@pytest.mark.parametrize("as_json", [False, True])
def test_unreachable_url_exits_69_with_one_line(url: str, as_json: bool) -> None:
    args = [sys.executable, "-m", "dblock.demo", "--url", url] + (["--json"] if as_json else [])
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 69, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dblock demo: cannot reach the database at ")
    assert "s3cr3t-pw" not in proc.stderr + proc.stdout
    assert proc.stdout == ""


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workers", "0"]) == 2
    assert main(["--strategies", "1,nope"]) == 2
    assert main(["--url", "nosuch://x"]) == 2
    err = capsys.readouterr().err
    assert "--workers" in err
    assert "nope" in err
    assert "nosuch" in err
    assert "Traceback" not in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "--strategies" in capsys.readouterr().out


def test_a_correct_strategy_that_oversells_fails_loudly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    def fake_run(self: Demo, strategy: Any, variant: str = "") -> Result:
        return Result(
            strategy.number,
            strategy.slug,
            strategy.title,
            strategy.correct,
            confirmed=12,
            shipped=33,
            stock_left=-3,
            oversold=3,
            elapsed=0.1,
            throughput=120,
        )

    monkeypatch.setattr(Demo, "run", fake_run)
    url = f"sqlite:///{tmp_path}/demo.sqlite3"
    assert main(["--url", url, "--workers", "1", "--strategies", "3"]) == 1
    captured = capsys.readouterr()
    assert "FAILED" in captured.out
    assert "SOMETHING IS WRONG" in captured.out
    assert "FAILED: strategy 3" in captured.err


def test_import_dblock_does_not_import_the_demo() -> None:
    code = "import sys, dblock; sys.exit(any(m.startswith('dblock.demo') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_orders_are_reproducible_from_the_seed() -> None:
    assert make_orders(5, 100) == make_orders(5, 100)
    assert make_orders(5, 100) != make_orders(6, 100)
    orders = make_orders(5, 100)
    assert sum(q for q, _ in orders) > 3 * 100  # enough demand to sell out
    assert all(1 <= q <= 5 and 0.001 <= d <= 0.003 for q, d in orders)


def test_strategy_selection() -> None:
    assert [s.number for s in parse_strategies("6, read-write,3,6")] == [6, 1, 3]
    assert len(parse_strategies(",".join(s.slug for s in STRATEGIES))) == 9
    (several,) = parse_strategies("several-skus")
    assert several.number == 8 and several.variants == ("a", "b", "c")
    assert parse_strategies("8") == [several]
    (stalled,) = parse_strategies("stalled-holder")
    assert stalled.number == 9 and stalled.variants == ("a", "b") and stalled.correct
    assert stalled.skip_reason("sqlite", "a", sql_store=False) is None  # tokens: any store
    assert "lock.guard" in str(stalled.skip_reason("sqlite", "b", sql_store=False))
    assert stalled.skip_reason("postgresql", "b") is None
    for bad in ("", "0", "10", "redis"):
        with pytest.raises(ValueError):
            parse_strategies(bad)


def test_progress_on_a_terminal() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    done = Result(3, "guarded-update", "UPDATE ... WHERE available >= q", correct=True)
    done.confirmed, done.shipped = 10, 30
    skipped = Result(7, "advisory", "advisory lock", correct=True, status="skipped", note="n/a")
    with RichProgress(console) as progress:
        progress.start(done.title, 30)
        progress.update(4, 12)
        progress.finish(done)
        progress.finish(skipped)
    text = buffer.getvalue()
    assert "UPDATE ... WHERE available >= q" in text
    assert "30 units" in text
    assert "advisory lock" in text


def test_p99_and_verdicts() -> None:
    assert p99([]) == 0.0
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([3.0]) == 3.0
    naive = Result(1, "read-write", "read-check-write", correct=False, shipped=30, stock_left=0)
    assert verdict(naive) == "lucky"
    naive.shipped, naive.oversold, naive.unaccounted = 45, 15, 15
    assert verdict(naive) == "OVERSOLD"
    assert not naive.failed
    safe = Result(3, "guarded-update", "guarded", correct=True, shipped=30, stock_left=0)
    assert verdict(safe) == "ok"
    assert not safe.failed
    text = conclusion([naive, safe], 30)
    assert "45 units" in text
    assert "oversold nothing" in text


def test_dblock_url_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """DBLOCK_URL is the default database, as for every command."""
    monkeypatch.setenv("DBLOCK_URL", "postgresql://demo:s3cr3t-pw@127.0.0.1:1/nope")
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-m", "dblock.demo"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 69
    assert "127.0.0.1:1" in proc.stderr


def test_orders_of_several_skus_are_reproducible_and_sell_every_sku_out() -> None:
    assert make_several_orders(5, 100) == make_several_orders(5, 100)
    assert make_several_orders(5, 100) != make_several_orders(6, 100)
    orders = make_several_orders(5, 100)
    each = several_stock(100)
    demand = dict.fromkeys(SKUS, 0)
    for lines, delay in orders:
        skus = [sku for sku, _ in lines]
        assert 1 <= len(skus) <= 5 and len(set(skus)) == len(skus)
        assert all(1 <= qty <= 3 for _, qty in lines)
        assert 0.001 <= delay <= 0.003
        for sku, qty in lines:
            demand[sku] += qty
    assert min(demand.values()) >= 2 * each  # enough demand to sell every SKU out
    # the lines come in arrival order, not sorted: what makes variant c deadlock
    assert any([s for s, _ in lines] != sorted(s for s, _ in lines) for lines, _ in orders)


def test_several_skus_variants_on_sqlite(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/demo.sqlite3"
    status, report = _run_json(capsys, "--url", url, *SMALL, "--strategies", "8")
    assert status == 0, report
    assert report["strategies"] == []  # strategy 8 is reported apart
    several = report["several_skus"]
    assert several["skus"] == list(SKUS)
    stock = several["stock_per_sku"] * len(SKUS)
    rows = {v["variant"]: v for v in several["variants"]}
    assert sorted(rows) == ["a", "b", "c"]
    for v in rows.values():
        assert v["status"] == "ok" and v["verdict"] == "ok", v
        assert v["oversold_units"] == 0 and v["unaccounted_units"] == 0, v
        assert v["units_shipped"] + v["stock_left"] == stock, v
        assert 0 < v["units_shipped"] <= stock
        assert v["lock_timeouts"] == v["retries"] >= 0
    assert rows["a"]["lock_timeouts"] == rows["b"]["lock_timeouts"] == 0


@pytest.fixture
def sku_worker(tmp_path: Any) -> Any:
    """A worker on an SQLite inventory of strategy 8's SKUs, and a client of its locks."""
    import dblock
    from dblock.demo._db import DemoDB, create_inventory, reset_inventory
    from dblock.demo._worker import Worker
    from dblock.stores import parse_url

    url = f"sqlite:///{tmp_path}/demo.sqlite3"
    db = DemoDB(parse_url(url))
    create_inventory(db, "dblock_demo_inventory_t", 10)
    reset_inventory(db, "dblock_demo_inventory_t", 10, SKUS)
    with dblock.connect(url, table="dblock_demo_locks_t") as client:
        worker = Worker(url, "dblock_demo_inventory_t", "dblock_demo_locks_t")
        worker.open(8)
        try:
            yield worker, client, db
        finally:
            worker.close()
            db.close()


def _key(sku: str) -> str:
    return f"inventory:WH1:{sku}"


def _holds_while_waiting(sku_worker: Any, variant: str) -> tuple[bool, Any]:
    """While SKUS[0] is held by another client, confirm an order of (SKUS[1], SKUS[0]) in
    ``variant``: did it hold SKUS[1] while it waited, and what did the order come to."""
    worker, client, _db = sku_worker
    first, second = SKUS[0], SKUS[1]
    lines = ((second, 1), (first, 1))
    outcome: list[Any] = []
    with client.lock(_key(first), ttl=30):
        thread = threading.Thread(
            target=lambda: outcome.append(worker.several_skus(variant, lines, 0.001))
        )
        thread.start()
        held = False
        deadline = time.monotonic() + 0.5  # variant c: its tries (three of 0.1 s) and more
        while time.monotonic() < deadline and not held and thread.is_alive():
            held = client.lock(_key(second), ttl=30).locked()
            time.sleep(0.005)
        if variant == "c":
            thread.join(30)
    thread.join(30)
    return held, outcome[0]


def test_lock_many_holds_no_sku_while_it_waits(sku_worker: Any) -> None:
    held, (outcome, timeouts) = _holds_while_waiting(sku_worker, "a")
    assert not held
    assert (outcome, timeouts) == ("confirmed", 0)  # once the other SKU was released
    _worker, _client, db = sku_worker
    assert stocks_left(db, "dblock_demo_inventory_t", SKUS[:2]) == {SKUS[0]: 9, SKUS[1]: 9}


def test_locks_in_arrival_order_hold_one_sku_and_time_out_on_the_other(sku_worker: Any) -> None:
    """Variant c takes the second SKU, then waits for the held one until its lock timeout;
    each try times out, and after ARRIVAL_TRIES the order is rejected with nothing sold."""
    held, (outcome, timeouts) = _holds_while_waiting(sku_worker, "c")
    assert held
    assert (outcome, timeouts) == ("rejected", ARRIVAL_TRIES)
    _worker, client, db = sku_worker
    assert not client.lock(_key(SKUS[1]), ttl=30).locked()  # given back at each timeout
    assert stocks_left(db, "dblock_demo_inventory_t", SKUS[:2]) == {SKUS[0]: 10, SKUS[1]: 10}


def test_report_rows_of_the_variants() -> None:
    single = Result(3, "guarded-update", "guarded", correct=True, shipped=30, stock_left=0)
    rows = [
        Result(8, "several-skus", title, correct=True, variant=letter, confirmed=9, shipped=20)
        for letter, title in SEVERAL_SKUS
    ]
    rows[2].retries = 4
    rows += [
        Result(9, "stalled-holder", title, correct=True, variant=letter, shipped=30)
        for letter, title in STALLED_HOLDER
    ]
    rows[3].stalled, rows[3].retries = ["refused", "refused"], 2
    rows[4].stalled, rows[4].retries = ["written", "refused"], 1
    buffer = io.StringIO()
    Console(file=buffer, width=120).print(table([single, *rows], 30, "6 SKUs of 6 units"))
    text = buffer.getvalue()
    assert "8a lock_many over the SKUs" in text
    assert "8c a lock per SKU, arrival order" in text
    assert "(8: 6 SKUs of 6 units)" in text
    assert "9b guarded commit (lock.guard)" in text
    words = conclusion([single, *rows], 30)
    assert "4 timeouts" in words and "oversold nothing" in words
    assert "of 2 stalled holders 1 committed" in words
    payload = to_json(
        [single, *rows], url="u", dialect="sqlite", workers=3, stock=30, seed=1, tables=[]
    )
    assert [s["number"] for s in payload["strategies"]] == [3]
    variants = payload["several_skus"]["variants"]
    assert [v["variant"] for v in variants] == ["a", "b", "c"]
    assert variants[2]["lock_timeouts"] == 4
    stalled = payload["stalled_holder"]["variants"]
    assert [v["variant"] for v in stalled] == ["a", "b"]
    assert stalled[1]["shows"] == STALLED_SHOWS["b"]
    assert stalled[1]["shows"].startswith("no token column")
    assert (stalled[1]["stalled_wrote"], stalled[1]["stalled_refused"]) == (1, 1)


def test_stalled_holder_variants_on_sqlite(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """Strategy 9 on the embedded store: holders stalled past their lease, yet neither the
    token column nor the guarded commit oversells or loses an update. Which stalled writes
    were refused depends on timing; that each stalled holder is accounted for does not."""
    url = f"sqlite:///{tmp_path}/demo.sqlite3"
    status, report = _run_json(capsys, "--url", url, *SMALL, "--strategies", "9")
    assert status == 0, report
    assert report["strategies"] == [] and report["several_skus"]["variants"] == []
    rows = {v["variant"]: v for v in report["stalled_holder"]["variants"]}
    assert sorted(rows) == ["a", "b"]
    for v in rows.values():
        assert v["status"] == "ok" and v["verdict"] == "ok" and v["correct"] is True, v
        assert v["oversold_units"] == 0 and v["unaccounted_units"] == 0, v
        assert v["units_shipped"] == 30 and v["stock_left"] == 0, v
        assert v["stalled_wrote"] + v["stalled_refused"] == len(STALLS), v
        assert v["retries"] >= v["stalled_refused"]


@pytest.fixture
def stall_worker(tmp_path: Any) -> Any:
    """A strategy 9 worker on an SQLite inventory of 10 units, and a client of its locks."""
    import dblock
    from dblock.demo._db import DemoDB, create_inventory
    from dblock.demo._worker import Worker
    from dblock.stores import parse_url

    url = f"sqlite:///{tmp_path}/demo.sqlite3"
    db = DemoDB(parse_url(url))
    create_inventory(db, "dblock_demo_inventory_t", 10)
    with dblock.connect(url, table="dblock_demo_locks_t") as client:
        worker = Worker(url, "dblock_demo_inventory_t", "dblock_demo_locks_t")
        worker.open(9)
        try:
            yield worker, client, db
        finally:
            worker.close()
            db.close()


def test_the_token_column_refuses_a_stale_holder(stall_worker: Any) -> None:
    """9a: a holder whose token is older than the one recorded on the row writes nothing,
    at its claim or at its write; the newest token writes."""
    from dblock.demo._db import stock_left

    worker, _client, db = stall_worker
    assert worker.fenced(5, 2, 0.001) == "confirmed"
    assert stock_left(db, "dblock_demo_inventory_t") == 8
    assert worker.fenced(4, 2, 0.001) is None  # a newer holder (5) claimed the row
    assert stock_left(db, "dblock_demo_inventory_t") == 8
    row = db.one("SELECT fence_token FROM dblock_demo_inventory_t")
    assert row == (5,)


def test_the_guard_refuses_a_hold_taken_over_and_nothing_is_written(stall_worker: Any) -> None:
    """9b: the lease of a stalled holder is gone and another owner holds the lock: its
    guard raises LockLost, the transaction is rolled back, the stock is untouched; a live
    hold's guarded read-check-write commits."""
    import dblock
    from dblock.demo._db import stock_left

    worker, client, db = stall_worker
    lock = worker.client.lock(worker.lock_key, ttl=30)
    assert lock.acquire(blocking=False)
    assert worker.guarded(lock, 3, 0.001) == "confirmed"
    assert stock_left(db, "dblock_demo_inventory_t") == 7
    assert client.force_release(worker.lock_key)
    assert client.lock(worker.lock_key, ttl=30).acquire(blocking=False)
    assert worker.guarded(lock, 3, 0.001) is None
    assert stock_left(db, "dblock_demo_inventory_t") == 7
    assert not worker.conn.connection.in_transaction  # rolled back
    with pytest.raises(dblock.LockLost):
        lock.release()
