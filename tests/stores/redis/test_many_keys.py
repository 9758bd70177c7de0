"""ManyKeys on Redis: acquire_many, renew_many and release_many, each one script over all the
keys, against the machine's Redis; holds taken so are ordinary lock holds."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from typing import Any

import pytest

import dblock
from tests._internals import store_of
from tests._private_servers import PrivateServer
from tests._servers import raw_redis

KEYS = ["a", "b", "c"]


def test_all_or_none(client: dblock.Client, other: dblock.Client) -> None:
    store = store_of(client)
    with other.lock("b", ttl=10):
        assert store.acquire_many(KEYS, "me", 10) is None
        assert client.info("a") is None
        assert client.info("c") is None
        assert store.acquire_many(["a", "c"], "me", 10) is not None
    assert store.acquire_many(["b"], "me", 10) is not None
    assert {i.key: (i.owner, i.kind) for i in client.list()} == {k: ("me", "lock") for k in KEYS}


def test_tokens_rise_above_earlier_single_key_tokens(client: dblock.Client) -> None:
    store = store_of(client)
    lock = client.lock("b", ttl=10)
    with lock:
        before = lock.token
    assert before is not None
    first = store.acquire_many(KEYS, "me", 10)
    assert first is not None and sorted(first) == KEYS
    assert all(t > before for t in first.values())
    assert [first[k] for k in KEYS] == sorted(first.values())  # distinct, rising
    assert store.release_many(first, "me")
    second = store.acquire_many(KEYS, "me", 10)
    assert second is not None
    assert min(second.values()) > max(first.values())
    assert all(client.info(k).token == t for k, t in second.items())  # type: ignore[union-attr]


def test_tokens_rise_across_a_purge_and_a_restart_that_lost_everything(
    server: PrivateServer,
) -> None:
    with dblock.connect(server.url, table="many") as client:
        store = store_of(client)
        first = store.acquire_many(KEYS, "me", 30)
        assert first is not None and store.release_many(first, "me")
        assert client.purge(older_than=0) == len(KEYS)
        second = store.acquire_many(KEYS, "me", 30)
        assert second is not None and min(second.values()) > max(first.values())
        server.kill()
        server.start()
        raw = raw_redis(server.url)
        assert raw.dbsize() == 0  # the restart forgot every key, the last token too
        raw.close()
        third = store.acquire_many(KEYS, "you", 30)
        assert third is not None and min(third.values()) > max(second.values())


def test_a_lock_hold_and_a_many_hold_exclude_each_other(
    client: dblock.Client, other: dblock.Client
) -> None:
    store = store_of(client)
    with other.rwlock("a", ttl=10).read_lock():
        assert store.acquire_many(KEYS, "me", 10) is None
    tokens = store.acquire_many(KEYS, "me", 10)
    assert tokens is not None
    assert not other.lock("a").acquire(blocking=False)
    assert not other.lock("c").acquire(blocking=False)
    assert store.release_many(tokens, "me")
    lock = other.lock("c", ttl=10)
    assert lock.acquire(blocking=False)
    assert lock.token is not None and lock.token > tokens["c"]
    lock.release()


def test_renew_and_release_say_whether_every_hold_was_live(client: dblock.Client) -> None:
    store = store_of(client)
    tokens = store.acquire_many(KEYS, "me", 5)
    assert tokens is not None
    assert store.renew_many(tokens, "me", 30)
    expiry = {k: client.info(k).expires_at for k in KEYS}  # type: ignore[union-attr]
    assert client.force_release("b")
    time.sleep(0.01)
    assert not store.renew_many(tokens, "me", 60)
    for k in ("a", "c"):
        assert client.info(k).expires_at > expiry[k]  # type: ignore[union-attr]
    assert not store.renew_many(tokens, "someone else", 60)
    assert not store.release_many(tokens, "me")
    assert client.list() == []
    assert not store.release_many(tokens, "me")


def test_a_retried_release_many_counts_what_its_first_attempt_ended(
    client: dblock.Client,
) -> None:
    """The script's retry flag (set by the store when it sends the script again after a lost
    reply), given here directly: the holds the first attempt ended count as ended by it."""
    store = store_of(client)
    tokens = store.acquire_many(KEYS, "me", 10)
    assert tokens is not None
    assert store.release_many(tokens, "me")
    values = list(tokens.values())
    assert store._many("release", "release_many", KEYS, "me", 1, *values) == 1
    assert store._many("release", "release_many", KEYS, "me", 0, *values) == 0
    again = store.acquire_many(KEYS, "me", 10)
    assert again is not None and client.force_release("a")  # not ended by a release
    assert store.release_many({"b": again["b"]}, "me")
    assert store._many("release", "release_many", KEYS, "me", 1, *again.values()) == 0
    assert client.info("c") is None  # ended all the same


def test_holds_expire_on_the_servers_clock(client: dblock.Client) -> None:
    store = store_of(client)
    assert store.acquire_many(KEYS, "me", 1) is not None
    assert store.acquire_many(KEYS, "you", 10) is None
    time.sleep(1.05)
    assert store.acquire_many(KEYS, "you", 10) is not None
    assert {i.owner for i in client.list()} == {"you"}


def test_a_retry_of_the_same_owner_takes_the_keys_again(client: dblock.Client) -> None:
    store = store_of(client)
    first = store.acquire_many(KEYS, "me", 10)
    again = store.acquire_many(KEYS, "me", 10)
    assert first is not None and again is not None
    assert all(again[k] > first[k] for k in KEYS)
    assert not store.renew_many(first, "me", 10)  # the first tokens are superseded
    assert store.release_many(again, "me")


def test_a_live_waiter_keeps_a_free_key_from_a_newcomer(
    client: dblock.Client, other: dblock.Client
) -> None:
    store = store_of(client)
    store_of(other).enqueue("b", "waiter", "lock", 10, lease=10)
    assert client.info("b") is None
    assert store.acquire_many(KEYS, "me", 10) is None
    assert client.list() == []
    store_of(other).dequeue("b", "waiter")
    assert store.acquire_many(KEYS, "me", 10) is not None


def test_release_many_hands_a_key_to_its_waiter(
    client: dblock.Client, other: dblock.Client
) -> None:
    store = store_of(client)
    tokens = store.acquire_many(KEYS, "me", 10)
    assert tokens is not None
    lock = other.lock("b", ttl=10)
    got: list[tuple[float, bool]] = []  # (when it got the key, its hold is what info shows)

    def wait() -> None:
        if lock.acquire(timeout=5):
            info = client.info("b")
            got.append((time.time(), info is not None and info.owner == lock.owner))
            lock.release()

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 5
    while store.probe("b", "nobody")[1] == 0:  # until it queues
        assert time.monotonic() < deadline
        time.sleep(0.01)
    released = time.time()
    assert store.release_many(tokens, "me")
    waiter.join(5)
    assert got, "the waiter did not get the key"
    assert got[0][1]
    assert got[0][0] - released < 0.5  # woken by the hand-over, not by a poll


def test_a_release_nobody_queued_for_frees_and_rings_every_key(
    client: dblock.Client, url: str
) -> None:
    """With no holders hash on any key the scripts skip the queues (one EXISTS): the release
    still frees each key, records the token it ended, and rings everyone for each key, as
    RELEASE does; the take still returns each key's token, in the keys' order."""
    store = store_of(client)
    raw = raw_redis(url)
    pubsub = raw.pubsub()
    pubsub.subscribe(store.channel)
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
    try:
        keys = ["c", "a", "b"]
        tokens = store.acquire_many(keys, "me", 10)
        assert tokens is not None and list(tokens) == keys
        assert tokens == {k: client.info(k).token for k in keys}  # type: ignore[union-attr]
        assert store.release_many(tokens, "me")
        assert client.list() == []
        for k in keys:
            assert raw.hget(f"{store.prefix}r:{k}", "ended") == str(tokens[k])
        rung = []
        while len(rung) < len(keys):
            message = pubsub.get_message(timeout=5)
            assert message is not None, f"rung only {rung}"
            rung.append(message["data"])
        assert rung == [" c", " a", " b"]
    finally:
        pubsub.close()
        raw.close()


def test_too_many_keys_are_refused(client: dblock.Client) -> None:
    store = store_of(client)
    with pytest.raises(ValueError, match="at most 64"):
        store.acquire_many([f"k{i:03}" for i in range(65)], "me", 10)


# -- atomicity as other processes see it ---------------------------------------------------------

POOL = [f"k{i}" for i in range(8)]
TAKES = 15  # sets each worker of the partial-view test takes at least
#: each key's owner while held, all read at one instant of the server
OBSERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for i = 1, #KEYS do
  local v = redis.call('HMGET', KEYS[i], 'owner', 'exp')
  if v[1] and tonumber(v[2]) > now then out[i] = v[1] else out[i] = '' end
end
return out
"""


