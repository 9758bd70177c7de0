"""The cold-start scenario (issue 52) runs on SQLite and reports every row beside its floor;
on Redis, whose driver imports the OpenTelemetry SDK where it is installed, it also times
dblock and the floor without it.

No test here asserts a speed: a loaded test machine's figures mean nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from bench.contenders import Targets

from bench import cold, run, servers


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


def test_a_driver_that_imports_the_otel_sdk_is_also_timed_without_it(tmp_path: Path) -> None:
    from tests._servers import REDIS_URL, require_server

    require_server("redis", REDIS_URL)
    t = Targets(redis=REDIS_URL)
    env = cold.child_env(str(tmp_path))
    table = f"t_cold_{uuid.uuid4().hex[:8]}"
    argvs = cold.sides(["redis"], t, table, str(tmp_path))
    bare = {f"redis/dblock{cold.NO_SDK}", f"redis/floor{cold.NO_SDK}"}
    assert (bare <= set(argvs)) is cold.loads_sdk("redis", env)
    if not bare <= set(argvs):
        return  # the SDK is not installed here: the plain rows are the only ones
    try:
        for name in sorted(bare):
            start, end = cold.sample(argvs[name], env)
            assert start is not None and 0 < start <= end, name  # dblock ran CMD, as the floor
    finally:
        servers.drop_dblock_tables(t, "redis", table)
    # what those rows run first makes the SDK's import fail, as on a host without it
    code = cold._HIDE_SDK + "import redis\nprint('opentelemetry.sdk.metrics' in sys.modules)\n"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"
