"""ManyKeys on the SQL stores (acquire_many, renew_many, release_many) and FairManyKeys (a
waiter's entries in every key's lock queue): the cases each SQL store's ``test_many_keys.py``
runs against its real server, through a fixture ``many_url`` (the store's URL) it defines.
Also the worker processes of the atomicity test: ``python -m tests.stores._sql_many_keys
take|look URL TABLE PREFIX``, which print "ready" once connected, then read a file's path from
stdin and start: a taker stops after a count of sets, a reader once that file exists.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import dblock
from dblock._contract import FairManyKeys, ManyKeys
from tests._internals import store_of
from tests._servers import drop_tables
from tests._worker import ROOT

TTL = 30.0
#: the lifetime of a waiter's queue entries (the engine's QUEUE_TTL)
QUEUE_TTL = 9.0
TAKES = 5  # sets each taker takes in the partial-view test


@pytest.fixture
def many_table(many_url: str) -> Iterator[str]:
    name = "t_" + uuid.uuid4().hex[:16]
    dblock.connect(many_url, table=name, create_schema=True).close()
    yield name
    drop_tables(many_url, name)


@pytest.fixture
def many(many_url: str, many_table: str) -> Iterator[tuple[dblock.Client, Any]]:
    with dblock.connect(many_url, table=many_table) as client:
        yield client, store_of(client)


def _keys(n: int) -> list[str]:
    base = "mk-" + uuid.uuid4().hex[:8]
    return sorted(f"{base}-{i}" for i in range(n))


def test_store_declares_many_keys(many: tuple[dblock.Client, Any]) -> None:
    _, store = many
    assert isinstance(store, ManyKeys)
    assert 1 <= store.max_keys <= 64


def test_all_or_none(many: tuple[dblock.Client, Any], many_url: str, many_table: str) -> None:
    _, store = many
    keys = _keys(3)
    with dblock.connect(many_url, table=many_table) as other:
        held = other.lock(keys[1], ttl=TTL)
        assert held.acquire(blocking=False)
        assert store.acquire_many(keys, "o1", TTL) is None
        assert store.info(keys[0]) is None
        assert store.info(keys[2]) is None
        assert store.info(keys[1]).owner != "o1"
        held.release()
    tokens = store.acquire_many(keys, "o1", TTL)
    assert tokens is not None and sorted(tokens) == keys
    assert all(store.info(k).owner == "o1" and store.info(k).kind == "lock" for k in keys)


def test_tokens_rise_above_every_earlier_token(many: tuple[dblock.Client, Any]) -> None:
    client, store = many
    keys = _keys(3)
    with client.lock(keys[0], ttl=TTL) as lock:
        single = lock.token
    first = store.acquire_many(keys, "o1", TTL)
    assert first is not None and first[keys[0]] > single
    assert store.release_many(first, "o1")
    second = store.acquire_many(keys, "o2", TTL)
    assert second is not None
    assert all(second[k] > first[k] for k in keys)
    assert store.release_many(second, "o2")
    with client.lock(keys[2], ttl=TTL) as lock:
        assert lock.token > second[keys[2]]


def test_excludes_and_is_excluded_by_plain_locks(many: tuple[dblock.Client, Any]) -> None:
    client, store = many
    keys = _keys(2)
    tokens = store.acquire_many(keys, "o1", TTL)
    assert tokens is not None
    assert not client.lock(keys[1], ttl=TTL).acquire(blocking=False)
    assert store.release_many(tokens, "o1")
    lock = client.lock(keys[1], ttl=TTL)
    assert lock.acquire(blocking=False)
    assert store.acquire_many(keys, "o1", TTL) is None
    lock.release()


def test_every_kind_of_hold_excludes_acquire_many(
    many: tuple[dblock.Client, Any], many_url: str, many_table: str
) -> None:
    """A read hold, a semaphore permit, a write hold, a session lock (``ttl=None``) and a
    once-record in progress each keep acquire_many off their key; and an acquire_many hold
    keeps a reader out."""
    _, store = many
    keys = _keys(3)
    with dblock.connect(many_url, table=many_table) as other:
        holds = [
            other.rwlock(keys[1]).read_lock(),
            other.semaphore(keys[1], 2),
            other.rwlock(keys[1]).write_lock(),
            other.lock(keys[1], ttl=None),
        ]
        for hold in holds:
            assert hold.acquire(blocking=False), hold
            assert store.acquire_many(keys, "o1", TTL) is None, hold
            assert store.info(keys[0]) is None and store.info(keys[2]) is None
            hold.release()
        with other.once(keys[1]):  # its record, succeeded, keeps locks off the key for good
            assert store.acquire_many(keys, "o1", TTL) is None
    tokens = store.acquire_many(keys[:1] + keys[2:], "o1", TTL)
    assert tokens is not None
    assert not _other_reader(many_url, many_table, keys[0])
    assert store.release_many(tokens, "o1")


def _other_reader(url: str, table: str, key: str) -> bool:
    """Whether another client's read hold of ``key`` is granted (and then let go)."""
    with dblock.connect(url, table=table) as other:
        hold = other.rwlock(key).read_lock()
        if not hold.acquire(blocking=False):
            return False
        hold.release()
        return True


