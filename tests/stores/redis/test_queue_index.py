"""The Redis store's queue index (scripts.py, ``walk``): the head, and the waiters ahead of one,
are read from it in queue order, past entries that expired, left or were granted; it keeps
no member whose entry is gone, and ``purge`` leaves none behind."""

from __future__ import annotations

import time

import dblock
from tests._internals import store_of
from tests._servers import raw_redis


def _index(url: str, table: str, key: str) -> list[str]:
    raw = raw_redis(url)
    try:
        return [str(m) for m in raw.zrange(f"dblock:{{{table}}}:q:{key}", 0, -1)]
    finally:
        raw.close()


def test_the_head_and_those_ahead_skip_entries_expired_left_or_granted(
    client: dblock.Client, url: str, table: str
) -> None:
    store = store_of(client)
    for owner, ttl in (("w1", 0.2), ("w2", 30), ("w3", 30), ("w4", 30), ("w5", 30)):
        store.enqueue("k", owner, "lock", ttl)
    store.dequeue("k", "w3")
    time.sleep(0.5)  # w1's entry has expired (on the server's clock)
    assert store.probe("k", "w5") == (True, 2)  # w2 and w4
    assert store.probe("k", "w2") == (True, 0)
    assert store.acquire_fair("k", "newcomer", 10, False) is None
    assert store.acquire_fair("k", "w4", 10, True) is None  # w2 is ahead
    token = store.acquire_fair("k", "w2", 10, True)
    assert token is not None
    assert _index(url, table, "k") == ["w4", "w5"]
    assert store.release("k", "w2", token)
    assert store.probe("k", "w5") == (True, 1)
    assert store.acquire_fair("k", "w4", 10, True) is not None


def test_a_release_hands_the_lock_to_the_head_past_gone_entries(
    client: dblock.Client, url: str, table: str
) -> None:
    store = store_of(client)
    token = store.acquire("k", "holder", 30, "lock")
    assert token is not None
    store.enqueue("k", "gone", "lock", 0.2, 30)
    store.enqueue("k", "next", "lock", 30, 30)
    time.sleep(0.5)
    assert store.release("k", "holder", token)
    info = client.info("k")
    assert info is not None and info.owner == "next"  # handed over, not to the expired one
    assert _index(url, table, "k") == []


def test_purge_leaves_no_index_behind(client: dblock.Client, url: str, table: str) -> None:
    store = store_of(client)
    for owner in ("a", "b"):
        store.enqueue("k", owner, "lock", 0.1)
    store.enqueue_many(["m1", "m2"], "c", 0.1)
    time.sleep(0.3)
    client.purge(older_than=0)
    raw = raw_redis(url)
    try:
        left = sorted(str(k) for k in raw.scan_iter(match=f"dblock:{{{table}}}:*"))
    finally:
        raw.close()
    assert left == [f"dblock:{{{table}}}:meta"]
