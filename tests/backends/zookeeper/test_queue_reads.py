"""A waiter reads only what it waits behind (Curator's way): joining the queue is a create,
one read of the key's children and one read of the node just below, which also sets the
watch that wakes it; never a read per waiter ahead."""

from __future__ import annotations

from collections import Counter
from typing import Any

import dblock
from tests._internals import store_of


def test_joining_a_queue_of_six_reads_one_node_and_watches_it(url: str, table: str) -> None:
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        holder = client.lock("k", ttl=30)
        holder.acquire()
        owners = [f"waiter-{i}" for i in range(5)]
        subs = [store.subscribe("k", owner, "lock") for owner in owners]
        for owner in owners:
            assert store.acquire_or_enqueue("k", owner, 30.0, 9.0) is None
        zk = store._client()
        calls: Counter[str] = Counter()
        call = zk._call

        def counted(request: Any, async_object: Any) -> Any:
            calls[type(request).__name__] += 1
            return call(request, async_object)

        zk._call = counted
        last = store.subscribe("k", "last", "lock")
        try:
            assert store.acquire_or_enqueue("k", "last", 30.0, 9.0) is None
        finally:
            del zk._call
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
