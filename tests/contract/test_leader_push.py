"""The LeaderPush capability on every store that declares it, sync and async: an observer of a
key is told, from a store thread and within moments, of each grant, proclaim, release and
force-release of it (what ``observe()`` waits on instead of polling), and no more once it
stopped watching."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

import dblock
from tests._internals import store_call, store_of
from tests.providers import Provider

pytestmark = pytest.mark.needs("LeaderPush")

#: generous: a store that pushes tells within milliseconds; one that does not, never
TOLD_WITHIN = 5.0


def _key() -> str:
    return "p-" + uuid.uuid4().hex[:10]


class Heard:
    """A ``heard`` callback that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._event = threading.Event()

    def __call__(self) -> None:
        self.calls += 1
        self._event.set()

    def quiet(self) -> None:
        """Forget what was told so far (a store may tell once as the watch starts)."""
        time.sleep(0.2)
        self._event.clear()

    def told(self) -> bool:
        """Told within TOLD_WITHIN since the last ``quiet``/``told``."""
        told = self._event.wait(TOLD_WITHIN)
        self._event.clear()
        return told


@contextmanager
def watching(client: dblock.Client, key: str) -> Iterator[tuple[Heard, Callable[[], None]]]:
    """Watch ``key``: what it is told, and the call that stops it (run as the client runs
    its store's code, as ``watch_leader`` itself is)."""
    from tests._async_facade import Client as Facade

    heard = Heard()
    unwatch = store_call(client, "watch_leader", key, heard)

    def stop() -> None:
        if isinstance(client, Facade):
            client.run_green(unwatch)
        else:
            unwatch()

    try:
        heard.quiet()
        yield heard, stop
    finally:
        stop()  # (twice, where the test stopped it: harmless)


def _every_hold(client: dblock.Client) -> bool:
    return bool(store_of(client).tells_every_hold)


def test_a_grant_and_the_proclaim_that_follows_it_are_told(client: dblock.Client) -> None:
    key = _key()
    with watching(client, key) as (heard, _):
        lock = client.lock(key, ttl=30)
        assert lock.acquire(blocking=False)
        if _every_hold(client):
            assert heard.told(), "a grant was not told"
        assert store_call(client, "proclaim", key, lock.owner, lock.token, "10.0.0.7:80")
        assert heard.told(), "a proclaim was not told"
        assert store_call(client, "proclaim", key, lock.owner, lock.token, "10.0.0.7:81")
        assert heard.told(), "a second proclaim was not told"
        lock.release()


def test_a_release_is_told(client: dblock.Client) -> None:
    key = _key()
    with watching(client, key) as (heard, _):
        lock = client.lock(key, ttl=30)
        assert lock.acquire(blocking=False)
        assert store_call(client, "proclaim", key, lock.owner, lock.token, "v")
        heard.quiet()
        lock.release()
        assert heard.told(), "the release of a proclaimed hold was not told"
        if _every_hold(client):
            assert lock.acquire(blocking=False)
            heard.quiet()
            lock.release()
            assert heard.told(), "a release was not told"


def test_a_force_release_is_told(client: dblock.Client) -> None:
    key = _key()
    with watching(client, key) as (heard, _):
        lock = client.lock(key, ttl=30)
        assert lock.acquire(blocking=False)
        heard.quiet()
        assert client.force_release(key)
        assert heard.told(), "a force-release was not told"


def test_what_another_client_does_is_told(
    provider: Provider, client: dblock.Client, table: str
) -> None:
    key = _key()
    with watching(client, key) as (heard, _), provider.connect(table=table) as other:
        lock = other.lock(key, ttl=30)
        assert lock.acquire(blocking=False)
        if _every_hold(client):
            assert heard.told(), "another client's grant was not told"
        assert store_call(other, "proclaim", key, lock.owner, lock.token, "theirs")
        assert heard.told(), "another client's proclaim was not told"
        lock.release()
        assert heard.told(), "another client's release was not told"


def test_a_stopped_watch_is_told_nothing_more_and_others_go_on(client: dblock.Client) -> None:
    key = _key()
    with watching(client, key) as (kept, _), watching(client, key) as (gone, stop):
        stop()
        gone.quiet()
        calls = gone.calls
        lock = client.lock(key, ttl=30)
        assert lock.acquire(blocking=False)
        assert store_call(client, "proclaim", key, lock.owner, lock.token, "v")
        assert kept.told(), "the watch left running was stopped too"
        lock.release()
        assert kept.told()
        time.sleep(0.5)
        assert gone.calls == calls, "told after it stopped"


def test_keys_are_told_apart(client: dblock.Client) -> None:
    key = _key()
    with watching(client, key) as (heard, _):
        heard.quiet()
        calls = heard.calls
        other = client.lock(key + "-other", ttl=30)
        assert other.acquire(blocking=False)
        assert store_call(client, "proclaim", other.key, other.owner, other.token, "v")
        other.release()
        time.sleep(0.3)
        assert heard.calls == calls, "told of another key"
