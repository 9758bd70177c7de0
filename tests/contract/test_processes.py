"""Mutual exclusion and crash behaviour across real processes (SIGKILL, SIGSTOP)."""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

import dblock
from tests._internals import store_call
from tests._worker import freeze_between_operations
from tests._worker import start as start_worker
from tests.providers import Provider

pytestmark = [pytest.mark.slow, pytest.mark.needs("processes")]
ROOT = Path(__file__).resolve().parents[2]


def worker(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return start_worker(*args, stdin=stdin)


def finish(proc: subprocess.Popen[str]) -> None:
    """Kill if still running, reap, and close the pipes."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.communicate(timeout=10)


def test_six_processes_read_modify_write_exactly(
    provider: Provider, db_url: str, table: str, key: str, tmp_path: Path
) -> None:
    provider.connect(table=table).close()
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


def test_sigkilled_holder_blocks_until_its_lease_ends(
    provider: Provider, db_url: str, table: str, key: str
) -> None:
    with provider.connect(table=table) as client:
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
    provider: Provider, db_url: str, table: str, key: str
) -> None:
    with provider.connect(table=table) as client:
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


@pytest.mark.needs("sql")
def test_a_statement_paused_with_its_process_is_not_aborted_on_resume(
    provider: Provider, db_url: str, table: str, key: str
) -> None:
    """The statement deadline (5 s) measures the statement, not a SIGSTOP of the whole process:
    a renew stopped with its process for longer than the deadline completes after SIGCONT."""
    with provider.connect(table=table):
        pass
    holder = worker("hold", db_url, table, key, "60", stdin=subprocess.PIPE)
    blocker = provider.raw()
    try:
        assert holder.stdout is not None and holder.stdin is not None
        json.loads(holder.stdout.readline())
        cur = blocker.cursor()
        provider.hold_up_writes(cur, table, key)
        holder.stdin.write("go\n")  # the renew now waits for the blocker's row lock
        holder.stdin.flush()
        time.sleep(0.5)
        os.kill(holder.pid, signal.SIGSTOP)
        time.sleep(6)
        os.kill(holder.pid, signal.SIGCONT)
        time.sleep(1)  # the renew is still blocked after the resume
        cur.execute("COMMIT")
        outcome = json.loads(holder.stdout.readline())
        assert outcome == {"renew": "ok", "release": "ok"}
        assert holder.wait(10) == 0
    finally:
        blocker.close()
        finish(holder)


def _line(proc: subprocess.Popen[str], timeout: float) -> str | None:
    """The next line the worker prints within ``timeout`` s, or None."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else None


def _waiters(client: dblock.Client, key: str, n: int) -> None:
    """Wait until ``n`` waiters queue for ``key``."""
    deadline = time.monotonic() + 40  # (a worker's start took over 20 s on a loaded machine)
    while store_call(client, "probe", key, "nobody")[1] < n:
        assert time.monotonic() < deadline, f"{n} waiters never queued"
        time.sleep(0.05)


@pytest.mark.needs("FairQueue")
def test_paused_waiter_at_the_head_holds_the_queue_up_only_briefly(
    provider: Provider, db_url: str, table: str, key: str
) -> None:
    """A waiter frozen at the head of the queue (PostgreSQL: handed the lock while frozen)
    holds up the waiters behind it only until its place in the queue expires, not for its
    ttl; once it resumes, it does not believe it holds the lock and waits its turn again."""
    with provider.connect(table=table) as client:
        first = client.lock(key, ttl=60)
        assert first.acquire()
        frozen = worker("hold", db_url, table, key, "60", stdin=subprocess.PIPE)
        _waiters(client, key, 1)
        behind = worker("hold", db_url, table, key, "60", stdin=subprocess.PIPE)
        try:
            assert frozen.stdin is not None and behind.stdin is not None
            # both queued before the head freezes: a worker that took longer than the head's
            # place lasts (9 s) to start found that place expired, never 2 waiters (CI)
            _waiters(client, key, 2)
            # stopped before the release hands it the lock: kill() returns before every
            # thread has stopped, and an async worker's loop thread took the hand-over (CI)
            freeze_between_operations(client, key, frozen.pid)
            first_token = first.token
            assert first_token is not None
            first_owner = first.owner
            first.release()
            if provider.has("handover"):  # handed over to the frozen head
                handed = client.info(key)
                assert handed is not None and handed.owner not in (first_owner, None)
            line = _line(behind, 25)  # the frozen head's place lasts at most 9 s
            assert line is not None, "the waiter behind a frozen head never got the lock"
            held = json.loads(line)
            assert held["token"] > first_token
            info = client.info(key)
            assert info is not None and info.owner == held["owner"]
            os.kill(frozen.pid, signal.SIGCONT)
            assert _line(frozen, 2) is None, "the resumed waiter claims a lock held by another"
            behind.stdin.write("go\n")
            behind.stdin.flush()
            assert json.loads(_line(behind, 10) or "{}") == {"renew": "ok", "release": "ok"}
            line = _line(frozen, 25)
            assert line is not None, "the resumed waiter never got its turn"
            assert json.loads(line)["token"] > held["token"]
            frozen.stdin.write("go\n")
            frozen.stdin.flush()
            assert json.loads(_line(frozen, 10) or "{}") == {"renew": "ok", "release": "ok"}
        finally:
            finish(frozen)
            finish(behind)


def test_ten_processes_create_the_schema_at_once(db_url: str, table: str) -> None:
    start_at = str(time.time() + 1.5)
    workers = [worker("schema", db_url, table, start_at) for _ in range(10)]
    outputs = [w.communicate(timeout=60)[0] for w in workers]
    assert [w.returncode for w in workers] == [0] * 10
    assert outputs == ["ok\n"] * 10
