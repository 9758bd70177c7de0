"""PostgreSQL hands a released lock to the head of its wait queue in the release statement,
where that waiter hears releases (one at a doorbell does not: test_doorbell.py).

These are the hand-over's own rules, checked on the backend statements (the other backends
free the lock and let the head take it, which the contract suite covers):
who gets it, that a waiter who gave up passes it on, that a waiter's refresh cannot undo it,
and that a waiter joining while the lock is released is never left asleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

import dblock
from dblock.stores.postgresql import doorbell
from dblock.stores.postgresql.store import PostgresStore
from tests._internals import store_of
from tests._servers import POSTGRESQL_URL, raw_connect

QUEUE_TTL = 9.0
T = TypeVar("T")


def _owner(client: dblock.Client, key: str) -> str | None:
    info = client.info(key)
    return None if info is None else info.owner


def _listen(backend: PostgresStore) -> Any:
    conn = raw_connect(POSTGRESQL_URL)
    conn.execute(f'LISTEN "{backend.channel}"')
    return conn


def _heard(conn: Any, wait: float = 2.0) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=wait, stop_after=1)]


def _blocked(call: Callable[[], T], unblock: Callable[[], None]) -> T:
    """Run ``call`` in a thread: still waiting (for a row lock) after 0.3 s, it must finish
    once ``unblock`` has run; its result."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    time.sleep(0.3)
    assert not out, "it did not wait for the row"
    unblock()
    thread.join(10)
    assert len(out) == 1, "it did not finish"
    return out[0]


def _held_by_a(backend: PostgresStore, *waiters: str, entry_ttl: float = QUEUE_TTL) -> int:
    """Key "k" held by "a", with ``waiters`` queued in that order (ttl 30); a's token.

    a takes it as a queued waiter would, so its release is the hand-over statement (a
    newcomer's release first tries a plain UPDATE: see the test of that below)."""
    token = backend.acquire_fair("k", "a", 30, queued=True)
    assert token is not None
    for waiter in waiters:
        backend.enqueue("k", waiter, "lock", entry_ttl, lease=30)
    return token


def test_release_hands_the_lock_to_the_head_of_the_queue(
    pg: tuple[dblock.Client, PostgresStore],
) -> None:
    client, backend = pg
    key = "k"
    token = _held_by_a(backend, "b", "c")
    listener = _listen(backend)
    try:
        assert backend.release(key, "a", token)
        heard = _heard(listener)
    finally:
        listener.close()
    info = client.info(key)
    assert info is not None and info.owner == "b", "the head of the queue holds it at once"
    assert info.token > token
    assert heard == [f"={info.token} b {key}"], "only the new holder is told, with its token"
    remaining = (info.expires_at - info.acquired_at).total_seconds()
    assert remaining <= QUEUE_TTL + 0.5, "no longer than the waiter's queue entry would live"
    # b's entry is gone with the hand-over, and b's refresh must not make it again
    assert not backend.requeue(key, "b", "lock", QUEUE_TTL)
    assert backend.probe(key, "c") == (False, 0), "c is next, behind nobody"
    # b holds it with the token it was told: its release hands it on to c
    assert backend.release(key, "b", info.token)
    assert _owner(client, key) == "c"


def test_a_waiter_that_gives_up_after_the_hand_over_passes_it_on(
    pg: tuple[dblock.Client, PostgresStore],
) -> None:
    client, backend = pg
    key = "k"
    token = _held_by_a(backend, "b", "c")
    assert backend.release(key, "a", token)
    assert _owner(client, key) == "b"
    backend.dequeue(key, "b")  # b timed out before it heard of the hand-over
    assert _owner(client, key) == "c"
    backend.dequeue(key, "c")
    assert client.info(key) is None, "with nobody left, the lock is free"
    assert client.lock(key).acquire(blocking=False)


def test_a_retried_release_after_a_hand_over_counts_as_released(
    pg: tuple[dblock.Client, PostgresStore],
) -> None:
    _client, backend = pg
    key = "k"
    token = _held_by_a(backend, "b")
    assert backend.release(key, "a", token)
    conn = raw_connect(POSTGRESQL_URL)
    try:
        row = conn.execute(backend.sql.released_by, {"key": key, "token": token}).fetchone()
        other = conn.execute(
            backend.sql.released_by, {"key": key, "token": token + 1000}
        ).fetchone()
    finally:
        conn.close()
    assert row is not None and row[0], "the row shows a handed it over"
    assert other is not None and not other[0]


def test_a_waiter_handed_an_expired_lease_queues_again(
    pg: tuple[dblock.Client, PostgresStore],
) -> None:
    client, backend = pg
    key = "k"
    token = _held_by_a(backend, "b", entry_ttl=0.5)  # b's entry lives 0.5 s
    assert backend.release(key, "a", token)
    info = client.info(key)
    assert info is not None and info.owner == "b"
    time.sleep(0.7)
    assert client.info(key) is None, "a frozen waiter holds it no longer than its entry"
    assert not backend.renew(key, "b", info.token, 30)