def _worker(url: str, table: str, n: int, seconds: float, out: Any) -> None:
    """Takes sets for ``seconds`` and until it has taken TAKES (a loaded machine's few seconds
    can hold only a handful)."""
    rng = random.Random(n)
    taken = 0
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        end = time.monotonic() + seconds
        while taken < TAKES or time.monotonic() < end:
            keys = sorted(rng.sample(POOL, rng.randint(2, 4)))
            owner = f"w{n}-{taken}:{','.join(keys)}"  # the set it takes, for the observers
            tokens = store.acquire_many(keys, owner, 10)
            if tokens is not None:
                taken += 1
                assert store.release_many(tokens, owner)
    out.put(("worker", taken, []))


def _observer(url: str, table: str, stop: Any, out: Any) -> None:
    """Reads every key's owner in one script until the workers are done (``stop`` set)."""
    raw = raw_redis(url)
    observe = raw.register_script(OBSERVE)
    names = [f"dblock:{{{table}}}:r:{k}" for k in POOL]
    seen, partial = 0, []
    while not stop.is_set():
        owners = observe(keys=names)
        held: dict[str, set[str]] = {}
        for key, owner in zip(POOL, owners, strict=True):
            if owner:
                held.setdefault(owner, set()).add(key)
        for owner, keys in held.items():
            seen += 1
            if keys != set(owner.split(":", 1)[1].split(",")):
                partial.append((owner, sorted(keys)))
    raw.close()
    out.put(("observer", seen, partial))


def test_no_process_ever_sees_part_of_a_set_held(url: str, table: str) -> None:
    """4 processes take and release overlapping sets while 2 read every key's owner in one
    script: an owner is seen holding all of its set or none of it."""
    ctx = multiprocessing.get_context("fork")
    out, stop = ctx.Queue(), ctx.Event()
    seconds = 4.0
    workers = [ctx.Process(target=_worker, args=(url, table, n, seconds, out)) for n in range(4)]
    observers = [ctx.Process(target=_observer, args=(url, table, stop, out)) for _ in range(2)]
    procs = workers + observers
    try:
        for p in procs:
            p.start()
        results = [out.get(timeout=90) for _ in workers]
        stop.set()
        results += [out.get(timeout=30) for _ in observers]
    finally:
        stop.set()
        for p in procs:
            p.join(5)
    assert all(p.exitcode == 0 for p in procs)
    taken = sum(n for who, n, _ in results if who == "worker")
    seen = sum(n for who, n, _ in results if who == "observer")
    partial = [p for _, _, ps in results for p in ps]
    assert partial == []
    assert taken >= 4 * TAKES, taken
    assert seen > 10, seen
