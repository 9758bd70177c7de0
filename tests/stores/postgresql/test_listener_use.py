"""PostgreSQL signals every listening backend of the database at every NOTIFY, whatever its
channel, and each such backend runs a transaction to read it. So a client's listener listens
only while a waiter, watch or observer of that client needs it (and a moment after, for a
client that waits again at once): a fleet of clients that each waited once costs nothing at
the next NOTIFY, though their connections stay open until the listener's idle close.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest

import dblock
from dblock.stores.postgresql.store import PostgresStore
from tests import _worker
from tests._servers import POSTGRESQL_URL, raw_connect
from tests._waiting import until

WAITERS = 6


def _listening(inspect: Any, backend: PostgresStore) -> int:
    """Backends whose last statement made them listen on the table's channel (a listener
    that stopped listening last ran UNLISTEN)."""
    row = inspect.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE %s",
        (f'LISTEN "{backend.channel}"%',),
    ).fetchone()
    return int(row[0])


@pytest.mark.parametrize("client_kind", ["sync", "async"])
def test_clients_that_waited_once_stop_listening_at_once_and_were_served_in_order(
    pg_store: tuple[dblock.Client, PostgresStore, str], client_kind: str, monkeypatch: Any
) -> None:
    client, backend, table = pg_store
    if client_kind == "async":
        monkeypatch.setenv("DBLOCK_TEST_CLIENT", "async")
    key = "k-" + uuid.uuid4().hex
    inspect = raw_connect(POSTGRESQL_URL)
    holder = client.lock(key, ttl=60)
    assert holder.acquire(blocking=False)
    workers = []
    try:
        for idx in range(WAITERS):  # one at a time: the queue's order is the start order
            w = _worker.start("turn", POSTGRESQL_URL, table, key, str(idx), "0.05", "30")
            workers.append(w)
            assert w.stdout is not None
            assert w.stdout.readline().strip() == "queued"
            until(lambda n=idx + 1: len(backend.waiters(key)) == n, f"{idx + 1} waiters queue", 30)
        assert _listening(inspect, backend) == WAITERS  # each waiting client listens
        holder.release()
        turns = []
        for w in workers:
            assert w.stdout is not None
            idx, token, acquired, released = w.stdout.readline().split()
            turns.append((int(idx), int(token), float(acquired), float(released)))
        # every client is still open (for 30 s), none waits: none listens any more (before,
        # each listened on until its listener's idle close, 10 s after its last wait)
        until(lambda: _listening(inspect, backend) == 0, "none listens", 3.0)
        assert all(w.poll() is None for w in workers)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.communicate()
        inspect.close()
    turns.sort(key=lambda t: t[1])
    assert [t[0] for t in turns] == list(range(WAITERS))  # first come, first served
    for before, after in itertools.pairwise(turns):
        assert after[2] >= before[3] - 0.01


def test_a_listener_stops_listening_when_its_last_waiter_goes_and_listens_again_for_the_next(
    pg_store: tuple[dblock.Client, PostgresStore, str],
) -> None:
    _client, backend, _table = pg_store
    inspect = raw_connect(POSTGRESQL_URL)
    try:
        sub = backend.subscribe("k1", "owner-1")
        assert sub.live
        assert _listening(inspect, backend) == 1
        sub.close()
        until(lambda: _listening(inspect, backend) == 0, "it stops listening", 3.0)
        again = backend.subscribe("k1", "owner-2")
        assert again.live
        assert _listening(inspect, backend) == 1
        # it hears what it listens for: a release's ring of its waiter's key
        inspect.execute("SELECT pg_notify(%s, %s)", (backend.channel, "owner-2 k1"))
        assert again.wait(5.0)
        again.close()
    finally:
        inspect.close()