def test_a_join_while_the_lock_is_released_is_rung(
    pg: tuple[dblock.Client, PostgresStore],
) -> None:
    """The join commits while the release waits for the row: the release rings everyone."""
    _client, backend = pg
    key = "k"
    token = _held_by_a(backend)
    joiner = raw_connect(POSTGRESQL_URL)
    listener = _listen(backend)
    try:
        joiner.autocommit = False
        # channel None: b has no listener of its own, so notices for it go on the table's
        params = {"key": key, "kind": "lock", "owner": "b", "ttl": 30, "qttl": QUEUE_TTL}
        params.update(lease=30, channel=None, crowd=8)
        row = joiner.execute(backend.sql.acquire_or_enqueue, params).fetchone()
        assert row is not None and row[:2] == (None, False), "held: b joins the queue"
        # the release waits for the row b's join counted itself on
        assert _blocked(lambda: backend.release(key, "a", token), joiner.commit)
        heard = _heard(listener)
    finally:
        joiner.close()
        listener.close()
    assert heard == [f" {key}"], "the release could not see b's entry, so it rings everyone"
    assert backend.acquire_fair(key, "b", 30, queued=True) is not None


def test_a_join_that_waits_for_a_release_takes_the_lock(
    pg: tuple[dblock.Client, PostgresStore],
) -> None:
    """The release commits while the join waits for the row: the join takes the lock."""
    client, backend = pg
    key = "k"
    token = _held_by_a(backend)
    releaser = raw_connect(POSTGRESQL_URL)
    try:
        releaser.autocommit = False
        row = releaser.execute(
            backend.sql.release_and_hand_over, {"key": key, "owner": "a", "token": token}
        ).fetchone()
        assert row is not None
        # b's join sees the lock held, and waits for the row to count itself on it
        got = _blocked(lambda: backend.acquire_or_enqueue(key, "b", 30, QUEUE_TTL), releaser.commit)
    finally:
        releaser.close()
    assert got is not None and got > token, "b took the freed lock"
    assert _owner(client, key) == "b"
    conn = raw_connect(POSTGRESQL_URL)
    try:
        entries = conn.execute(
            f"SELECT count(*) FROM {backend.sql.holders} WHERE lock_key = %s", (key,)
        ).fetchone()
    finally:
        conn.close()
    assert entries == (0,), "and left no queue entry behind"


def test_a_join_that_started_before_the_release_takes_the_lock(
    pg: tuple[dblock.Client, PostgresStore],
) -> None:
    """b's join starts, then waits for the row; a's release runs after it started (so the
    freed row's time is later than the join's statement time) and commits: b takes the
    lock, instead of sleeping in a queue nobody will ring."""
    client, backend = pg
    key = "k"
    token = _held_by_a(backend)
    releaser = raw_connect(POSTGRESQL_URL)
    try:
        releaser.autocommit = False
        releaser.execute(f"SELECT 1 FROM {backend.sql.main} WHERE lock_key = %s FOR UPDATE", (key,))

        def release() -> None:
            row = releaser.execute(
                backend.sql.release_and_hand_over, {"key": key, "owner": "a", "token": token}
            ).fetchone()
            assert row is not None
            releaser.commit()

        got = _blocked(lambda: backend.acquire_or_enqueue(key, "b", 30, QUEUE_TTL), release)
    finally:
        releaser.close()
    assert got is not None and got > token, "b took the freed lock"
    assert _owner(client, key) == "b"


