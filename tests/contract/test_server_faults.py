"""Connections killed from the server side (providers with "server": pg_terminate_backend,
MariaDB KILL).

A table lease pins no connection, so killing connections loses nothing by itself: the client
reconnects on the next call and the hold is still there. What the client must never do is
report a hold it no longer has.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

import dblock
from tests._internals import store_of
from tests.providers import Provider

pytestmark = pytest.mark.needs("server")


def test_client_recovers_after_its_connections_are_killed(
    provider: Provider, table: str, key: str
) -> None:
    with provider.connect(table=table) as client:
        lock = client.lock(key, ttl=30)
        assert lock.acquire()
        token = lock.token
        assert provider.kill_sessions(client) >= 1
        lock.renew()  # on a fresh connection, no error for the user
        info = client.info(key)
        assert info is not None and info.token == token
        assert provider.kill_sessions(client) >= 1
        lock.release()
        assert client.info(key) is None
        assert provider.kill_sessions(client) >= 1
        assert lock.acquire(blocking=False)
        assert lock.token is not None and token is not None and lock.token > token
        lock.release()


def test_after_kills_and_expiry_the_client_never_claims_a_lost_hold(
    provider: Provider, table: str, key: str
) -> None:
    with (
        provider.connect(table=table) as client,
        provider.connect(table=table) as rival,
    ):
        lock = client.lock(key, ttl=0.5)
        lock.acquire()
        provider.kill_sessions(client)
        time.sleep(0.8)
        taker = rival.lock(key, ttl=30)
        assert taker.acquire(blocking=False)
        assert not lock.held
        provider.kill_sessions(client)
        with pytest.raises(dblock.LockLost):
            lock.renew()
        with pytest.raises(dblock.LockLost):
            lock.release()  # still lost: the with-statement's release must say so too
        with pytest.raises(dblock.NotHeld):
            lock.release()
        info = client.info(key)
        assert info is not None and info.owner == taker.owner
        taker.release()


def test_auto_renew_survives_killed_connections(provider: Provider, table: str, key: str) -> None:
    lost = threading.Event()
    with provider.connect(table=table) as client:
        lock = client.lock(key, ttl=0.9, auto_renew=True, on_lost=lambda _l: lost.set())
        lock.acquire()
        for _ in range(4):
            provider.kill_sessions(client)
            time.sleep(0.4)
        assert not lost.is_set()
        assert lock.held
        lock.release()


def test_waiter_still_wakes_after_its_connections_are_killed(
    provider: Provider, table: str, key: str
) -> None:
    """Kills every session of the test client, including a LISTEN connection if it has one."""
    app = "dblock-test-" + uuid.uuid4().hex[:8]
    with (
        provider.connect(table=table, url=provider.tagged(app)) as client,
        provider.connect(table=table) as holder_client,
    ):
        holder = holder_client.lock(key, ttl=30)
        holder.acquire()
        got = threading.Event()

        def wait() -> None:
            if client.lock(key).acquire(timeout=30):
                got.set()

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.5)
        provider.kill_tagged(client, app)
        time.sleep(0.3)
        holder.release()
        thread.join(40)
        assert got.is_set()


def test_a_failed_release_stops_renewal_so_the_lease_lapses(
    provider: Provider, table: str, key: str
) -> None:
    """The caller wanted it released: if the database cannot be told, the lease must not be
    kept alive by the background renewal for as long as the process lives."""
    with (
        provider.connect(table=table) as client,
        provider.connect(table=table) as rival,
    ):
        lock = client.lock(key, ttl=1.0, auto_renew=True)
        lock.acquire()
        backend = store_of(client)
        real_release = backend.release

        def unreachable(*_args: object) -> bool:
            raise dblock.BackendError("simulated: the database is unreachable", key=key)

        backend.release = unreachable  # the fault seam only: the database itself stays real
        try:
            with pytest.raises(dblock.BackendError):
                lock.release()
        finally:
            backend.release = real_release
        # the rival gets the key once the unrenewed lease has run out (1 s), not never
        assert rival.lock(key).acquire(timeout=10)
        with pytest.raises(dblock.LockLost):
            lock.release()  # the retry learns that the lease lapsed
