"""FairManyKeys and subscribe_many on Redis, against the machine's Redis: a waiter for several
keys queues on all of them in one script, at one place of an order common to all keys; its
entries count for newcomers and single-key waiters as a single-key waiter's do; a release
never hands it a lock but frees the key and rings it."""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any

import pytest

import dblock
from dblock.stores.redis import waiter as _redis_waiter
from tests._internals import store_of
from tests._servers import raw_redis

AB = ["a", "b"]


def _ahead(store: Any, keys: list[str], owner: str) -> list[int]:
    return [store.probe(k, owner)[1] for k in keys]


# -- (a) one order common to all keys ---------------------------------------------------------

ROUNDS = 60
POOL = [f"k{i}" for i in range(8)]
WAITERS = 4


def _keys_of(n: int, r: int) -> list[str]:
    """Waiter n's set in round r: 5 of the pool's 8 keys (any two sets share at least 2)."""
    return sorted(f"r{r}:{k}" for k in random.Random(r * 100 + n).sample(POOL, 5))


def _enqueuer(url: str, table: str, n: int, barrier: Any, out: Any) -> None:
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        for r in range(ROUNDS):
            barrier.wait(30)  # all waiters of the round at once
            store.enqueue_many(_keys_of(n, r), f"w{n}", 60)
    out.put(n)


