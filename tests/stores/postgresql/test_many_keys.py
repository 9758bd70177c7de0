"""ManyKeys on PostgreSQL: the SQL stores' cases (tests/stores/_sql_many_keys.py), and how a
waiter for several keys is rung."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import dblock
from tests._servers import POSTGRESQL_URL, raw_connect, require_server
from tests.stores._sql_many_keys import *  # noqa: F403 - the cases
from tests.stores._sql_many_keys import (
    QUEUE_TTL,
    TTL,
    _keys,
    _taken_in_turn,
    queued_many,
    subscribed_many,
)


@pytest.fixture
def many_url() -> str:
    require_server("postgresql", POSTGRESQL_URL)
    return POSTGRESQL_URL


# -- FairManyKeys on PostgreSQL: wake-ups pushed to a many-waiter, and the hand-over's rules --


def _raw_listen(*channels: str) -> Any:
    conn = raw_connect(POSTGRESQL_URL)
    for channel in channels:
        conn.execute(f'LISTEN "{channel}"')
    return conn


def _heard(conn: Any, wait: float) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=wait, stop_after=1)]


def test_a_release_rings_a_many_waiter_on_its_clients_own_channel(
    many: tuple[dblock.Client, Any],
) -> None:
    """The release of any of its keys rings the waiter at the head of the key's queue on its
    client's own channel (its entries name it): its one subscription wakes, and no client
    listening on the table's channel is woken."""
    _, store = many
    keys = _keys(2)
    with subscribed_many(store, keys, "m") as sub:
        assert sub is not None and sub.live
        held = {k: store.acquire(k, "h", TTL, "lock") for k in keys}
        store.enqueue_many(keys, "m", QUEUE_TTL)
        assert not sub.wait(0.3), "nothing released yet"
        table, own = _raw_listen(store.channel), _raw_listen(store._own_channel())
        try:
            for key in keys:
                assert store.release(key, "h", held[key])
                assert store.info(key) is None
                assert _heard(own, 5) == [f"m {key}"]
                assert sub.wait(5), f"the release of {key} woke it"
            assert _heard(table, 0.3) == [], "nobody else was woken"
        finally:
            table.close()
            own.close()
        assert sub.granted is None
        _taken_in_turn(store, keys, "m", held)


def test_a_many_subscription_hears_its_keys_for_its_owner_or_everyone(
    many: tuple[dblock.Client, Any],
) -> None:
    _, store = many
    keys = _keys(3)
    sub = store.subscribe_many(keys[:2], "m")
    assert sub is not None
    notify = raw_connect(POSTGRESQL_URL)
    try:

        def ring(payload: str) -> None:
            notify.execute("SELECT pg_notify(%s, %s)", (store.channel, payload))

        for quiet in (f"x {keys[0]}", f"m {keys[2]}", f" {keys[2]}"):
            ring(quiet)
            assert not sub.wait(0.3), quiet
        for heard in (f"m {keys[1]}", f" {keys[0]}", f"=5 m {keys[1]}"):
            ring(heard)
            assert sub.wait(5), heard
        assert sub.granted is None, "a many-waiter is never handed a lock"
        sub.close()
        ring(f" {keys[0]}")
        assert not sub.wait(0.3), "closed: off every key"
    finally:
        notify.close()
        sub.close()


def test_a_quiet_release_rings_a_many_waiter_that_queued_while_it_held(
    many: tuple[dblock.Client, Any],
) -> None:
    """A newcomer's hold is released with a plain UPDATE unless someone joined the key's queue
    since it was taken: enqueue_many counts its join on every key's row, as enqueue does."""
    _, store = many
    keys = _keys(2)
    with subscribed_many(store, keys, "m") as sub:
        assert sub is not None
        first = store.acquire(keys[0], "h", TTL, "lock")  # the key's row exists
        assert first is not None and store.release(keys[0], "h", first)
        token = store.acquire_fair(keys[0], "h", TTL, False)  # a newcomer's: quiet
        assert token is not None and (keys[0], "h") in store._quiet
        store.enqueue_many(keys, "m", QUEUE_TTL)
        assert store.release(keys[0], "h", token)
        assert sub.wait(5), "the release rang it"


