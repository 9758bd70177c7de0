"""ManyKeys on ZooKeeper against the real server: acquire_many's two multis (entries, then all
of them turned into holds at once) seen by other clients and other processes, its round
trips, and its nodes' ACL (tests/contract/test_many_keys.py has what every store shares)."""

from __future__ import annotations

import multiprocessing
import random
import time
import uuid
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.security import make_digest_acl, make_digest_acl_credential

import dblock
from tests._internals import store_of
from tests._servers import raw_connect, zookeeper_base
from tests._zk_secure import SUPER, SecureZk
from tests.stores.zookeeper.test_queue import rounds

KEYS = [f"a{i}" for i in range(6)]


def _owner() -> str:
    return "many-" + uuid.uuid4().hex[:12]


def test_all_or_none_and_tokens_above_earlier_ones(url: str, table: str) -> None:
    with dblock.connect(url, table=table) as client, dblock.connect(url, table=table) as other:
        store = store_of(client)
        held = other.lock("a1", ttl=30)
        assert held.acquire(blocking=False)
        assert store.acquire_many(["a0", "a1", "a2"], _owner(), 30.0) is None
        assert client.info("a0") is None and client.info("a2") is None
        info = client.info("a1")
        assert info is not None and info.token == held.token
        zk = store._client()  # nothing left behind: the entries were deleted
        assert zk.get_children(f"{store.keys}/a0") == zk.get_children(f"{store.keys}/a2") == []
        earlier = held.token
        held.release()
        owner = _owner()
        first = store.acquire_many(["a0", "a1", "a2"], owner, 30.0)
        assert first is not None and first["a1"] > earlier
        assert store.release_many(first, owner) is True
        second = store.acquire_many(["a0", "a1", "a2"], owner, 30.0)
        assert second is not None and all(second[k] > first[k] for k in first)
        assert store.release_many(second, owner) is True


def test_a_lock_hold_and_a_many_hold_exclude_each_other(url: str, table: str) -> None:
    with dblock.connect(url, table=table) as client, dblock.connect(url, table=table) as other:
        store = store_of(client)
        with other.lock("a1", ttl=30):
            assert store.acquire_many(["a0", "a1"], _owner(), 30.0) is None
        owner = _owner()
        tokens = store.acquire_many(["a0", "a1"], owner, 30.0)
        assert tokens is not None
        assert not other.lock("a0").acquire(blocking=False)
        assert not other.lock("a1").acquire(blocking=False)
        assert {h.key: h.token for h in other.list("a")} == tokens
        assert store.release_many(tokens, owner) is True
        assert other.lock("a0").acquire(blocking=False)


def test_renew_and_release_many_end_or_renew_the_others_when_one_is_gone(
    url: str, table: str
) -> None:
    with dblock.connect(url, table=table) as client, dblock.connect(url, table=table) as other:
        store = store_of(client)
        owner = _owner()
        tokens = store.acquire_many(["a0", "a1", "a2"], owner, 2.0)
        assert tokens is not None
        before = client.info("a2")
        assert other.force_release("a1")
        assert store.renew_many(tokens, owner, 30.0) is False
        after = client.info("a2")
        assert before is not None and after is not None
        assert after.expires_at > before.expires_at  # type: ignore[operator]
        assert client.info("a1") is None
        assert store.renew_many({k: tokens[k] for k in ("a0", "a2")}, owner, 30.0) is True
        assert other.force_release("a0")
        assert store.release_many(tokens, owner) is False
        assert client.list("a") == []


def test_expired_many_holds_are_taken_by_another_owner(url: str, table: str) -> None:
    with dblock.connect(url, table=table) as client, dblock.connect(url, table=table) as other:
        first = store_of(client).acquire_many(["a0", "a1"], _owner(), 1.0)
        assert first is not None
        assert store_of(other).acquire_many(["a0", "a1"], _owner(), 30.0) is None
        time.sleep(1.1)
        second = store_of(other).acquire_many(["a0", "a1"], _owner(), 30.0)
        assert second is not None and all(second[k] > first[k] for k in first)


