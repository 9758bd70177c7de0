"""The queue's requests. A waiter reads only what it waits behind (Curator's way): joining the
queue is a create, one read of the key's children and one read of the node just below, which
also sets the watch that wakes it; never a read per waiter ahead. At its turn a waiter whose
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
        with counting(store) as calls:
            assert store.acquire_or_enqueue("k", "last", 30.0, 9.0) is None
        assert calls == {"Create2": 1, "GetChildren": 1, "GetData": 1}
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


def test_a_waiter_takes_its_turn_without_a_write(url: str, table: str) -> None:
    """The holder goes; the head waiter's try reads the children, finds nothing below its
    entry (which holds by itself), and hands it over through its subscription: no setData.
    The lock then works as any: others wait behind it, its release frees it."""
    with dblock.connect(url, table=table) as client:
        store, sub = _waiting_at_the_head(client, "head")
        with counting(store) as calls:
            assert store.acquire_fair("k", "head", 30.0, True) is None
        assert calls == {"GetChildren": 1}
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
