"""The Lock contract, run identically on every provider (no store branches here)."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import timedelta

import pytest

import dblock
from tests.providers import Provider

KEYS_THAT_MUST_SURVIVE = [
    "'; DROP TABLE dblock_locks; --",
    'quote"double',
    "back\\slash",
    "percent%_under",
    "x" * 255,
    "日本語のキー",
    "emoji 🔒 key",
    " leading and trailing ",
    "Key",  # differs from "key" only by case
    "key",
]


def test_acquire_release_and_state(client: dblock.Client, key: str) -> None:
    lock = client.lock(key, ttl=10)
    assert not lock.held and lock.token is None and not lock.locked()
    assert lock.acquire()
    assert lock.held and lock.locked()
    assert isinstance(lock.token, int)
    info = client.info(key)
    assert info is not None
    assert (info.key, info.owner, info.token, info.kind) == (key, lock.owner, lock.token, "lock")
    lock.release()
    assert not lock.held and lock.token is None and not lock.locked()
    assert client.info(key) is None


def test_owner_identity_format(client: dblock.Client, provider: Provider, key: str) -> None:
    import os
    import socket

    with client.lock(key) as lock:
        host, pid, thread, rand = lock.owner.split(":")
        assert host == socket.gethostname()[:64]
        assert int(pid) == os.getpid()
        assert len(rand) >= 8
        if provider.has("blocking"):  # the async client names the task: "task-<n>"
            assert int(thread) == threading.get_ident()
    # <thread> names the owner: the same for this thread's next hold, another for another's
    with client.lock(key + "2") as again:
        assert again.owner.split(":")[2] == thread
    others: list[str] = []
    elsewhere = threading.Thread(target=lambda: others.append(client.lock(key).owner))
    elsewhere.start()
    elsewhere.join()
    assert others and others[0].split(":")[2] != thread


@pytest.mark.parametrize("odd", KEYS_THAT_MUST_SURVIVE)
def test_odd_keys_round_trip_and_the_table_survives(client: dblock.Client, odd: str) -> None:
    with client.lock(odd) as lock:
        info = client.info(odd)
        assert info is not None and info.key == odd and info.token == lock.token
        assert [i.key for i in client.list(odd)] == [odd]
    assert client.info(odd) is None
    with client.lock("after-" + odd[:200]):
        pass  # the table still works


def test_keys_differing_by_case_are_different_locks(client: dblock.Client) -> None:
    with client.lock("Key"), client.lock("key", timeout=0):
        assert {i.key for i in client.list()} == {"Key", "key"}


def test_keys_differing_by_trailing_spaces_are_different_locks(client: dblock.Client) -> None:
    # MySQL's utf8mb4_bin pads with spaces: 'k' and 'k ' compared equal and shared one row
    keys = ["k", "k ", "k  ", "k\t"]
    locks = [client.lock(k, timeout=0) for k in keys]
    for lock in locks:
        assert lock.acquire(), f"{lock.key!r} is free: no other key holds it"
    assert [i.key for i in client.list("k")] == sorted(keys)
    assert [i.key for i in client.list("k ")] == ["k ", "k  "]
    for lock in locks:
        info = client.info(lock.key)
        assert info is not None and info.key == lock.key and info.token == lock.token
        lock.release()
    assert client.list("k") == []


@pytest.mark.needs("exact_ttl")  # a sub-second lease, or its exact length
def test_lease_is_measured_on_the_database_clock(client: dblock.Client, key: str) -> None:
    with client.lock(key, ttl=12.5):
        info = client.info(key)
        assert info is not None
        assert info.acquired_at.tzinfo is not None and info.acquired_at.utcoffset() == timedelta(0)
        # both ends come from one server-side timestamp: the lease is exactly ttl long
        assert info.expires_at - info.acquired_at == timedelta(seconds=12.5)


def test_second_owner_waits_then_times_out(client: dblock.Client, key: str) -> None:
    with client.lock(key):
        other = client.lock(key, reentrant=False)
        assert not other.acquire(blocking=False)
        assert not other.acquire(timeout=0.3)
        with pytest.raises(dblock.LockTimeout, match=key):
            with client.lock(key, reentrant=False, timeout=0.2):
                pass  # pragma: no cover


def test_timeout_default_comes_from_the_lock(client: dblock.Client, key: str) -> None:
    with client.lock(key):
        assert not client.lock(key, reentrant=False, timeout=0.1).acquire()


def test_waiter_gets_the_lock_after_release(client: dblock.Client, key: str) -> None:
    holder = client.lock(key)
    holder.acquire()
    got: list[int | None] = []

    def wait() -> None:
        lock = client.lock(key, reentrant=False)
        if lock.acquire(timeout=20):
            got.append(lock.token)
            lock.release()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)
    first = holder.token
    holder.release()
    thread.join(30)
    assert got and got[0] is not None and first is not None and got[0] > first


def test_reentrant_same_thread_needs_as_many_releases(client: dblock.Client, key: str) -> None:
    a = client.lock(key)
    b = client.lock(key)  # another object, same client and thread: the same owner
    assert a.acquire() and a.acquire(blocking=False) and b.acquire(blocking=False)
    assert a.token == b.token
    b.release()
    a.release()
    assert client.lock(key, reentrant=False).acquire(blocking=False) is False
    a.release()
    assert not client.lock(key).locked()
    with pytest.raises(dblock.NotHeld):
        a.release()
    with pytest.raises(dblock.NotHeld):
        b.release()


def test_not_reentrant_waits_like_anyone(client: dblock.Client, key: str) -> None:
    lock = client.lock(key, reentrant=False)
    assert lock.acquire()
    assert not lock.acquire(timeout=0.2)
    lock.release()


def test_another_thread_is_another_owner(client: dblock.Client, key: str) -> None:
    lock = client.lock(key)
    lock.acquire()
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(lock.acquire(blocking=False)))
    thread.start()
    thread.join()
    assert result == [False]
    errors: list[BaseException] = []

    def release_elsewhere() -> None:
        try:
            lock.release()
        except dblock.NotHeld as exc:
            errors.append(exc)

    thread = threading.Thread(target=release_elsewhere)
    thread.start()
    thread.join()
    assert len(errors) == 1 and lock.locked()
    lock.release()


def test_release_not_held_is_not_held(client: dblock.Client, key: str) -> None:
    with pytest.raises(dblock.NotHeld, match=key) as info:
        client.lock(key).release()
    assert not isinstance(info.value, dblock.LockLost)


@pytest.mark.needs("exact_ttl")  # a sub-second lease, or its exact length
def test_expired_lease_raises_lock_lost_even_if_nobody_took_it(
    client: dblock.Client, key: str
) -> None:
    lock = client.lock(key, ttl=0.3)
    lock.acquire()
    time.sleep(0.6)
    assert not lock.held
    assert not lock.locked()
    with pytest.raises(dblock.LockLost, match=key):
        lock.release()
    with pytest.raises(dblock.NotHeld):
        lock.release()  # the hold is gone from the lock object too


@pytest.mark.parametrize("ttl", [1e-9, 1e-4, 3e-4, 1e-3, 3e-3])
def test_a_ttl_about_as_short_as_a_reply_neither_hangs_nor_refuses_a_free_key(
    client: dblock.Client, key: str, ttl: float
) -> None:
    """Leases about as long as a round trip (1 ns: none beats it; 0.1-3 ms: some replies do,
    some not): a blocking acquire of the free key returns True rather than wait forever. A
    grant that came back after its lease is not reported held where ordinary grants beat the
    ttl (test_chaos.py), so there a try without waiting may find none it can use; a 1 ns
    grant is reported as made, its lease already over."""
    out: dict[str, object] = {}

    def scenario() -> None:
        for blocking in (True, False):
            lock = client.lock(key, ttl=ttl, reentrant=False)
            got = out[f"got {blocking}"] = lock.acquire(blocking=blocking)  # no timeout
            out[f"held {blocking}"] = lock.held
            with contextlib.suppress(dblock.LockLost):  # the lease may be over by now
                if got:
                    lock.release()

    thread = threading.Thread(target=scenario, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), f"acquire() of a free key with a {ttl} s ttl did not return"
    assert out["got True"] is True
    if ttl < 1e-6:
        assert out["got False"] is True
        assert out["held True"] is False
    other = client.lock(key, ttl=30, reentrant=False)
    assert other.acquire(timeout=10)
    other.release()


@pytest.mark.needs("exact_ttl")  # a sub-second lease, or its exact length
def test_taken_over_lease_raises_lock_lost_and_leaves_the_new_owner(
    client: dblock.Client, key: str
) -> None:
    old = client.lock(key, ttl=0.3)
    old.acquire()
    old_token = old.token
    time.sleep(0.6)
    new = client.lock(key, reentrant=False, ttl=30)
    assert new.acquire(blocking=False)
    assert new.token is not None and old_token is not None and new.token > old_token
    with pytest.raises(dblock.LockLost):
        old.renew()
    with pytest.raises(dblock.LockLost):
        old.release()
    info = client.info(key)
    assert info is not None and info.owner == new.owner and info.token == new.token
    new.release()


def test_renew_extends_the_lease_and_keeps_the_token(client: dblock.Client, key: str) -> None:
    with client.lock(key, ttl=5) as lock:
        token = lock.token
        before = client.info(key)
        lock.renew(60)
        after = client.info(key)
        assert before is not None and after is not None
        assert after.expires_at - before.expires_at > timedelta(seconds=50)
        assert after.token == token == lock.token
        lock.renew()
        again = client.info(key)
        assert again is not None and again.expires_at < after.expires_at
    with pytest.raises(dblock.NotHeld):
        lock.renew()


def test_renew_rejects_bad_ttl(client: dblock.Client, key: str) -> None:
    with client.lock(key) as lock, pytest.raises(ValueError):
        lock.renew(0)


@pytest.mark.needs("exact_ttl")  # a sub-second lease, or its exact length
def test_tokens_strictly_increase_across_everything(
    client: dblock.Client, provider: Provider, table: str, key: str
) -> None:
    tokens: list[int] = []

    def take(c: dblock.Client, ttl: float = 10) -> dblock.Lock:
        lock = c.lock(key, ttl=ttl, reentrant=False)
        assert lock.acquire(timeout=5)
        assert lock.token is not None
        tokens.append(lock.token)
        return lock

    take(client).release()  # release
    take(client, ttl=0.2)
    time.sleep(0.4)
    take(client).release()  # expiry takeover
    take(client)
    assert client.force_release(key)  # force release
    lock = take(client)
    lock.release()
    assert client.purge() >= 1  # purge deletes the row
    assert client.info(key) is None
    take(client).release()
    with provider.connect(table=table) as fresh:  # a new client
        take(fresh).release()
        fresh.purge()
        take(fresh).release()
    assert tokens == sorted(set(tokens)), tokens


def test_reentrant_acquisition_keeps_the_token(client: dblock.Client, key: str) -> None:
    with client.lock(key) as outer, client.lock(key) as inner:
        assert inner.token == outer.token


def test_auto_renew_keeps_the_lock_past_its_ttl_and_stops_on_release(
    client: dblock.Client, key: str
) -> None:
    lock = client.lock(key, ttl=0.6, auto_renew=True)
    lock.acquire()
    token = lock.token
    time.sleep(1.5)
    assert lock.held
    info = client.info(key)
    assert info is not None and info.token == token
    assert not client.lock(key, reentrant=False).acquire(blocking=False)
    lock.release()
    time.sleep(0.5)  # a renewal still running would resurrect the row
    assert client.info(key) is None


def test_auto_renew_detects_takeover_and_calls_on_lost_once(
    client: dblock.Client, key: str
) -> None:
    calls: list[dblock.Lock] = []
    lost = threading.Event()

    def on_lost(lock: dblock.Lock) -> None:
        calls.append(lock)
        lost.set()

    lock = client.lock(key, ttl=0.6, auto_renew=True, on_lost=on_lost)
    lock.acquire()
    assert client.force_release(key)
    assert lost.wait(5)
    time.sleep(0.5)
    assert calls == [lock]
    assert not lock.held
    with pytest.raises(dblock.LockLost):
        lock.release()


def test_on_lost_without_auto_renew_fires_when_the_lease_runs_out(
    client: dblock.Client, key: str
) -> None:
    lost = threading.Event()
    lock = client.lock(key, ttl=0.4, on_lost=lambda _lock: lost.set())
    lock.acquire()
    assert lost.wait(5)
    with pytest.raises(dblock.LockLost):
        lock.release()


def test_on_lost_not_called_after_a_clean_release(client: dblock.Client, key: str) -> None:
    lost = threading.Event()
    with client.lock(key, ttl=0.4, auto_renew=True, on_lost=lambda _lock: lost.set()):
        pass
    assert not lost.wait(1.0)


def test_info_and_list(client: dblock.Client) -> None:
    keys = ["b", "a", "a%", "a_", "ab", "é", "Z", "a\\"]
    locks = [client.lock(k) for k in keys]
    for lock in locks:
        lock.acquire()
    free = client.lock("a-free")
    free.acquire()
    free.release()
    assert [i.key for i in client.list()] == sorted(keys)
    assert [i.key for i in client.list("a")] == sorted(["a", "a%", "a_", "ab", "a\\"])
    assert [i.key for i in client.list("a%")] == ["a%"]  # no LIKE wildcards
    assert [i.key for i in client.list("a_")] == ["a_"]
    assert client.list("nothing") == []
    assert client.info("a-free") is None
    for info in client.list():
        assert info.expires_at > info.acquired_at
    for lock in locks:
        lock.release()
    assert client.list() == []


def test_force_release(client: dblock.Client, key: str) -> None:
    assert client.force_release(key) is False
    lock = client.lock(key)
    lock.acquire()
    assert client.force_release(key) is True
    assert client.force_release(key) is False
    assert not lock.locked()
    with pytest.raises(dblock.LockLost):
        lock.release()


def test_purge_respects_older_than_and_live_holds(client: dblock.Client) -> None:
    held = client.lock("held")
    held.acquire()
    released = client.lock("released")
    released.acquire()
    released.release()
    assert client.purge(older_than=3600) == 0
    assert client.purge() == 1
    assert [i.key for i in client.list()] == ["held"]
    assert client.purge() == 0
    held.release()
    with pytest.raises(ValueError):
        client.purge(-1)


def test_create_schema_false_on_missing_table(provider: Provider, table: str) -> None:
    with pytest.raises(dblock.ConfigurationError, match="dblock schema"):
        provider.connect(table=table, create_schema=False)
    provider.connect(table=table).close()
    provider.connect(table=table).close()  # idempotent
    with provider.connect(table=table, create_schema=False) as client:
        assert client.list() == []


def test_client_is_a_context_manager_and_closes(provider: Provider, table: str) -> None:
    with provider.connect(table=table) as client:
        pass
    client.close()  # idempotent
    with pytest.raises(dblock.BackendError, match="closed"):
        client.lock("k").acquire()


def test_client_shared_by_threads(client: dblock.Client, key: str) -> None:
    counter = {"n": 0}
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(10):
                with client.lock(key, timeout=30):
                    value = counter["n"]
                    time.sleep(0.001)
                    counter["n"] = value + 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert counter["n"] == 40
