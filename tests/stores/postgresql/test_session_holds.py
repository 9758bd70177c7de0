"""PostgreSQL session holds (``ttl=None``) from the inside: the advisory lock's key, the
connections set aside for holds, and the lease statements' try-lock
(stores/postgresql/session.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import dblock
from dblock.stores.postgresql.store import PostgresStore
from tests._internals import store_of
from tests._servers import POSTGRESQL_URL, raw_connect


def _backend(client: dblock.Client) -> PostgresStore:
    backend = store_of(client)
    assert isinstance(backend, PostgresStore)
    return backend


def _session_acquires_waiting(raw: Any) -> int:
    """Session acquires waiting in the server's queue for an advisory lock now."""
    return int(
        raw.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND wait_event = 'advisory' AND query LIKE %s",
            ("%dblock_session_take%",),
        ).fetchone()[0]
    )


def test_a_lease_statement_cannot_take_the_try_lock_of_a_held_key(pg_table: str) -> None:
    with dblock.connect(POSTGRESQL_URL, table=pg_table) as client:
        sql = _backend(client).sql
        raw = raw_connect(POSTGRESQL_URL)
        try:
            probe = f"SELECT pg_try_advisory_xact_lock({sql.advisory_key})"
            with client.lock("k", ttl=None):
                assert raw.execute(probe, {"key": "k"}).fetchone()[0] is False
                assert raw.execute(probe, {"key": "k2"}).fetchone()[0] is True
            assert raw.execute(probe, {"key": "k"}).fetchone()[0] is True
        finally:
            raw.close()


def test_a_holds_connection_is_its_own_with_keepalives_and_dblocks_settings(
    pg_table: str,
) -> None:
    with dblock.connect(POSTGRESQL_URL, table=pg_table) as client:
        backend = _backend(client)
        with client.lock("k", ttl=None) as lock:
            assert lock.token is not None
            conn, pid = backend._sessions._conns["k", lock.owner, lock.token]
            assert conn not in backend._idle  # outside the pool
            assert pid == conn.info.backend_pid  # no pooler between
            settings = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]
                for name in ("tcp_user_timeout", "tcp_keepalives_idle", "synchronous_commit")
            }
            assert settings == {
                "tcp_user_timeout": "10000",
                "tcp_keepalives_idle": "3",
                "synchronous_commit": "on",
            }
        # kept for the next hold: the fast path opens no connection
        assert [kept for kept, _ in backend._sessions._idle] == [conn]
        with client.lock("k2", ttl=None) as again:
            assert again.token is not None
            assert backend._sessions._conns["k2", again.owner, again.token][0] is conn


def test_without_temp_privilege_the_grant_is_a_pipeline_of_two_statements(
    pg_table: str,
) -> None:
    """Where the connection cannot make the temporary grant function (TEMP revoked), the
    lock and the grant go as two statements in one pipeline, with the same outcome."""
    with dblock.connect(POSTGRESQL_URL, table=pg_table) as client:
        backend = _backend(client)
        backend.sql.session_function = "SELECT 1 / 0"  # as a refused CREATE would fail
        lock = client.lock("k", ttl=None)
        assert lock.acquire(timeout=5)
        (conn, _pid), *_ = backend._sessions._conns.values()
        assert backend._sessions._one_statement[id(conn)] is False
        with dblock.connect(POSTGRESQL_URL, table=pg_table) as other:
            assert not other.lock("k", ttl=10).acquire(timeout=0)
            assert not other.lock("k", ttl=None).acquire(timeout=0.2)
            first = lock.token
            lock.release()
            lease = other.lock("k", ttl=10)
            assert lease.acquire(timeout=0)
            assert not lock.acquire(timeout=0.2)  # stepped back by the live lease
            lease.release()
        assert lock.acquire(timeout=5)
        assert first is not None and lock.token is not None and lock.token > first
        lock.release()


def test_a_lease_committed_while_the_grant_waited_steps_it_back(pg_table: str) -> None:
    """The grant's look for a live lease runs after its lock wait, with a snapshot of its
    own: a lease committed while the session acquire waited in the server's queue keeps it
    from the key (a look with the statement's own snapshot, taken before the wait, would
    miss it and grant a second holder)."""
    with dblock.connect(POSTGRESQL_URL, table=pg_table) as client:
        sql = _backend(client).sql
        raw = raw_connect(POSTGRESQL_URL)
        try:
            raw.execute(f"SELECT pg_advisory_lock({sql.advisory_key})", {"key": "k"})
            outcome: list[bool] = []
            waiter = threading.Thread(
                target=lambda: outcome.append(client.lock("k", ttl=None).acquire(timeout=3))
            )
            waiter.start()
            deadline = time.monotonic() + 10
            while not _session_acquires_waiting(raw):
                assert time.monotonic() < deadline, "the session acquire never waited"
                time.sleep(0.01)
            with dblock.connect(POSTGRESQL_URL, table=pg_table) as other:
                lease = other.lock("elsewhere", ttl=30)
                assert lease.acquire(timeout=5)
                # the lease is the key's now, committed while the acquire waits (a lease
                # statement could not take the key's try-lock while ``raw`` holds it)
                raw.execute(f"UPDATE {sql.main} SET lock_key = 'k' WHERE lock_key = 'elsewhere'")
                raw.execute(f"SELECT pg_advisory_unlock({sql.advisory_key})", {"key": "k"})
                waiter.join(10)
                assert outcome == [False]
                info = client.info("k")
                assert info is not None and info.token == lease.token
        finally:
            raw.close()


def test_an_acquire_cancelled_as_the_server_grants_leaves_the_key_free(pg_table: str) -> None:
    """The grant is in the server (the reply in the client's socket) when the task is
    cancelled: the cancelled acquire gives the lock back before it returns. Closing its
    connection alone would free it only once the server process noticed and exited, and the
    next look (here a try at once) could come first."""

    async def scenario() -> bool:
        client = await dblock.connect_async(POSTGRESQL_URL, table=pg_table)
        raw = raw_connect(POSTGRESQL_URL)
        try:
            advisory = store_of(client).sql.advisory_key
            raw.execute(f"SELECT pg_advisory_lock({advisory})", {"key": "k"})
            task = asyncio.ensure_future(client.lock("k", ttl=None).acquire(timeout=10))
            deadline = time.monotonic() + 10
            while not _session_acquires_waiting(raw):
                assert time.monotonic() < deadline, "the session acquire never waited"
                await asyncio.sleep(0.01)
            # the loop does not run between these: the server grants, the reply waits in
            # the socket, and the task learns of its cancellation first
            raw.execute(f"SELECT pg_advisory_unlock({advisory})", {"key": "k"})
            time.sleep(0.05)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert task.cancelled()
            free = raw.execute(f"SELECT pg_try_advisory_lock({advisory})", {"key": "k"})
            return bool(free.fetchone()[0])
        finally:
            raw.close()
            await client.close()

    assert asyncio.run(scenario()), "the cancelled acquire's grant still held the key"
