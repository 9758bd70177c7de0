"""The etcd store's FairManyKeys and subscribe_many against the machine's node: one place in
an order common to all keys, single-key newcomers and waiters yielding to a many-entry as
to a single waiter's, no hand-over to it, wake-ups, entries' leases, lost replies, tokens."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

import dblock
from dblock.stores.etcd.store import EtcdStore
from tests._internals import store_of
from tests._proxy import Proxy
from tests.stores.etcd import test_lost_replies as lost

client, proxy = lost.client, lost.proxy  # the lost-reply tests' fixtures: through the proxy
#: the engine's queue entry lease
QUEUE_TTL = 9.0


@pytest.fixture
def stores(url: str, table: str) -> Iterator[list[EtcdStore]]:
    """Three clients' stores on one table (three waiters' processes)."""
    clients = [dblock.connect(url, table=table, create_schema=True) for _ in range(3)]
    try:
        found = [store_of(c) for c in clients]
        assert all(isinstance(s, EtcdStore) for s in found)
        yield found
    finally:
        for c in clients:
            c.close()


def queue(s: EtcdStore, key: str) -> list[tuple[str, int]]:
    """(owner, create revision) of the live entries of ``key``'s lock queue, in order."""
    line = s._parts(key)[3] + b"lock/"
    _, kvs = s._read("test", key)
    found = [
        (bytes(kv.key)[len(line) :].decode(), int(kv.create_revision))
        for kv in kvs
        if bytes(kv.key).startswith(line)
    ]
    return sorted(found, key=lambda e: e[1])


def owners(s: EtcdStore, key: str) -> list[str]:
    return [o for o, _ in queue(s, key)]


def waits(sub: dblock._contract.Subscription, seconds: float = 30.0) -> threading.Event:
    """Start ``sub.wait(seconds)`` on a thread; the event is set if it returned True."""
    woke = threading.Event()

    def run() -> None:
        if sub.wait(seconds):
            woke.set()

    threading.Thread(target=run, daemon=True).start()
    return woke


def _at_once(calls: list[Callable[[], None]]) -> None:
    """Run ``calls`` on threads released together; raise the first error."""
    start = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(call: Callable[[], None]) -> None:
        try:
            start.wait(10)
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


def test_overlapping_waiters_take_one_order_on_every_shared_key(
    stores: list[EtcdStore],
) -> None:
    """Three owners enqueue overlapping sets at once, many times: on every key two of them
    share, they stand in the same order (else X first on one key and Y on another would
    wait for each other forever)."""
    sets = {"x": ["a", "b", "c", "d"], "y": ["b", "c", "d", "e"], "z": ["a", "c", "e"]}
    for n in range(25):
        _at_once(
            [
                lambda s=s, o=o, keys=keys: s.enqueue_many(keys, o, QUEUE_TTL)
                for s, (o, keys) in zip(stores, sets.items(), strict=True)
            ]
        )
        orders = {k: owners(stores[0], k) for k in "abcde"}
        for key, found in orders.items():
            assert sorted(found) == sorted(o for o, ks in sets.items() if key in ks), (n, key)
        for x, xs in sets.items():
            for y, ys in sets.items():
                shared = [k for k in xs if k in ys and x < y]
                seen = {orders[k].index(x) < orders[k].index(y) for k in shared}
                assert len(seen) <= 1, (n, x, y, orders)
        # one place each: every entry of one owner has one create revision
        for owner, keys in sets.items():
            revs = {dict(queue(stores[0], k))[owner] for k in keys}
            assert len(revs) == 1, (n, owner, revs)
        for s, (owner, keys) in zip(stores, sets.items(), strict=True):
            s.dequeue_many(keys, owner)
    assert all(owners(stores[0], k) == [] for k in "abcde")


