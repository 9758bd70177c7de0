"""The chaos soak's guarded writers on PostgreSQL: its referee catches two holders'
interleaved transactions, and lock.guard prevents them.

The same soak runs twice with pauses only (SIGSTOP of a holder past its lease): with
``--unguarded`` the writers' read-modify-write rests on the lease alone, and a holder paused
between its read and its write commits over its successor's work (the referee reports lost
updates); with the guard, the paused holder's transaction keeps every other holder off the
key until it ends, and the referee reports nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests._servers import POSTGRESQL_URL, require_server
from tests.contract.test_chaos import run_soak

DURATION = 15.0
#: short leases and frequent pauses: each unguarded run sees several pauses land between a
#: holder's read and its write
PAUSES = ["--faults", "pause", "--ttl", "1", "--fault-interval", "0.3,0.8", "--grace", "30"]
#: unguarded runs until one shows an interleave (a pause may land outside the transaction)
ATTEMPTS = 3


def _soak(tmp_path: Path, name: str, *extra: str) -> tuple[int, dict[str, Any]]:
    # PAUSES' --grace comes after run_soak's: the later one is the one chaos.py takes
    return run_soak(POSTGRESQL_URL, tmp_path / f"{name}.json", [*PAUSES, *extra], DURATION)


@pytest.mark.slow
@pytest.mark.timeout((ATTEMPTS + 1) * (DURATION + 200))
def test_the_referee_catches_unguarded_writers_and_guard_prevents_it(tmp_path: Path) -> None:
    require_server("postgresql", POSTGRESQL_URL)
    caught: list[str] = []
    for attempt in range(ATTEMPTS):
        code, summary = _soak(tmp_path, f"unguarded{attempt}", "--unguarded")
        assert summary["guard"] is False and summary["hung"] == 0
        caught = [v for v in summary["violations"] if v.startswith(("lost-update:", "interleave:"))]
        if caught:
            assert code == 1
            break
    assert caught, "no interleaved transactions without the guard: the referee missed them"

    code, summary = _soak(tmp_path, "guarded")
    assert summary["guard"] is True
    assert summary["violations"] == []
    assert summary["hung"] == 0 and code == 0
    assert summary["faults"].get("pause", 0) >= 1
    assert summary["guarded_commits"] > 0
    assert summary["guarded_commits"] >= summary["guarded_acked"]
