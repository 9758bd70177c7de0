"""FairManyKeys on ZooKeeper against the real server: a many-waiter's entries are plain lock
queue entries (sequential nodes without ``h``) made by one multi, so they hold one place of
an order common to all keys; single-key newcomers and waiters treat them as any waiter's
entry; a release in front of one frees the key and wakes its subscription; its turn turns
every entry into a hold in one multi."""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from typing import Any

import pytest
from kazoo.exceptions import NoNodeError

import dblock
from tests._internals import store_of

KEYS = ["a0", "a1", "a2"]


def _owner(name: str = "many") -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _queue(store: Any, key: str) -> list[tuple[str, bool]]:
    """The key's contenders in sequence order: (owner, holds-once-unblocked ``h``)."""
    zk, kpath = store._client(), store._kpath(key)
    try:
        names = [n for n in zk.get_children(kpath) if n != "record"]
    except NoNodeError:
        return []
    found = []
    for name in sorted(names, key=lambda n: n[-10:]):
        try:
            raw, _ = zk.get(f"{kpath}/{name}")
        except NoNodeError:
            continue
        data = json.loads(raw)
        found.append((data["o"], bool(data.get("h"))))
    return found


def _waiting(store: Any, keys: list[str], owner: str) -> Any:
    """``owner`` queued for ``keys`` as the engine does it: subscribed, entries made, its first
    try refused (which points the subscription at what blocks it)."""
    sub = store.subscribe_many(keys, owner)
    store.enqueue_many(keys, owner, 9.0)
    assert store.acquire_many_in_turn(keys, owner, 30.0) is None
    return sub


def _held(client: dblock.Client, key: str, ttl: float = 30.0) -> tuple[dblock.Lock, int]:
    """A lock of ``key`` taken by ``client``, and its token."""
    lock = client.lock(key, ttl=ttl)
    assert lock.acquire(blocking=False)
    assert lock.token is not None
    return lock, lock.token


def _its_turn(store: Any, sub: Any, owner: str, above: dict[str, int]) -> dict[str, int]:
    """The waiter, woken, takes its keys (trying again if woken early: a renewal moved its
    watch), each with a token above ``above``'s for the key; its subscription is closed."""
    tokens = None
    while tokens is None and sub.wait(15):
        tokens = store.acquire_many_in_turn(KEYS, owner, 30.0)
    sub.close()
    assert tokens is not None and all(tokens[k] > t for k, t in above.items()), tokens
    return tokens  # type: ignore[no-any-return]


