"""Fair locks, read-write locks and semaphores on every backend, across processes."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import dblock
from dblock._engine import QUEUE_TTL
from dblock.stores._names import aux_name
from tests._internals import store_call
from tests._waiting import until
from tests._worker import start
from tests.providers import Provider

pytestmark = pytest.mark.slow


def spawn(*args: str) -> subprocess.Popen[str]:
    return start(*args)


def finish(procs: list[subprocess.Popen[str]], timeout: float = 120) -> list[str]:
    outs = []
    for proc in procs:
        try:
            outs.append(proc.communicate(timeout=timeout)[0].strip())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return outs


def queued(provider: Provider, table: str, key: str) -> int:
    """Live queue entries of ``key``, read straight from the holders table."""
    conn = provider.raw()
    try:
        cur = conn.cursor()
        q, mark = provider.q, provider.mark
        cur.execute(
            f"SELECT count(*) FROM {q}{aux_name(table, '_holders')}{q} "
            f"WHERE lock_key = {mark} AND waiting = 1",
            (key,),
        )
        return int(cur.fetchone()[0])
    finally:
        conn.close()


def overlaps(intervals: list[tuple[int, int]]) -> int:
    """The largest number of intervals open at one moment."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = current = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


# -- fair ---------------------------------------------------------------------------------
# serial where waiters wait at a doorbell: on MySQL a waiter whose wait at the bell outlasts
# RING_WAIT lines up again behind later arrivals (docs/stores/mysql.md), so a loaded machine
# reorders them
@pytest.mark.serial_where("bell")
@pytest.mark.needs("FairQueue", "processes", "sql")
def test_fair_waiters_acquire_in_the_order_they_started_waiting(
    provider: Provider, db_url: str, table: str, key: str
) -> None:
    with provider.connect(table=table) as client:
        holder = client.lock(key, fair=True)
        holder.acquire()
        procs = []
        for idx in range(5):
            procs.append(spawn("fair", db_url, table, key, str(idx), "60"))
            until(
                lambda n=idx + 1: queued(provider, table, key) == n, f"{idx + 1} waiters queue", 30
            )
        holder.release()
        outs = finish(procs)
    order = [int(idx) for idx, _ in sorted((o.split() for o in outs), key=lambda p: int(p[1]))]
    assert order == [0, 1, 2, 3, 4]


# serial where waiters wait at a doorbell, as the test above: there they wait past the dead
# head's entry (up to 9 s), and a loaded machine reordered them on mysql-async in two of five
# CI runs
@pytest.mark.serial_where("bell")
@pytest.mark.needs("FairQueue", "processes", "sql")
def test_a_killed_waiter_does_not_stall_the_queue(
    provider: Provider, db_url: str, table: str, key: str
) -> None:
    with provider.connect(table=table) as client:
        holder = client.lock(key, fair=True)
        holder.acquire()
        doomed = spawn("fair", db_url, table, key, "0", "60")
        until(lambda: queued(provider, table, key) == 1, "a waiter queues", 30)
        procs = []
        for idx in (1, 2):
            procs.append(spawn("fair", db_url, table, key, str(idx), str(QUEUE_TTL + 30)))
            until(
                lambda n=idx + 1: queued(provider, table, key) == n, f"{idx + 1} waiters queue", 30
            )
        doomed.send_signal(signal.SIGKILL)
        finish([doomed])
        holder.release()
        outs = finish(procs)
    assert [o.split()[0] for o in sorted(outs, key=lambda o: int(o.split()[1]))] == ["1", "2"]


@pytest.mark.needs("FairQueue")
@pytest.mark.parametrize("fair", [True, False])
def test_a_newcomer_does_not_barge_past_waiters(
    client: dblock.Client, key: str, fair: bool
) -> None:
    holder = client.lock(key, fair=fair)
    holder.acquire()
    store_call(client, "enqueue", key, "someone-waiting", "lock", 30)
    holder.release()
    assert not client.lock(key, fair=fair).acquire(blocking=False)
    store_call(client, "dequeue", key, "someone-waiting")
    assert client.lock(key, fair=fair).acquire(blocking=False)


@pytest.mark.needs("FairQueue")
@pytest.mark.parametrize("fair", [True, False])
def test_a_waiter_whose_ttl_is_shorter_than_its_wait_keeps_its_place(
    client: dblock.Client, key: str, fair: bool
) -> None:
    """A queue entry lives by its waiter's refreshes, not by the lock's ttl: a waiter with a
    2 s ttl that waits over 4 s (past a refresh) is served before one that came 2 s later.
    (Where the entry expired with the ttl, the later waiter would delete it and go first;
    the later one's ttl is long, so that the first cannot do the same to it. With a 1 s ttl
    a loaded machine's late hand-over notice left too little of the lease to confirm, ended
    it, and queued the first afresh: ci3 saw the second served first.)"""
    order: list[str] = []
    holder = client.lock(key, ttl=30)
    holder.acquire()

    def wait(name: str, ttl: float) -> None:
        lock = client.lock(key, ttl=ttl, fair=fair)
        if lock.acquire(timeout=60):
            order.append(name)
            lock.release()

    first = threading.Thread(target=wait, args=("first", 2))
    first.start()
    time.sleep(2)
    second = threading.Thread(target=wait, args=("second", 30))
    second.start()
    time.sleep(2.5)
    holder.release()
    first.join(90)
    second.join(90)
    assert order == ["first", "second"]


