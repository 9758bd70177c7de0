"""PostgreSQL signals every listening backend of the database at every NOTIFY, whatever its
channel, and each such backend runs a transaction to read it. So a plain lock's waiters behind
a crowd do not listen: each sleeps at the key's doorbell (doorbell.py); and a client's
listener (for the others, watches and observers) listens only while one of them needs it (and
a moment after, for a client that waits again at once).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import dblock
from dblock.stores.postgresql.store import PostgresStore
from tests import _pg_crowd
from tests._servers import POSTGRESQL_URL, raw_connect
from tests._waiting import until
from tests.stores.postgresql._bells import turns, waiters_in_line

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
@pytest.mark.parametrize("crowd", ["dblock's", "the suite's"])
def test_waiting_clients_listen_only_below_the_crowd_and_are_served_in_order(
    pg_store: tuple[dblock.Client, PostgresStore, str],
    client_kind: str,
    crowd: str,
    monkeypatch: Any,
) -> None:
    """Six clients wait for a lock taken without waiting. Below dblock's own threshold
    (CROWD), each listens, and once done none does any more. At doorbells (the suite's
    threshold: tests/_pg_crowd.py), none listens, so the six hand-offs signal nobody: the
    first waiter has the key's bell and looks at the lock, the other five sleep at it. First
    come, first served either way."""
    backend = pg_store[1]
    at_bell = crowd == "the suite's"
    if not at_bell:
        _pg_crowd.dblocks_own(monkeypatch)
    if client_kind == "async":
        monkeypatch.setenv("DBLOCK_TEST_CLIENT", "async")
    with waiters_in_line(pg_store, WAITERS, at_bell=at_bell) as (holder, workers, inspect):
        assert _listening(inspect, backend) == (0 if at_bell else WAITERS)
        holder.release()
        served = turns(workers)
        # every client is still open (for 30 s), none waits: none listens any more
        until(lambda: _listening(inspect, backend) == 0, "none listens", 3.0)
        assert all(w.poll() is None for w in workers)
    assert [t[0] for t in served] == list(range(WAITERS))  # first come, first served
    for before, after in itertools.pairwise(served):
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
