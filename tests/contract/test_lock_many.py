"""``client.lock_many`` (API.md § Many keys at once) on every store with ManyKeys, sync and
async: all or none, each key its own token, exclusion with single-key locks, loss, bad input.
The multi-process checks (no deadlock, atomicity seen from outside, a killed holder) are in
tests/contract/test_lock_many_processes.py."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import dblock
from tests._internals import store_of
from tests.providers import Provider

pytestmark = pytest.mark.needs("ManyKeys")


@pytest.fixture
def other(provider: Provider, table: str) -> Iterator[dblock.Client]:
    """A second client of the same table: another owner, in this thread too."""
    with provider.connect(table=table) as c:
        yield c


def _keys(n: int = 3) -> list[str]:
    stem = "lm-" + uuid.uuid4().hex[:8]
    return [f"{stem}-{i}" for i in (2, 0, 1, 3, 4)[:n]]  # not in sorted order


def test_every_key_is_held_with_its_own_token_above_the_keys_earlier_ones(
    client: dblock.Client,
) -> None:
    keys = _keys()
    before = {}
    for key in keys:
        with client.lock(key, timeout=5) as lock:
            before[key] = lock.token
    many = client.lock_many(keys, ttl=30, timeout=5)
    assert many.keys == tuple(keys) and not many.held and many.tokens is None
    with many:
        tokens = many.tokens
        assert many.held and tokens is not None and sorted(tokens) == sorted(keys)
        for key in keys:
            assert tokens[key] > before[key]
            info = client.info(key)
            assert info is not None and (info.owner, info.token) == (many.owner, tokens[key])
        holds = client.list(keys[0][:11])
        assert sorted(h.key for h in holds) == sorted(keys)
    assert many.tokens is None and not many.held
    assert all(client.info(key) is None for key in keys)
    with client.lock_many(keys, timeout=5) as again:  # and the next grant is above this one
        assert again.tokens is not None
        assert all(again.tokens[k] > tokens[k] for k in keys)


def test_a_key_held_by_a_lock_takes_none_and_a_many_hold_excludes_locks(
    client: dblock.Client, other: dblock.Client
) -> None:
    keys = _keys()
    with other.lock(keys[1], timeout=5):
        many = client.lock_many(keys)
        assert many.acquire(blocking=False) is False
        assert many.acquire(timeout=0.3) is False
        assert client.info(keys[0]) is None and client.info(keys[2]) is None
    with client.lock_many(keys, timeout=5):
        for key in keys:
            assert threading_try(client, key) is False
    assert all(threading_try(client, key) for key in keys)


def threading_try(client: dblock.Client, key: str) -> bool:
    """Try ``key`` once from another thread (another owner); release it if had."""
    got: list[bool] = []

    def attempt() -> None:
        lock = client.lock(key)
        ok = lock.acquire(blocking=False)
        got.append(ok)
        if ok:
            lock.release()

    t = threading.Thread(target=attempt)
    t.start()
    t.join(30)
    return got == [True]


def test_a_waiter_holds_none_of_its_keys_and_gets_them_all_at_a_release(
    client: dblock.Client,
) -> None:
    keys = _keys()
    blocker = client.lock(keys[2], ttl=30)
    assert blocker.acquire(timeout=5)
    result: list[dict[str, int] | None] = []
    many = client.lock_many(keys, ttl=30)

    def wait() -> None:
        result.append(many.tokens if many.acquire(timeout=30) else None)
        if many.held:
            many.release()

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.4)
    # waiting, it holds nothing: another owner takes a key of its set that is free
    assert client.info(keys[0]) is None and client.info(keys[1]) is None
    blocker.release()
    t.join(30)
    assert result and result[0] is not None and sorted(result[0]) == sorted(keys)


def test_not_had_in_time_with_raises_lock_timeout_and_leaves_nothing(
    client: dblock.Client, other: dblock.Client
) -> None:
    keys = _keys()
    with other.lock(keys[0], timeout=5):
        started = time.monotonic()
        with pytest.raises(dblock.LockTimeout) as caught:
            with client.lock_many(keys, timeout=0.5):
                pytest.fail("entered")
        assert time.monotonic() - started < 20
        assert keys[0] in str(caught.value)
        assert client.info(keys[1]) is None and client.info(keys[2]) is None
    assert all(client.info(k) is None for k in keys)


def test_bad_input_is_refused_before_any_io(client: dblock.Client) -> None:
    limit = store_of(client).max_keys
    for bad, error in (
        ([], ValueError),
        (["a", "b", "a"], ValueError),
        ([f"k{i}" for i in range(limit + 1)], ValueError),
        (["ok", ""], ValueError),
        (["ok", "x" * 256], ValueError),
        ("ab", TypeError),
        (["ok", 7], TypeError),
        (None, TypeError),
    ):
        with pytest.raises(error):
            client.lock_many(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        client.lock_many(["a"], ttl=0)
    with pytest.raises(ValueError):
        client.lock_many(["a"], timeout=-1)


def test_not_reentrant_and_a_lock_inside_refuses_instead_of_waiting_for_itself(
    client: dblock.Client,
) -> None:
    keys = _keys()
    with client.lock_many(keys, timeout=5) as many:
        with pytest.raises(ValueError, match="re-entrant"):
            many.acquire(timeout=1)
        with pytest.raises(ValueError, match="re-entrant"):
            client.lock_many([keys[1], "other-" + keys[0]]).acquire(timeout=1)
        with pytest.raises(ValueError, match="lock_many"):
            client.lock(keys[0]).acquire(timeout=1)
        assert many.held
    with client.lock(keys[0], timeout=5):
        with pytest.raises(ValueError, match="re-entrant"):
            client.lock_many(keys).acquire(timeout=1)


def test_renew_and_a_key_force_released_is_a_loss_that_frees_the_rest(
    client: dblock.Client,
) -> None:
    keys = _keys()
    many = client.lock_many(keys, ttl=30)
    assert many.acquire(timeout=5)
    tokens = many.tokens
    assert tokens is not None
    many.renew(60)
    info = client.info(keys[1])
    assert info is not None and info.expires_at is not None
    assert client.force_release(keys[1])
    with pytest.raises(dblock.LockLost):
        many.renew()
    with pytest.raises(dblock.LockLost):
        many.release()
    assert all(client.info(k) is None for k in keys), "release freed the keys still held"
    with pytest.raises(dblock.NotHeld):
        many.release()
    for key in keys:  # every key's next token is above the many hold's, force-released or not
        with client.lock(key, timeout=5) as lock:
            assert lock.token is not None and lock.token > tokens[key]


def test_on_lost_is_called_once_when_a_key_is_lost(client: dblock.Client) -> None:
    keys = _keys()
    lost: list[object] = []
    many = client.lock_many(keys, ttl=1.5, auto_renew=True, on_lost=lost.append)
    assert many.acquire(timeout=5)
    assert client.force_release(keys[0])
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lost) == 1 and not many.held
    with pytest.raises(dblock.LockLost):
        many.release()
    assert all(client.info(k) is None for k in keys)
    time.sleep(0.3)
    assert len(lost) == 1


def test_an_expired_lease_is_taken_over_and_its_release_raises_lock_lost(
    client: dblock.Client,
) -> None:
    keys = _keys(2)
    many = client.lock_many(keys, ttl=1)
    assert many.acquire(timeout=5)
    first = many.tokens
    assert first is not None
    time.sleep(1.3)
    with client.lock(keys[1], timeout=5) as lock:  # another owner, past the lease
        assert lock.token is not None and lock.token > first[keys[1]]
        with pytest.raises(dblock.LockLost):
            many.release()
        assert lock.held
    assert client.info(keys[0]) is None


def test_auto_renew_keeps_every_key_past_its_ttl(client: dblock.Client) -> None:
    keys = _keys(2)
    # a ttl of 2 s: renewals come every third of it, and a loaded CI machine once delayed
    # one past a 1 s lease (postgresql-async)
    with client.lock_many(keys, ttl=2, auto_renew=True, timeout=5) as many:
        time.sleep(2.6)
        assert many.held
        assert all(threading_try(client, k) is False for k in keys)
    assert all(client.info(k) is None for k in keys)


def test_ttl_none_is_held_until_released(client: dblock.Client) -> None:
    keys = _keys(2)
    with client.lock_many(keys, ttl=None, timeout=5) as many:
        assert many.held and many.tokens is not None
        assert all(threading_try(client, k) is False for k in keys)
    assert all(client.info(k) is None for k in keys)


@pytest.mark.needs("FairManyKeys")
def test_a_stream_of_single_key_holders_does_not_starve_a_waiter(client: dblock.Client) -> None:
    """Four threads keep the two keys held, taking turns so that one of them is always held.
    A waiter for both queues on both: the holds after it queued are only those of waiters
    already queued then (at most one per thread and key), then it has them."""
    keys = _keys(2)
    stop = threading.Event()
    errors: list[BaseException] = []
    granted: dict[str, list[float]] = {k: [] for k in keys}

    def hammer(key: str) -> None:
        try:
            while not stop.is_set():
                with client.lock(key, ttl=30, timeout=60):
                    granted[key].append(time.monotonic())
                    time.sleep(0.03)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(keys[i % 2],)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        many = client.lock_many(keys, ttl=30)
        started = time.monotonic()
        assert many.acquire(timeout=30), "the lock_many waiter starved"
        got = time.monotonic()
        many.release()
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    for k in keys:
        # holds of the key granted while it waited: those queued ahead of it (two threads per
        # key, each once), and a margin for the moments before its entries were made
        during = [at for at in granted[k] if started < at < got]
        assert len(during) <= 6, (k, len(during), got - started)