def test_overlapping_waiters_hold_one_order_on_every_shared_key(
    client: dblock.Client, url: str, table: str
) -> None:
    """4 processes queue for overlapping sets at once, round after round: on every key two
    waiters share, the same one is ahead (one script per waiter, never one per key)."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(WAITERS), ctx.Queue()
    procs = [
        ctx.Process(target=_enqueuer, args=(url, table, n, barrier, out)) for n in range(WAITERS)
    ]
    for p in procs:
        p.start()
    assert sorted(out.get(timeout=120) for _ in procs) == list(range(WAITERS))
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    store = store_of(client)
    pairs = 0
    for r in range(ROUNDS):
        # place[n][key]: waiters ahead of waiter n on key
        place = [{k: store.probe(k, f"w{n}")[1] for k in _keys_of(n, r)} for n in range(WAITERS)]
        for n in range(WAITERS):
            for m in range(n + 1, WAITERS):
                shared = place[n].keys() & place[m].keys()
                # each key's queue holds exactly the waiters whose sets have it
                firsts = {place[n][k] < place[m][k] for k in shared}
                assert len(firsts) == 1, (r, n, m, {k: (place[n][k], place[m][k]) for k in shared})
                pairs += 1
        for k in {k for p in place for k in p}:
            lined = sorted(p[k] for p in place if k in p)
            assert lined == list(range(len(lined)))  # one entry per waiter, a strict order
    assert pairs == ROUNDS * WAITERS * (WAITERS - 1) // 2


def test_enqueue_many_is_a_fresh_arrival_on_every_key(client: dblock.Client) -> None:
    """Entries made again after one was lost all take one new place, behind a waiter that
    came meanwhile, also on the key where the old entry was still live."""
    store = store_of(client)
    store.enqueue_many(AB, "x", 30)
    store.dequeue("b", "x")  # one of x's entries is gone (as if expired)
    store.enqueue_many(AB, "y", 30)
    assert _ahead(store, AB, "x") == [0, 1]
    assert not store.requeue_many(AB, "x", 30)
    store.enqueue_many(AB, "x", 30)
    assert _ahead(store, AB, "x") == [1, 1]
    assert _ahead(store, AB, "y") == [0, 0]


def test_a_later_arrival_queues_behind_even_after_the_servers_clock_stepped_back(
    client: dblock.Client, url: str, table: str
) -> None:
    """An entry placed before the server's clock stepped back an hour (written here as the
    store would have written it then: its place an hour ahead of the clock now) stays ahead
    of every later arrival, single-key or many."""
    store = store_of(client)
    raw = raw_redis(url)
    try:
        seconds, micros = raw.time()
        now = seconds * 1_000_000 + micros
        hour = 3_600_000_000
        prefix = f"dblock:{{{table}}}:"
        raw.hset(f"{prefix}h:a", "early", f"1 lock 0 {now + hour} {now + 30_000_000} - ")
        raw.zadd(f"{prefix}q:a", {"early": now + hour})  # the queue's index (scripts.py)
        raw.hset(f"{prefix}meta", "queued", str(now + hour))
    finally:
        raw.close()
    store.enqueue_many(AB, "x", 30)
    store.enqueue("a", "single", "lock", 30)
    assert store.probe("a", "early")[1] == 0
    assert store.probe("a", "x")[1] == 1
    assert store.probe("a", "single")[1] == 2


# -- (b) a many-entry counts as a single-key waiter's entry --------------------------------


def test_a_many_entry_keeps_a_free_key_from_newcomers(
    client: dblock.Client, other: dblock.Client
) -> None:
    store, newcomer = store_of(client), store_of(other)
    store.enqueue_many(AB, "x", 30)
    assert client.info("a") is None
    assert newcomer.acquire_fair("a", "n1", 10, False) is None
    assert newcomer.acquire_or_enqueue("b", "n2", 10, 30) is None  # queued behind x
    assert newcomer.probe("b", "n2") == (True, 1)
    assert newcomer.acquire_many(["a"], "n3", 10) is None
    assert not other.lock("a", ttl=10).acquire(blocking=False)
    assert newcomer.acquire_fair("b", "n2", 10, True) is None  # a queued waiter behind x
    assert client.list() == []
    tokens = store.acquire_many_in_turn(AB, "x", 10)
    assert tokens is not None and sorted(tokens) == AB
    assert store.release_many(tokens, "x")  # b is handed to n2, queued with a lease
    held = client.info("b")
    assert held is not None and held.owner == "n2"
    store.dequeue("b", "n2")  # the lock handed to n2 (which hears nothing here) goes on
    lock = other.lock("a", ttl=10)
    assert lock.acquire(blocking=False)  # x's entries are gone: a newcomer takes the key
    lock.release()


def test_a_single_waiter_queued_earlier_goes_first(
    client: dblock.Client, other: dblock.Client
) -> None:
    store, single = store_of(client), store_of(other)
    single.enqueue("a", "s", "lock", 30)
    store.enqueue_many(AB, "x", 30)
    single.enqueue("b", "t", "lock", 30)  # behind x
    assert store.acquire_many_in_turn(AB, "x", 10) is None
    assert client.list() == []  # nothing taken
    assert single.acquire_fair("b", "t", 10, True) is None
    token = single.acquire_fair("a", "s", 10, True)
    assert token is not None
    assert store.acquire_many_in_turn(AB, "x", 10) is None  # a is s's now
    assert single.release("a", "s", token)
    assert client.info("a") is None  # not handed to x
    tokens = store.acquire_many_in_turn(AB, "x", 10)
    assert tokens is not None and tokens["a"] > token
    assert single.probe("b", "t") == (False, 0)


def test_entries_behind_a_many_waiter_do_not_block_it(
    client: dblock.Client, other: dblock.Client
) -> None:
    store, rest = store_of(client), store_of(other)
    rest.enqueue_many(["b"], "y", 30)  # ahead of x on b only
    store.enqueue_many(["a", "b", "c"], "x", 30)
    rest.enqueue("a", "t", "lock", 30, lease=10)
    rest.enqueue_many(["b", "c"], "z", 30)
    assert store.acquire_many_in_turn(["a", "b", "c"], "x", 10) is None
    rest.dequeue_many(["b"], "y")
    assert store.acquire_many_in_turn(["a", "b", "c"], "x", 10) is not None
    assert _ahead(rest, ["b", "c"], "z") == [0, 0]  # x's entries left with its take


# -- (c) no hand-over to a many-waiter; a release rings it -------------------------------------


@pytest.mark.parametrize("connection", ["own", "listener"])
def test_a_release_frees_a_key_headed_by_a_many_entry_and_wakes_its_waiter(
    client: dblock.Client,
    other: dblock.Client,
    connection: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The release does not hand the key to the head (a many-waiter), nor to the single
    waiter with a lease behind it: the key is free, and the many-waiter's subscription (on
    its thread's own pub/sub connection, or through the listener) is woken."""
    if connection == "listener":
        monkeypatch.setattr(_redis_waiter, "MAX_OWN", 0)
    store, holder = store_of(client), store_of(other)
    token = holder.acquire("b", "h", 30, "lock")
    assert token is not None
    sub = store.subscribe_many(AB, "x")
    assert sub is not None and sub.live
    expected = "OwnSubscription" if connection == "own" else "ListenedMany"
    assert type(sub).__name__ == expected
    try:
        store.enqueue_many(AB, "x", 30)
        holder.enqueue("b", "t", "lock", 30, lease=30)  # takes hand-overs, behind x
        other_key = holder.acquire("z", "h", 30, "lock")
        assert other_key is not None and holder.release("z", "h", other_key)
        assert not sub.wait(0.3)  # a key it does not wait for
        assert holder.release("b", "h", token)
        assert client.info("b") is None
        assert sub.wait(10)
        assert sub.granted is None
        tokens = store.acquire_many_in_turn(AB, "x", 10)
        assert tokens is not None and tokens["b"] > token
        assert store.release_many(tokens, "x")
        held = client.info("b")  # now t heads b's queue: handed to it
        assert held is not None and held.owner == "t"
    finally:
        sub.close()


