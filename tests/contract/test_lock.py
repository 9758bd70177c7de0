"""The Lock contract, run identically on every provider (no store branches here)."""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import time
from datetime import timedelta

import pytest

import dblock
from dblock._engine.waiting import PUSHED_POLL_CAP
from tests._internals import store_call, store_of
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


@pytest.mark.needs("Wakeups")
def test_a_release_before_the_waiter_subscribes_to_wake_ups_is_not_slept_through(
    client: dblock.Client, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hold ends after the waiter's first try failed and before it subscribed to
    wake-ups, so no wake-up tells it of that release (the async client's tasks meet this at
    nearly every hand-over: only one of them waits in the store for a key, and the holder
    lets go while it tries). Once listening, the waiter must look again, not sleep until its
    fallback poll (3.75-5 s on), which a generous bound tells apart."""
    store = store_of(client)
    token = store_call(client, "acquire", key, "someone-else", 30, "lock")
    assert token is not None
    subscribe = store.subscribe
    released: list[bool] = []

    def release_then_subscribe(*args: object) -> object:
        if not released:  # on the waiter's side, as it runs the store's code
            released.append(store.release(key, "someone-else", token))
        return subscribe(*args)

    monkeypatch.setattr(store, "subscribe", release_then_subscribe)
    lock = client.lock(key, reentrant=False)
    start = time.monotonic()
    assert lock.acquire(timeout=20)
    waited = time.monotonic() - start
    lock.release()
    assert released == [True]
    assert waited < 0.75 * PUSHED_POLL_CAP / 2


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


@pytest.mark.parametrize("ttl", [30.0, None], ids=["lease", "session"])
def test_held_is_false_as_soon_as_the_store_has_released(
    client: dblock.Client, key: str, ttl: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the store's answer to the last release on, the key may be another owner's: this
    object's ``held`` must say False then, not only once the client has forgotten its hold
    (filelock's threaded test saw another object's hold as ``held`` inside its own critical
    section). A release that fails leaves ``held`` as it was."""
    lock = client.lock(key, ttl=ttl)
    inner = getattr(getattr(lock, "_async", lock), "_lock", lock)  # the blocking Lock
    store = store_of(client)
    name = "release_session" if ttl is None and hasattr(store, "release_session") else "release"
    end = getattr(store, name)
    seen: list[bool] = []

    def end_then_look(*args: object) -> object:
        answer = end(*args)
        seen.append(inner.held)
        return answer

    def failing(*_args: object) -> object:
        raise dblock.BackendError("the store is out of reach (test)")

    assert lock.acquire(timeout=10)
    monkeypatch.setattr(store, name, failing)
    with pytest.raises(dblock.BackendError):
        lock.release()
    assert lock.held
    monkeypatch.setattr(store, name, end_then_look)
    lock.release()
    assert seen == [False]
    assert not lock.held


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


#: what a refusal of a ttl names: the shortest ttl this client's grant replies confirm
SHORTEST = re.compile(r"the shortest ttl it confirms is about ([0-9.e+-]+) s")


def _named_shortest(exc: ValueError, key: str) -> float:
    """The shortest ttl a refusal names (it names the key and how it was measured)."""
    text = str(exc)
    assert key in text
    assert "median round trip of this client's last" in text
    found = SHORTEST.search(text)
    assert found is not None, text
    return float(found.group(1))


@pytest.mark.parametrize("ttl", [1e-9, 1e-4, 3e-4, 1e-3, 3e-3])
def test_a_ttl_about_as_short_as_a_reply_neither_hangs_nor_is_reported_held_when_over(
    client: dblock.Client, key: str, ttl: float
) -> None:
    """Leases about as long as a round trip (1 ns: none beats it; 0.1-3 ms: some replies do,
    some not). acquire() returns True only with ``held`` True right after; a blocking
    acquire of the free key returns True, or raises ValueError naming a longer ttl (the
    shortest the store's measured replies confirm), rather than wait forever; a try returns
    True or False. A ttl under a thread switch interval is always refused: a hold reported
    with less left could be over before its caller runs again."""
    out: dict[str, object] = {}

    def scenario() -> None:
        for blocking in (True, False, False, False, False, False):
            lock = client.lock(key, ttl=ttl, reentrant=False)
            try:
                got = lock.acquire(blocking=blocking)  # no timeout
            except ValueError as exc:
                out.setdefault(f"refused {blocking}", exc)
                continue
            held = lock.held
            out.setdefault(f"got {blocking}", got)
            if not blocking:
                out.setdefault("tries", []).append(got)  # type: ignore[union-attr]
            if got and not held:
                out["True but not held"] = (blocking, got, held)
            with contextlib.suppress(dblock.LockLost):  # the lease may be over by now
                if got:
                    lock.release()

    thread = threading.Thread(target=scenario, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), f"acquire() of a free key with a {ttl} s ttl did not return"
    assert "True but not held" not in out, out
    assert "refused False" not in out, out  # a try is never refused by an error
    refused = out.get("refused True")
    if refused is None:
        assert out["got True"] is True
    else:
        assert isinstance(refused, ValueError) and _named_shortest(refused, key) > ttl
    if ttl < sys.getswitchinterval():
        # less than it would have to have left when reported (docs/lock.md: short leases)
        assert isinstance(refused, ValueError)
        assert out["tries"] == [False] * 5
    assert client.info(key) is None
    other = client.lock(key, ttl=30, reentrant=False)
    assert other.acquire(timeout=10)
    other.release()


def test_a_ttl_no_reply_beats_is_refused_and_leaves_no_hold(
    client: dblock.Client, key: str
) -> None:
    """1 ns: every grant comes back after its lease. A try returns False; a blocking acquire,
    with or without a timeout, raises ValueError naming the shortest ttl this client's
    replies confirm (a ttl a normal acquire beats), instead of waiting on for a grant it can
    use (it returns well before its 60 s timeout); and no hold is left in the store."""
    out: dict[str, object] = {}

    def scenario() -> None:
        lock = client.lock(key, ttl=1e-9, reentrant=False)
        out["try"] = lock.acquire(blocking=False)
        out["held after try"] = lock.held
        out["info after try"] = client.info(key)
        for name, kwargs in (("no timeout", {}), ("timeout", {"timeout": 60.0})):
            try:
                out[name] = lock.acquire(**kwargs)
            except ValueError as exc:
                out[name] = exc
            out[f"info after {name}"] = client.info(key)
        out["try again"] = lock.acquire(blocking=False)

    thread = threading.Thread(target=scenario, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "a blocking acquire with a 1 ns ttl waited on"
    assert out["try"] is False and out["held after try"] is False
    assert out["try again"] is False
    for name in ("try", "no timeout", "timeout"):
        assert out[f"info after {name}"] is None, name
    shortest = []
    for name in ("no timeout", "timeout"):
        exc = out[name]
        assert isinstance(exc, ValueError), f"acquire() with {name}: {exc!r}"
        assert not isinstance(exc, dblock.DBLockError)
        assert "ttl=1e-09 s is too short" in str(exc)
        shortest.append(_named_shortest(exc, key))
    assert all(1e-9 < s <= 0.05 for s in shortest), shortest
    other = client.lock(key, ttl=30, reentrant=False)
    assert other.acquire(blocking=False)  # at once: nothing was left to expire
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
    lock = client.lock(key, ttl=1.2, auto_renew=True)
    lock.acquire()
    token = lock.token
    time.sleep(2.0)  # past the ttl: renewed at least once
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