def test_a_many_entry_keeps_newcomers_out_and_single_waiters_ahead_go_first(
    stores: list[EtcdStore],
) -> None:
    many, single, other = stores
    keys = ["a", "b"]
    # a free key with a live many-entry: a newcomer, single or many, is refused
    many.enqueue_many(keys, "M", QUEUE_TTL)
    assert single.acquire_fair("a", "N", 30, False) is None
    assert single.acquire_many(["a"], "N", 30) is None
    # a single-key waiter arriving after it is behind it: refused on a free key
    single.enqueue("a", "late", "lock", QUEUE_TTL)
    assert single.acquire_fair("a", "late", 30, True) is None
    tokens = many.acquire_many_in_turn(keys, "M", 30)
    assert tokens is not None and owners(single, "a") == ["late"]
    assert many.release_many(tokens, "M")
    late = single.acquire_fair("a", "late", 30, True)  # now its turn
    assert late is not None and owners(single, "a") == []
    assert single.release("a", "late", late)

    # a single-key waiter queued before the many-waiter goes first
    held = other.acquire_fair("a", "H", 30, False)
    assert held is not None
    single.enqueue("a", "W", "lock", QUEUE_TTL)
    many.enqueue_many(keys, "M2", QUEUE_TTL)
    assert owners(single, "a") == ["W", "M2"]
    assert many.acquire_many_in_turn(keys, "M2", 30) is None  # held
    assert other.release("a", "H", held)
    assert many.acquire_many_in_turn(keys, "M2", 30) is None  # W is ahead of it on a
    assert owners(single, "a") == ["W", "M2"] and owners(single, "b") == ["M2"]
    token = single.acquire_fair("a", "W", 30, True)
    assert token is not None
    assert many.acquire_many_in_turn(keys, "M2", 30) is None  # W holds a
    assert single.release("a", "W", token)
    tokens = many.acquire_many_in_turn(keys, "M2", 30)
    assert tokens is not None and tokens["a"] > token


def test_a_release_before_a_many_entry_frees_the_key_and_wakes_it(
    stores: list[EtcdStore],
) -> None:
    many, holder, single = stores
    keys = ["a", "b"]
    held = holder.acquire_fair("a", "H", 30, False)
    assert held is not None
    sub = many.subscribe_many(keys, "M")
    assert sub is not None and sub.live and sub.granted is None
    try:
        many.enqueue_many(keys, "M", QUEUE_TTL)
        assert many.acquire_many_in_turn(keys, "M", 30) is None
        assert not sub.wait(0.5)  # nothing ended: no wake-up
        woke = waits(sub)
        assert holder.release("a", "H", held)
        assert woke.wait(30)
        assert sub.granted is None and holder.info("a") is None  # freed, not handed over
        assert owners(holder, "a") == ["M"]
        # an entry behind it leaving wakes it not; the entry ahead of it leaving does
        single.enqueue("b", "behind", "lock", QUEUE_TTL)
        single.dequeue("b", "behind")
        assert not sub.wait(0.5)
        tokens = many.acquire_many_in_turn(keys, "M", 30)
        assert tokens is not None and tokens["a"] > held
        assert many.release_many(tokens, "M")
        while sub.wait(0.5):  # the release's own wake-up, heard
            pass
        single.enqueue("b", "ahead", "lock", QUEUE_TTL)
        many.enqueue_many(keys, "M", QUEUE_TTL)
        assert owners(single, "b") == ["ahead", "M"]
        woke = waits(sub)
        single.dequeue("b", "ahead")
        assert woke.wait(30)
        assert many.acquire_many_in_turn(keys, "M", 30) is not None
    finally:
        sub.close()


