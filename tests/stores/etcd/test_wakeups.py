"""Waiting on etcd: a release wakes the head of the queue only (each waiter acts on its
predecessor leaving, nothing else), waiters never poll, and a waiter keeps one watch."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

import dblock
from dblock.stores.etcd.store import EtcdStore


def test_a_release_wakes_only_the_head(
    url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: Counter[str] = Counter()
    for name in ("acquire_fair", "probe"):
        original = getattr(EtcdStore, name)

        def counted(self: EtcdStore, *args: Any, _o: Any = original, _n: str = name) -> Any:
            calls[_n] += 1
            return _o(self, *args)

        monkeypatch.setattr(EtcdStore, name, counted)
    holder = dblock.connect(url, table=table)
    waiters = [dblock.connect(url, table=table) for _ in range(4)]
    lock = holder.lock("k", ttl=30)
    assert lock.acquire()
    order: list[int] = []
    release = threading.Event()

    def wait(i: int, client: dblock.Client) -> None:
        with client.lock("k", ttl=30, timeout=60):
            order.append(i)
            release.wait(30)

    threads = []
    for i, c in enumerate(waiters):
        threads.append(threading.Thread(target=wait, args=(i, c)))
        threads[-1].start()
        time.sleep(0.3)  # they queue in this order
    time.sleep(1.0)
    calls.clear()
    lock.release()
    deadline = time.monotonic() + 10
    while not order and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # anyone else woken would have tried or probed by now
    assert order == [0]
    assert calls["acquire_fair"] == 1 and calls["probe"] == 0, calls
    release.set()
    for t in threads:
        t.join(30)
    assert order == [0, 1, 2, 3]
    for c in (holder, *waiters):
        c.close()


def test_a_queued_waiter_keeps_one_watch_while_the_queue_moves(
    url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No watch is made while the queue moves: etcd may put a new watch among its unsynced
    watchers, which hear of a release only at its next 100 ms catch-up."""
    from dblock.stores.etcd import watch as _etcd_watch

    made: list[str] = []
    original = _etcd_watch.EtcdSubscription._start

    def counted(self: Any, *args: Any) -> bool:
        made.append(threading.current_thread().name)
        return bool(original(self, *args))

    monkeypatch.setattr(_etcd_watch.EtcdSubscription, "_start", counted)
    holder = dblock.connect(url, table=table)
    waiters = [dblock.connect(url, table=table) for _ in range(4)]
    lock = holder.lock("k", ttl=30)
    assert lock.acquire()
    order: list[int] = []

    def wait(i: int, client: dblock.Client) -> None:
        with client.lock("k", ttl=30, timeout=60):
            order.append(i)
            time.sleep(0.05)

    threads = [threading.Thread(target=wait, args=(i, c)) for i, c in enumerate(waiters)]
    for t in threads:
        t.start()
        time.sleep(0.3)  # they queue in this order
    time.sleep(0.5)
    assert len(made) == 4  # one watch per waiter
    lock.release()
    for t in threads:
        t.join(30)
    assert order == [0, 1, 2, 3]
    assert len(made) == 4, "a waiter made a new watch when its predecessor left"
    for c in (holder, *waiters):
        c.close()
