"""What waits for the disk: every acquisition does, a release that only frees the lock doesn't.

A release issues no token, and the commit of any later acquisition, which waits for the disk,
makes the release durable first (the log is written in order); a crash may undo only the
latest releases, which leaves their locks held until their leases end. A token a waiter is
handed is on disk before the waiter has it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dblock
from tests._internals import store_of


def _statements(tmp_path: Path, hold: Callable[[dblock.Client], dblock.Lock]) -> list[str]:
    """The statements of three acquire-release pairs and an acquire of ``hold(client)`` (after
    a first pair), on the pool's one connection; it is back at FULL after the last release."""
    with dblock.connect(f"sqlite:///{tmp_path}/locks.sqlite3", table="t") as client:
        lock = hold(client)
        lock.acquire()
        lock.release()
        backend = store_of(client)
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
    return statements


def test_sqlite_release_relaxes_sync_for_its_own_commit_only(tmp_path: Path) -> None:
    statements = _statements(tmp_path, lambda client: client.lock("k", ttl=30))
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


def test_sqlite_release_many_relaxes_sync_for_its_own_commit_only(tmp_path: Path) -> None:
    """lock_many's grant waits for the disk; its release (one statement over the keys, in a
    transaction of its own) commits without waiting, as a single key's release does."""
    statements = _statements(tmp_path, lambda client: client.lock_many(["a", "b", "c"], ttl=30))
    mode, last, commits = "FULL", "", {"release": 0, "acquire": 0}
    for sql in statements:
        words = sql.split()
        if words[:2] == ["PRAGMA", "synchronous"]:
            mode = words[-1]
        elif sql.startswith("UPDATE") and "SET owner = NULL" in sql:
            last = "release"
        elif sql.startswith("INSERT"):
            last = "acquire"
        elif sql == "COMMIT":
            assert mode == ("NORMAL" if last == "release" else "FULL"), last
            commits[last] += 1
    assert commits == {"release": 3, "acquire": 4}
    assert mode == "FULL"
