"""ManyKeys on PostgreSQL: the SQL stores' cases (tests/stores/_sql_many_keys.py), and how a
waiter for several keys is rung."""

from __future__ import annotations

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
