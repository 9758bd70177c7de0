"""``dblock bench`` (dblock.bench.main): runs on a tiny budget; unreachable URL exits 69."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from dblock import bench
from dblock.cli import main


def test_user_bench_runs_and_reports_json(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = "bench_" + tmp_path.name[-8:].replace("-", "_")
    code = bench.main(
        [
            "--url",
            db_url,
            "--table",
            table,
            "--duration",
            "0.6",
            "--repeats",
            "1",
            "--workers",
            "3",
            "--max-ops",
            "200",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(out)
    assert result["uncontended"]["pairs_per_s"] > 0
    c = result["contended"]
    assert c["sections"] > 0 and c["lost_updates"] == 0 and c["overlaps"] == 0
    assert 0 <= c["fairness"] <= 1
    assert result["handoff"]["samples"] >= 0


def test_user_bench_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/b.sqlite3"
    code = bench.main(["--url", url, "--duration", "0.3", "--repeats", "1", "--workers", "2"])
    assert code == 0
    assert "hand-off" in capsys.readouterr().out


def test_unreachable_url_exits_69_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench.main(["--url", "postgresql://u:secret@127.0.0.1:1/x", "--duration", "0.1"])
    err = capsys.readouterr().err
    assert code == 69
    assert len(err.strip().splitlines()) == 1
    assert "secret" not in err


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--duration", "0"]) == 2
    assert bench.main(["--no-such-option"]) == 2


def test_dblock_bench_uses_the_table_given(tmp_path: Path) -> None:
    """`dblock bench --table T` measures on T, not on the default table (issue 29, point 15)."""
    url = f"sqlite:///{tmp_path}/b.sqlite3"
    args = ["--duration", "0.3", "--repeats", "1", "--workers", "2", "--json"]
    assert main(["--url", url, "bench", "--table", "bench_locks", *args]) == 0
    with sqlite3.connect(tmp_path / "b.sqlite3") as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert "bench_locks" in tables
        assert "dblock_locks" not in tables
        keys = [row[0] for row in conn.execute("SELECT lock_key FROM bench_locks")]
    assert keys and all(key.startswith("dblock-bench:") for key in keys)
