"""The chaos soak (bench/chaos.py) on a quorum of three private Redis servers, with store
kills among its faults: each is SIGKILLed and comes back empty (no persistence). The referee
finds no violation: tokens strictly increase and no two holds of a key overlap."""

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
    summary = soak(url, tmp_path / "summary.json", members, duration=max(DURATION, 20.0))
    assert summary["holds"] > 0
    assert summary["faults"].get("storekill", 0) >= 1
