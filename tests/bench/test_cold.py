"""The cold-start scenario (issue 52) runs on SQLite and reports every row beside its floor.

No test here asserts a speed: a loaded test machine's figures mean nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench import cold, run


def test_cold_scenario_times_dblock_beside_flock_python_and_the_floor(tmp_path: Path) -> None:
    out, md = tmp_path / "result.json", tmp_path / "result.md"
    options = "--backends sqlite --scenarios cold --contenders dblock --repeats 1 --no-spinner"
    code = run.main([*options.split(), "--json", str(out), "--markdown", str(md)])
    assert code == 0
    res = json.loads(out.read_text())["results"]["cold"]
    rounds = cold.rounds_of(run.Budget(repeats=1))
    rows = res["rows"]
    assert {"python -c pass", "sqlite/dblock", "sqlite/floor"} <= set(rows)
    for name, row in rows.items():
        assert "error" not in row, (name, row)
        assert len(row["exit"]["samples_ms"]) == rounds
        if name != "python -c pass":  # it starts no CMD
            starts = row["start"]["samples_ms"]
            assert len(starts) == rounds
            assert all(0 < s <= e for s, e in zip(starts, row["exit"]["samples_ms"], strict=True))
    assert "start" not in rows["python -c pass"]
    assert cold.gap(res, "sqlite") is not None
    text = md.read_text()
    assert "(cold) `dblock run --no-wait KEY -- CMD`" in text
    assert "| sqlite/dblock |" in text
    assert not [t for t in json.loads(out.read_text())["targets"] if "(cold)" in t["target"]]
