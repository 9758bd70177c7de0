"""The etcd store on a private 3-node cluster: the leader killed while a lock is held and
waiters wait, a holder process paused past its lease, a compaction; tokens keep growing."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import dblock
import dblock.fencing
from tests._internals import store_of
from tests._worker import start
from tests.stores.etcd._cluster import Cluster

TTL = 2.0


def test_leader_killed_while_held_and_waited_for(cluster: Cluster) -> None:
    """The holder keeps its lock through the new election (or hears of the loss before anyone
    else is granted it); the waiters are granted in turn within 2 x ttl of each release."""
    holder = dblock.connect(cluster.url, table="t_leader")
    waiters = [dblock.connect(cluster.url, table="t_leader") for _ in range(2)]
    lost = threading.Event()
    lock = holder.lock("k", ttl=TTL, auto_renew=True, on_lost=lambda _l: lost.set())
    assert lock.acquire(timeout=5)
    first = lock.token
    assert first is not None
    granted: list[tuple[float, int, bool]] = []

    def wait_for_it(client: dblock.Client) -> None:
        with client.lock("k", ttl=TTL, timeout=60) as mine:
            granted.append((time.monotonic(), mine.token or 0, lost.is_set()))
            time.sleep(0.2)

    threads = [threading.Thread(target=wait_for_it, args=(c,)) for c in waiters]
    for t in threads:
        t.start()
    time.sleep(0.5)
    cluster.leader().kill()
    time.sleep(3 * TTL)  # past the lease: only renewals through the new leader keep it
    assert not granted or lost.is_set(), "a waiter was granted while the holder held it"
    released = time.monotonic()
    if not lost.is_set():
        lock.release()
    for t in threads:
        t.join(60)
    assert len(granted) == 2
    assert granted[0][0] - released <= 2 * TTL
    tokens = [first] + [tok for _, tok, _ in granted]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    for c in (holder, *waiters):
        c.close()


_PAUSED_HOLDER = """
import sys, time, dblock
client = dblock.connect(sys.argv[1], table="t_paused")
lock = client.lock("k", ttl=float(sys.argv[2]))
assert lock.acquire(timeout=10)
print(lock.token, flush=True)
sys.stdin.readline()  # SIGSTOPped here, then woken
print("awake", flush=True)
sys.stdin.readline()
"""


def test_paused_holder_is_fenced_out(cluster: Cluster, tmp_path: Path) -> None:
    """A holder SIGSTOPped past its ttl: another holder gets the lock with a larger token, and
    the paused one's fenced write is rejected when it wakes."""
    db = tmp_path / "resource.sqlite3"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INT, fence_token BIGINT)")
    conn.execute("INSERT INTO stock VALUES ('sku', 10, NULL)")
    stmt = dblock.fencing.fenced_update("sqlite", "stock", set_columns=["qty"], key_columns=["sku"])
    proc = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_HOLDER, cluster.url, str(TTL)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        paused_token = int(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGSTOP)
        other = dblock.connect(cluster.url, table="t_paused")
        started = time.monotonic()
        with other.lock("k", ttl=TTL, timeout=4 * TTL) as lock:
            assert time.monotonic() - started <= 2 * TTL + 1.5  # lease + the leader's expiry pass
            assert lock.token is not None and lock.token > paused_token
            assert stmt.execute(conn.cursor(), [9], ["sku"], lock.token)
        other.close()
        os.kill(proc.pid, signal.SIGCONT)
        # the paused holder wakes and writes under its stale token: rejected
        assert not stmt.execute(conn.cursor(), [8], ["sku"], paused_token)
        assert conn.execute("SELECT qty FROM stock").fetchone() == (9,)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        conn.close()


