"""The ManyKeys capability on every store that declares it, sync and async: several keys taken,
renewed and ended in one step each (what ``lock_many``, issue 47, builds on). Each store's own
tests (``tests/stores/<name>/test_many_keys.py``) add what only it can show: its atomicity seen
from other processes, its lost replies."""

from __future__ import annotations

import uuid

import pytest

import dblock
from tests._internals import store_call

pytestmark = pytest.mark.needs("ManyKeys")


def _keys(n: int = 3) -> list[str]:
    stem = "m-" + uuid.uuid4().hex[:8]
    return sorted(f"{stem}-{i}" for i in range(n))


def _owner() -> str:
    return "many-" + uuid.uuid4().hex


def test_every_key_is_granted_a_lock_hold_with_a_token_above_its_earlier_ones(
    client: dblock.Client,
) -> None:
    keys = _keys()
    before = {}
    for key in keys:  # each key had holds before: the new tokens are above theirs
        lock = client.lock(key, ttl=30)
        assert lock.acquire(blocking=False)
        before[key] = lock.token
        lock.release()
    owner = _owner()
    tokens = store_call(client, "acquire_many", keys, owner, 30.0)
    assert tokens is not None and sorted(tokens) == keys
    for key in keys:
        assert tokens[key] > before[key]
        info = client.info(key)
        assert info is not None
        assert (info.owner, info.token, info.kind) == (owner, tokens[key], "lock")
    assert store_call(client, "release_many", tokens, owner) is True
    assert all(client.info(key) is None for key in keys)


def test_one_key_held_elsewhere_takes_none_of_them(client: dblock.Client) -> None:
    keys = _keys()
    other = client.lock(keys[1], ttl=30)
    assert other.acquire(blocking=False)
    assert store_call(client, "acquire_many", keys, _owner(), 30.0) is None
    assert client.info(keys[0]) is None and client.info(keys[2]) is None
    info = client.info(keys[1])
    assert info is not None and info.token == other.token
    other.release()


def test_a_many_hold_and_a_lock_hold_exclude_each_other(client: dblock.Client) -> None:
    keys = _keys()
    owner = _owner()
    tokens = store_call(client, "acquire_many", keys, owner, 30.0)
    assert tokens is not None
    for key in keys:
        assert not client.lock(key, ttl=30).acquire(blocking=False)
    assert store_call(client, "acquire_many", keys[1:], _owner(), 30.0) is None
    assert store_call(client, "release_many", tokens, owner) is True
    for key in keys:
        lock = client.lock(key, ttl=30)
        assert lock.acquire(blocking=False)
        assert lock.token is not None and lock.token > tokens[key]
        lock.release()


def test_a_retry_by_the_same_owner_is_granted_again_with_new_tokens(
    client: dblock.Client,
) -> None:
    keys = _keys()
    owner = _owner()
    first = store_call(client, "acquire_many", keys, owner, 30.0)
    again = store_call(client, "acquire_many", keys, owner, 30.0)
    assert first is not None and again is not None
    assert all(again[key] > first[key] for key in keys)
    assert store_call(client, "release_many", again, owner) is True


def test_renewing_and_ending_say_whether_every_hold_was_still_there(
    client: dblock.Client,
) -> None:
    keys = _keys()
    owner = _owner()
    tokens = store_call(client, "acquire_many", keys, owner, 30.0)
    assert tokens is not None
    assert store_call(client, "renew_many", tokens, owner, 30.0) is True
    assert client.force_release(keys[1])
    assert store_call(client, "renew_many", tokens, owner, 30.0) is False
    info = client.info(keys[0])
    assert info is not None and info.token == tokens[keys[0]]  # the live ones still held
    assert store_call(client, "release_many", tokens, owner) is False
    assert all(client.info(key) is None for key in keys)  # the others ended all the same
    assert store_call(client, "release_many", tokens, owner) is False


def test_another_owners_tokens_end_nothing(client: dblock.Client) -> None:
    keys = _keys(2)
    owner = _owner()
    tokens = store_call(client, "acquire_many", keys, owner, 30.0)
    assert tokens is not None
    assert store_call(client, "release_many", tokens, _owner()) is False
    assert store_call(client, "renew_many", tokens, _owner(), 30.0) is False
    assert all(client.info(key) is not None for key in keys)
    assert store_call(client, "release_many", tokens, owner) is True


@pytest.mark.needs("FairQueue")
def test_a_waiter_in_a_keys_queue_keeps_the_newcomer_out(client: dblock.Client) -> None:
    # as for one key (test_a_newcomer_does_not_barge_past_waiters): all or none
    keys = _keys()
    store_call(client, "enqueue", keys[2], "someone-waiting", "lock", 30)
    assert store_call(client, "acquire_many", keys, _owner(), 30.0) is None
    assert client.info(keys[0]) is None
    store_call(client, "dequeue", keys[2], "someone-waiting")
    owner = _owner()
    tokens = store_call(client, "acquire_many", keys, owner, 30.0)
    assert tokens is not None
    assert store_call(client, "release_many", tokens, owner) is True


def test_as_many_keys_as_the_store_takes_at_once(client: dblock.Client) -> None:
    store = getattr(client, "_sync", client)._store
    keys = _keys(store.max_keys)
    owner = _owner()
    tokens = store_call(client, "acquire_many", keys, owner, 30.0)
    assert tokens is not None and len(tokens) == store.max_keys
    assert store_call(client, "release_many", tokens, owner) is True
