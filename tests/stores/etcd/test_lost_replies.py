"""A reply lost after etcd applied the request: the retry recognises its own effect.

The proxy (``tests/_proxy.py``) forwards one call to the machine's etcd, swallows the answer
and resets the client's connection; the client sends the call again to its other endpoint,
the same node."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest

import dblock
from dblock.stores.etcd.store import EtcdStore
from tests._proxy import Proxy

_pyetcd = importlib.import_module("pyetcd.client")  # the module (pyetcd.client is a function)


@pytest.fixture
def proxy(url: str, tmp_path: Path) -> Iterator[Proxy]:
    parts = urlsplit(url.replace("etcd://", "http://", 1))
    with Proxy(parts.hostname or "127.0.0.1", parts.port or 2379, tmp_path / "proxy") as p:
        yield p


@pytest.fixture
def client(
    proxy: Proxy, url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dblock.Client]:
    # the proxy first, the client's endpoint in use (pyetcd picks one at random); the
    # machine's node behind it second, for the retry to fail over to
    node = urlsplit(url.replace("etcd://", "http://", 1)).netloc
    with monkeypatch.context() as m:
        m.setattr(_pyetcd, "random", SimpleNamespace(choice=lambda seq: seq[0]))
        c = dblock.connect(f"etcd://127.0.0.1:{proxy.port},{node}", table=table, create_schema=True)
    yield c
    c.close()


def store(client: dblock.Client) -> EtcdStore:
    found = client._core.store
    assert isinstance(found, EtcdStore)
    return found


def test_a_release_whose_reply_is_lost_is_not_a_loss(
    client: dblock.Client, proxy: Proxy, url: str, table: str
) -> None:
    lock = client.lock("k", ttl=30)
    assert lock.acquire()
    proxy.drop_next_reply()
    lock.release()  # no LockLost: the store applied it
    assert proxy.dropped() == 1
    with dblock.connect(url, table=table) as other:
        assert other.lock("k", ttl=5).acquire(blocking=False)


def through_proxy(s: EtcdStore, proxy: Proxy) -> None:
    """Send the store's next calls through the proxy again (a lost reply failed it over)."""
    c = s.rpc.client()
    label = f"127.0.0.1:{proxy.port}"
    c.endpoints[label].last_failed = 0
    c._current_endpoint_label = label