def test_compaction_keeps_tokens_growing(cluster: Cluster) -> None:
    client = dblock.connect(cluster.url, table="t_compact")
    with client.lock("k", ttl=TTL) as lock:
        before = lock.token
    raw = cluster.client(cluster.leader())
    revision = raw.status().raft_index  # type: ignore[attr-defined]
    head = raw.get_response(b"x").header.revision  # type: ignore[attr-defined]
    raw.compact(head, physical=True)  # type: ignore[attr-defined]
    raw.close()  # type: ignore[attr-defined]
    assert revision > 0
    with client.lock("k", ttl=TTL) as lock:
        assert lock.token is not None and before is not None and lock.token > before
    client.close()


def test_node_stopped_and_back_no_overlap(cluster: Cluster, tmp_path: Path) -> None:
    """A follower stopped (cut off) and brought back while three processes take turns: an
    independent referee (a record file each holder checks and marks inside the lock) never
    sees two holders at once, nor a token that is not above every earlier one."""
    record = tmp_path / "record"
    record.write_text("0 0")
    args = ["fence_through_faults", cluster.url, "t_partition", "k", str(TTL), "9", str(record)]
    workers = [start(*args, stderr=subprocess.PIPE) for _ in range(3)]
    try:
        leader = cluster.leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        time.sleep(2)
        follower.pause()
        time.sleep(3)
        follower.resume()
        outputs = [w.communicate(timeout=120) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.communicate()
    for w, (out, err) in zip(workers, outputs, strict=True):
        # a failed referee check is an AssertionError in the worker: exit 1, its traceback
        assert w.returncode == 0, err[-2000:]
        assert json.loads(out)["sections"] > 0
    tokens = [int(x) for x in (tmp_path / "record.log").read_text().split()]
    assert tokens == sorted(set(tokens))  # every grant's token above the one before


pytestmark = pytest.mark.timeout(180)


def test_far_waiters_are_served_when_the_member_they_talk_to_is_killed(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fourteen waiters on one key, five of them far back (each watching one entry ahead, not
    the key's range); the member the last one's client talks to is killed while they wait:
    their watch streams break, they look again through the others, and every one is still
    served, once, alone, with rising tokens."""
    from dblock.stores.etcd import watch as _etcd_watch

    broken: list[bool] = []
    heard = _etcd_watch.EtcdSubscription._heard

    def counted(self: Any, response: Any) -> None:
        if response is None or isinstance(response, BaseException):
            broken.append(self._watched is not None)
        heard(self, response)

    monkeypatch.setattr(_etcd_watch.EtcdSubscription, "_heard", counted)
    holder = dblock.connect(cluster.url, table="t_far")
    lock = holder.lock("k", ttl=30)
    assert lock.acquire(timeout=10)
    clients = [dblock.connect(cluster.url, table="t_far") for _ in range(14)]
    served: list[tuple[int, int]] = []
    inside = [0]
    overlaps: list[int] = []

    def wait_for_it(i: int, client: dblock.Client) -> None:
        with client.lock("k", ttl=30, timeout=90) as mine:
            inside[0] += 1
            if inside[0] > 1:
                overlaps.append(i)
            served.append((i, mine.token or 0))
            time.sleep(0.05)
            inside[0] -= 1

    threads = [threading.Thread(target=wait_for_it, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
        time.sleep(0.15)  # they queue in this order
    time.sleep(1.0)
    # the member the last waiter's client talks to (the first listed, unless a call of that
    # client found it slow to answer: a loaded machine) is the one whose death breaks a far
    # waiter's watch
    in_use = store_of(clients[-1]).rpc.client().endpoint_in_use.netloc
    (member,) = (n for n in cluster.nodes if in_use == f"127.0.0.1:{n.client_port}")
    member.kill()
    time.sleep(1.0)
    lock.release()
    for t in threads:
        t.join(120)
    assert any(broken), "no far waiter's watch broke: the member killed was not theirs"
    assert overlaps == []
    assert sorted(i for i, _ in served) == list(range(14))
    tokens = [tok for _, tok in served]
    assert tokens == sorted(tokens) and len(set(tokens)) == 14
    for c in (holder, *clients):
        c.close()
