"""PostgreSQL's doorbells (stores/postgresql/doorbell.py): a plain lock's waiters sleep in
``pg_advisory_lock`` on the key's bell, in the server's queue, and keep their place there
while they wake now and then; a holder that waited keeps the bell and its release lets go of
it. What a bell must never cost is exclusion; a lost or stuck bell costs time only."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from typing import Any

import pytest

import dblock
from dblock.stores.postgresql.store import PostgresStore
from tests import _worker
from tests._internals import store_of
from tests._servers import POSTGRESQL_URL, raw_connect
from tests._waiting import until
from tests._worker import freeze
from tests.stores.postgresql._bells import (
    at_the_bell,
    bell_holder_and_one_behind,
    finish,
    in_pg_locks,
    line,
    turns,
    waiters_in_line,
)

# alone, as MySQL's doorbell tests: they SIGSTOP and SIGKILL holders and time what follows;
# in the parallel run "the second waits at the kept bell" timed out once in four CI runs (why
# is not known: alone, and in three runs, the bell was kept)
pytestmark = pytest.mark.serial


def _bell_free(backend: PostgresStore, key: str) -> bool:
    """Nobody keeps ``key``'s doorbell (it is had, and let go of, by a connection of ours)."""
    c, o = backend._bells.lock_of(key)
    conn = raw_connect(POSTGRESQL_URL)
    try:
        had = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (c, o)).fetchone()
        if had and had[0]:
            conn.execute("SELECT pg_advisory_unlock(%s, %s)", (c, o))
        return bool(had and had[0])
    finally:
        conn.close()


def test_waiters_keep_their_place_at_the_bell_across_their_wake_ups(
    pg_store: tuple[dblock.Client, PostgresStore, str],
) -> None:
    """The lock is held for longer than a waiter sleeps between its tries and queue refreshes
    (about 4 s): each waiter's wait for the bell stays in the server's queue meanwhile
    instead of joining it again at its end, so they are served in the order they came."""
    backend = pg_store[1]
    with waiters_in_line(pg_store, 4, at_bell=True) as (holder, workers, inspect):
        time.sleep(9)  # every waiter has woken, tried and refreshed its entry at least once
        # the first has the bell; the others wait in line
        assert at_the_bell(inspect, backend, holder.key)() == 3
        holder.release()
        served = turns(workers)
    assert [t[0] for t in served] == [0, 1, 2, 3]


def test_a_sigkilled_bell_holder_frees_the_bell_and_its_lease_still_binds(
    pg_store: tuple[dblock.Client, PostgresStore, str],
) -> None:
    client = pg_store[0]
    key = "k-" + uuid.uuid4().hex
    with bell_holder_and_one_behind(pg_store, key, "4") as (doomed, held, behind, _inspect):
        lease = client.info(key)
        assert lease is not None and lease.owner == held["owner"]
        doomed.send_signal(signal.SIGKILL)
        doomed.communicate(timeout=10)
        # the bell is free at once, but the dead holder's lease is not over
        got = line(behind, 30)
        assert got is not None, "the waiter behind never got the lock"
        taken = client.info(key)
        assert taken is not None and taken.owner == json.loads(got)["owner"]
        assert lease.expires_at is not None
        assert taken.acquired_at >= lease.expires_at, "taken before the dead one's lease ended"
        assert json.loads(got)["token"] > held["token"]


def test_a_sigstopped_bell_holder_holds_the_others_up_no_longer_than_its_lease(
    pg_store: tuple[dblock.Client, PostgresStore, str],
) -> None:
    client = pg_store[0]
    key = "k-" + uuid.uuid4().hex
    with bell_holder_and_one_behind(pg_store, key, "3") as (frozen, held, behind, _inspect):
        freeze(frozen.pid)
        stopped = time.monotonic()
        # the bell stays with the frozen holder; the waiter behind takes the lock once the
        # lease is over, on one of its tries
        got = line(behind, 20)
        assert got is not None, "the waiter behind a frozen bell holder never got the lock"
        assert time.monotonic() - stopped < 3 + 8
        taken = json.loads(got)
        assert taken["token"] > held["token"]
        frozen.send_signal(signal.SIGCONT)
        assert frozen.stdin is not None
        frozen.stdin.write("go\n")
        frozen.stdin.flush()
        assert json.loads(line(frozen, 10) or "{}") == {
            "renew": "LockLost",
            "release": "LockLost",
        }
        info = client.info(key)
        assert info is not None and info.owner == taken["owner"], "the resumed one took nothing"


@pytest.mark.parametrize("client_kind", ["sync", "async"])
def test_a_waiter_that_gives_up_leaves_the_bells_queue(
    pg_store: tuple[dblock.Client, PostgresStore, str], client_kind: str, monkeypatch: Any
) -> None:
    """Its statement is cancelled in the server: left there, it would get the bell later and
    take the lock for nobody, holding up the next waiter for a whole lease."""
    client, backend, table = pg_store
    if client_kind == "async":
        monkeypatch.setenv("DBLOCK_TEST_CLIENT", "async")
    key = "k-" + uuid.uuid4().hex
    inspect = raw_connect(POSTGRESQL_URL)
    holder = client.lock(key, ttl=60)
    assert holder.acquire(blocking=False)
    try:
        front = _worker.start("turn", POSTGRESQL_URL, table, key, "0", "0", "10")
        assert front.stdout is not None and front.stdout.readline().strip() == "queued"
        until(lambda: len(backend.waiters(key)) == 1, "the front queues", 30)
        quitter = _worker.start("fair", POSTGRESQL_URL, table, key, "q", "1.5")
        asleep = at_the_bell(inspect, backend, key)
        until(lambda: asleep() == 1, "the quitter waits at the bell", 30)
        assert (quitter.communicate(timeout=30)[0] or "").strip() == "q timeout"
        until(lambda: asleep() == 0, "its wait is gone from the server", 10)
        holder.release()
        assert line(front, 20) is not None
        time.sleep(0.5)
        assert client.info(key) is None, "nobody took the lock for the quitter"
    finally:
        finish(front)
        inspect.close()