def test_a_retry_of_the_same_owner_replaces_its_holds(url: str, table: str) -> None:
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        owner = _owner()
        first = store.acquire_many(["a0", "a1"], owner, 30.0)
        again = store.acquire_many(["a0", "a1"], owner, 30.0)  # its reply lost, say
        assert first is not None and again is not None
        assert all(again[k] > first[k] for k in first)
        assert {h.key: (h.owner, h.token) for h in client.list("a")} == {
            k: (owner, t) for k, t in again.items()
        }
        assert store.renew_many(first, owner, 30.0) is False  # the old ones are gone
        known = dict(store._mine)
        assert store.renew_many(again, owner, 20.0) is True
        store._mine.update(known)  # as if its reply was lost: the retry finds its own write
        assert store.renew_many(again, owner, 20.0) is True
        assert store.release_many(again, owner) is True


def test_acquire_many_takes_three_round_trips_whatever_the_number_of_keys(
    url: str, table: str
) -> None:
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        owner = _owner()
        tokens = store.acquire_many(KEYS, owner, 30.0)  # the key nodes exist from now on
        assert tokens is not None and store.release_many(tokens, owner)
        for n in (2, 6):
            owner = _owner()
            with rounds(store) as groups:
                tokens = store.acquire_many(KEYS[:n], owner, 30.0)
            assert tokens is not None
            # the entries' multi, the children, the nodes below (none: no request), the holds'
            assert [g[0] for g in groups] == ["Transaction", "GetChildren", "Transaction"]
            assert len(groups[1]) == n
            with rounds(store) as groups:
                assert store.release_many(tokens, owner) is True
            assert [g[0] for g in groups] == ["Transaction"]


# -- atomicity seen from other processes ----------------------------------------------------------
def _reporting(fn: Any, done: Any, *args: Any) -> None:
    """Run ``fn`` in a child process; what it returns or raises goes to ``done``."""
    try:
        done.put(fn(*args))
    except BaseException as exc:  # the test says what, not a queue left empty
        done.put(("error", repr(exc)))


def _worker(url: str, table: str, seconds: float, seed: int, stop: Any) -> tuple[str, int]:
    """acquire_many/release_many over random overlapping key sets; the owner names the set.
    It goes on, past ``seconds``, until ``stop`` is set (the observers are done), at most
    ten times as long."""
    rnd = random.Random(seed)
    taken = 0
    with dblock.connect(url, table=table) as client:
        store = store_of(client)
        start = time.monotonic()
        while time.monotonic() - start < 10 * seconds and not (
            stop.is_set() and time.monotonic() - start >= seconds
        ):
            keys = sorted(rnd.sample(KEYS, rnd.randint(2, 4)))
            owner = f"w{seed}-{uuid.uuid4().hex[:6]}:" + ",".join(keys)
            tokens = store.acquire_many(keys, owner, 30.0)
            if tokens is not None:
                taken += 1
                time.sleep(0.03 + rnd.random() * 0.07)  # observers get to see it
                assert store.release_many(tokens, owner) is True
            time.sleep(rnd.random() * 0.05)  # quiet moments, for consistent views
    return ("worker", taken)


def _collect(zk: KazooClient, base: str) -> dict[str, Any]:
    """Each key's children (cversion, and each child's data version and data)."""
    listed = {k: zk.get_children_async(f"{base}/{k}", include_data=True) for k in KEYS}
    kids: dict[str, tuple[int, list[str]]] = {}
    for k, result in listed.items():
        try:
            names, stat = result.get()
        except NoNodeError:
            names, stat = [], None
        kids[k] = (stat.cversion if stat else -1, sorted(names, key=lambda n: n[-10:]))
    read = {
        (k, n): zk.get_async(f"{base}/{k}/{n}") for k, (_, names) in kids.items() for n in names
    }
    data: dict[tuple[str, str], Any] = {}
    for kn, result in read.items():
        try:
            raw, stat = result.get()
            data[kn] = (stat.version, raw)
        except NoNodeError:
            data[kn] = None
    return {"kids": kids, "data": data}