def test_taking_in_turn_removes_every_entry_and_a_lost_reply_is_its_own(
    client: dblock.Client,
    proxy: Proxy,
    url: str,
    table: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = lost.store(client)
    keys = ["a", "b", "c"]
    # enqueue_many's reply lost: the retry finds its own entries, one place
    lost.drop_after_grant(s, proxy, monkeypatch)
    s.enqueue_many(keys, "M", QUEUE_TTL)
    assert proxy.dropped() == 1
    with dblock.connect(url, table=table) as other:
        o = store_of(other)
        places = {dict(queue(o, k)).get("M") for k in keys}
        assert len(places) == 1 and None not in places
        assert s.requeue_many(keys, "M", QUEUE_TTL)
        # acquire_many_in_turn's reply lost: the retry's copy took them; entries all gone
        lost.drop_after_grant(s, proxy, monkeypatch)
        tokens = s.acquire_many_in_turn(keys, "M", 30)
        assert proxy.dropped() == 2
        assert tokens is not None
        for key in keys:
            assert owners(o, key) == []
            held = other.info(key)
            assert held is not None and (held.owner, held.token) == ("M", tokens[key])
        assert not s.requeue_many(keys, "M", QUEUE_TTL)  # taken: no entries left
        # dequeue_many after a take, and twice: nothing to remove, no error
        s.dequeue_many(keys, "M")
        s.dequeue_many(keys, "M")
        # a retry of the take (its caller never learnt): the holds are taken again, with
        # new tokens, still the owner's only holds
        again = s.acquire_many_in_turn(keys, "M", 30)
        assert again is not None and all(again[k] > tokens[k] for k in keys)
        assert [i.token for i in o.list_holds("")] == [again[k] for k in keys]
        assert s.release_many(again, "M")


def test_entries_a_failed_enqueue_left_are_found_by_the_take_and_the_dequeue(
    stores: list[EtcdStore],
) -> None:
    """A client that does not know of its entries (an enqueue whose outcome it never learnt)
    still takes in turn at their place, and dequeue_many removes them."""
    s, t, _ = stores
    keys = ["a", "b"]
    s.enqueue_many(keys, "M", QUEUE_TTL)
    t.enqueue("a", "after", "lock", QUEUE_TTL)
    s._queued_many.clear()  # as if its reply never came
    tokens = s.acquire_many_in_turn(keys, "M", 30)
    assert tokens is not None and owners(t, "a") == ["after"] and owners(t, "b") == []
    assert s.release_many(tokens, "M")
    s.enqueue_many(keys, "M", QUEUE_TTL)
    s._queued_many.clear()
    s.dequeue_many(keys, "M")
    assert owners(t, "a") == ["after"] and owners(t, "b") == []


def _gone(s: EtcdStore, keys: Sequence[str], owner: str, seconds: float = 20.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if all(owner not in owners(s, k) for k in keys):
            return True
        time.sleep(0.2)
    return False


def test_requeue_keeps_the_place_and_says_when_an_entry_is_gone(
    stores: list[EtcdStore],
) -> None:
    s, t, _ = stores
    keys = ["a", "b", "c"]
    s.enqueue_many(keys, "M", QUEUE_TTL)
    place = dict(queue(s, "a"))["M"]
    t.enqueue("a", "later", "lock", QUEUE_TTL)
    assert s.requeue_many(keys, "M", QUEUE_TTL)
    assert s.requeue_many(keys, "M", 4)  # another ttl: a new lease, the same place
    assert s.requeue_many(keys, "M", QUEUE_TTL)
    assert owners(t, "a") == ["M", "later"] and dict(queue(t, "b"))["M"] == place
    assert t.acquire_fair("a", "later", 30, True) is None  # still behind it
    # one entry gone (its owner's single-key dequeue on one key): False
    s.dequeue("b", "M")
    assert not s.requeue_many(keys, "M", QUEUE_TTL)
    # enqueued afresh: a new place, behind "later" now
    s.enqueue_many(keys, "M", QUEUE_TTL)
    assert owners(t, "a") == ["later", "M"] and owners(t, "b") == ["M"]
    # the lease revoked (a dead waiter's): every entry goes, and requeue says so
    s.rpc.revoke("test", s._queued_many["M"][1])
    assert not s.requeue_many(keys, "M", QUEUE_TTL)
    assert all("M" not in owners(t, k) for k in keys)
    # a short ttl not refreshed: the entries expire
    s.enqueue_many(keys, "M", 1)
    assert _gone(t, keys, "M")
    assert not s.requeue_many(keys, "M", 1)
    assert t.acquire_fair("a", "later", 30, True) is not None  # nobody ahead of it now


def test_tokens_grow_across_single_and_many_holds(stores: list[EtcdStore]) -> None:
    s, t, _ = stores
    keys = ["a", "b"]
    last = dict.fromkeys(keys, 0)
    for n in range(6):
        key = keys[n % 2]
        token = t.acquire_fair(key, f"s{n}", 30, False)
        assert token is not None and token > last[key]
        last[key] = token
        s.enqueue_many(keys, f"m{n}", QUEUE_TTL)
        assert s.acquire_many_in_turn(keys, f"m{n}", 30) is None
        assert t.release(key, f"s{n}", token)
        tokens = s.acquire_many_in_turn(keys, f"m{n}", 30)
        assert tokens is not None and all(tokens[k] > last[k] for k in keys)
        last = dict(tokens)
        assert s.release_many(tokens, f"m{n}")


def _lock_many(s: EtcdStore, keys: list[str], owner: str, ttl: float) -> dict[str, int]:
    """The engine's wait for ``keys``: newcomer, then queued with wake-ups (a generous
    bound: a deadlock fails the test rather than hanging it)."""
    end = time.monotonic() + 90
    tokens = s.acquire_many(keys, owner, ttl)
    if tokens is not None:
        return tokens
    sub = s.subscribe_many(keys, owner)
    assert sub is not None
    try:
        s.enqueue_many(keys, owner, QUEUE_TTL)
        refreshed = time.monotonic()
        while time.monotonic() < end:
            tokens = s.acquire_many_in_turn(keys, owner, ttl)
            if tokens is not None:
                return tokens
            sub.wait(1.0)
            if time.monotonic() - refreshed > QUEUE_TTL / 3:
                if not s.requeue_many(keys, owner, QUEUE_TTL):
                    s.enqueue_many(keys, owner, QUEUE_TTL)
                refreshed = time.monotonic()
        raise AssertionError(f"{owner} never got {keys}")
    finally:
        s.dequeue_many(keys, owner)
        sub.close()


def test_overlapping_waiters_and_single_key_newcomers_all_get_their_turn(
    stores: list[EtcdStore],
) -> None:
    """Many-waiters for overlapping sets and single-key lockers at once: every hold is
    exclusive, nobody deadlocks, every waiter gets its keys."""
    sets = [["a", "b", "c"], ["b", "c", "d"], ["a", "d"]]
    holding: dict[str, str] = {}
    mutex = threading.Lock()
    errors: list[BaseException] = []
    done: list[str] = []

    def hold(keys: list[str], owner: str) -> None:
        with mutex:
            clash = {k: holding[k] for k in keys if k in holding}
            assert not clash, (owner, clash)
            holding.update(dict.fromkeys(keys, owner))
        time.sleep(0.01)
        with mutex:
            for k in keys:
                del holding[k]

    def many_worker(i: int) -> None:
        try:
            for n in range(8):
                owner = f"m{i}-{n}"
                tokens = _lock_many(stores[i], sets[i], owner, 30)
                hold(sets[i], owner)
                assert stores[i].release_many(tokens, owner)
            done.append(f"m{i}")
        except BaseException as exc:
            errors.append(exc)

    def single_worker() -> None:
        try:
            for n in range(30):
                key, owner = "abcd"[n % 4], f"s{n}"
                token = stores[0].acquire_fair(key, owner, 30, False)
                if token is not None:
                    hold([key], owner)
                    assert stores[0].release(key, owner, token)
            done.append("s")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=many_worker, args=(i,), daemon=True) for i in range(3)]
    threads.append(threading.Thread(target=single_worker, daemon=True))
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    assert sorted(done) == ["m0", "m1", "m2", "s"]
    assert all(owners(stores[0], k) == [] for k in "abcd")
