"""Mutual exclusion and crash behaviour across real processes (SIGKILL, SIGSTOP)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dblock

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def worker(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests._worker", *args],
        cwd=ROOT,
        stdin=stdin,
        stdout=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> None:
    """Kill if still running, reap, and close the pipes."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.communicate(timeout=10)


def test_six_processes_read_modify_write_exactly(
    db_url: str, table: str, key: str, tmp_path: Path
) -> None:
    dblock.connect(db_url, table=table).close()
    counter = tmp_path / "counter"
    counter.write_text("0")
    procs, per_worker = 6, 12
    logs = [tmp_path / f"log{i}" for i in range(procs)]
    workers = [
        worker("count", db_url, table, key, str(per_worker), str(counter), str(log)) for log in logs
    ]
    for w in workers:
        w.communicate(timeout=180)
        assert w.returncode == 0
    assert int(counter.read_text()) == procs * per_worker
    holds = sorted(
        tuple(map(int, line.split())) for log in logs for line in log.read_text().splitlines()
    )
    assert len(holds) == procs * per_worker
    for (_, end, token), (start, _, next_token) in itertools.pairwise(holds):
        assert end <= start, "two holds overlapped"
        assert token < next_token, "fencing tokens did not increase with time"


def test_sigkilled_holder_blocks_until_its_lease_ends(db_url: str, table: str, key: str) -> None:
    with dblock.connect(db_url, table=table) as client:
        holder = worker("hold", db_url, table, key, "2", stdin=subprocess.PIPE)
        try:
            assert holder.stdout is not None
            held = json.loads(holder.stdout.readline())
            before = client.info(key)
            assert before is not None and before.token == held["token"]
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)
            lock = client.lock(key, ttl=30)
            assert not lock.acquire(blocking=False), "taken before the dead holder's lease ended"
            assert lock.acquire(timeout=20)
            after = client.info(key)
            assert after is not None
            # measured on the database clock: not a moment before the dead lease expired
            assert after.acquired_at >= before.expires_at
            assert after.token > before.token
            lock.release()
        finally:
            finish(holder)


def test_paused_holder_loses_the_lease_and_cannot_free_the_new_owner(
    db_url: str, table: str, key: str
) -> None:
    with dblock.connect(db_url, table=table) as client:
        holder = worker("hold", db_url, table, key, "1", stdin=subprocess.PIPE)
        try:
            assert holder.stdout is not None and holder.stdin is not None
            held = json.loads(holder.stdout.readline())
            os.kill(holder.pid, signal.SIGSTOP)
            lock = client.lock(key, ttl=30)
            assert lock.acquire(timeout=20)  # once the paused holder's lease ran out
            assert lock.token is not None and lock.token > held["token"]
            os.kill(holder.pid, signal.SIGCONT)
            holder.stdin.write("go\n")
            holder.stdin.flush()
            outcome = json.loads(holder.stdout.readline())
            assert outcome == {"renew": "LockLost", "release": "LockLost"}
            assert holder.wait(10) == 0
            info = client.info(key)
            assert info is not None
            assert (info.owner, info.token) == (lock.owner, lock.token)
            lock.release()
        finally:
            finish(holder)


def test_ten_processes_create_the_schema_at_once(db_url: str, table: str) -> None:
    start_at = str(time.time() + 1.5)
    workers = [worker("schema", db_url, table, start_at) for _ in range(10)]
    outputs = [w.communicate(timeout=60)[0] for w in workers]
    assert [w.returncode for w in workers] == [0] * 10
    assert outputs == ["ok\n"] * 10