def drop_after_grant(s: EtcdStore, proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lose the reply to the transaction that follows the store's next lease grant."""
    through_proxy(s, proxy)
    grant = s.rpc.grant

    def then_drop(*args: Any, **kwargs: Any) -> tuple[int, int]:
        found = grant(*args, **kwargs)
        monkeypatch.setattr(s.rpc, "grant", grant)
        proxy.drop_next_reply()
        return found

    monkeypatch.setattr(s.rpc, "grant", then_drop)


def test_an_acquire_whose_reply_is_lost_is_granted(
    client: dblock.Client, proxy: Proxy, url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_after_grant(store(client), proxy, monkeypatch)
    lock = client.lock("k", ttl=30)
    assert lock.acquire(blocking=False)
    assert proxy.dropped() == 1
    with dblock.connect(url, table=table) as other:
        held = other.info("k")
        assert held is not None and held.token == lock.token and held.owner == lock.owner
        lock.release()
        assert other.info("k") is None


@pytest.mark.parametrize("lease_ended", [False, True], ids=["lease-alive", "lease-ended"])
def test_a_release_is_known_when_the_key_was_taken_before_the_retry(
    client: dblock.Client,
    proxy: Proxy,
    url: str,
    table: str,
    monkeypatch: pytest.MonkeyPatch,
    lease_ended: bool,
) -> None:
    """Between the lost reply and the retry another client takes the key (its acquire
    overwrites the record of the release), and the released hold's lease may end too: the
    release is still known to be the holder's own."""
    lock = client.lock("k", ttl=30)
    assert lock.acquire()
    s = store(client)
    lease = s._holds[lock.token][0]  # type: ignore[index]
    other = dblock.connect(url, table=table)
    theirs = other.lock("k", ttl=30)
    failed = s.rpc._failed

    def taken_meanwhile() -> None:
        failed()
        if lease_ended:
            assert store(other).rpc.revoke("test", lease)
        assert theirs.acquire(blocking=False)

    monkeypatch.setattr(s.rpc, "_failed", taken_meanwhile)
    proxy.drop_next_reply()
    lock.release()
    assert proxy.dropped() == 1
    assert theirs.token is not None
    theirs.release()
    other.close()


def test_a_lost_hold_is_still_lost_when_the_reply_is_lost(
    client: dblock.Client, proxy: Proxy, url: str, table: str
) -> None:
    lock = client.lock("k", ttl=30)
    assert lock.acquire()
    with dblock.connect(url, table=table) as other:
        assert other.force_release("k")
    proxy.drop_next_reply()
    with pytest.raises(dblock.LockLost):
        lock.release()
    assert proxy.dropped() == 1


@pytest.mark.parametrize("ttl", [None, 60.0], ids=["keep-alive", "new-lease"])
def test_a_renew_whose_reply_is_lost_renews(
    client: dblock.Client,
    proxy: Proxy,
    url: str,
    table: str,
    monkeypatch: pytest.MonkeyPatch,
    ttl: float | None,
) -> None:
    lock = client.lock("k", ttl=30)
    assert lock.acquire()
    if ttl is None:
        proxy.drop_next_reply()
    else:
        drop_after_grant(store(client), proxy, monkeypatch)
    lock.renew(ttl)
    assert proxy.dropped() == 1
    with dblock.connect(url, table=table) as other:
        held = other.info("k")
        assert held is not None and held.token == lock.token
    lock.release()


def test_queue_operations_whose_replies_are_lost(
    client: dblock.Client, proxy: Proxy, url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(client)
    with dblock.connect(url, table=table) as other:
        blocker = other.lock("k", ttl=30)
        assert blocker.acquire()
        for owner in ("a", "b"):  # a queues, then b behind it
            drop_after_grant(s, proxy, monkeypatch)
            s.enqueue("k", owner, "lock", 30)
        assert proxy.dropped() == 2
        assert s.probe("k", "b") == (False, 1)
        through_proxy(s, proxy)
        proxy.drop_next_reply()
        s.dequeue("k", "b")  # b leaves
        assert proxy.dropped() == 3
        assert s.probe("k", "a") == (False, 0)
        blocker.release()
        drop_after_grant(s, proxy, monkeypatch)
        token = s.acquire_fair("k", "a", 30, True)  # a, at the head, is served
        assert proxy.dropped() == 4
        assert token is not None
        held = other.info("k")
        assert held is not None and held.token == token and held.owner == "a"
        assert s.probe("k", "c") == (False, 0)  # no queue entry left
        assert s.release("k", "a", token)
        assert other.info("k") is None


def test_shared_and_once_holds_whose_replies_are_lost(
    client: dblock.Client, proxy: Proxy, url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(client)
    with dblock.connect(url, table=table) as other:
        drop_after_grant(s, proxy, monkeypatch)
        token = s.acquire_shared("r", "a", 30, "read", None)
        assert proxy.dropped() == 1
        assert token is not None
        held = other.info("r")
        assert held is not None and held.token == token and held.owner == "a"
        through_proxy(s, proxy)
        proxy.drop_next_reply()
        assert s.release_shared("r", "a", token)
        assert proxy.dropped() == 2
        assert other.info("r") is None

        drop_after_grant(s, proxy, monkeypatch)
        token = s.claim_once("o", "a", 30, None)
        assert proxy.dropped() == 3
        assert token is not None
        held = other.info("o")
        assert held is not None and held.token == token and held.owner == "a"
        through_proxy(s, proxy)
        proxy.drop_next_reply()
        assert s.finish_once("o", "a", token, "succeeded")
        assert proxy.dropped() == 4
        assert s.once_state("o") == ("once", "succeeded", False)


def test_a_release_retried_by_the_caller_after_every_reply_was_lost_is_not_a_loss(
    client: dblock.Client, proxy: Proxy, url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each copy of the release reaches etcd and each reply is lost: the call fails (the
    hold stays the caller's, by the contract), and the caller's next release finds the hold
    gone. That is its own earlier copy's doing, not a loss (the first copy's effect was
    forgotten with the call that failed, and the retry took the missing hold for a loss)."""
    lock = client.lock("k", ttl=30)
    assert lock.acquire()
    s = store(client)
    failed = s.rpc._failed

    def lost_again() -> None:
        failed()
        through_proxy(s, proxy)
        proxy.drop_next_reply()

    monkeypatch.setattr(s.rpc, "_failed", lost_again)
    through_proxy(s, proxy)
    proxy.drop_next_reply()
    with pytest.raises(dblock.BackendError):
        lock.release()
    monkeypatch.setattr(s.rpc, "_failed", failed)
    (proxy.where / "drop").unlink(missing_ok=True)
    # every copy sent was applied and no answer came back (each retry's too, where the reset
    # reads as unreachable: one per endpoint and one more)
    assert proxy.dropped() >= 1
    with dblock.connect(url, table=table) as other:
        assert other.info("k") is None
        lock.release()  # no LockLost
        assert not lock.held
