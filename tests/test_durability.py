"""What waits for the disk: every acquisition does, a release that only frees the lock doesn't.

A release issues no token, and the commit of any later acquisition, which waits for the disk,
makes the release durable first (the log is written in order); a crash may undo only the
latest releases, which leaves their locks held until their leases end. A token a waiter is
handed is on disk before the waiter has it.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import dblock
from tests._private_servers import SLOW_MS, PrivateServer, private_mariadb, private_postgresql
from tests._servers import POSTGRESQL_URL, raw_connect
from tests._waiting import until
from tests.conformance.test_processes import finish, worker

PAIRS = 200


def _wal_syncs(conn: object) -> int:
    """The server's count of WAL flushes to disk, once it has stopped moving."""
    last = -1
    for _ in range(50):
        row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()  # type: ignore[attr-defined]
        if row[0] == last:
            return int(last)
        last = row[0]
        time.sleep(0.3)
    return int(last)


def test_postgresql_acquisitions_wait_for_the_disk_and_quiet_releases_do_not(
    pg_table: str,
) -> None:
    observer = raw_connect(POSTGRESQL_URL)
    counted = []
    try:
        # other sessions' flushes only add to the count (a session that stays open reports
        # its last second's counts up to 10 s late), so a noisy try is repeated
        for _ in range(3):
            with dblock.connect(POSTGRESQL_URL, table=pg_table) as client:
                lock = client.lock("k", ttl=30)
                lock.acquire()
                lock.release()
                before = _wal_syncs(observer)
                for _ in range(PAIRS):
                    lock.acquire()
                    lock.release()
            # the client's sessions have ended, so their statistics have reached the server
            counted.append(_wal_syncs(observer) - before)
            if counted[-1] < PAIRS * 1.5:
                break
    finally:
        observer.close()
    # one flush per acquisition; durable releases would double it
    assert PAIRS <= counted[-1] < PAIRS * 1.5, counted


def test_postgresql_a_lazy_release_is_seen_at_once_by_others(pg_table: str) -> None:
    with (
        dblock.connect(POSTGRESQL_URL, table=pg_table) as a,
        dblock.connect(POSTGRESQL_URL, table=pg_table) as b,
    ):
        first = a.lock("k", ttl=30)
        second = b.lock("k", ttl=30)
        for _ in range(20):
            assert first.acquire(blocking=False)
            token = first.token
            first.release()
            assert second.acquire(blocking=False)
            assert second.token is not None and token is not None and second.token > token
            second.release()


def test_sqlite_release_relaxes_sync_for_its_own_commit_only(tmp_path: Path) -> None:
    with dblock.connect(f"sqlite:///{tmp_path}/locks.sqlite3", table="t") as client:
        lock = client.lock("k", ttl=30)
        lock.acquire()
        lock.release()
        backend = client._store
        conn = backend._checkout()  # the pool's one connection
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        backend._checkin(conn)
        for _ in range(3):
            lock.acquire()
            lock.release()
        lock.acquire()
        conn.set_trace_callback(None)
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        lock.release()

    mode, released, written = "FULL", 0, 0
    for sql in statements:
        words = sql.split()
        if words[:2] == ["PRAGMA", "synchronous"]:
            mode = words[-1]
        elif sql.startswith("UPDATE") and "SET owner = NULL" in sql:
            assert mode == "NORMAL", sql
            released += 1
        elif sql.startswith(("INSERT", "UPDATE")):
            assert mode == "FULL", sql  # an acquisition waits for the disk
            written += 1
    assert (released, mode) == (3, "FULL")
    assert written >= 4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("slow_ms", "waiter_query", "gated"),
    [(SLOW_MS, "", True), (1500, "?read_timeout=3", False)],
    ids=["through-the-gate", "gate-wait-runs-out"],
)
def test_mysql_a_handed_over_token_survives_the_server_dying_as_the_waiter_gets_it(
    tmp_path: Path, slow_ms: int, waiter_query: str, gated: bool
) -> None:
    """InnoDB lets other sessions read a commit before it has written it to its log. A waiter
    woken by a hand-over that took the lock from such a read could be left, after a crash,
    holding a token the database no longer knows, and would see it issued again (a hold and a
    token the server restart undid). A waiter whose wait at the gate runs out first (a third
    of its read timeout: 1 s) must not take the hand-over it reads: it takes the lock again
    with a commit of its own."""
    with private_mariadb(tmp_path) as db:
        held, handed, note = _crash_as_the_waiter_gets_it(db, slow_ms, waiter_query)
    # handed over; or handed over, then taken again by the waiter's own write
    assert handed == held + (1 if gated else 2)
    assert note == (str(held) if gated else None), "the hold on disk came by a hand-over"