def test_concurrent_waiters_hold_one_order_on_every_key_they_share(url: str, table: str) -> None:
    """Two clients (two sessions, so their requests interleave at the server) queue for
    overlapping sets at the same moment, many times: whichever is ahead on one shared key is
    ahead on all of them. Entries made key by key would, now and then, be crossed."""
    shared = [f"s{i}" for i in range(8)]
    sets = (["a0", *shared], [*shared, "z0"])
    with dblock.connect(url, table=table) as one, dblock.connect(url, table=table) as two:
        stores = (store_of(one), store_of(two))
        owners = (_owner("x"), _owner("y"))
        for _ in range(40):
            start = threading.Barrier(2)

            def enqueue(i: int, start: threading.Barrier = start) -> None:
                start.wait()
                stores[i].enqueue_many(sets[i], owners[i], 9.0)

            threads = [threading.Thread(target=enqueue, args=(i,)) for i in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            orders = {tuple(o for o, _ in _queue(stores[0], key)) for key in shared}
            assert len(orders) == 1, orders  # one order on every shared key
            (order,) = orders
            assert sorted(order) == sorted(owners)  # one entry each
            for i in (0, 1):
                stores[i].dequeue_many(sets[i], owners[i])
        assert all(_queue(stores[0], key) == [] for key in shared)


def test_a_newcomer_queues_behind_a_many_entry_on_a_free_key(url: str, table: str) -> None:
    with dblock.connect(url, table=table) as client, dblock.connect(url, table=table) as other:
        store, others = store_of(client), store_of(other)
        holder, before = _held(other, "a1")
        many = _owner()
        assert store.acquire_many(KEYS, many, 30.0) is None
        sub = _waiting(store, KEYS, many)
        assert client.info("a0") is None  # free, and its queue's head is the many-entry
        assert others.acquire_fair("a0", "newcomer", 30.0, False) is None
        assert not other.lock("a0", ttl=30).acquire(blocking=False)
        assert others.acquire_many(["a0"], _owner(), 30.0) is None
        late = others.subscribe("a0", "late", "lock")
        assert others.acquire_or_enqueue("a0", "late", 30.0, 9.0) is None
        assert [o for o, _ in _queue(store, "a0")] == [many, "late"]
        assert client.info("a0") is None
        holder.release()
        tokens = _its_turn(store, sub, many, {"a1": before})
        assert others.acquire_fair("a0", "late", 30.0, True) is None  # behind the many-hold
        assert store.release_many(tokens, many) is True
        assert late.wait(10)
        token = others.acquire_fair("a0", "late", 30.0, True) or late.granted
        assert token is not None and token > tokens["a0"]
        late.close()
        assert others.release("a0", "late", token)


def test_a_single_key_waiter_queued_first_takes_the_key_first(url: str, table: str) -> None:
    """The many-waiter's turn on a key comes after the entries ahead of it, even when the
    key is free: the single-key waiter that queued first takes it, and only its release lets
    the many-waiter take its keys."""
    with dblock.connect(url, table=table) as client, dblock.connect(url, table=table) as other:
        store, others = store_of(client), store_of(other)
        holder, before = _held(other, "a0")
        others.enqueue("a0", "first", "lock", 9.0)
        many = _owner()
        sub = _waiting(store, KEYS, many)
        assert [o for o, _ in _queue(store, "a0")][1:] == ["first", many]
        holder.release()
        assert client.info("a0") is None
        assert store.acquire_many_in_turn(KEYS, many, 30.0) is None  # "first" is ahead
        first = others.acquire_fair("a0", "first", 30.0, True)
        assert first is not None and first > before
        assert store.acquire_many_in_turn(KEYS, many, 30.0) is None
        assert others.release("a0", "first", first)
        tokens = _its_turn(store, sub, many, {"a0": first})
        assert store.release_many(tokens, many) is True


def test_a_release_in_front_of_a_many_entry_frees_the_key_and_wakes_it(
    url: str, table: str
) -> None:
    with dblock.connect(url, table=table) as client, dblock.connect(url, table=table) as other:
        store = store_of(client)
        (h0, t0), (h2, t2) = _held(other, "a0"), _held(other, "a2")
        many = _owner()
        sub = _waiting(store, KEYS, many)
        assert not sub.wait(0.3)  # nothing released yet
        h0.release()
        assert sub.wait(10)
        assert sub.granted is None  # never handed a lock: the key is free
        assert client.info("a0") is None
        assert [h.key for h in client.list("a")] == ["a2"]
        assert not other.lock("a0", ttl=30).acquire(blocking=False)  # the entry still queues
        assert store.acquire_many_in_turn(KEYS, many, 30.0) is None  # a2 still held
        assert not sub.wait(0.3)
        h2.release()
        tokens = _its_turn(store, sub, many, {"a0": t0, "a2": t2})
        assert store.release_many(tokens, many) is True


def test_a_blockers_lease_end_wakes_the_many_waiter(url: str, table: str) -> None:
    """A holder that is alive but stuck (no renewal, no release): the waiter wakes at its
    lease's end, and its next try, reading the server's time, deletes it and takes the keys."""
    with dblock.connect(url, table=table) as client, dblock.connect(url, table=table) as other:
        store = store_of(client)
        _, before = _held(other, "a1", ttl=1.5)
        many = _owner()
        sub = _waiting(store, KEYS, many)
        tokens = _its_turn(store, sub, many, {"a1": before})
        assert store.release_many(tokens, many) is True


def test_its_turn_turns_every_entry_into_a_hold_and_a_retry_finds_them(
    url: str, table: str
) -> None:
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        many = _owner()
        store.enqueue_many(KEYS, many, 9.0)
        assert all(_queue(store, k) == [(many, False)] for k in KEYS)
        known = copy.deepcopy(store._waits[many])
        tokens = store.acquire_many_in_turn(KEYS, many, 30.0)
        assert tokens is not None
        assert all(_queue(store, k) == [(many, True)] for k in KEYS)  # no entry left
        assert {h.key: (h.owner, h.token) for h in client.list("a")} == {
            k: (many, t) for k, t in tokens.items()
        }
        store._waits[many] = known  # as if its reply was lost: the retry finds its holds
        assert store.acquire_many_in_turn(KEYS, many, 30.0) == tokens
        assert all(_queue(store, k) == [(many, True)] for k in KEYS)
        assert store.renew_many(tokens, many, 30.0) is True
        assert store.release_many(tokens, many) is True
        assert all(_queue(store, k) == [] for k in KEYS)


def test_enqueue_requeue_and_dequeue_are_idempotent(url: str, table: str) -> None:
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        many = _owner()
        store.enqueue_many(KEYS, many, 9.0)
        names = {k: store._waits[many].nodes[k].path for k in KEYS}
        known = copy.deepcopy(store._waits[many])
        assert store.requeue_many(KEYS, many, 9.0) is True
        store._waits[many] = known  # its reply lost: the retry finds its own write
        assert store.requeue_many(KEYS, many, 9.0) is True
        assert {k: store._waits[many].nodes[k].path for k in KEYS} == names  # same place
        store.enqueue_many(KEYS, many, 9.0)  # afresh: replaces them
        assert all(_queue(store, k) == [(many, False)] for k in KEYS)
        assert all(store._waits[many].nodes[k].path != names[k] for k in KEYS)
        store._waits[many].nodes.clear()  # an interrupted enqueue_many: outcome unknown
        store.dequeue_many(KEYS, many)  # finds them by their names' shared random part
        assert all(_queue(store, k) == [] for k in KEYS)
        store.dequeue_many(KEYS, many)  # again: nothing to do
        assert many not in store._waits


def test_requeue_many_is_false_once_one_entry_is_gone(url: str, table: str) -> None:
    with dblock.connect(url, table=table) as client, dblock.connect(url, table=table) as other:
        store = store_of(client)
        many = _owner()
        store.enqueue_many(KEYS, many, 9.0)
        # another client deleted one as expired (or its session's end did)
        store._client().delete(store._waits[many].nodes["a1"].path)
        assert store.requeue_many(KEYS, many, 9.0) is False
        assert store.acquire_many_in_turn(KEYS, many, 30.0) is None
        store.enqueue_many(KEYS, many, 9.0)  # afresh: the others' places are given up
        assert all(_queue(store, k) == [(many, False)] for k in KEYS)
        assert store.requeue_many(KEYS, many, 9.0) is True
        # an entry whose lease ended before the refresh is gone although nobody deleted it
        store.enqueue_many(KEYS, many, 0.5)
        time.sleep(0.8)
        assert store.requeue_many(KEYS, many, 9.0) is False
        store.enqueue_many(KEYS, many, 0.5)
        time.sleep(0.8)  # the waiter lives on, but its lease ends: a newcomer is not kept out
        token = store_of(other).acquire_fair("a0", "newcomer", 30.0, False)
        assert token is not None
        store.dequeue_many(KEYS, many)
        assert store_of(other).release("a0", "newcomer", token)


def test_entries_end_with_their_waiters_session(url: str, table: str) -> None:
    with dblock.connect(url, table=table) as other:
        with dblock.connect(url, table=table) as client:
            store_of(client).enqueue_many(KEYS, _owner(), 9.0)
            assert store_of(other).acquire_many(KEYS, _owner(), 30.0) is None
        owner = _owner()
        tokens = store_of(other).acquire_many(KEYS, owner, 30.0)  # at once: nothing is left
        assert tokens is not None
        assert store_of(other).release_many(tokens, owner) is True


def _lock_many(store: Any, keys: list[str], owner: str, deadline: float) -> dict[str, int]:
    """The engine's loop: a newcomer's try, then queued tries woken by the subscription."""
    tokens = store.acquire_many(keys, owner, 30.0)
    if tokens is not None:
        return tokens  # type: ignore[no-any-return]
    sub = store.subscribe_many(keys, owner)
    store.enqueue_many(keys, owner, 9.0)
    queued = time.monotonic()
    try:
        while time.monotonic() < deadline:
            tokens = store.acquire_many_in_turn(keys, owner, 30.0)
            if tokens is not None:
                return tokens  # type: ignore[no-any-return]
            sub.wait(0.5)
            if time.monotonic() - queued > 3:
                if not store.requeue_many(keys, owner, 9.0):
                    store.enqueue_many(keys, owner, 9.0)
                queued = time.monotonic()
        store.dequeue_many(keys, owner)
        pytest.fail(f"{owner} waited for {keys} past the deadline")
    finally:
        sub.close()


def test_overlapping_many_waiters_and_single_key_ones_all_get_through(url: str, table: str) -> None:
    """Waiters for overlapping sets in opposite directions (a0+a1, a1+a2, a2+a0) and
    single-key lockers, in rounds: nobody waits forever, no key is ever held twice, and
    each key's tokens rise through the grants."""
    sets = [["a0", "a1"], ["a1", "a2"], ["a0", "a2"]]
    grants: list[tuple[float, str, int]] = []
    held: dict[str, str] = {}
    mutex = threading.Lock()
    errors: list[BaseException] = []

    def hold(key_tokens: dict[str, int], who: str) -> None:
        with mutex:
            for key, token in key_tokens.items():
                assert key not in held, (key, held[key], who)
                held[key] = who
                grants.append((time.monotonic(), key, token))
        time.sleep(0.02)
        with mutex:
            for key in key_tokens:
                del held[key]

    def many_worker(keys: list[str], i: int) -> None:
        try:
            with dblock.connect(url, table=table) as client:
                store = store_of(client)
                for _ in range(6):
                    owner = _owner(f"m{i}")
                    tokens = _lock_many(store, keys, owner, time.monotonic() + 60)
                    hold(tokens, owner)
                    assert store.release_many(tokens, owner) is True
        except BaseException as exc:
            errors.append(exc)

    def single_worker(key: str) -> None:
        try:
            with dblock.connect(url, table=table) as client:
                for _ in range(6):
                    lock = client.lock(key, ttl=30)
                    assert lock.acquire(timeout=60)
                    assert lock.token is not None
                    hold({key: lock.token}, f"single-{key}")
                    lock.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=many_worker, args=(s, i)) for i, s in enumerate(sets)]
    threads += [threading.Thread(target=single_worker, args=(k,)) for k in ("a0", "a2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    for key in KEYS:
        tokens = [t for _, k, t in sorted(grants) if k == key]
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
