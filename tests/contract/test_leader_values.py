"""The LeaderValues capability on every store that declares it, sync and async: a lease hold
carries the value its holder proclaims, read with the hold in one step (what
``client.election`` builds on, issue 48). The election's own behaviour is in
test_election.py."""

from __future__ import annotations

import time
import uuid

import pytest

import dblock
from tests._internals import store_call
from tests.providers import Provider

pytestmark = pytest.mark.needs("LeaderValues")


def _key() -> str:
    return "e-" + uuid.uuid4().hex[:10]


def test_a_free_key_has_no_leader(client: dblock.Client) -> None:
    assert store_call(client, "leader", _key()) is None


def test_a_hold_reads_back_with_no_value_until_its_holder_proclaims_one(
    client: dblock.Client,
) -> None:
    key = _key()
    lock = client.lock(key, ttl=30)
    assert lock.acquire(blocking=False)
    leading = store_call(client, "leader", key)
    assert leading is not None
    assert (leading.info.key, leading.info.owner, leading.info.token) == (
        key,
        lock.owner,
        lock.token,
    )
    assert (leading.proclaimed, leading.value) == (False, None)
    assert store_call(client, "proclaim", key, lock.owner, lock.token, "10.0.0.7:8080")
    leading = store_call(client, "leader", key)
    assert (leading.proclaimed, leading.value) == (True, "10.0.0.7:8080")
    assert leading.info.token == lock.token
    # a second proclaim replaces the value; the same one again changes nothing
    for value in ("10.0.0.7:9090", "10.0.0.7:9090", None, "x" * 1024, "ünï ✓ 'quoted' \" -- ;"):
        assert store_call(client, "proclaim", key, lock.owner, lock.token, value)
        leading = store_call(client, "leader", key)
        assert (leading.proclaimed, leading.value) == (True, value)
    lock.release()
    assert store_call(client, "leader", key) is None


def test_only_the_live_holder_with_its_token_proclaims(client: dblock.Client) -> None:
    key = _key()
    lock = client.lock(key, ttl=30)
    assert lock.acquire(blocking=False)
    assert store_call(client, "proclaim", key, lock.owner, lock.token, "mine")
    assert not store_call(client, "proclaim", key, "someone-else", lock.token, "theirs")
    assert not store_call(client, "proclaim", key, lock.owner, lock.token + 1, "theirs")
    assert not store_call(client, "proclaim", key, lock.owner, lock.token - 1, "theirs")
    assert store_call(client, "leader", key).value == "mine"
    lock.release()
    assert not store_call(client, "proclaim", key, lock.owner, 1, "after")
    assert not store_call(client, "proclaim", _key(), "nobody", 1, "never held")


def test_a_new_hold_does_not_show_the_last_holders_value(client: dblock.Client) -> None:
    key = _key()
    first = client.lock(key, ttl=30)
    assert first.acquire(blocking=False)
    assert store_call(client, "proclaim", key, first.owner, first.token, "first")
    first.release()
    second = client.lock(key, ttl=30)
    assert second.acquire(blocking=False)
    leading = store_call(client, "leader", key)
    assert leading.info.token == second.token and leading.info.token > (first.token or 0)
    assert (leading.proclaimed, leading.value) == (False, None)
    # the earlier holder's proclaim, retried late, writes nothing
    assert not store_call(client, "proclaim", key, leading.info.owner + "x", second.token, "x")
    second.release()


def test_an_expired_hold_is_no_leader_and_takes_no_value(client: dblock.Client) -> None:
    key = _key()
    lock = client.lock(key, ttl=0.5)
    assert lock.acquire(blocking=False)
    owner, token = lock.owner, lock.token
    assert store_call(client, "proclaim", key, owner, token, "v")
    deadline = time.monotonic() + 10
    while store_call(client, "leader", key) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert not store_call(client, "proclaim", key, owner, token, "late")


def test_a_force_released_hold_is_no_leader(client: dblock.Client) -> None:
    key = _key()
    lock = client.lock(key, ttl=30)
    assert lock.acquire(blocking=False)
    assert store_call(client, "proclaim", key, lock.owner, lock.token, "v")
    assert client.force_release(key)
    assert store_call(client, "leader", key) is None
    assert not store_call(client, "proclaim", key, lock.owner, lock.token, "late")


def test_a_value_takes_no_room_in_list_or_info(client: dblock.Client) -> None:
    key = _key()
    lock = client.lock(key, ttl=30)
    assert lock.acquire(blocking=False)
    assert store_call(client, "proclaim", key, lock.owner, lock.token, "v")
    assert [i.key for i in client.list()] == [key]
    assert client.purge(0.0) >= 0  # a purge leaves a live hold's value alone
    assert store_call(client, "leader", key).value == "v"
    lock.release()
    assert client.list(key) == [] and client.info(key) is None
    assert client.purge(0.0) >= 0  # a purge keeps working beside a value
    assert client.list(key) == []


def test_keys_of_any_shape_keep_their_own_values_through_a_purge(client: dblock.Client) -> None:
    # each key's value is found from the key alone, by the store's own means too (a purge
    # that must tell a live hold's value from an orphan's): keys that differ only by a
    # trailing space, non-ASCII keys and the longest key allowed each keep their own
    stem = _key()
    keys = [stem, stem + " ", stem + " ünï ✓ 'q'", (stem + "x" * 255)[:255]]
    locks = [client.lock(key, ttl=30) for key in keys]
    for n, lock in enumerate(locks):
        assert lock.acquire(blocking=False)
        assert store_call(client, "proclaim", lock.key, lock.owner, lock.token, f"v{n}")
    assert client.purge(0.0) >= 0
    for n, key in enumerate(keys):
        assert store_call(client, "leader", key).value == f"v{n}"
    for lock in locks:
        lock.release()
    assert client.purge(0.0) >= 0
    assert all(store_call(client, "leader", key) is None for key in keys)


def test_a_renewal_keeps_the_value(client: dblock.Client) -> None:
    key = _key()
    lock = client.lock(key, ttl=30)
    assert lock.acquire(blocking=False)
    assert store_call(client, "proclaim", key, lock.owner, lock.token, "v")
    for ttl in (30, 45):  # the same lease, and another (a store may move the hold to a new one)
        assert store_call(client, "renew", key, lock.owner, lock.token, ttl)
        leading = store_call(client, "leader", key)
        assert (leading.proclaimed, leading.value, leading.info.token) == (True, "v", lock.token)
    lock.release()
    assert store_call(client, "leader", key) is None


def test_a_value_proclaimed_through_another_client_leaves_the_hold_alone(
    provider: Provider, client: dblock.Client, table: str
) -> None:
    key = _key()
    lock = client.lock(key, ttl=30)
    assert lock.acquire(blocking=False)
    with provider.connect(table=table) as other:
        assert not store_call(other, "proclaim", key, "someone-else", lock.token, "theirs")
        assert store_call(other, "proclaim", key, lock.owner, lock.token, "via other")
        assert store_call(client, "leader", key).value == "via other"
    # the holder's own renewal and release still find their hold as they left it
    assert store_call(client, "renew", key, lock.owner, lock.token, 30)
    assert store_call(client, "proclaim", key, lock.owner, lock.token, "mine")
    assert store_call(client, "leader", key).value == "mine"
    lock.release()
    assert store_call(client, "leader", key) is None