# -- read-write ---------------------------------------------------------------------------
@pytest.mark.needs("SharedHolds", "processes")
def test_readers_overlap_and_writers_are_alone(
    provider: Provider, db_url: str, table: str, key: str, tmp_path: Path
) -> None:
    provider.connect(table=table).close()
    log = tmp_path / "log"
    procs = [spawn("rw", db_url, table, key, "read", "0.3", "4", str(log)) for _ in range(3)]
    procs += [spawn("rw", db_url, table, key, "write", "0.05", "4", str(log)) for _ in range(2)]
    finish(procs)
    holds = [line.split() for line in log.read_text().splitlines()]
    assert len(holds) == 20
    reads = [(int(s), int(e)) for mode, s, e in holds if mode == "read"]
    writes = [(int(s), int(e)) for mode, s, e in holds if mode == "write"]
    assert overlaps(reads) >= 2, "readers never held at the same time"
    for ws, we in writes:
        for mode, s, e in holds:
            if (int(s), int(e)) != (ws, we):
                assert int(e) <= ws or we <= int(s), f"a writer overlapped a {mode}er"


@pytest.mark.needs("SharedHolds", "processes")
def test_a_stream_of_readers_does_not_starve_a_writer(
    provider: Provider, db_url: str, table: str, key: str, tmp_path: Path
) -> None:
    provider.connect(table=table).close()
    log = tmp_path / "log"
    readers = [spawn("rw", db_url, table, key, "read", "0.4", "15", str(log)) for _ in range(3)]
    time.sleep(1.5)  # the readers' holds now overlap continuously
    writer = spawn("rw", db_url, table, key, "write", "0.05", "1", str(log))
    finish([writer, *readers])
    holds = [line.split() for line in log.read_text().splitlines()]
    write_start = next(int(s) for mode, s, _ in holds if mode == "write")
    last_read_end = max(int(e) for mode, _, e in holds if mode == "read")
    assert write_start < last_read_end, "the writer waited until every reader had finished"


@pytest.mark.needs("SharedHolds")
def test_rwlock_kinds_tokens_and_release(client: dblock.Client, key: str) -> None:
    rw = client.rwlock(key, ttl=10)
    with rw.read_lock() as r1, rw.read_lock() as r2:
        assert r1.token is not None and r2.token is not None and r2.token > r1.token
        read_token = r2.token
        assert [i.kind for i in client.list(key)] == ["read", "read"]
        assert not rw.write_lock().acquire(blocking=False)
    with rw.write_lock() as w:
        assert w.token is not None and w.token > read_token
        assert [i.kind for i in client.list(key)] == ["write"]
        assert not rw.read_lock().acquire(blocking=False)
    assert client.list(key) == []


@pytest.mark.needs("exact_ttl")  # a sub-second lease, or its exact length
@pytest.mark.needs("SharedHolds")
def test_reader_holds_expire_independently(client: dblock.Client, key: str) -> None:
    rw = client.rwlock(key, ttl=30)
    short = client.rwlock(key, ttl=0.3).read_lock()
    short.acquire()
    long = rw.read_lock()
    long.acquire()
    time.sleep(0.6)
    assert [i.owner for i in client.list(key)] == [long.owner]
    with pytest.raises(dblock.LockLost):
        short.release()
    long.renew()
    long.release()


# -- semaphore ----------------------------------------------------------------------------
@pytest.mark.needs("SharedHolds", "processes")
def test_semaphore_of_three_with_six_processes(
    provider: Provider, db_url: str, table: str, key: str, tmp_path: Path
) -> None:
    provider.connect(table=table).close()
    log, meet = tmp_path / "log", tmp_path / "meet"
    meet.mkdir()
    args = ("3", "0.3", "3", str(log), str(meet), "6")  # the 6 start together
    finish([spawn("sem", db_url, table, key, *args) for _ in range(6)])
    holds = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    assert len(holds) == 18
    assert overlaps(holds) == 3  # never more, and the limit is reached


@pytest.mark.needs("SharedHolds", "processes")
def test_a_killed_holders_permit_comes_back_after_its_ttl(
    provider: Provider, db_url: str, table: str, key: str
) -> None:
    with provider.connect(table=table) as client:
        dead = spawn("sem_hold", db_url, table, key, "2", "2")
        try:
            assert dead.stdout is not None
            int(dead.stdout.readline())
            dead.send_signal(signal.SIGKILL)
        finally:
            finish([dead])
        first = client.semaphore(key, 2)
        assert first.acquire(blocking=False)
        second = client.semaphore(key, 2)
        assert not second.acquire(blocking=False), "the dead holder's permit came back early"
        dead_hold = next(i for i in client.list(key) if i.owner != first.owner)
        assert second.acquire(timeout=20)
        mine = next(i for i in client.list(key) if i.owner == second.owner)
        assert mine.acquired_at >= dead_hold.expires_at
        second.release()
        first.release()


@pytest.mark.needs("SharedHolds")
def test_semaphore_validation_and_release(client: dblock.Client, key: str) -> None:
    with pytest.raises(ValueError):
        client.semaphore(key, 0)
    with pytest.raises(TypeError):
        client.semaphore(key, 1.5)  # type: ignore[arg-type]
    sem = client.semaphore(key, 2)
    with sem, sem:  # one thread may take two permits
        assert len(client.list(key)) == 2
        assert not client.semaphore(key, 2).acquire(blocking=False)
        assert client.semaphore(key, 3).acquire(blocking=False)  # its own, larger limit
    assert client.force_release(key)  # frees the permit taken with permits=3
    assert client.list(key) == []
    with pytest.raises(dblock.NotHeld):
        sem.release()