def test_renew_and_release_report_a_lost_key(many: tuple[dblock.Client, Any]) -> None:
    _, store = many
    keys = _keys(3)
    tokens = store.acquire_many(keys, "o1", 5.0)
    assert tokens is not None
    before = store.info(keys[0]).expires_at
    assert store.renew_many(tokens, "o1", TTL)
    assert store.force_release(keys[1])
    assert not store.renew_many(tokens, "o1", 60.0)
    assert store.info(keys[0]).expires_at > before
    assert store.info(keys[2]).expires_at > before
    assert not store.release_many(tokens, "o1")
    assert all(store.info(k) is None for k in keys)
    assert not store.release_many(tokens, "o1")  # gone already
    assert not store.renew_many(tokens, "o1", TTL)


def test_wrong_owner_or_token_ends_nothing(many: tuple[dblock.Client, Any]) -> None:
    _, store = many
    keys = _keys(2)
    tokens = store.acquire_many(keys, "o1", TTL)
    assert tokens is not None
    assert not store.release_many(tokens, "o2")
    assert not store.release_many({k: t + 1000 for k, t in tokens.items()}, "o1")
    assert all(store.info(k).owner == "o1" for k in keys)
    assert store.release_many(tokens, "o1")


def test_expired_holds_are_taken_by_another_owner(many: tuple[dblock.Client, Any]) -> None:
    _, store = many
    keys = _keys(3)
    first = store.acquire_many(keys, "o1", 0.5)
    assert first is not None
    assert store.acquire_many(keys, "o2", TTL) is None
    time.sleep(0.7)
    second = store.acquire_many(keys, "o2", TTL)
    assert second is not None and all(second[k] > first[k] for k in keys)
    assert not store.renew_many(first, "o1", TTL)


def test_a_retry_takes_the_owners_keys_again(many: tuple[dblock.Client, Any]) -> None:
    _, store = many
    keys = _keys(3)
    first = store.acquire_many(keys, "o1", TTL)
    again = store.acquire_many(keys, "o1", TTL)
    assert first is not None and again is not None
    assert all(again[k] > first[k] for k in keys)
    assert all(store.info(k).token == again[k] for k in keys)
    assert store.release_many(again, "o1")


def _lose_the_first_reply(store: Any) -> list[int]:
    """From now on the store's first operation that commits fails after its commit (after
    the transaction or the autocommitted statement that it runs), as if the connection had
    dropped before the reply (the driver's own error for it): the pool retries the operation
    on a new connection. The list gets an item when that happened."""
    real = store.run
    lost: list[int] = []

    def run(what: str, op: Callable[[Any], Any], **kw: Any) -> Any:
        def once(conn: Any) -> Any:
            result = op(conn)
            if not lost:
                lost.append(1)
                raise _dropped(store.name)
            return result

        return real(what, once, **kw)

    store.run = run
    return lost


def _dropped(dialect: str) -> Exception:
    if dialect == "postgresql":
        import psycopg

        return psycopg.OperationalError("server closed the connection unexpectedly")
    if dialect == "mysql":
        import pymysql

        return pymysql.err.OperationalError(2013, "Lost connection to server during query")
    return sqlite3.ProgrammingError("Cannot operate on a closed database.")


