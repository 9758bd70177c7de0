"""What waits for the disk: every acquisition does, a release that only frees the lock doesn't.

A release issues no token, and the commit of any later acquisition, which waits for the disk,
makes the release durable first (the log is written in order); a crash may undo only the
latest releases, which leaves their locks held until their leases end. A token a waiter is
handed is on disk before the waiter has it.
"""

from __future__ import annotations

import time

import pytest

import dblock
from tests._private_servers import SLOW_MS, private_postgresql
from tests._servers import POSTGRESQL_URL, raw_connect
from tests.stores._durability import crash_as_the_waiter_gets_it

# serial: pg_stat_wal counts the whole server's flushes
pytestmark = pytest.mark.serial

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


@pytest.mark.slow
def test_postgresql_a_handed_over_token_survives_the_server_dying_as_the_waiter_gets_it() -> None:
    """PostgreSQL shows a commit to other sessions, and sends its NOTIFY, only once it is on
    disk (dblock's token-issuing statements commit with synchronous_commit=on)."""
    with private_postgresql() as db:
        held, handed, _ = crash_as_the_waiter_gets_it(db, SLOW_MS, "")
    assert handed == held + 1