@pytest.mark.slow
def test_postgresql_a_handed_over_token_survives_the_server_dying_as_the_waiter_gets_it() -> None:
    """PostgreSQL shows a commit to other sessions, and sends its NOTIFY, only once it is on
    disk (dblock's token-issuing statements commit with synchronous_commit=on)."""
    with private_postgresql() as db:
        held, handed, _ = _crash_as_the_waiter_gets_it(db, SLOW_MS, "")
    assert handed == held + 1


def _crash_as_the_waiter_gets_it(
    db: PrivateServer, slow_ms: int, waiter_query: str
) -> tuple[int, int, str | None]:
    """A holder that waited for the lock (on MySQL it keeps the key's bell) releases it to a
    waiter in another process while each log write waits ``slow_ms``; the server is killed
    the moment the waiter has the lock, and started again. Checks that the hold the waiter
    was told of is the one on disk, and that the next token is higher; returns the holder's
    token, the waiter's, and the lease row's ``note``."""
    key = "k"
    raw = raw_connect(db.url)
    cur = raw.cursor()
    cur.execute("CREATE TABLE slow_check (id INT PRIMARY KEY)")
    with db.slow_redo(slow_ms):
        started = time.monotonic()
        cur.execute("INSERT INTO slow_check VALUES (1)")
        assert time.monotonic() - started >= slow_ms / 1000 * 0.9, "commits wait for the log"

    with dblock.connect(db.url) as client:
        first, holder = client.lock(key, ttl=30), client.lock(key, ttl=30)
        assert first.acquire()
        # the holder waits for the lock; it releases in the thread that acquired (a hold is
        # its thread's)
        tokens: list[int | None] = []
        release = threading.Event()
        holding = threading.Thread(target=_hold_until, args=(holder, release, tokens), daemon=True)
        holding.start()
        until(lambda: _queued(cur, 1), "the holder-to-be waits")
        first.release()
        until(lambda: bool(tokens), "the holder has the lock")
        held = tokens[0]
        assert held is not None

        url = db.url + waiter_query
        waiter = worker("hold", url, "dblock_locks", key, "2", stdin=subprocess.PIPE)
        try:
            until(lambda: _queued(cur, 1), "the waiter waits")
            time.sleep(0.5)  # asleep (MySQL: at the bell)
            with db.slow_redo(slow_ms):
                release.set()
                assert waiter.stdout is not None
                ready, _, _ = select.select([waiter.stdout], [], [], 15)
                assert ready, "the waiter never got the lock"
                db.kill()
                told = json.loads(waiter.stdout.readline())
                handed, waiter_owner = told["token"], told["owner"]
            holding.join(15)
        finally:
            finish(waiter)
    raw.close()

    db.start()
    raw = raw_connect(db.url)
    cur = raw.cursor()
    cur.execute("SELECT owner, token, note FROM dblock_locks WHERE lock_key = %s", (key,))
    owner, token, note = cur.fetchone()
    raw.close()
    assert (owner, token) == (waiter_owner, handed), "the hold the waiter had is on disk"
    with dblock.connect(db.url) as client:
        after = client.lock(key, ttl=30)
        assert after.acquire(timeout=10)  # once the waiter's 2 s lease has ended
        assert after.token is not None and after.token > handed
    return held, handed, note


def _queued(cur: Any, n: int) -> bool:
    cur.execute("SELECT count(*) FROM dblock_locks_holders WHERE waiting = 1")
    return int(cur.fetchone()[0]) >= n


def _hold_until(lock: dblock.Lock, release: threading.Event, tokens: list[int | None]) -> None:
    """Acquire, tell the token, release once told to (the server may be killed meanwhile)."""
    assert lock.acquire(timeout=15)
    tokens.append(lock.token)
    release.wait(30)
    with contextlib.suppress(dblock.BackendError, dblock.LockLost):
        lock.release()
