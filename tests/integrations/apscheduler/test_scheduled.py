"""Three processes, each with an APScheduler firing the same job at the same moment through
``client.scheduled``: the job runs exactly once."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("apscheduler")

from tests._servers import drop_tables, require_server, server_url

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_job_fired_by_three_schedulers_at_once_runs_once(store: str, tmp_path: Path) -> None:
    url = server_url(store, str(tmp_path))
    if store != "sqlite":
        require_server(store, url)
    table = "t_aps_" + uuid.uuid4().hex[:12]
    out = tmp_path / "runs.txt"
    at = time.time() + 3  # after the three have started (a late one fires at once anyway)
    command = [sys.executable, "-m", "tests.integrations.apscheduler._host", url, table]
    hosts = [subprocess.Popen([*command, str(at), str(out)], cwd=ROOT) for _ in range(3)]
    try:
        assert [host.wait(timeout=60) for host in hosts] == [0, 0, 0]
    finally:
        for host in hosts:
            if host.poll() is None:
                host.kill()
                host.wait()
        if store != "sqlite":
            drop_tables(url, table)
    assert len(out.read_text().splitlines()) == 1