def test_a_release_many_retried_after_a_lost_reply_succeeds(
    many: tuple[dblock.Client, Any],
) -> None:
    _, store = many
    keys = _keys(3)
    tokens = store.acquire_many(keys, "o1", TTL)
    assert tokens is not None
    lost = _lose_the_first_reply(store)
    assert store.release_many(tokens, "o1")  # the retry finds its own release done
    assert lost and all(store.info(k) is None for k in keys)
    assert not store.release_many(tokens, "o1")


def test_an_acquire_many_retried_after_a_lost_reply_holds_every_key(
    many: tuple[dblock.Client, Any],
) -> None:
    _, store = many
    keys = _keys(3)
    lost = _lose_the_first_reply(store)
    tokens = store.acquire_many(keys, "o1", TTL)  # the retry takes its own keys again
    assert lost and tokens is not None
    assert all(store.info(k).token == tokens[k] and store.info(k).owner == "o1" for k in keys)
    assert store.release_many(tokens, "o1")


def test_a_queued_waiter_blocks_acquire_many(many: tuple[dblock.Client, Any]) -> None:
    client, store = many
    keys = _keys(3)
    with client.lock(keys[1], ttl=TTL):  # a waiter queues for a key that was held
        store.enqueue(keys[1], "waiter", "lock", TTL)
    assert store.acquire_fair(keys[1], "o1", TTL, False) is None  # the same rule as this:
    assert store.acquire_many(keys, "o1", TTL) is None
    assert all(store.info(k) is None for k in keys)
    store.dequeue(keys[1], "waiter")
    assert store.acquire_many(keys, "o1", TTL) is not None


def test_release_many_wakes_a_waiter(
    many: tuple[dblock.Client, Any], many_url: str, many_table: str
) -> None:
    """A waiter blocked in ``client.lock(key).acquire()`` gets the key soon after release_many
    (by the store's own hand-over or wake-up), long before its timeout."""
    _, store = many
    keys = _keys(2)
    tokens = store.acquire_many(keys, "o1", TTL)
    assert tokens is not None
    with dblock.connect(many_url, table=many_table) as other:
        lock = other.lock(keys[1], ttl=TTL)
        got: list[float] = []
        checked = threading.Event()

        def wait() -> None:
            if lock.acquire(timeout=15):
                got.append(time.monotonic())
                # held until the hand-over is checked (a release at once could free the key
                # before the check reads it: CI found it free)
                checked.wait(10)
                lock.release()

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.3)
        released = time.monotonic()
        assert store.release_many(tokens, "o1")
        checked.set()
        thread.join(20)
        assert got and got[0] - released < 3.0


# -- FairManyKeys: a waiter's entries in every key's queue ---------------------------------


def _queues(store: Any, keys: list[str]) -> dict[str, list[tuple[str, Any]]]:
    """Each key's live queue entries in queue order: (owner, acquired_at)."""
    queues: dict[str, list[tuple[str, Any]]] = {k: [] for k in keys}
    for entry in store.waiters(_prefix(keys)):
        if entry.key in queues:
            queues[entry.key].append((entry.owner, entry.acquired_at))
    return queues


def queued_many(store: Any, n: int) -> list[str]:
    """``n`` new keys, with "m"'s entries queued on every one."""
    keys = _keys(n)
    store.enqueue_many(keys, "m", QUEUE_TTL)
    return keys


def _taken_in_turn(store: Any, keys: list[str], owner: str, above: dict[str, int]) -> None:
    """``owner`` takes its keys in turn, each with a token above ``above``'s, and lets go."""
    tokens = store.acquire_many_in_turn(keys, owner, TTL)
    assert tokens is not None and all(tokens[k] > t for k, t in above.items())
    assert store.release_many(tokens, owner)


@contextmanager
def subscribed_many(store: Any, keys: list[str], owner: str) -> Iterator[Any]:
    """The store's subscription of a waiter for ``keys`` (None if it has none), closed after."""
    sub = store.subscribe_many(keys, owner)
    try:
        yield sub
    finally:
        if sub is not None:
            sub.close()


def _prefix(keys: list[str]) -> str:
    return keys[0].rsplit("-", 1)[0] + "-"


