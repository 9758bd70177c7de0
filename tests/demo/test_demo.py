"""``dblock demo``: its arguments, output and report, without a store (the runs against each
store are tests/contract/test_demo.py)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from rich.console import Console

from dblock.demo import main
from dblock.demo._report import RichProgress, conclusion, verdict
from dblock.demo._runner import Demo, Result, make_orders, p99
from dblock.demo._strategies import STRATEGIES, parse_strategies

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
    def fake_run(self: Demo, strategy: Any) -> Result:
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
    assert len(parse_strategies(",".join(s.slug for s in STRATEGIES))) == 7
    for bad in ("", "0", "8", "redis"):
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
