"""Several keys on a quorum of three stores (ManyKeys over each store's FencedManyGrants):
all or none with stores down or refusing, every store that granted undone when a majority did
not, tokens rising per key across releases and stores restarted empty, and exclusion with
single-key locks under contention. Private Redis servers where a store is killed; SQLite
files elsewhere. (The contract's tests/contract/test_many_keys.py runs on quorums too.)"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

import dblock
from dblock._contract import FairManyKeys, FairQueue, ManyKeys, provides
from dblock.stores.quorum import store as quorum_store
from tests._internals import store_of
from tests._servers import MYSQL_URL, POSTGRESQL_URL, REDIS_URL, drop_tables, require_server
from tests.providers import fresh_table
from tests.stores.quorum.test_faults import _sqlite_trio

KEYS = ["a", "b", "c"]
T = TypeVar("T")


def _owner() -> str:
    return "many-" + uuid.uuid4().hex


@contextlib.contextmanager
def _members(urls: list[str], table: str) -> Iterator[list[dblock.Client]]:
    """A plain client of each store the test can still reach (to look at it directly)."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(dblock.connect(url, table=table)) for url in urls]


def _held(member: dblock.Client, keys: list[str]) -> dict[str, tuple[str, int]]:
    """key -> (owner, token) of each of ``keys`` that ``member`` holds now."""
    return {k: (i.owner, i.token) for k in keys if (i := member.info(k)) is not None}