def test_store_declares_fair_many_keys(many: tuple[dblock.Client, Any]) -> None:
    _, store = many
    assert isinstance(store, FairManyKeys)


def test_a_many_waiters_entries_share_one_arrival_and_keep_newcomers_off_free_keys(
    many: tuple[dblock.Client, Any],
) -> None:
    """Keys never held (no rows yet): the entries alone keep every newcomer off, single-key
    or several; a single-key waiter that queues after it is behind it, until it has taken
    its keys and let go of them."""
    _, store = many
    keys = queued_many(store, 3)
    queues = _queues(store, keys)
    assert [owner for q in queues.values() for owner, _ in q] == ["m"] * 3
    assert len({at for q in queues.values() for _, at in q}) == 1, "one arrival on every key"
    for key in keys:
        assert store.acquire_fair(key, "n", TTL, False) is None
    assert store.acquire_many(keys[1:], "n", TTL) is None
    assert all(store.info(k) is None for k in keys)
    store.enqueue(keys[1], "s", "lock", QUEUE_TTL)
    assert store.probe(keys[1], "s") == (True, 1), "the single-key waiter queues behind it"
    assert store.acquire_fair(keys[1], "s", TTL, True) is None
    tokens = store.acquire_many_in_turn(keys, "m", TTL)
    assert tokens is not None and sorted(tokens) == keys
    assert _queues(store, keys)[keys[1]] == [("s", _queues(store, keys)[keys[1]][0][1])]
    assert store.release_many(tokens, "m")
    token = store.acquire_fair(keys[1], "s", TTL, True)
    assert token is not None and token > tokens[keys[1]]


def test_a_single_key_waiter_queued_before_a_many_waiter_goes_first(
    many: tuple[dblock.Client, Any],
) -> None:
    """The queue's order is the entries' times: the single-key waiter ("z") queued first
    takes the key first, though its name sorts after the many-waiter's ("a")."""
    _, store = many
    keys = _keys(2)
    held = store.acquire(keys[0], "h", TTL, "lock")
    assert held is not None
    store.enqueue(keys[0], "z", "lock", QUEUE_TTL)
    time.sleep(0.02)  # past the clock's resolution (SQLite: a millisecond)
    store.enqueue_many(keys, "a", QUEUE_TTL)
    assert [o for o, _ in _queues(store, keys)[keys[0]]] == ["z", "a"]
    assert store.release(keys[0], "h", held)
    assert store.acquire_many_in_turn(keys, "a", TTL) is None, "z is ahead on the first key"
    assert all(store.info(k) is None for k in keys), "nothing taken"
    token = store.acquire_fair(keys[0], "z", TTL, True)
    assert token is not None and token > held
    assert store.acquire_many_in_turn(keys, "a", TTL) is None, "z holds it"
    assert store.release(keys[0], "z", token)
    _taken_in_turn(store, keys, "a", {keys[0]: token})


def test_a_release_with_a_many_waiter_at_the_head_frees_the_key(
    many: tuple[dblock.Client, Any],
) -> None:
    """No hand-over to the many-waiter, nor past it to a single-key waiter behind it that
    takes hand-overs (a lease): the key is freed, and the many-waiter takes all its keys."""
    _, store = many
    keys = _keys(2)
    with subscribed_many(store, keys, "m") as sub:
        held = store.acquire(keys[1], "h", TTL, "lock")
        assert held is not None
        store.enqueue_many(keys, "m", QUEUE_TTL)
        time.sleep(0.02)
        store.enqueue(keys[1], "s", "lock", QUEUE_TTL, lease=TTL)
        assert store.release(keys[1], "h", held)
        assert store.info(keys[1]) is None, "freed, handed to nobody"
        assert store.probe(keys[1], "s") == (True, 1)
        if sub is not None and sub.live:
            assert sub.wait(10), "the release woke the many-waiter"
        _taken_in_turn(store, keys, "m", {keys[1]: held})