def test_a_grant_its_acquire_cannot_use_is_ended_with_the_bell(
    pg_store: tuple[dblock.Client, PostgresStore, str],
) -> None:
    """A waiter's take at the bell, ended by its acquire before the wait is over (a grant it
    could not confirm): the release lets go of the bell too."""
    _client, backend, _table = pg_store
    key = "k-" + uuid.uuid4().hex
    token = backend.acquire_fair(key, "h", 30, queued=False)
    assert token is not None
    bell = backend.subscribe(key, "w", "lock")
    try:
        backend.enqueue(key, "w", "lock", 9.0, lease=30)
        assert bell.wait(5.0), "the first waiter gets the free bell at once"
        assert not _bell_free(backend, key)
        assert backend.release(key, "h", token)
        taken = backend.acquire_fair(key, "w", 30, queued=True)
        assert taken is not None
        assert backend.release(key, "w", taken)
        assert _bell_free(backend, key), "the release let go of the bell"
    finally:
        bell.close()
    assert _bell_free(backend, key)
    assert backend.info(key) is None


def test_a_holder_whose_bell_connection_the_server_killed_still_releases(
    pg_store: tuple[dblock.Client, PostgresStore, str],
) -> None:
    client, backend, table = pg_store
    key = "k-" + uuid.uuid4().hex
    first = client.lock(key, ttl=60)
    assert first.acquire(blocking=False)
    got: dict[str, Any] = {}
    go = threading.Event()

    def wait() -> None:
        with dblock.connect(POSTGRESQL_URL, table=table) as other:
            lock = other.lock(key, ttl=30)
            assert lock.acquire(timeout=20)
            got["token"] = lock.token
            go.wait(20)
            lock.release()  # its bell's connection is gone: the plain release
            got["released"] = True

    thread = threading.Thread(target=wait)
    thread.start()
    inspect = raw_connect(POSTGRESQL_URL)
    try:
        until(lambda: len(backend.waiters(key)) == 1, "the waiter queues", 30)
        first.release()
        until(lambda: "token" in got, "the waiter takes the lock", 20)
        where, params = in_pg_locks(backend, key)
        killed = inspect.execute(
            f"SELECT pg_terminate_backend(pid) FROM pg_locks WHERE {where} AND granted", params
        ).fetchall()
        assert killed == [(True,)], "the bell was kept with the hold"
        go.set()
        thread.join(20)
        assert got.get("released")
        assert client.info(key) is None
    finally:
        go.set()
        thread.join(20)
        inspect.close()


def test_a_waiter_slow_to_reach_the_bell_is_served_in_its_queue_order(
    pg_store: tuple[dblock.Client, PostgresStore, str],
) -> None:
    """A waiter's bell connection is ready before its queue entry is written: one that opened
    it only after queueing (slowly, a loaded machine) reached the bell behind a waiter that
    queued after it, which then went first (the contract's election order test saw
    candidates 20 ms apart served out of order). Now the service order is the queue's."""
    client, backend, table = pg_store
    key = "k-" + uuid.uuid4().hex
    inspect = raw_connect(POSTGRESQL_URL)
    holder = client.lock(key, ttl=60)
    assert holder.acquire(blocking=False)
    slow, quick = (dblock.connect(POSTGRESQL_URL, table=table) for _ in range(2))
    slow_store = store_of(slow)
    assert isinstance(slow_store, PostgresStore)
    opening = slow_store._bell_connection

    def opened_slowly() -> Any:
        time.sleep(1.0)
        return opening()

    slow_store._bell_connection = opened_slowly  # type: ignore[method-assign]
    served: list[str] = []
    threads_of: dict[str, str] = {}  # thread (as in an owner's name) -> waiter

    def wait(c: dblock.Client, name: str) -> None:
        threads_of[str(threading.get_ident())] = name
        with c.lock(key, ttl=30, timeout=30):
            served.append(name)

    waiters = ((slow, "slow"), (quick, "quick"))
    threads = [threading.Thread(target=wait, args=args) for args in waiters]
    try:
        threads[0].start()
        time.sleep(0.3)
        threads[1].start()
        # both queued, one has the bell (the holder has none) and the other waits for it
        until(lambda: len(backend.waiters(key)) == 2, "both queue", 30)
        until(lambda: at_the_bell(inspect, backend, key)() == 1, "one waits at the bell", 30)
        entries = sorted(backend.waiters(key), key=lambda w: w.acquired_at)
        order = [threads_of[w.owner.split(":")[2]] for w in entries]
        holder.release()
        for t in threads:
            t.join(30)
        assert served == order
    finally:
        for c in (slow, quick):
            c.close()
        inspect.close()