def test_a_handed_over_lock_is_renewed_to_its_ttl(
    pg: tuple[dblock.Client, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hand-over's lease is capped by the waiter's queue entry (here 1 s instead of 9 s);
    a holder that keeps the lock longer still has its full ttl, without asking for it. (The
    waiter hears releases: its client has no doorbell to spare.)"""
    client, _ = pg
    monkeypatch.setattr(dblock._engine.waiting, "QUEUE_TTL", 1.0)
    monkeypatch.setattr(doorbell, "MAX_BELLS", 0)
    key = "k"
    holder = client.lock(key, ttl=30)
    assert holder.acquire()
    outcome: dict[str, Any] = {}

    def wait() -> None:
        with dblock.connect(POSTGRESQL_URL, table=store_of(client).table) as other:
            lock = other.lock(key, ttl=30)
            assert lock.acquire(timeout=10)
            outcome["owner"] = lock.owner
            time.sleep(2.5)
            outcome["held"] = lock.held
            info = other.info(key)
            outcome["left"] = None if info is None else info.expires_at - info.acquired_at
            lock.release()  # raises LockLost if the lease had run out
            outcome["released"] = True

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 10
    while store_of(client).probe(key, "nobody")[1] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    holder.release()
    handed = client.info(key)
    thread.join(20)
    assert handed is not None and handed.owner == outcome["owner"], "handed over on release"
    assert outcome["held"] and outcome["released"]
    assert outcome["left"].total_seconds() > 20, "renewed to the lock's ttl"


def test_a_newcomers_release_hands_over_to_who_joined_meanwhile(
    pg: tuple[dblock.Client, PostgresStore],
) -> None:
    """A newcomer's release is a plain UPDATE while nobody joined the queue since it took the
    lock; after a join, that UPDATE changes nothing and the hand-over statement runs."""
    client, backend = pg
    token = backend.acquire_fair("k", "a", 30, queued=False)
    assert token is not None
    assert backend.release("k", "a", token)
    assert client.info("k") is None
    token = backend.acquire_fair("k", "a", 30, queued=False)
    assert token is not None
    backend.enqueue("k", "b", "lock", QUEUE_TTL, lease=30)
    assert backend.release("k", "a", token)
    assert _owner(client, "k") == "b", "b joined while a held it: handed over"


def _joining(backend: PostgresStore, key: str, waiter: str) -> Any:
    """A connection whose open transaction has made ``waiter``'s queue entry (and counted
    the join on the lock's row, if there is one): commit it to finish the join."""
    joiner = raw_connect(POSTGRESQL_URL)
    joiner.autocommit = False
    params = {"key": key, "owner": waiter, "kind": "lock", "ttl": QUEUE_TTL, "lease": 30}
    joiner.execute(backend.sql.enqueue, {**params, "channel": None, "crowd": 8})
    return joiner


def test_a_newcomer_that_waited_for_a_join_hands_over_to_it(
    pg: tuple[dblock.Client, PostgresStore],
) -> None:
    """b's join commits while a newcomer's acquisition waits for the lock's row: a's snapshot
    missed b's entry, so a takes the lock, and its join count already includes b. a's release
    must still hand over to b (b saw the lock held and waits to be told)."""
    client, backend = pg
    key = "k"
    first = backend.acquire_fair(key, "x", 30, queued=True)  # the row exists, free
    assert first is not None and backend.release(key, "x", first)
    joiner = _joining(backend, key, "b")
    try:
        token = _blocked(lambda: backend.acquire_fair(key, "a", 30, queued=False), joiner.commit)
    finally:
        joiner.close()
    assert token is not None, "a's snapshot predates b's entry"
    assert backend.release(key, "a", token)
    assert _owner(client, key) == "b", "handed over to b, not freed with nobody told"


def test_a_newcomer_that_made_the_row_hands_over_to_who_joined_meanwhile(
    pg: tuple[dblock.Client, PostgresStore],
) -> None:
    """The first acquisition of a key makes its row: a join meanwhile had no row to count
    itself on, so a's release must hand over rather than trust an unchanged count."""
    client, backend = pg
    key = "k"
    joiner = _joining(backend, key, "b")
    try:
        token = backend.acquire_fair(key, "a", 30, queued=False)
        joiner.commit()
    finally:
        joiner.close()
    assert token is not None, "a's snapshot predates b's entry"
    assert backend.release(key, "a", token)
    assert _owner(client, key) == "b", "handed over to b, not freed with nobody told"


def test_a_hand_over_is_told_on_the_waiting_clients_own_channel(
    pg: tuple[dblock.Client, PostgresStore],
) -> None:
    """A waiter's queue entry names its client's own LISTEN channel: the hand-over notice goes
    there, so the other clients listening on the table's channel are not woken by it."""
    client, backend = pg
    key = "k"
    token = backend.acquire_fair(key, "a", 30, queued=True)
    assert token is not None
    with dblock.connect(POSTGRESQL_URL, table=client.table) as other:
        waiter = other.lock(key, ttl=30)
        got: list[bool] = []
        checked = threading.Event()

        def wait_then_release() -> None:
            got.append(waiter.acquire(timeout=20))
            checked.wait(10)
            waiter.release()

        thread = threading.Thread(target=wait_then_release)
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while backend.probe(key, "nobody")[1] < 1:
                assert time.monotonic() < deadline, "the waiter never queued"
                time.sleep(0.02)
            table_channel = _listen(backend)
            try:
                assert backend.release(key, "a", token)
                deadline = time.monotonic() + 10
                while not got and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert got == [True], "the waiter was handed the lock"
                assert _heard(table_channel, wait=0.5) == [], "nobody else was woken"
            finally:
                table_channel.close()
            info = client.info(key)
            assert info is not None and (info.owner, info.token) == (waiter.owner, waiter.token)
        finally:
            checked.set()
            thread.join(10)