def test_acquire_many_in_turn_and_enqueue_many_retried_after_a_lost_reply(
    many: tuple[dblock.Client, Any],
) -> None:
    """A retried enqueue_many leaves one entry a key, all of one arrival; a retried
    acquire_many_in_turn, whose first attempt took the keys and removed the entries, holds
    every key (though a waiter now queues on one of them) and leaves no entry of its own."""
    _, store = many
    keys = _keys(3)
    lost = _lose_the_first_reply(store)
    store.enqueue_many(keys, "m", QUEUE_TTL)
    assert lost
    queues = _queues(store, keys)
    assert [[o for o, _ in q] for q in queues.values()] == [["m"]] * 3
    assert len({q[0][1] for q in queues.values()}) == 1
    time.sleep(0.02)
    store.enqueue(keys[1], "s", "lock", QUEUE_TTL)
    lost = _lose_the_first_reply(store)
    tokens = store.acquire_many_in_turn(keys, "m", TTL)
    assert lost and tokens is not None and sorted(tokens) == keys
    assert all(store.info(k).owner == "m" and store.info(k).token == tokens[k] for k in keys)
    assert [[o for o, _ in q] for q in _queues(store, keys).values()] == [[], ["s"], []]
    assert store.release_many(tokens, "m")


def test_requeue_many_keeps_the_place_until_an_entry_expires(
    many: tuple[dblock.Client, Any],
) -> None:
    _, store = many
    keys = queued_many(store, 3)
    time.sleep(0.02)
    store.enqueue_many(keys[1:2], "a", QUEUE_TTL)  # behind m ("a" sorts first: time decides)
    before = _queues(store, keys)
    ends = {e.key: e.expires_at for e in store.waiters(_prefix(keys)) if e.owner == "m"}
    assert store.requeue_many(keys, "m", QUEUE_TTL)
    assert _queues(store, keys) == before, "the same places, the same arrival"
    assert all(e.expires_at > ends[e.key] for e in store.waiters(_prefix(keys)) if e.owner == "m")
    assert store.requeue_many(keys[:1], "m", 0.3)  # the first key's entry ends soon
    time.sleep(0.5)
    assert not store.requeue_many(keys, "m", QUEUE_TTL), "one entry expired"
    store.enqueue_many(keys, "m", QUEUE_TTL)  # afresh: a new arrival, behind a now
    assert [o for o, _ in _queues(store, keys)[keys[1]]] == ["a", "m"]
    assert store.requeue_many(keys, "m", QUEUE_TTL)


def test_dequeue_many_removes_every_entry(many: tuple[dblock.Client, Any]) -> None:
    _, store = many
    keys = queued_many(store, 3)
    store.enqueue(keys[2], "s", "lock", QUEUE_TTL)
    store.dequeue_many(keys, "m")
    store.dequeue_many(keys, "m")  # again: nothing left to remove
    assert [[o for o, _ in q] for q in _queues(store, keys).values()] == [[], [], ["s"]]
    assert not store.requeue_many(keys, "m", QUEUE_TTL)
    tokens = store.acquire_many(keys[:2], "n", TTL)
    assert tokens is not None, "a newcomer takes keys nobody queues for"
    assert store.acquire_fair(keys[2], "s", TTL, True) is not None


