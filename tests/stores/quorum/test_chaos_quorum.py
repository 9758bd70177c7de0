"""The chaos soak (bench/chaos.py) on a quorum of three private Redis servers, with store
faults among its own: store kills (each is SIGKILLed and comes back empty: no persistence)
and the rolling sequence (two stores restarted empty one after the other, then the third
unreachable). The referee finds no violation: tokens strictly increase, no two holds of a
key overlap, nothing that lived is reported lost."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.contract.test_chaos import CHAOS_TIMEOUT, DURATION, soak


@pytest.mark.slow
@pytest.mark.timeout(CHAOS_TIMEOUT + 120)
def test_soak_on_a_redis_quorum_with_store_kills(redis_trio: list[Any], tmp_path: Path) -> None:
    members = []
    for server in redis_trio:
        server.kill()  # from here on chaos runs it (and SIGKILLs it, and starts it again)
        members += ["--member-cmd", shlex.join(server.command)]
    url = " ".join(s.url for s in redis_trio)
    # 1 s leases: the rolling sequence (3 leases between two stores' restarts) takes about
    # 10 s, and every fault kind fits the run
    options = [*members, "--ttl", "1", "--fault-interval", "0.5,1.5"]
    summary = soak(url, tmp_path / "summary.json", options, duration=max(DURATION, 30.0))
    assert summary["holds"] > 0
    assert summary["faults"].get("storekill", 0) >= 1
    assert summary["faults"].get("rolling", 0) >= 1