def _retrying(call: Callable[[], T]) -> T:
    """``call()``, tried again for up to 10 s while too few stores answer (a store just
    restarted is backed off from for a moment)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return call()
        except dblock.BackendError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@dataclass
class Trio:
    """A quorum client of three private Redis servers, its store and its fresh table."""

    client: dblock.Client
    quorum: Any
    table: str
    servers: list[Any]


@pytest.fixture
def trio(redis_trio: list[Any]) -> Iterator[Trio]:
    table = fresh_table()
    with dblock.connect([s.url for s in redis_trio], table=table) as client:
        yield Trio(client, store_of(client), table, redis_trio)


@pytest.fixture
def files(tmp_path: Path) -> Iterator[tuple[Any, list[dblock.Client]]]:
    """The store of a quorum client of three SQLite files, and a plain client of each file."""
    urls = _sqlite_trio(tmp_path)
    table = fresh_table()
    with dblock.connect(urls, table=table) as client, _members(urls, table) as members:
        yield store_of(client), members


def test_with_one_store_down_a_majority_grants_the_set_and_each_live_store_holds_all(
    trio: Trio,
) -> None:
    quorum, table = trio.quorum, trio.table
    a, b, c = trio.servers
    c.kill()
    owner = _owner()
    tokens = quorum.acquire_many(KEYS, owner, 30.0)
    assert tokens is not None and sorted(tokens) == KEYS
    with _members([a.url, b.url], table) as live:
        for member in live:
            assert _held(member, KEYS) == {k: (owner, tokens[k]) for k in KEYS}
    assert quorum.renew_many(tokens, owner, 30.0) is True
    assert quorum.release_many(tokens, owner) is True
    with _members([a.url, b.url], table) as live:
        assert all(_held(member, KEYS) == {} for member in live)


def test_with_two_stores_down_nothing_is_granted_and_nothing_stays_held(trio: Trio) -> None:
    a, b, c = trio.servers
    b.kill()
    c.kill()
    with pytest.raises(dblock.BackendError, match="only 1 of the quorum's 3 stores"):
        trio.quorum.acquire_many(KEYS, _owner(), 30.0)
    with _members([a.url], trio.table) as (live,):
        assert _held(live, KEYS) == {}
        # and the live store is free for the keys: nothing of the attempt blocks them
        assert store_of(live).acquire_many(KEYS, _owner(), 30.0) is not None


def test_a_store_that_granted_the_set_is_undone_when_a_majority_refused(
    files: tuple[Any, list[dblock.Client]],
) -> None:
    quorum, (a, b, c) = files
    blockers = [member.lock("b", ttl=30) for member in (b, c)]  # one key, on two stores
    for lock in blockers:
        assert lock.acquire(blocking=False)
    assert quorum.acquire_many(KEYS, _owner(), 30.0) is None
    # the first store granted all three (nothing blocked them there) and was undone
    assert _held(a, KEYS) == {}
    for member, lock in zip((b, c), blockers, strict=True):
        assert _held(member, KEYS) == {"b": (lock.owner, lock.token)}
    for lock in blockers:
        lock.release()
    owner = _owner()
    tokens = quorum.acquire_many(KEYS, owner, 30.0)
    assert tokens is not None
    assert all(_held(m, KEYS) == {k: (owner, tokens[k]) for k in KEYS} for m in (a, b, c))
    assert quorum.release_many(tokens, owner) is True


def test_each_keys_tokens_rise_across_releases_and_stores_restarted_empty_one_after_another(
    trio: Trio,
) -> None:
    quorum, (a, b, c) = trio.quorum, trio.servers
    issued: dict[str, list[int]] = {k: [] for k in KEYS}

    def take_all() -> None:
        owner = _owner()
        tokens = _retrying(lambda: quorum.acquire_many(KEYS, owner, 10.0))
        assert tokens is not None
        for k in KEYS:
            issued[k].append(tokens[k])
        assert quorum.release_many(tokens, owner) is True

    for _ in range(3):
        take_all()
        with trio.client.lock("b", ttl=10) as lock:  # a single-key hold between the sets
            assert lock.token is not None
            issued["b"].append(lock.token)
    take_all()
    a.kill()
    a.start()  # empty
    b.kill()
    b.start()  # empty: only c knows the keys' fences now
    c.kill()
    take_all()  # granted by a and b, which remember nothing
    for k, tokens in issued.items():
        assert tokens == sorted(set(tokens)), f"{k}: {tokens}"


def test_each_keys_token_is_above_the_largest_fence_of_the_stores_that_answer(
    files: tuple[Any, list[dblock.Client]],
) -> None:
    quorum, (_a, _b, c) = files
    far = time.time_ns() // 1000 + 10**12  # ahead of every clock: only c's fence knows it
    member = store_of(c)
    assert member.grant_fenced("b", "someone", 0.001, far, "lock")
    time.sleep(0.01)  # that hold has ended; its fence stays
    owner = _owner()
    tokens = quorum.acquire_many(KEYS, owner, 30.0)
    assert tokens is not None
    assert tokens["b"] == far + 1
    assert tokens["a"] < far and tokens["c"] < far  # each key's own fences
    assert quorum.release_many(tokens, owner) is True


def test_a_renewal_gives_the_set_again_to_a_store_restarted_empty(trio: Trio) -> None:
    quorum, table, a = trio.quorum, trio.table, trio.servers[0]
    owner = _owner()
    tokens = quorum.acquire_many(KEYS, owner, 30.0)
    assert tokens is not None
    a.kill()
    a.start()  # empty: it has forgotten the set
    with _members([a.url], table) as (restarted,):
        assert _held(restarted, KEYS) == {}
        assert quorum.renew_many(tokens, owner, 30.0) is True
        assert _held(restarted, KEYS) == {k: (owner, tokens[k]) for k in KEYS}
    assert quorum.release_many(tokens, owner) is True


def test_sets_and_single_key_locks_exclude_each_other_under_contention(tmp_path: Path) -> None:
    """Threads take random sets of two or three of four keys, and single keys, on one quorum:
    no key is ever had by two of them at once, and each key's tokens rise in the order its
    holds were had."""
    urls = _sqlite_trio(tmp_path)
    table = fresh_table()
    keys = ["k0", "k1", "k2", "k3"]
    guard = threading.Lock()
    holder: dict[str, str | None] = dict.fromkeys(keys)
    order: dict[str, list[int]] = {k: [] for k in keys}
    overlaps: list[str] = []
    errors: list[BaseException] = []

    def had(name: str, tokens: dict[str, int]) -> None:
        with guard:
            for k, token in tokens.items():
                if holder[k] is not None:
                    overlaps.append(f"{k}: {name} while {holder[k]} holds it")
                holder[k] = name
                order[k].append(token)
        time.sleep(0.002)
        with guard:
            for k in tokens:
                holder[k] = None

    def worker(i: int) -> None:
        rng = random.Random(i)
        try:
            with dblock.connect(urls, table=table) as client:
                quorum = store_of(client)
                done = 0
                while done < 12:
                    if i % 2:
                        with client.lock(rng.choice(keys), ttl=30, timeout=60) as lock:
                            assert lock.token is not None
                            had(f"lock {i}", {lock.key: lock.token})
                        done += 1
                        continue
                    chosen = sorted(rng.sample(keys, rng.choice((2, 3))))
                    owner = _owner()
                    tokens = quorum.acquire_many(chosen, owner, 30.0)
                    if tokens is None:
                        time.sleep(rng.uniform(0, 0.01))
                        continue
                    had(f"set {i}", tokens)
                    assert quorum.release_many(tokens, owner) is True
                    done += 1
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert overlaps == []
    for k, tokens in order.items():
        assert tokens == sorted(set(tokens)), f"{k}: {tokens}"
    assert sum(map(len, order.values())) >= 48


def test_the_quorum_takes_as_many_keys_as_its_least_member_and_queues_sets_where_they_all_do(
    files: tuple[Any, list[dblock.Client]],
) -> None:
    quorum = files[0]
    stores = [m.store for m in quorum.members]
    assert provides(quorum, ManyKeys)
    assert quorum.max_keys == min(s.max_keys for s in stores)
    keeps_sets = all(provides(s, FairManyKeys) for s in stores if provides(s, FairQueue))
    assert provides(quorum, FairManyKeys) == keeps_sets
    with pytest.raises(ValueError, match="keys in one step"):
        quorum.acquire_many([f"k{i:03}" for i in range(quorum.max_keys + 1)], _owner(), 30)


def test_set_waiters_in_the_queue_go_in_their_order_and_keep_newcomers_out(
    files: tuple[Any, list[dblock.Client]], monkeypatch: pytest.MonkeyPatch
) -> None:
    quorum = files[0]
    if not provides(quorum, FairManyKeys):
        pytest.skip("the quorum's stores keep no queues for several keys (FairManyKeys)")
    # a queue keeper that does not answer within the window is passed over (turns are
    # fairness, never safety: tests/stores/quorum/test_faults.py); this test is about the
    # order it keeps, so a loaded machine's slow file access must not count as no answer
    monkeypatch.setattr(quorum_store, "ANSWER_WITHIN", 30.0)
    first, second = _owner(), _owner()
    quorum.enqueue_many(["a", "b"], first, 30.0)
    # entries made in the same millisecond of SQLite's clock are ordered by their owners
    time.sleep(0.01)
    quorum.enqueue_many(["b", "c"], second, 30.0)
    assert quorum.acquire_many(["c", "d"], _owner(), 30.0) is None  # a newcomer set
    assert quorum.acquire_fair("a", _owner(), 30.0, False) is None  # a newcomer lock
    assert quorum.acquire_many_in_turn(["b", "c"], second, 30.0) is None  # first is ahead
    assert quorum.requeue_many(["a", "b"], first, 30.0) is True
    tokens = quorum.acquire_many_in_turn(["a", "b"], first, 30.0)  # second is behind it
    assert tokens is not None and sorted(tokens) == ["a", "b"]
    assert quorum.probe("a", _owner()) == (False, 0)  # held, and its entry is gone
    assert quorum.release_many(tokens, first) is True
    later = quorum.acquire_many_in_turn(["b", "c"], second, 30.0)
    assert later is not None and later["b"] > tokens["b"]
    assert quorum.release_many(later, second) is True


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mysql", "redis"])
def test_each_kind_of_store_grants_a_set_all_or_none_in_one_step(kind: str, tmp_path: Path) -> None:
    """A store's FencedManyGrants: each key on grant_fenced's condition, all or none; a retry
    (a lost reply) granted again; the owner's holds ended whatever their tokens."""
    url = {
        "sqlite": f"sqlite:///{tmp_path}/member.sqlite3",
        "postgresql": POSTGRESQL_URL,
        "mysql": MYSQL_URL,
        "redis": REDIS_URL,
    }[kind]
    if kind != "sqlite":
        require_server(kind, url)
    table = fresh_table()
    try:
        with dblock.connect(url, table=table) as client:
            store = store_of(client)
            now_us = time.time_ns() // 1000
            fences = store.fence_many(KEYS)
            assert sorted(fences) == KEYS
            assert all(f >= now_us - 1_000_000 for f in fences.values())  # the clock floor
            tokens = {k: f + 1 for k, f in fences.items()}
            owner = _owner()
            assert store.grant_fenced_many(tokens, owner, 30.0) is True
            assert store.grant_fenced_many(tokens, owner, 30.0) is True  # a retry
            assert _held(client, KEYS) == {k: (owner, tokens[k]) for k in KEYS}
            assert all(store.fence_many(KEYS)[k] >= tokens[k] for k in KEYS)
            # held by owner: another owner is refused every key, above the fences or not
            above = {k: t + 1_000_000 for k, t in tokens.items()}
            assert store.grant_fenced_many(above, _owner(), 30.0) is False
            assert store.release_owned_many(KEYS, owner) is True
            assert _held(client, KEYS) == {}
            # free, but one key fenced at its token already: none of them is granted
            other = _owner()
            again = dict(tokens)
            again["a"] = store.fence_many(["a"])["a"] + 1
            assert store.grant_fenced_many(again, other, 30.0) is False
            assert _held(client, KEYS) == {}
            assert store.release_owned_many(KEYS, other) is False
    finally:
        if kind != "sqlite":
            drop_tables(url, table)
