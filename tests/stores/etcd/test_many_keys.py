"""The etcd store's ManyKeys against the machine's node: all or none, tokens, exclusion with
lock holds, renew/release, expiry, lost replies, and atomicity seen from other processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import dblock
from dblock.stores.etcd.store import EtcdStore
from tests._internals import store_of
from tests._proxy import Proxy
from tests.stores.etcd import test_lost_replies as lost

KEYS = ["a", "b", "c"]
client, proxy = lost.client, lost.proxy  # the lost-reply tests' fixtures: through the proxy


@pytest.fixture
def mine(url: str, table: str) -> Iterator[dblock.Client]:
    with dblock.connect(url, table=table, create_schema=True) as c:
        yield c


def _store(c: dblock.Client) -> EtcdStore:
    found = store_of(c)
    assert isinstance(found, EtcdStore)
    return found


def test_one_key_held_by_another_client_takes_none(
    mine: dblock.Client, url: str, table: str
) -> None:
    with dblock.connect(url, table=table) as other:
        theirs = other.lock("b", ttl=30)
        assert theirs.acquire(blocking=False)
        assert _store(mine).acquire_many(KEYS, "me", 30) is None
        assert other.info("a") is None and other.info("c") is None
        held = other.info("b")
        assert held is not None and held.token == theirs.token
        # an acquire_many hold keeps a plain lock out, and the other way round
        theirs.release()
        tokens = _store(mine).acquire_many(KEYS, "me", 30)
        assert tokens is not None
        assert not other.lock("b", ttl=30).acquire(blocking=False)
        assert _store(mine).release_many(tokens, "me")
        assert other.lock("b", ttl=30).acquire(blocking=False)


def test_tokens_rise_above_single_key_ones(mine: dblock.Client) -> None:
    lock = mine.lock("b", ttl=30)
    assert lock.acquire(blocking=False) and lock.token is not None
    before = lock.token
    lock.release()
    s = _store(mine)
    first = s.acquire_many(KEYS, "me", 30)
    assert first is not None and first["b"] > before
    for key in KEYS:
        info = mine.info(key)
        assert info is not None and (info.owner, info.token, info.kind) == (
            "me",
            first[key],
            "lock",
        )
    assert s.release_many(first, "me")
    second = s.acquire_many(KEYS, "you", 30)
    assert second is not None and all(second[k] > first[k] for k in KEYS)
    assert s.release_many(second, "you")


def test_renew_and_release_say_whether_every_hold_was_there(mine: dblock.Client) -> None:
    s = _store(mine)
    tokens = s.acquire_many(KEYS, "me", 30)
    assert tokens is not None
    assert s.renew_many(tokens, "me", 60)  # another ttl: a new shared lease
    info = mine.info("a")
    assert info is not None and info.token == tokens["a"]
    assert info.expires_at - info.acquired_at > timedelta(seconds=40)
    assert mine.force_release("b")  # that key alone: the shared lease keeps the others
    assert not s.renew("b", "me", tokens["b"], 60)  # its lease alive is not its hold
    assert not s.renew_many(tokens, "me", 60)
    assert mine.info("a") is not None and mine.info("c") is not None
    assert not s.release_many(tokens, "me")
    assert all(mine.info(k) is None for k in KEYS)


def test_the_holds_expire_together(mine: dblock.Client, url: str, table: str) -> None:
    tokens = _store(mine).acquire_many(KEYS, "me", 1)
    assert tokens is not None
    with dblock.connect(url, table=table) as other:
        deadline = time.monotonic() + 10
        taken = None
        while taken is None and time.monotonic() < deadline:
            taken = _store(other).acquire_many(KEYS, "you", 30)
            time.sleep(0.2)
        assert taken is not None and all(taken[k] > tokens[k] for k in KEYS)
        assert not _store(mine).release_many(tokens, "me")
        assert _store(other).release_many(taken, "you")


def test_lost_replies_to_acquire_many_and_release_many_are_recognised(
    client: dblock.Client,
    proxy: Proxy,
    url: str,
    table: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = _store(client)
    lost.drop_after_grant(s, proxy, monkeypatch)
    tokens = s.acquire_many(KEYS, "me", 30)
    assert proxy.dropped() == 1
    assert tokens is not None
    with dblock.connect(url, table=table) as other:
        for key in KEYS:
            held = other.info(key)
            assert held is not None and held.token == tokens[key] and held.owner == "me"
        lost.through_proxy(s, proxy)
        sent = s.rpc.txn_sent

        def drop_the_release(what: str, compare: Any, success: Any, *rest: Any, **kw: Any) -> Any:
            if what == "release" and success:
                monkeypatch.setattr(s.rpc, "txn_sent", sent)
                proxy.drop_next_reply()
            return sent(what, compare, success, *rest, **kw)

        monkeypatch.setattr(s.rpc, "txn_sent", drop_the_release)
        assert s.release_many(tokens, "me")  # its own lost copy ended them: no loss
        assert proxy.dropped() == 2
        assert all(other.info(k) is None for k in KEYS)


_WORKER = """
import json, os, random, sys, time
import dblock
from dblock.stores.etcd.rpc import get
url, table, role, seed, seconds, stop = sys.argv[1:7]
rng = random.Random(int(seed))
keys = [f"k{i}" for i in range(8)]
with dblock.connect(url, table=table) as c:
    s = c._core.store
    end, done, seen = time.monotonic() + float(seconds), 0, 0
    # a taker: for `seconds` and until it has taken 4 sets; an observer: until `stop` exists
    while (done < 4 or time.monotonic() < end) if role == "take" else not os.path.exists(stop):
        if role == "take":
            mine = sorted(rng.sample(keys, rng.randint(2, 5)))
            owner = f"{seed}-{done}:" + "+".join(mine)
            tokens = s.acquire_many(mine, owner, 30)
            if tokens is not None:
                done += 1
                assert s.release_many(tokens, owner)
            continue
        # one Range: one revision of every hold
        reply = s.rpc.txn("observe", [], [get(s.prefix, whole_prefix=True)])
        held = {}
        for kv in reply.responses[0].response_range.kvs:
            key, _, part = bytes(kv.key)[len(s.prefix):].partition(b"\\0")
            if part == b"l":
                held.setdefault(json.loads(kv.value)["o"], set()).add(key.decode())
        for owner, found in held.items():
            assert found == set(owner.split(":")[1].split("+")), (owner, found)
        seen += bool(held)
print(json.dumps({"done": done, "seen": seen}))
"""


def test_no_process_sees_some_of_one_acquire_many_taken(
    mine: dblock.Client, url: str, table: str, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    roles = ["take"] * 4 + ["observe"] * 2
    stop = tmp_path / "stop"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, url, table, role, str(i), "4", str(stop)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i, role in enumerate(roles)
    ]
    results = []
    try:
        for n, p in enumerate(procs):
            if n == 4:  # every taker is done: the observers stop
                stop.touch()
            out, err = p.communicate(timeout=90)
            assert p.returncode == 0, err[-2000:]
            results.append(json.loads(out))
    finally:
        stop.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert sum(r["done"] for r in results[:4]) >= 16
    assert all(r["seen"] > 0 for r in results[4:])
