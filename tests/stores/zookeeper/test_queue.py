"""The queue's requests. A try sends its create with the read of the key's children right
behind it, one round trip (a session's requests are answered in order, so the list holds the
new node): a free key is taken in that round trip. A waiter reads only what it waits behind
(Curator's way): joining the queue is that round trip and one read of the node just below,
which also sets the watch that wakes it; never a read per waiter ahead. At its turn a waiter whose
entry still holds by itself takes the lock without a write (kazoo's recipe makes none
either): a read of the children, and the engine takes it as a lock handed over."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dblock
from tests._internals import store_of


@contextmanager
def counting(store: Any) -> Iterator[Counter[str]]:
    """The requests the store's kazoo client sends meanwhile, by type."""
    zk = store._client()
    calls: Counter[str] = Counter()
    call = zk._call

    def counted(request: Any, async_object: Any) -> Any:
        calls[type(request).__name__] += 1
        return call(request, async_object)

    zk._call = counted
    try:
        yield calls
    finally:
        del zk._call


@contextmanager
def rounds(store: Any) -> Iterator[list[list[str]]]:
    """The requests the calling thread sends meanwhile, grouped by when it waits for replies:
    one group per round trip (a new group starts with the first request after a wait)."""
    zk = store._client()
    groups: list[list[str]] = []
    waited = [True]
    call, make = zk._call, zk.handler.async_result

    def sent(request: Any, async_object: Any) -> Any:
        if waited[0]:
            groups.append([])
            waited[0] = False
        groups[-1].append(type(request).__name__)
        return call(request, async_object)

    def result() -> Any:
        made = make()
        get = made.get

        def waiting(*args: Any, **kwargs: Any) -> Any:
            waited[0] = True
            return get(*args, **kwargs)

        made.get = waiting
        return made

    zk._call, zk.handler.async_result = sent, result
    try:
        yield groups
    finally:
        del zk._call, zk.handler.async_result


def test_a_free_key_is_taken_in_one_round_trip(url: str, table: str) -> None:
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        first = client.lock("k", ttl=30)
        first.acquire()  # the key's node exists, as after any first use
        first.release()
        with rounds(store) as trips:
            token = store.acquire("k", "me", 30.0, "lock")
        assert token is not None
        assert trips == [["Create2", "GetChildren"]]
        with rounds(store) as trips:
            assert store.release("k", "me", token)
        assert trips == [["Delete"]]
        # a try that finds the key held is the same round trip, then its node's delete
        holder = client.lock("k", ttl=30)
        holder.acquire()
        with rounds(store) as trips:
            assert store.acquire("k", "other", 30.0, "lock") is None
        assert trips[0] == ["Create2", "GetChildren"]
        holder.release()


def test_joining_a_queue_of_six_reads_one_node_and_watches_it(url: str, table: str) -> None:
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        holder = client.lock("k", ttl=30)
        holder.acquire()
        owners = [f"waiter-{i}" for i in range(5)]
        subs = [store.subscribe("k", owner, "lock") for owner in owners]
        for owner in owners:
            assert store.acquire_or_enqueue("k", owner, 30.0, 9.0) is None
        last = store.subscribe("k", "last", "lock")
        with rounds(store) as trips:
            assert store.acquire_or_enqueue("k", "last", 30.0, 9.0) is None
        assert trips == [["Create2", "GetChildren"], ["GetData"]]
        # that read's watch is the waiter's: the waiter just ahead leaving wakes it
        assert not last.wait(0.2)
        store.dequeue("k", owners[-1])
        assert last.wait(10)
        for sub in [*subs, last]:
            sub.close()
        for owner in [*owners[:-1], "last"]:
            store.dequeue("k", owner)
        holder.release()


def _waiting_at_the_head(client: dblock.Client, owner: str) -> tuple[Any, Any]:
    """``owner`` queued behind a holder that then leaves: (its store, its subscription),
    woken by the release, its turn not yet tried."""
    store = store_of(client)
    holder = client.lock("k", ttl=30)
    holder.acquire()
    sub = store.subscribe("k", owner, "lock")
    assert store.acquire_or_enqueue("k", owner, 30.0, 9.0) is None
    holder.release()
    assert sub.wait(10)
    return store, sub


def test_a_waiter_takes_its_turn_without_a_request(url: str, table: str) -> None:
    """The holder, the only node below the waiter's, goes: nothing can be below the waiter's
    entry now (nodes below only go), so its try sends nothing, and its entry, which holds by
    itself, is handed over through its subscription. The lock then works as any: others
    wait behind it, its release frees it."""
    with dblock.connect(url, table=table) as client:
        store, sub = _waiting_at_the_head(client, "head")
        with counting(store) as calls:
            assert store.acquire_fair("k", "head", 30.0, True) is None
        assert calls == {}
        token = sub.granted
        assert token is not None and sub.wait(0)
        sub.close()
        info = client.info("k")
        assert info is not None and (info.owner, info.token) == ("head", token)
        assert not client.lock("k", ttl=30).acquire(timeout=0)
        assert store.release("k", "head", token)
        assert client.info("k") is None


def test_a_turn_its_waiter_leaves_untaken_frees_the_lock(url: str, table: str) -> None:
    """A waiter that gives up (its timeout, a cancellation) after its turn was taken for it
    but before it took it leaves the queue: the turn's node goes, so the lock is free at once
    rather than when its lease ends (30 s here)."""
    with dblock.connect(url, table=table) as client:
        store, sub = _waiting_at_the_head(client, "leaver")
        assert store.acquire_fair("k", "leaver", 30.0, True) is None
        assert sub.granted is not None
        sub.close()
        store.dequeue("k", "leaver")
        assert client.info("k") is None
        other = client.lock("k", ttl=30)
        assert other.acquire(timeout=0)
        other.release()


def test_a_waiter_ahead_leaving_is_not_the_waiters_turn(url: str, table: str) -> None:
    """The waiter just ahead leaves the queue while the holder below it still holds: that
    deletion does not make the next waiter the head. Its try reads the children again,
    finds the holder, and waits on, watching it; the holder's release then is its turn."""
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        holder = client.lock("k", ttl=30)
        holder.acquire()
        ahead = store.subscribe("k", "ahead", "lock")
        assert store.acquire_or_enqueue("k", "ahead", 30.0, 9.0) is None
        sub = store.subscribe("k", "next", "lock")
        assert store.acquire_or_enqueue("k", "next", 30.0, 9.0) is None
        store.dequeue("k", "ahead")
        ahead.close()
        assert sub.wait(10)
        with counting(store) as calls:
            assert store.acquire_fair("k", "next", 30.0, True) is None
        assert calls["GetChildren"] == 1
        assert sub.granted is None
        assert not sub.wait(0.2)
        info = client.info("k")
        assert info is not None and info.owner != "next"
        holder.release()
        assert sub.wait(10)
        with counting(store) as calls:
            assert store.acquire_fair("k", "next", 30.0, True) is None
        assert calls == {}
        token = sub.granted
        assert token is not None
        sub.close()
        info = client.info("k")
        assert info is not None and (info.owner, info.token) == ("next", token)
        assert store.release("k", "next", token)