def test_overlapping_many_waiters_queued_at_once_keep_one_order_on_every_key(
    many_url: str, many_table: str
) -> None:
    """4 clients enqueue overlapping sets of 6 keys (each given in its own shuffled order) at
    the same moment, 15 times: each one's entries share one arrival, and of any two, the one
    ahead on one shared key is ahead on all of them (else each could wait for the other)."""
    clients = [dblock.connect(many_url, table=many_table) for _ in range(4)]
    try:
        stores = [store_of(c) for c in clients]
        for _ in range(15):
            keys = _keys(6)
            sets = {f"w{i}": random.sample(keys, random.randint(3, 6)) for i in range(4)}
            start = threading.Barrier(4)

            def enqueue(store: Any, owner: str, keys: list[str], start: threading.Barrier) -> None:
                start.wait(10)
                store.enqueue_many(keys, owner, QUEUE_TTL)

            threads = [
                threading.Thread(target=enqueue, args=(store, owner, chosen, start))
                for store, (owner, chosen) in zip(stores, sets.items(), strict=True)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            _assert_one_order(_queues(stores[0], keys), sets)
    finally:
        for c in clients:
            c.close()


def _assert_one_order(queues: dict[str, list[tuple[str, Any]]], sets: dict[str, list[str]]) -> None:
    arrivals: dict[str, set[Any]] = {}
    ahead: dict[tuple[str, str], str] = {}  # (x, y) -> a key where x is ahead of y
    for key, queue in queues.items():
        owners = [o for o, _ in queue]
        assert sorted(owners) == sorted(o for o, chosen in sets.items() if key in chosen)
        for place, (owner, at) in enumerate(queue):
            arrivals.setdefault(owner, set()).add(at)
            for behind in owners[place + 1 :]:
                ahead[owner, behind] = key
    assert all(len(ats) == 1 for ats in arrivals.values()), arrivals
    crossed = [(x, y, k) for (x, y), k in ahead.items() if (y, x) in ahead]
    assert not crossed, f"ahead on one key, behind on another: {crossed} in {queues}"


def test_no_one_sees_part_of_an_acquire_many(
    many_url: str, many_table: str, tmp_path: Path
) -> None:
    """4 processes take overlapping random key sets while 2 read the holds: a reader never
    sees some of one acquire_many's keys held by its owner and not the others."""
    prefix = "at-" + uuid.uuid4().hex[:6] + "-"
    stop = tmp_path / "stop"
    args = [many_url, many_table, prefix]
    takers = [_start("take", *args) for _ in range(4)]
    lookers = [_start("look", *args) for _ in range(2)]
    procs = takers + lookers
    try:
        for p in procs:  # each has connected: all start now
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{stop}\n")
            p.stdin.close()
        # Each taker stops after a count of sets, not a time: on a loaded machine a few
        # seconds held only 7 sets (CI). The readers read until the last taker is done.
        outs = [p.stdout.read() if p.stdout else "" for p in takers]
        stop.touch()
        outs += [p.stdout.read() if p.stdout else "" for p in lookers]
        for p in procs:
            p.wait(timeout=30)
    finally:
        stop.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    stream.close()
    assert all(p.returncode == 0 for p in procs), outs
    taken = sum(int(o.split()[0]) for o in outs[:4])
    looks = sum(int(o.split()[0]) for o in outs[4:])
    seen = sum(int(o.split()[1]) for o in outs[4:])
    assert taken >= 4 * TAKES and looks > 10 and seen > 0, outs


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.stores._sql_many_keys", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _take(url: str, table: str, prefix: str) -> None:
    """Loop: acquire_many over 2 to 5 of 8 keys, hold briefly, release_many. Prints how many
    sets were taken. The owner names its set, so a reader can tell a partial one."""
    keys = [f"{prefix}{i}" for i in range(8)]
    taken = 0
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        _ready(store, prefix)
        until = time.monotonic() + 1.5
        while taken < TAKES or time.monotonic() < until:
            chosen = sorted(random.sample(keys, random.randint(2, 5)))
            owner = uuid.uuid4().hex[:8] + "=" + ",".join(chosen)
            tokens = store.acquire_many(chosen, owner, TTL)
            if tokens is None:
                time.sleep(random.uniform(0, 0.005))
                continue
            taken += 1
            time.sleep(random.uniform(0, 0.01))
            assert store.release_many(tokens, owner)
    print(taken)


def _look(url: str, table: str, prefix: str) -> None:
    """Loop: read the holds of the keys (one statement on the lock table); fail on any owner
    seen holding only part of its set. Prints the reads and the holds seen."""
    looks = seen = 0
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        stop = _ready(store, prefix)
        while not stop.exists():
            held: dict[str, set[str]] = {}
            for info in store.list_holds(prefix):
                held.setdefault(info.owner, set()).add(info.key)
            for owner, got in held.items():
                wanted = set(owner.split("=", 1)[1].split(","))
                assert got == wanted, f"{owner} seen holding only {sorted(got)}"
            looks += 1
            seen += len(held)
    print(looks, seen)


def _ready(store: Any, prefix: str) -> Path:
    """Connected (a first statement run): say so, and wait for the go, which names the file
    whose existence tells a reader to stop."""
    store.list_holds(prefix)
    print("ready", flush=True)
    return Path(sys.stdin.readline().strip())


if __name__ == "__main__":
    command, url, table, prefix = sys.argv[1:]
    {"take": _take, "look": _look}[command](url, table, prefix)
