"""The chaos soak's faults begin once a worker holds a key: in CI a ZooKeeper restart drawn
before the workers had started (a JVM's restart took 30 s on the loaded machine) left a soak
of no hold at all."""

from __future__ import annotations

from pathlib import Path

from tests.contract.test_chaos import run_soak


def test_no_fault_comes_before_the_first_hold(tmp_path: Path) -> None:
    # SQLite's file lock needs no holder to fire, as a restart does not: drawn every 10-30 ms,
    # without the wait it fires long before a worker process has imported dblock
    code, summary = run_soak(
        f"sqlite:///{tmp_path / 'locks.db'}",
        tmp_path / "summary.json",
        ["--workers", "2", "--faults", "filelock", "--fault-interval", "0.01,0.03"],
        duration=3,
    )
    assert code == 0, summary["violations"]
    assert summary["holds"] > 0
    assert sum(summary["faults"].values()) > 0
    assert summary["faults_before_first_hold"] == 0
