"""Waiting on etcd: a release wakes the head of the queue only (each waiter acts on its
predecessor leaving, nothing else), waiters never poll, a waiter keeps one watch while it is
near the head, and a hand-off reaches only the nearest waiters' watches."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from typing import Any

import pytest

import dblock
from dblock.stores.etcd.store import EtcdStore
from tests._internals import store_of
from tests._waiting import start_in_turn, until


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

    threads = [threading.Thread(target=wait, args=(i, c)) for i, c in enumerate(waiters)]
    start_in_turn(threads, lambda: store_of(holder).probe("k", "nobody")[1])
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
    original = _etcd_watch.EtcdSubscription._add

    def counted(self: Any, *args: Any) -> int | None:
        made.append(threading.current_thread().name)
        return original(self, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(_etcd_watch.EtcdSubscription, "_add", counted)
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
    start_in_turn(threads, lambda: store_of(holder).probe("k", "nobody")[1])
    time.sleep(0.5)
    assert len(made) == 4  # one watch per waiter
    lock.release()
    for t in threads:
        t.join(30)
    assert order == [0, 1, 2, 3]
    assert len(made) == 4, "a waiter made a new watch when its predecessor left"
    for c in (holder, *waiters):
        c.close()


def _queue_up(
    url: str, table: str, n: int, holds: dict[int, float], timeouts: dict[int, float] | None = None
) -> tuple[list[dblock.Client], list[threading.Thread], list[tuple[int, float]]]:
    """``n`` clients that wait for "k" in this order, each in a thread, and hold it 0.05 s
    (waiter i: ``holds[i]`` s) once they get it (waiter i gives up after ``timeouts[i]`` s);
    the (waiter, time) they got it. Each starts once the one before it has queued (a start
    0.15 s after it was not enough on a loaded machine: waiters 3 and 4 queued swapped)."""
    clients = [dblock.connect(url, table=table) for _ in range(n)]
    got: list[tuple[int, float]] = []

    def wait(i: int, client: dblock.Client) -> None:
        with contextlib.suppress(dblock.LockTimeout):
            with client.lock("k", ttl=30, timeout=(timeouts or {}).get(i, 60)):
                got.append((i, time.monotonic()))
                time.sleep(holds.get(i, 0.05))

    threads = [threading.Thread(target=wait, args=(i, c)) for i, c in enumerate(clients)]
    start_in_turn(
        threads, lambda: store_of(clients[0]).probe("k", "nobody")[1], tuple(timeouts or {})
    )
    return clients, threads, got


def test_a_hand_off_reaches_only_the_nearest_waiters_watches(
    url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With many waiters, a release and the grant that follows it reach the watches of the
    NEAR nearest waiters and of one far waiter: a watch of the key's whole range in each of
    them would hear every deletion (24 waiters: about 47 responses for one hand-off)."""
    from dblock.stores.etcd import watch as _etcd_watch

    heard: list[int] = []
    original = _etcd_watch.EtcdSubscription._heard

    def counted(self: Any, response: Any) -> None:
        heard.append(id(self))
        original(self, response)

    monkeypatch.setattr(_etcd_watch.EtcdSubscription, "_heard", counted)
    holder = dblock.connect(url, table=table)
    lock = holder.lock("k", ttl=30)
    assert lock.acquire()
    clients, threads, got = _queue_up(url, table, 24, {0: 1.0})
    time.sleep(0.5)
    heard.clear()
    lock.release()
    until(lambda: bool(got), "the first waiter got the lock")
    time.sleep(0.3)  # (the first holds 1 s: nothing else moves meanwhile)
    one_hand_off = len(heard)
    assert [i for i, _ in got] == [0]
    for t in threads:
        t.join(60)
    assert [i for i, _ in got] == list(range(24))
    assert one_hand_off <= 2 * (_etcd_watch.NEAR + 1) + 2, one_hand_off
    for c in (holder, *clients):
        c.close()


def test_a_far_waiter_hears_of_a_predecessor_that_left_while_it_was_far(
    url: str, table: str
) -> None:
    """Waiter 12 is far (12 ahead) and watches only its sentinel (waiter 3); its predecessor,
    waiter 11, gives up just after waiter 12 looked. When the sentinel leaves, waiter 12
    watches the range from that look on, so it hears that waiter 11 is gone and goes right
    after waiter 10: a watch from the sentinel's leaving on would wait for a deletion that
    came before it, until the wait's poll (3.75 s at least) ends."""
    holder = dblock.connect(url, table=table)
    lock = holder.lock("k", ttl=30)
    assert lock.acquire()
    clients, threads, got = _queue_up(url, table, 13, {}, timeouts={11: 0.3})
    time.sleep(0.3)  # waiter 11 has given up
    lock.release()
    for t in threads:
        t.join(60)
    order = [i for i, _ in got]
    assert order == [*range(11), 12]
    gap = got[-1][1] - got[-2][1]
    assert gap < 1.5, f"waiter 12 got the lock {gap:.2f} s after waiter 10"
    for c in (holder, *clients):
        c.close()