def _observer(url: str, table: str, seconds: float) -> tuple[str, int, int]:
    """Two collects alike (every key's cversion and children's versions): the keys were in
    that state at once, between them. Each owner holding a key then holds its whole set."""
    import json

    conn = raw_connect(url)
    zk, base = conn.zk, zookeeper_base(url, table) + "/k"
    snapshots = holders_seen = 0
    start = time.monotonic()
    try:
        # ``seconds`` at least, and on until holds were seen (a loaded machine may give few
        # consistent views), at most eight times as long: the workers go on until then
        while time.monotonic() - start < seconds or (
            holders_seen == 0 and time.monotonic() - start < 8 * seconds
        ):
            zk.sync(base)
            first, second = _collect(zk, base), _collect(zk, base)
            if first != second:
                continue
            snapshots += 1
            held: dict[str, set[str]] = {}
            for k, (_, names) in first["kids"].items():
                if not names or first["data"][(k, names[0])] is None:
                    continue
                data = json.loads(first["data"][(k, names[0])][1])
                if data.get("h"):  # the lowest node holds; an entry (no ``h``) holds nothing
                    held.setdefault(data["o"], set()).add(k)
            for owner, keys in held.items():
                assert keys == set(owner.split(":")[1].split(",")), (owner, keys)
                holders_seen += 1
    finally:
        conn.close()
    return ("observer", snapshots, holders_seen)


def test_no_process_ever_sees_part_of_a_many_hold(url: str, table: str) -> None:
    with dblock.connect(url, table=table):
        pass  # the table exists
    ctx = multiprocessing.get_context("spawn")
    done, stop = ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_reporting, args=(_worker, done, url, table, 4.0, i, stop))
        for i in range(3)
    ]
    procs += [
        ctx.Process(target=_reporting, args=(_observer, done, url, table, 4.5)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    reports = []
    try:
        while sum(r[0] != "worker" for r in reports) < 2:  # the observers (or an error)
            reports.append(done.get(timeout=60))
    finally:
        stop.set()
    reports += [done.get(timeout=60) for _ in range(len(procs) - len(reports))]
    assert not [r for r in reports if r[0] == "error"], reports
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    workers = [r for r in reports if r[0] == "worker"]
    observers = [r for r in reports if r[0] == "observer"]
    assert len(workers) == 3 and all(r[1] > 0 for r in workers)
    # each observer took consistent views, and between them they saw holds (the check of no
    # partial set was not vacuous)
    assert len(observers) == 2 and all(r[1] > 0 for r in observers), observers
    assert sum(r[2] for r in observers) > 0, observers


# -- ACLs -----------------------------------------------------------------------------------------
def test_many_holds_carry_the_acl_of_a_single_key_hold(secure_zk: SecureZk) -> None:
    chroot = f"sec_{uuid.uuid4().hex[:10]}"
    user, ops = ("alice", "Al1ce-pw"), ("ops", "0ps-pw")
    admin = "digest:" + make_digest_acl_credential(*ops)
    url = secure_zk.url(":".join(user), chroot, admin=admin)
    root = KazooClient(f"127.0.0.1:{secure_zk.port}", auth_data=[("digest", ":".join(SUPER))])
    root.start(timeout=10)
    try:
        with dblock.connect(url, table="locks") as client:
            assert client.lock("single").acquire(blocking=False)
            assert store_of(client).acquire_many(["m0", "m1"], _owner(), 30.0) is not None
            expected = sorted([make_digest_acl(*user, all=True), make_digest_acl(*ops, all=True)])
            for key in ("single", "m0", "m1"):
                path = f"/{chroot}/locks/k/{key}"
                [node] = root.get_children(path)
                assert sorted(root.get_acls(f"{path}/{node}")[0]) == expected
                assert sorted(root.get_acls(path)[0]) == expected
    finally:
        root.stop()
        root.close()