def test_a_release_that_rings_everyone_wakes_a_many_waiter(
    client: dblock.Client, other: dblock.Client
) -> None:
    store = store_of(client)
    read = other.rwlock("b", ttl=30).read_lock()
    read.acquire()
    sub = store.subscribe_many(AB, "x")
    assert sub is not None
    try:
        store.enqueue_many(AB, "x", 30)
        assert store.acquire_many_in_turn(AB, "x", 10) is None
        read.release()
        assert sub.wait(10)
        assert store.acquire_many_in_turn(AB, "x", 10) is not None
    finally:
        sub.close()


def test_a_many_waiter_leaving_rings_the_next_head(
    client: dblock.Client, other: dblock.Client
) -> None:
    """x was rung for a freed key and gives up: the single-key waiter behind it is rung."""
    store, single = store_of(client), store_of(other)
    store.enqueue_many(AB, "x", 30)
    single.enqueue("a", "s", "lock", 30)
    sub = single.subscribe("a", "s")
    try:
        assert not sub.wait(0.2)
        store.dequeue_many(AB, "x")
        assert sub.wait(10)
        assert single.acquire_fair("a", "s", 10, True) is not None
    finally:
        sub.close()


# -- (d) taking in turn, and retries ----------------------------------------------------------


def test_acquire_in_turn_removes_every_entry_and_a_retry_takes_again(
    client: dblock.Client, other: dblock.Client
) -> None:
    keys = ["a", "b", "c"]
    store, rest = store_of(client), store_of(other)
    store.enqueue_many(keys, "x", 30)
    store.enqueue_many(keys, "x", 30)  # a retry: still one entry per key
    rest.enqueue_many(keys, "y", 30)
    assert _ahead(rest, keys, "y") == [1, 1, 1]
    first = store.acquire_many_in_turn(keys, "x", 10)
    assert first is not None
    assert _ahead(rest, keys, "y") == [0, 0, 0]
    again = store.acquire_many_in_turn(keys, "x", 10)  # a retry after a lost reply
    assert again is not None and all(again[k] > first[k] for k in keys)
    assert not store.requeue_many(keys, "x", 30)  # no entries left to refresh
    store.dequeue_many(keys, "x")
    store.dequeue_many(keys, "x")
    assert {i.key: (i.owner, i.token) for i in client.list()} == {
        k: ("x", again[k]) for k in keys
    }  # leaving the queue leaves the holds alone
    assert rest.acquire_many_in_turn(keys, "y", 10) is None
    assert store.release_many(again, "x")
    assert rest.acquire_many_in_turn(keys, "y", 10) is not None


# -- (e) refreshing -------------------------------------------------------------------------


def test_requeue_keeps_the_place_while_every_entry_is_live(client: dblock.Client) -> None:
    store = store_of(client)
    store.enqueue_many(AB, "x", 0.5)
    store.enqueue_many(AB, "y", 30)
    assert store.requeue_many(AB, "x", 30)
    time.sleep(0.6)
    assert _ahead(store, AB, "y") == [1, 1]  # x's entries outlived their first lease
    assert store.requeue_many(AB, "x", 30)  # a retry


def test_requeue_fails_once_one_entry_expired(client: dblock.Client) -> None:
    store = store_of(client)
    store.enqueue_many(AB, "x", 0.3)
    assert store.requeue("a", "x", "lock", 30)  # only a's entry is extended
    time.sleep(0.4)
    assert not store.requeue_many(AB, "x", 30)
    assert store.probe("b", "y") == (True, 0)  # b's entry stays expired
    store.enqueue_many(AB, "x", 30)
    assert store.requeue_many(AB, "x", 30)
    assert _ahead(store, AB, "y") == [1, 1]


# -- (f) tokens, limits ---------------------------------------------------------------------


def test_tokens_taken_in_turn_still_rise(client: dblock.Client) -> None:
    """Above every earlier token of the key, rising within the step, and below later ones."""
    store = store_of(client)
    before = store.acquire("b", "earlier", 10, "lock")
    assert before is not None and store.release("b", "earlier", before)
    store.enqueue_many(AB, "x", 30)
    tokens = store.acquire_many_in_turn(AB, "x", 10)
    assert tokens is not None
    assert before < tokens["a"] < tokens["b"]
    assert store.release_many(tokens, "x")
    later = store.acquire("a", "later", 10, "lock")
    assert later is not None and later > tokens["b"]


def test_too_many_keys_are_refused(client: dblock.Client) -> None:
    store = store_of(client)
    keys = [f"k{i:03}" for i in range(65)]
    for call in (store.enqueue_many, store.requeue_many, store.acquire_many_in_turn):
        with pytest.raises(ValueError, match="at most 64"):
            call(keys, "x", 10)
    with pytest.raises(ValueError, match="at most 64"):
        store.dequeue_many(keys, "x")