def test_a_newcomer_joins_the_queue_behind_a_many_waiter(
    many: tuple[dblock.Client, Any],
) -> None:
    _, store = many
    keys = queued_many(store, 2)
    assert store.acquire_or_enqueue(keys[0], "n", TTL, QUEUE_TTL) is None
    assert store.info(keys[0]) is None
    assert store.probe(keys[0], "n") == (True, 1), "n queued behind m"
    assert store.acquire_fair(keys[0], "n", TTL, True) is None


def test_dequeue_many_rings_the_next_head_of_a_free_key(
    many: tuple[dblock.Client, Any],
) -> None:
    """A many-waiter at the head of a free key's queue (rung by the release, say) that gives
    up rings the waiter behind it, whose turn it now is."""
    _, store = many
    keys = queued_many(store, 2)
    next_sub = store.subscribe(keys[1], "s")
    try:
        store.enqueue(keys[1], "s", "lock", QUEUE_TTL, lease=TTL)
        assert not next_sub.wait(0.3)
        store.dequeue_many(keys, "m")
        assert next_sub.wait(5), "s was rung"
        assert store.acquire_fair(keys[1], "s", TTL, True) is not None
    finally:
        next_sub.close()


# -- the one-statement take and quiet release: a race between snapshot and row lock ---------


def _free_rows(store: Any, n: int) -> list[str]:
    """n keys whose rows exist, free."""
    keys = _keys(n)
    for key in keys:
        token = store.acquire(key, "x", TTL, "lock")
        assert token is not None and store.release(key, "x", token)
    return keys


def _in_a_moment(conn: Any, sql: str, params: dict[str, Any]) -> threading.Thread:
    """Commit ``sql`` (run now, in an open transaction of ``conn``) 0.5 s from now, while
    the test's next statement waits for the row it locked."""
    conn.execute("BEGIN")
    conn.execute(sql, params)

    def commit() -> None:
        time.sleep(0.5)
        conn.execute("COMMIT")

    thread = threading.Thread(target=commit)
    thread.start()
    return thread


def test_a_key_taken_between_snapshot_and_row_lock_undoes_the_whole_take(
    many: tuple[dblock.Client, Any],
) -> None:
    """acquire_many's one statement saw every key free in its snapshot; a key's row is taken
    by a transaction that commits while the statement waits for its row lock, so its ON
    CONFLICT clause refuses that key after taking the keys before it: the statement fails
    (MANY_TAKEN_PARTLY), which undoes those, and the store answers busy."""
    _, store = many
    keys = _free_rows(store, 4)
    other = raw_connect(POSTGRESQL_URL)
    try:
        taking = _in_a_moment(
            other,
            f"UPDATE {store.sql.main} SET owner = 'o', expires_at = now() + interval '1 hour',"
            " token = token + 1000 WHERE lock_key = %(k)s",
            {"k": keys[2]},
        )
        assert store.acquire_many(keys, "m", TTL) is None, "busy: the third key was taken"
        taking.join()
    finally:
        other.close()
    assert [store.info(k) for k in keys[:2] + keys[3:]] == [None, None, None], "nothing kept"
    held = store.info(keys[2])
    assert held is not None and held.owner == "o"


def test_a_join_between_snapshot_and_row_lock_undoes_the_quiet_release(
    many: tuple[dblock.Client, Any],
) -> None:
    """release_many's quiet statement counted every hold unwaited in its snapshot; a queue
    join (its count on the key's row) commits while the statement waits for that row: the
    statement fails and is undone, and the release that hands over ends every hold."""
    _, store = many
    keys = _free_rows(store, 4)  # a new row's join count is not trusted: not taken quietly
    tokens = store.acquire_many(keys, "m", TTL)
    assert tokens is not None and all((k, "m") in store._quiet for k in keys), "taken quietly"
    other = raw_connect(POSTGRESQL_URL)
    run = store.run
    try:
        joining = _in_a_moment(
            other,
            f"UPDATE {store.sql.main} SET joins = joins + 1 WHERE lock_key = %(k)s",
            {"k": keys[1]},
        )
        calls: list[str] = []

        def counted(what: str, op: Any, **kw: Any) -> Any:
            calls.append(what)
            return run(what, op, **kw)

        store.run = counted
        assert store.release_many(tokens, "m")
        joining.join()
    finally:
        store.run = run
        other.close()
    assert calls == ["release", "release"], "the quiet statement, then the one that hands over"
    assert [store.info(k) for k in keys] == [None] * 4
